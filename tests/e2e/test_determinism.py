"""Temperature 0 (and a seed) means the same text whatever else the server is doing: in
the default configuration (split KV layout) output does not depend on batch composition or
prefix-cache state. Real engine only: the scripted runner's logits depend on neither."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from tests.e2e.conftest import Server, _start_subprocess

CHATS = ["Tell me about the sea.", "What is 2+2?", "Write a haiku about rain.", "Say hello.",
         "Name a famous painter.", "Why do cats purr?", "Give me a synonym for fast.",
         "What is the capital of Italy?"]
SYSTEM = ("You are a patient tutor for a public library's evening class. Explain things "
          "simply, in two or three sentences, and end with a short question. ")


@pytest.fixture(scope="module")
def real_server(server: Server) -> Server:
    if server.mode != "real":
        pytest.skip("batch and cache invariance is a property of the real engine")
    return server


@pytest.fixture(scope="module")
def cold_server(real_server: Server) -> Iterator[Server]:
    """A second server that has seen none of this module's prompts when first asked."""
    yield from _start_subprocess(None)


async def _chat(client: openai.AsyncOpenAI, model: str, content: str, system: str = "",
                **kw) -> str:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": content})
    params = {"max_tokens": 32, "temperature": 0, **kw}
    reply = await client.chat.completions.create(model=model, messages=messages, **params)
    return reply.choices[0].message.content


def test_sixteen_concurrent_greedy_chats_equal_alone_and_cold(real_server, cold_server):
    async def run():
        warm, cold = real_server.async_client(), cold_server.async_client()
        try:
            on_cold = [await _chat(cold, cold_server.model, c) for c in CHATS]
            alone = [await _chat(warm, real_server.model, c) for c in CHATS]
            prompts = CHATS + CHATS  # 16, the second copy served from the prefix cache
            together = await asyncio.gather(*(_chat(warm, real_server.model, c)
                                              for c in prompts))
            return on_cold, alone, together
        finally:
            await warm.close()
            await cold.close()

    on_cold, alone, together = asyncio.run(run())
    assert alone == on_cold
    assert together == alone + alone


def test_seeded_request_repeats_on_a_warm_cache(real_server):
    client = real_server.client()
    ask = dict(model=real_server.model, max_tokens=32, temperature=0.9, seed=1234,
               messages=[{"role": "user", "content": "Invent a name for a boat."}])
    first = client.chat.completions.create(**ask).choices[0].message.content
    # warm the cache with the same prompt under another seed, and keep the batch busy
    client.chat.completions.create(**{**ask, "seed": 99})
    again = client.chat.completions.create(**ask).choices[0].message.content
    assert again == first


def test_prompt_half_from_cache_equals_it_cold(real_server, cold_server):
    async def run():
        warm, cold = real_server.async_client(), cold_server.async_client()
        try:
            # the shared system prompt fills the cache; the question is new to both servers
            await _chat(warm, real_server.model, "What is a library card?", SYSTEM)
            cached = await _chat(warm, real_server.model, "How do I return a book late?",
                                 SYSTEM)
            fresh = await _chat(cold, cold_server.model, "How do I return a book late?",
                                SYSTEM)
            return cached, fresh
        finally:
            await warm.close()
            await cold.close()

    cached, fresh = asyncio.run(run())
    before = real_server.metric("tandem_prefix_cache_hit_tokens_total")
    assert before > 0
    assert cached == fresh
