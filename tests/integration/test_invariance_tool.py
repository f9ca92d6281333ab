"""`python -m app.bench.invariance`: the grouping-invariance table (issue 31), on the embedded
model. The partition and verify rows depend on the machine, thread count and prompt length
(that is what the tool is for), so this asserts the rows that must hold anywhere: the
control (the same grouping twice) and, in the split layout, a decode step unchanged by its
neighbours (what the README's batched-or-alone guarantee rests on)."""

from __future__ import annotations

import math

import pytest

from app.bench.invariance import _describe, _scaled, measure
from backends.base import RunnerConfig


@pytest.fixture(scope="module")
def runner(embedded_model):
    from backends.loader import load_runner

    config = RunnerConfig(max_seqs=16, seq_tokens=48, n_threads=1, flash_attn="on",
                          kv_layout="split")
    runner, _ = load_runner(embedded_model, backend="llamacpp", config=config)
    yield runner
    runner.close()


def test_control_and_neighbours_are_exact_and_every_row_is_measured(runner) -> None:
    rows = {(r["grouping"], r["compared"]): r["max_abs_delta"] for r in measure(runner, 32)}
    assert list(rows) == [
        ("32 again (control)", "last position"),
        ("16 + 16", "last position"),
        ("31 + 1", "last position"),
        ("25 + 7", "last position"),
        ("8 single tokens + 24", "last position"),
        ("4-token verify step vs 4 one-token steps", "every position"),
        ("4-token verify step vs 4 one-token steps", "last position only"),
        ("8-token verify step vs 8 one-token steps", "every position"),
        ("8-token verify step vs 8 one-token steps", "last position only"),
        ("a decode step alone vs beside 15 sequences", "last position"),
    ]
    assert rows[("32 again (control)", "last position")] == 0.0
    assert rows[("a decode step alone vs beside 15 sequences", "last position")] == 0.0
    assert all(math.isfinite(v) and v >= 0 for v in rows.values())


def test_partitions_scale_to_the_prompt_length() -> None:
    assert _scaled((399, 1), 64) == (63, 1)
    assert _scaled((1,) * 8 + (392,), 64) == (1,) * 8 + (56,)
    assert _scaled((200, 200), 65) == (33, 32)
    assert _describe((1,) * 8 + (392,)) == ["8 single tokens", "392"]
    with pytest.raises(ValueError, match="too short"):
        _scaled((393, 7), 7)
