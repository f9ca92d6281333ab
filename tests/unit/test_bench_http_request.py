"""What the peer benchmark's clients send: the same sampling to every server."""

from __future__ import annotations

import asyncio
import json

import httpx

from app.bench.http import stream_chat

STREAM = (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,'
          b'"prompt_tokens_details":{"cached_tokens":3}}}\n\n'
          b"data: [DONE]\n\n")


def test_every_server_gets_greedy_without_repetition_penalty() -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=STREAM,
                              headers={"content-type": "text/event-stream"})

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler),
                                     base_url="http://peer") as http:
            return await stream_chat(http, "m", [{"role": "user", "content": "hi"}], 2)

    result = asyncio.run(run())
    (body,) = bodies
    # tandem's registry default for the embedded model is repetition_penalty 1.05 and
    # llama-server's is none: both names pin it to 1.0, so both do the same work
    assert {k: body[k] for k in ("temperature", "repetition_penalty", "repeat_penalty")} == {
        "temperature": 0, "repetition_penalty": 1.0, "repeat_penalty": 1.0}
    assert body["ignore_eos"] is True and body["max_tokens"] == 2 and body["stream"] is True
    assert (result.completion_tokens, result.prompt_tokens, result.cached_tokens) == (2, 7, 3)
