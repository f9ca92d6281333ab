"""What every benchmark chart shares: the title (model, format, tokens, machine), bar panels
with concurrency as categories, y axes from zero with units and which way is better, value
labels on every bar, and where a chart goes when no path is given.

matplotlib is imported inside the functions (it takes a second; most commands never draw).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs

BETTER = {"higher": "higher is better", "lower": "lower is better"}


@dataclass(frozen=True, slots=True)
class ChartContext:
    """What was measured, for the title. model: e.g. "SmolLM2-135M-Instruct"; fmt: e.g.
    "GGUF Q4_1" ("" when unknown, as for a server); tokens: e.g. "512 prompt + 128 output
    tokens per request"; machine: e.g. "Intel Xeon (2 cores)" or "server http://host:8000"."""

    model: str
    fmt: str
    tokens: str
    machine: str

    def title(self, what: str, width: int = 200) -> str:
        """`what`, then `model (fmt) · tokens · machine` on lines of at most `width`
        characters (broken at the dots where it is longer)."""
        model = f"{self.model} ({self.fmt})" if self.fmt else self.model
        lines = [what, ""]
        for part in (model, self.tokens, self.machine):
            joined = f"{lines[-1]} · {part}" if lines[-1] else part
            if lines[-1] and len(joined) > width:
                lines.append(part)
            else:
                lines[-1] = joined
        return "\n".join(lines)


def model_and_format(path: str | Path) -> tuple[str, str]:
    """(name, format) of a model file or MLX directory: ("SmolLM2-135M-Instruct", "GGUF
    Q4_1") from the GGUF's `general.file_type` (the file name's last dotted part if that
    cannot be read), ("name", "MLX") for a directory."""
    p = Path(path)
    if p.is_dir():
        return p.name, "MLX"
    stem = p.stem
    name, _, suffix = stem.rpartition(".")
    name = name or stem
    try:
        import gguf

        field = gguf.GGUFReader(p).fields.get("general.file_type")
        quant = gguf.LlamaFileType(field.contents()).name.removeprefix("MOSTLY_")
    except Exception:  # noqa: BLE001 - a title must not fail a finished benchmark
        quant = suffix if name != stem else ""
    return name, f"GGUF {quant}".strip()


def default_chart_path(kind: str) -> Path:
    """`<user data dir>/tandem/bench/<kind>-<YYYYmmdd-HHMMSS>.png` (`$TANDEM_HOME/bench/...`
    when set): outside any checkout. The directory is created."""
    home = os.environ.get("TANDEM_HOME")
    base = Path(home).expanduser() if home else Path(platformdirs.user_data_dir("tandem"))
    folder = base / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}.png"


def figure(n_panels: int, panel_width: float = 4.6, height: float = 3.8):
    """(fig, [ax, ...]): one row of panels, laid out by constrained_layout (no clipped
    labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n_panels, figsize=(panel_width * n_panels + 0.4, height),
                             squeeze=False, layout="constrained")
    return fig, list(axes[0])


def bar_panel(ax, categories: list[str], series: dict[str, list[float | None]], *, title: str,
              ylabel: str, better: str, xlabel: str = "concurrency (requests in flight)",
              labels: dict[str, list[str]] | None = None, ymax: float | None = None,
              legend: bool = True) -> None:
    """Grouped bars: one group per category (concurrency levels, in the order given), one bar
    per series, each labelled with its value (or `labels[series][i]`). The y axis starts at
    0 and reads `ylabel (higher|lower is better)`; a legend only for two or more series
    (and `legend`: False where the figure has one for all panels).
    None values leave a gap labelled "n/a"."""
    n = len(series)
    width = 0.8 / n
    for j, (name, values) in enumerate(series.items()):
        xs = [i + (j - (n - 1) / 2) * width for i in range(len(categories))]
        heights = [v or 0 for v in values]
        bars = ax.bar(xs, heights, width * 0.92, label=name)
        texts = (labels or {}).get(name) or [_short(v) for v in values]
        ax.bar_label(bars, labels=texts, padding=2, fontsize=8)
    ax.set_xticks(range(len(categories)), categories)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{ylabel} ({BETTER[better]})")
    ax.set_title(title, fontsize=10)
    top = ymax if ymax is not None else max((v or 0 for vs in series.values() for v in vs),
                                            default=0)
    ax.set_ylim(0, (top or 1) * 1.15)  # room for the value labels above the bars
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    if n > 1 and legend:
        ax.legend(fontsize=8)


def suptitle(fig, context: ChartContext, what: str) -> None:
    """The figure's title from `context`, wrapped to the figure's width."""
    fig.suptitle(context.title(what, width=int(fig.get_figwidth() * 13)))


def save(fig, path: str | Path) -> None:
    """Write `fig` as PNG (dpi 120, bounding box tight) and close it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _short(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"
