"""Server behaviour that needs a misbehaving or specially configured engine: runs in-process
on the real engine over the scripted runner (no model) only."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import Server, _start_inprocess


@pytest.fixture(scope="module")
def failing() -> Iterator[Server]:
    yield from _start_inprocess(None, fail_after=3)


@pytest.fixture(scope="module")
def open_cors() -> Iterator[Server]:
    yield from _start_inprocess(None, cors=("http://localhost:3000",), context_length=128)


def test_error_after_stream_began_is_an_event(failing: Server) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True}
    body["ignore_eos"] = True  # the scripted reply must outlast the failure
    with httpx.stream("POST", f"{failing.url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        events = [e for e in r.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    err = json.loads(events[-2][len("data: ") :])
    assert set(err) == {"error"}
    assert err["error"]["type"] == "server_error"
    assert "simulated backend error" in err["error"]["message"]
    plain = httpx.post(
        f"{failing.url}/v1/chat/completions", json={**body, "stream": False}, timeout=30
    )
    assert plain.status_code == 500
    assert plain.json()["error"]["type"] == "server_error"


def test_no_key_configured_and_aliases(open_cors: Server) -> None:
    r = httpx.post(
        f"{open_cors.url}/v1/completions",
        json={"model": "fake-model.gguf", "prompt": "x", "max_tokens": 2},
        headers={"Authorization": "Bearer anything"},
        timeout=30,
    )
    assert r.status_code == 200
    assert r.json()["model"] == "fake-model.gguf"
    huge = httpx.post(
        f"{open_cors.url}/v1/completions",
        json={"prompt": "x", "max_tokens": 10**9, "ignore_eos": True, "stream": False},
        timeout=60,
    )
    assert huge.status_code == 200  # capped by the context window, not refused
    assert huge.json()["choices"][0]["finish_reason"] == "length"


def test_cors(open_cors: Server) -> None:
    origin = "http://localhost:3000"
    pre = httpx.options(
        f"{open_cors.url}/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
        timeout=10,
    )
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == origin
    other = httpx.get(
        f"{open_cors.url}/health", headers={"Origin": "http://evil.example"}, timeout=10
    )
    assert "access-control-allow-origin" not in other.headers
