"""`app.bench.decode_probe.DecodeTimes`: which decodes and gaps it times."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import app.bench.decode_probe as probe
from app.bench.decode_probe import DecodeTimes


def step(n: int, pos: int, seq: int = 0) -> SimpleNamespace:
    """A llama_batch of `n` tokens of sequence `seq` from position `pos`."""
    return SimpleNamespace(n_tokens=n, pos=[pos + i for i in range(n)], seq_id=[[seq]] * n)


def test_gaps_are_between_decodes_that_continue_each_other(monkeypatch):
    # decode k runs from 10k to 10k + 3 seconds: every gap is 7 s, every decode 3 s
    clock = iter(t for k in range(12) for t in (10.0 * k, 10.0 * k + 3))
    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(clock))
    times = DecodeTimes()

    def decode(ctx, batch):
        if batch.n_tokens == 0:
            raise RuntimeError("llama_decode failed")
        return 0

    timed = times.wrap(decode)
    steps = [step(5, 0), step(1, 5), step(1, 6), step(1, 7),  # prefill, 3 decodes: 2 gaps
             step(3, 8), step(1, 11), step(1, 12),  # a 3-token verification, then 1 gap
             step(1, 4),  # the next request: one uncached prompt token, no gap
             step(1, 5, seq=1), step(1, 5)]  # another sequence, then back: no gaps
    for s in steps:
        assert timed(None, s) == 0
    with pytest.raises(RuntimeError):
        timed(None, SimpleNamespace(n_tokens=0, pos=[], seq_id=[]))
    assert times.summary() == {"decodes": 10, "decode_us_p50": 3e6, "gaps": 3,
                               "gap_us_p50": 7e6}


def test_no_gap_across_a_failed_decode(monkeypatch):
    clock = iter(float(t) for t in range(10))
    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(clock))
    times = DecodeTimes()
    fail = [False, True, False]

    def decode(ctx, batch):
        if fail.pop(0):
            raise RuntimeError("llama_decode failed")
        return 0

    timed = times.wrap(decode)
    timed(None, step(1, 0))
    with pytest.raises(RuntimeError):
        timed(None, step(1, 1))
    timed(None, step(1, 1))
    assert (len(times.decodes), times.gaps) == (2, [])


def test_nothing_to_take_a_median_of():
    assert DecodeTimes().summary() == {"decodes": 0, "decode_us_p50": None, "gaps": 0,
                                       "gap_us_p50": None}
