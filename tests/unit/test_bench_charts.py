"""The benchmark charts as a reader meets them: a title with model, format, tokens and
machine; concurrency as categories in the order run; every y axis from 0 with its unit and
which way is better; every bar labelled; legends only where there is more than one series;
panels in the order asked. Checked on the matplotlib Figure, not on pixels."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.bench.charts import ChartContext, default_chart_path, model_and_format
from app.bench.engine import plot
from app.bench.spec import plot_frontier

CTX = ChartContext("SmolLM2-135M-Instruct", "GGUF Q4_1",
                   "512 prompt + 128 output tokens per request", "AMD EPYC (2 cores)")
BENCH = [
    {"concurrency": 1, "throughput_tok_s": 88.4, "per_user_tok_s": 121.3,
     "ttft_ms": {"p50": 310.2, "p99": 402.0}},
    {"concurrency": 4, "throughput_tok_s": 131.7, "per_user_tok_s": 52.1,
     "ttft_ms": {"p50": 1210.0, "p99": 2410.0}},
    {"concurrency": 16, "throughput_tok_s": 119.9, "per_user_tok_s": 12.4,
     "ttft_ms": {"p50": 5230.0, "p99": 9800.0}},
]


def bar_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_bench_chart_title_axes_and_labels(tmp_path: Path) -> None:
    path = tmp_path / "bench.png"
    fig = plot(BENCH, path, CTX, "tandem bench: in-process engine")
    assert path.stat().st_size > 10_000
    assert fig.get_suptitle() == ("tandem bench: in-process engine\nSmolLM2-135M-Instruct "
                                  "(GGUF Q4_1) · 512 prompt + 128 output tokens per request · "
                                  "AMD EPYC (2 cores)")
    throughput, per_user, ttft = fig.axes
    assert [ax.get_title() for ax in fig.axes] == [
        "Throughput, all users\n(output tokens / wall time, prefill included)",
        "Decode speed per user\n(1 / median time per output token)",
        "Time to first token\n(median and 99th percentile)"]
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "output tok/s (higher is better)", "tok/s per user (higher is better)",
        "TTFT, ms (lower is better)"]
    for ax in fig.axes:
        assert ax.get_xlabel() == "concurrency (requests in flight)"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16"]
        assert ax.get_ylim()[0] == 0
    assert bar_texts(throughput) == ["88.4", "132", "120"]
    assert bar_texts(per_user) == ["121", "52.1", "12.4"]
    assert bar_texts(ttft) == ["310", "1210", "5230", "402", "2410", "9800"]
    # a legend only where two series share a panel
    assert [ax.get_legend() is not None for ax in fig.axes] == [False, False, True]
    assert [t.get_text() for t in ttft.get_legend().get_texts()] == ["p50", "p99"]


def test_bench_chart_of_a_server_takes_per_user_speed_from_tpot(tmp_path: Path) -> None:
    # HTTP results carry tpot_ms but no per_user_tok_s
    rows = [{"concurrency": 2, "throughput_tok_s": 50.0, "tpot_ms": {"p50": 20.0, "p99": 30.0},
             "ttft_ms": {"p50": 100.0, "p99": 150.0}}]
    fig = plot(rows, tmp_path / "b.png", CTX, "tandem bench: server http://h:8000")
    assert bar_texts(fig.axes[1]) == ["50"]


def spec_rows(workloads: list[str]) -> list[dict]:
    rows = []
    for w, scale in zip(workloads, (1, 2), strict=False):
        for c in (1, 16):
            for mode, r in (("off", 1.0), ("auto", 0.97)):
                rows.append({"workload": w, "concurrency": c, "mode": mode,
                             "decode_tok_s": 100.0 * c * scale * r, "ratio_vs_off": r})
    return rows


def test_spec_chart_panels_in_the_order_run_on_one_scale(tmp_path: Path) -> None:
    path = tmp_path / "spec.png"
    fig = plot_frontier(spec_rows(["free", "code-edit"]), path,
                        ChartContext("M", "GGUF Q8_0", "128 output tokens per request, greedy",
                                     "AMD EPYC (2 cores)"))
    assert path.is_file()
    assert fig.get_suptitle().startswith("Speculative decoding: decode speed per mode\nM (GGUF "
                                         "Q8_0) · 128 output tokens per request, greedy")
    assert [ax.get_title() for ax in fig.axes] == ["workload: free", "workload: code-edit"]
    for ax in fig.axes:
        assert ax.get_ylabel() == "decode tok/s, all users (higher is better)"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "16"]
        assert ax.get_legend() is None
    # one scale for all panels, from 0: the top bar (3200 tok/s) plus room for its label
    assert {ax.get_ylim() for ax in fig.axes} == {(0, 3200 * 1.15)}
    assert bar_texts(fig.axes[0]) == ["100", "1600", "97\n×0.97", "1552\n×0.97"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["off", "auto"]


def test_spec_chart_with_one_mode_has_no_legend(tmp_path: Path) -> None:
    rows = [r for r in spec_rows(["free"]) if r["mode"] == "off"]
    fig = plot_frontier(rows, tmp_path / "s.png", CTX)
    assert fig.legends == [] and fig.axes[0].get_legend() is None


def test_title_wraps_at_the_dots_for_a_narrow_figure() -> None:
    assert CTX.title("T", width=40) == ("T\nSmolLM2-135M-Instruct (GGUF Q4_1)\n"
                                        "512 prompt + 128 output tokens per request\n"
                                        "AMD EPYC (2 cores)")


def test_default_chart_path_is_outside_the_checkout(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    path = default_chart_path("spec")
    assert path.parent == tmp_path / "bench" and path.parent.is_dir()
    assert path.name.startswith("spec-") and path.suffix == ".png"


def test_format_falls_back_to_the_file_name(tmp_path: Path) -> None:
    fake = tmp_path / "Foo-1B.Q8_0.gguf"
    fake.write_bytes(b"not a gguf")
    assert model_and_format(fake) == ("Foo-1B", "GGUF Q8_0")
    (tmp_path / "bar-mlx").mkdir()
    assert model_and_format(tmp_path / "bar-mlx") == ("bar-mlx", "MLX")


def test_chart_context_reads_the_embedded_model(embedded_model_path: str) -> None:
    from app.commands.bench import chart_context

    args = argparse.Namespace(url=None, model=embedded_model_path, workload=None,
                              prompt_tokens=512, max_tokens=128)
    ctx = chart_context(args, {"prompt_tokens": 512})
    assert (ctx.model, ctx.fmt, ctx.tokens) == (
        "SmolLM2-135M-Instruct", "GGUF Q4_1", "512 prompt + 128 output tokens per request")
    assert ctx.machine.endswith(" cores)")
