"""The two ChatClient implementations, without a model: the engine over a scripted runner,
and a mock server."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest

from app.disagg.report import route_summary
from tui.chat_settings import ChatSettings
from tui.client import ClientError, ContextFullError
from tui.engine_client import EngineClient
from tui.export import last_code_block, title_from
from tui.server_client import ServerClient, normalize_base_url
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


async def test_server_client_streams_and_reports_usage():
    requests: list[dict] = []
    client = ServerClient("127.0.0.1:9", transport=_server(requests))
    client.load()
    assert client.model_name == "tiny" and client.context_length == 2048
    reply = client.start_reply([{"role": "user", "content": "hi"}], ChatSettings(seed=3))
    chunks = [c async for c in reply]
    assert chunks == ["Hel", "lo"]
    assert reply.stats.finish_reason == "stop"
    assert (reply.stats.prompt_tokens, reply.stats.cached_tokens) == (9, 4)
    assert reply.stats.context_tokens == 11
    assert requests[0]["model"] == "tiny" and requests[0]["seed"] == 3
    assert requests[0]["stream"] is True


async def test_server_client_maps_context_error():
    client = ServerClient("http://x", model="m", transport=_server([], status=400))
    reply = client.start_reply([{"role": "user", "content": "hi"}], ChatSettings())
    with pytest.raises(ContextFullError):
        async for _ in reply:
            pass


def test_server_unreachable_is_a_client_error():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ClientError, match="unreachable"):
        ServerClient(f"http://127.0.0.1:{port}").load()


def test_base_url_normalisation():
    assert normalize_base_url("localhost:8000") == "http://localhost:8000/v1"
    assert normalize_base_url("https://h/v1/") == "https://h/v1"


async def test_engine_client_cancel_frees_request(scripted):
    engine = scripted(["ab c d"])
    engine.hold()
    client = EngineClient("fake", factory=lambda _n: engine.engine)
    client.load()
    reply = client.start_reply([{"role": "user", "content": "x"}], ChatSettings())
    chunks = []
    async for chunk in reply:
        chunks.append(chunk)
        if len(chunks) == 1:
            assert await asyncio.to_thread(engine.runner.holding.wait, 5)
            reply.cancel()
    # The step in flight at the cancel ("b") completes; then the request is aborted.
    assert chunks == ["a", "b"] and reply.stats.finish_reason == "abort"
    assert engine.cancelled == ["req-0"]
    stats = engine.engine.stats()
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)


def test_engine_client_context_full(scripted):
    client = EngineClient("fake", factory=lambda _n: scripted(context_length=5).engine)
    client.load()
    with pytest.raises(ContextFullError) as info:
        client.start_reply([{"role": "user", "content": "too long"}], ChatSettings())
    assert info.value.context_length == 5


def test_status_line_and_helpers():
    line = format_status(StatusInfo("llamacpp", "smol", "ready", 0.042, 118.04, 812, 8192, 768, (52, 512)))
    assert line == (
        "● llamacpp · smol │ TTFT 42 ms │ 118.0 tok/s │ ctx 812/8192 tok │ cached 768 tok │ KV 52/512 tok"
    )
    spec = StatusInfo("llamacpp", "smol", "ready", spec=(45, 60))
    assert format_status(spec).endswith(" │ drafts 45/60 accepted")
    assert "drafts" not in format_status(StatusInfo(spec=(0, 0)))
    remote = StatusInfo("llamacpp", "smol", "ready", prefill=route_summary(
        {"remote": True, "reason": "probe", "ok": True, "imported_tokens": 2047,
         "bytes": 47_162_880}))
    assert format_status(remote).endswith(
        " │ KV – │ prefilled remotely (first prompt: measuring the link: 2047 tokens, "
        "47.2 MB of KV)")
    assert route_summary({"remote": True, "reason": "always", "ok": False,
                          "failure": "frame_timeout", "imported_tokens": 512}) == (
        "remote prefill failed (the worker stalled) after 512 tokens")
    assert route_summary({"remote": False, "reason": "short_prompt", "uncached": 120,
                          "min_tokens": 256}) == (
        "prefilled here (short prompt: 120 new tokens, under 256)")
    assert route_summary(None) is None
    assert last_code_block("a\n```py\nx = 1\n```\nb\n~~~\ny\n~~~\n") == "y\n"
    assert last_code_block("no code") is None
    assert title_from("a very long first message that goes on and on forever", 20) == "a very long first…"
