"""The two ChatBackend implementations, without a model: fake engine and a mock server."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.tui.fake_engine import FakeEngine
from tui.backend import BackendError, ContextFullError
from tui.engine_backend import EngineBackend
from tui.export import last_code_block, title_from
from tui.server_backend import ServerBackend, normalize_base_url
from tui.settings import ChatSettings
from tui.widgets.status import StatusInfo, format_status


def _sse(*events: dict) -> bytes:
    lines = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


def _server(requests: list[dict], status: int = 200):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "context_length": 2048}]})
        requests.append(json.loads(request.content))
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "exceeds context length"}})
        body = _sse(
            {"choices": [{"delta": {"role": "assistant"}}]},
            {"choices": [{"delta": {"content": "Hel"}}]},
            {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                                      "prompt_tokens_details": {"cached_tokens": 4}}},
        )
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


async def test_server_backend_streams_and_reports_usage():
    requests: list[dict] = []
    backend = ServerBackend("127.0.0.1:9", transport=_server(requests))
    backend.load()
    assert backend.model_name == "tiny" and backend.context_length == 2048
    reply = backend.start_reply([{"role": "user", "content": "hi"}], ChatSettings(seed=3))
    chunks = [c async for c in reply]
    assert chunks == ["Hel", "lo"]
    assert reply.stats.finish_reason == "stop"
    assert (reply.stats.prompt_tokens, reply.stats.cached_tokens) == (9, 4)
    assert reply.stats.context_tokens == 11
    assert requests[0]["model"] == "tiny" and requests[0]["seed"] == 3
    assert requests[0]["stream"] is True


async def test_server_backend_maps_context_error():
    backend = ServerBackend("http://x", model="m", transport=_server([], status=400))
    reply = backend.start_reply([{"role": "user", "content": "hi"}], ChatSettings())
    with pytest.raises(ContextFullError):
        async for _ in reply:
            pass


def test_server_unreachable_is_a_backend_error():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(BackendError, match="unreachable"):
        ServerBackend(f"http://127.0.0.1:{port}").load()


def test_base_url_normalisation():
    assert normalize_base_url("localhost:8000") == "http://localhost:8000/v1"
    assert normalize_base_url("https://h/v1/") == "https://h/v1"


async def test_engine_backend_cancel_frees_request():
    engine = FakeEngine(["a b c d"])
    engine.hold()
    backend = EngineBackend("fake", factory=lambda _n: engine)
    backend.load()
    reply = backend.start_reply([{"role": "user", "content": "x"}], ChatSettings())
    chunks = []
    async for chunk in reply:
        chunks.append(chunk)
        reply.cancel()
    assert chunks == ["a"] and reply.stats.finish_reason == "abort"
    assert engine.cancelled == ["req-1"]


def test_engine_backend_context_full():
    backend = EngineBackend("fake", factory=lambda _n: FakeEngine(context_length=5))
    backend.load()
    with pytest.raises(ContextFullError) as info:
        backend.start_reply([{"role": "user", "content": "too long"}], ChatSettings())
    assert info.value.context_length == 5


def test_status_line_and_helpers():
    line = format_status(StatusInfo("llamacpp", "smol", "ready", 0.042, 118.04, 812, 8192, 768, (52, 512)))
    assert line == (
        "● llamacpp · smol │ TTFT 42 ms │ 118.0 tok/s │ ctx 812/8192 │ cached 768 │ KV 52/512"
    )
    assert last_code_block("a\n```py\nx = 1\n```\nb\n~~~\ny\n~~~\n") == "y\n"
    assert last_code_block("no code") is None
    assert title_from("a very long first message that goes on and on forever", 20) == "a very long first…"
