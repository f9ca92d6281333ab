"""The Python floor of the paired peer benchmark does tandem's work: the same greedy tokens,
prompt cold or reused from its KV, in the chunks tandem sends."""

from __future__ import annotations

import asyncio
import sys

import httpx
import openai
import pytest

from app.bench.peer import SEQ_TOKENS, SEQS
from app.bench.python_floor import FloorModel
from app.bench.server_process import free_port, running
from app.config import EngineArgs
from app.engine import SamplingParams
from app.loader import load_engine
from app.prompts import chat_prompt_ids
from backends.base import RunnerConfig

FIRST = [{"role": "user", "content": "Name three colors of the rainbow."}]


@pytest.fixture(scope="module")
def floor(embedded_model_path):
    port = free_port()
    cmd = [sys.executable, "-m", "app.bench.python_floor", "--model", embedded_model_path,
           "--port", str(port), "--threads", "2"]
    with running(cmd, port) as url:
        yield url


def tandem_greedy(path: str, prompts: list[list[dict] | list[int]], n: int) -> list:
    """tandem's greedy reply to each prompt: text for a conversation, token ids for ids."""
    engine = load_engine(EngineArgs(path, runner=RunnerConfig(max_seqs=SEQS,
                                                               seq_tokens=SEQ_TOKENS,
                                                               n_threads=2)))

    async def one(prompt):
        chat = isinstance(prompt[0], dict)
        ids = chat_prompt_ids(engine.tokenizer, prompt) if chat else prompt
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        outs = [out async for out in engine.generate(ids, params)]
        return "".join(o.text for o in outs) if chat else [t for o in outs for t in o.token_ids]

    try:
        return [asyncio.run(one(p)) for p in prompts]
    finally:
        engine.shutdown()


def test_floor_reuses_kv_up_to_the_last_decoded_token(embedded_model_path):
    floor = FloorModel(embedded_model_path, threads=2)
    try:
        first = chat_prompt_ids(floor.tokenizer, FIRST)
        reply = floor.generate(first, 12, lambda piece: None)
        # continues the whole reply: the KV holds all of it but its last token
        second = first + reply + [reply[-1]]
        again = floor.generate(second, 12, lambda piece: None)
    finally:
        floor.close()
    assert [reply, again] == tandem_greedy(embedded_model_path, [first, second], 12)


def stream(client: openai.OpenAI, messages: list[dict], n: int):
    model = client.models.list().data[0].id
    return list(client.chat.completions.create(model=model, messages=messages, max_tokens=n,
                                               stream=True,
                                               stream_options={"include_usage": True}))


def test_floor_streams_tandems_greedy_tokens(floor, embedded_model_path):
    client = openai.OpenAI(base_url=f"{floor}/v1", api_key="none", max_retries=0, timeout=60)
    first = stream(client, FIRST, 24)
    assert first[0].choices[0].delta.role == "assistant"
    assert first[-2].choices[0].finish_reason == "length"
    assert first[-1].choices == [] and first[-1].usage.completion_tokens == 24
    reply = "".join(c.choices[0].delta.content or "" for c in first if c.choices)
    # the follow-up repeats the whole reply: its KV is reused up to the last token, which
    # was generated but never decoded
    second = [*FIRST, {"role": "assistant", "content": reply},
              {"role": "user", "content": "And two more?"}]
    texts = [reply]
    for messages in (second, FIRST):
        chunks = stream(client, messages, 24)
        assert chunks[-1].usage.completion_tokens == 24
        texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    assert texts == tandem_greedy(embedded_model_path, [FIRST, second, FIRST], 24)


def test_floor_refuses_what_it_cannot_serve(floor):
    r = httpx.post(f"{floor}/v1/chat/completions", json={"messages": FIRST})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "ValueError: only streamed requests are served"
    r = httpx.post(f"{floor}/v1/chat/completions",
                   json={"messages": FIRST, "stream": True, "max_tokens": SEQ_TOKENS})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        f"ValueError: max_tokens must be 1 or more, with the prompt at most {SEQ_TOKENS} tokens")
    assert httpx.get(f"{floor}/v1/nothing").status_code == 404
    assert httpx.get(f"{floor}/health").json() == {"status": "ok"}
