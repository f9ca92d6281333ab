"""The one-line status bar: what the engine did for the last reply, at a glance."""

from __future__ import annotations

from dataclasses import dataclass

from textual.widgets import Static


@dataclass(slots=True)
class StatusInfo:
    """Everything the status bar shows; None renders as "–".

    Rates are tokens/s, `ttft_s` seconds; `kv` is (blocks used, blocks total).
    """

    backend: str = "?"
    model: str = "?"
    state: str = "loading"  # loading | ready | generating | error
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    context_tokens: int | None = None
    context_length: int | None = None
    cached_tokens: int | None = None
    kv: tuple[int, int] | None = None


_STATE_MARK = {"loading": "◌", "ready": "●", "generating": "▶", "error": "✖"}


def _n(value: int | None) -> str:
    return "–" if value is None else str(value)


def format_status(info: StatusInfo) -> str:
    """The status line, e.g. `● llamacpp · smollm2 │ TTFT 42 ms │ 118.0 tok/s │ ctx 812/8192 │
    cached 768 │ KV 52/512`."""
    ttft = "–" if info.ttft_s is None else f"{info.ttft_s * 1000:.0f} ms"
    rate = "–" if info.decode_tok_s is None else f"{info.decode_tok_s:.1f}"
    kv = "–" if info.kv is None else f"{info.kv[0]}/{info.kv[1]}"
    parts = [
        f"{_STATE_MARK.get(info.state, '?')} {info.backend} · {info.model}",
        f"TTFT {ttft}",
        f"{rate} tok/s",
        f"ctx {_n(info.context_tokens)}/{_n(info.context_length)}",
        f"cached {_n(info.cached_tokens)}",
        f"KV {kv}",
    ]
    return " │ ".join(parts)


class StatusBar(Static):
    """Renders a `StatusInfo`; the app mutates `info` and calls `refresh_info()`."""

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text; padding: 0 1; }
    StatusBar.error { background: $error 40%; }
    """

    def __init__(self, **kwargs):
        super().__init__("", markup=False, **kwargs)
        self.info = StatusInfo()

    def refresh_info(self) -> None:
        self.update(format_status(self.info))
        self.set_class(self.info.state == "error", "error")
