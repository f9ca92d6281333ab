"""`app.bench.decode_probe` around a real server: what it writes when the server stops (the
Python floor under it, two requests)."""

from __future__ import annotations

import json
import sys

import httpx

from app.bench.http import SAMPLING
from app.bench.server_process import free_port, running


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
