"""`app.bench.decode_probe`: which decodes and gaps it times, and what it writes when the
server it runs stops (the Python floor under it, two requests)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import httpx
import pytest

import app.bench.decode_probe as probe
from app.bench.decode_probe import DecodeTimes
from app.bench.http import SAMPLING
from app.bench.server_process import free_port, running


def test_gaps_are_between_one_token_decodes(monkeypatch):
    # decode k runs from 10k to 10k + 3 seconds: every gap is 7 s, every decode 3 s
    clock = iter(t for k in range(8) for t in (10.0 * k, 10.0 * k + 3))
    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(clock))
    times = DecodeTimes()

    def decode(ctx, batch):
        if batch.n_tokens == 0:
            raise RuntimeError("llama_decode failed")
        return 0

    timed = times.wrap(decode)
    for n in [5, 1, 1, 1, 3, 1, 1]:
        assert timed(None, SimpleNamespace(n_tokens=n)) == 0
    with pytest.raises(RuntimeError):
        timed(None, SimpleNamespace(n_tokens=0))
    # 1-1, 1-1 after the prefill; 1-1 after the 3-token step; none around the failure
    assert times.summary() == {"decodes": 8, "decode_us_p50": 3e6, "gaps": 3,
                               "gap_us_p50": 7e6}


def test_nothing_to_take_a_median_of():
    assert DecodeTimes().summary() == {"decodes": 0, "decode_us_p50": None, "gaps": 0,
                                       "gap_us_p50": None}


def test_the_floor_under_the_probe(embedded_model_path, tmp_path):
    out = tmp_path / "floor.json"
    port = free_port()
    cmd = [sys.executable, "-m", "app.bench.decode_probe", str(out), "app.bench.python_floor",
           "--model", embedded_model_path, "--port", str(port), "--threads", "2"]
    with running(cmd, port) as url:
        for content in ("Name three colors.", "Count to five."):
            r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
                "model": "floor", "stream": True, "max_tokens": 8, **SAMPLING,
                "messages": [{"role": "user", "content": content}]})
            assert r.status_code == 200
        assert not out.exists()  # written when the server stops
    written = json.loads(out.read_text())
    # per request: the prompt, then 7 one-token decodes (the 8th token is never decoded),
    # 6 gaps between them
    assert (written["decodes"], written["gaps"]) == (16, 12)
    assert written["gap_us_p50"] > 0 and written["decode_us_p50"] > written["gap_us_p50"]
