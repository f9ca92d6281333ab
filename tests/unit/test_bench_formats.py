"""`tandem bench --workload ... --formats`: the summary against the fastest plain format,
and the refusals."""

from __future__ import annotations

import pytest

from app.cli import main
from app.commands.bench import format_summary


def _row(fmt: str, mode: str, tok_s: float, workload: str = "prediction", c: int = 1) -> dict:
    return {"format": fmt, "workload": workload, "concurrency": c, "mode": mode,
            "decode_tok_s": tok_s, "ratio_vs_off": None, "same_tokens": True}


def test_each_cell_is_compared_with_the_fastest_plain_format_of_that_cell() -> None:
    rows = [_row("Q4_K_M", "off", 20.0), _row("Q4_K_M", "fixed:3", 18.0),
            _row("Q8_0", "off", 12.0), _row("Q8_0", "fixed:3", 30.0),
            _row("Q4_K_M", "off", 40.0, c=4), _row("Q8_0", "off", 50.0, c=4)]
    assert [(r["format"], r["mode"], r["concurrency"], r["vs_best_plain"])
            for r in format_summary(rows)] == [
        ("Q4_K_M", "off", 1, 1.0), ("Q4_K_M", "fixed:3", 1, 0.9),
        ("Q8_0", "off", 1, 0.6), ("Q8_0", "fixed:3", 1, 1.5),
        ("Q4_K_M", "off", 4, 0.8), ("Q8_0", "off", 4, 1.0)]


@pytest.mark.parametrize(("argv", "message"), [
    (["--workload", "json-schema", "--formats", "q8_0"],
     "tandem: error: --formats is for the speculative workloads (code-edit, prediction, file-edit, free, agent-loop, chat)\n"),
    (["--workload", "prediction", "--formats", "q8_0", "--png", "x.png"],
     "tandem: error: --png draws one format's cells; leave it out with --formats\n"),
    (["--workload", "json-schema", "--spec", "oracle"],
     "tandem: error: --spec oracle is for the speculative workloads (code-edit, prediction, "
     "file-edit, free, agent-loop, chat)\n"),
    (["--workload", "free", "--spec", "oracle,wrong"],
     "tandem: error: spec mode must be off, auto, ngram, draft or fixed:K, not 'wrong'\n"),
    (["--workload", "file-edit", "--kv-layout", "unified"],
     "tandem: error: the speculative and structured benchmarks run the split KV layout (every "
     "mode's tokens comparable); leave out --kv-layout\n"),
])
def test_refusals(argv: list[str], message: str, capsys) -> None:
    assert main(["bench", *argv]) == 1
    assert capsys.readouterr().err == message
