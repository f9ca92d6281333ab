"""The Python floor of the paired peer benchmark does tandem's work: the same greedy tokens,
prompt cold or half reused, and OpenAI's stream shape."""

from __future__ import annotations

import asyncio
import sys

import httpx
import openai
import pytest

from app.bench.peer import SEQ_TOKENS, SEQS
from app.bench.server_process import free_port, running
from app.config import EngineArgs
from app.engine import SamplingParams
from app.loader import load_engine
from app.prompts import chat_prompt_ids
from backends.base import RunnerConfig

FIRST = [{"role": "user", "content": "Name three colors of the rainbow."}]
# shares the chat template's opening and FIRST's message with FIRST: served half from KV
SECOND = [*FIRST, {"role": "assistant", "content": "Red."},
          {"role": "user", "content": "And two more?"}]


@pytest.fixture(scope="module")
def floor(embedded_model_path):
    port = free_port()
    cmd = [sys.executable, "-m", "app.bench.python_floor", "--model", embedded_model_path,
           "--port", str(port), "--threads", "2"]
    with running(cmd, port) as url:
        yield url


def tandem_greedy(path: str, conversations: list[list[dict]], n: int) -> list[str]:
    engine = load_engine(EngineArgs(path, runner=RunnerConfig(max_seqs=SEQS,
                                                               seq_tokens=SEQ_TOKENS,
                                                               n_threads=2)))

    async def one(messages):
        ids = chat_prompt_ids(engine.tokenizer, messages)
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        return "".join([out.text async for out in engine.generate(ids, params)])

    try:
        return [asyncio.run(one(m)) for m in conversations]
    finally:
        engine.shutdown()


def test_floor_streams_tandems_greedy_tokens(floor, embedded_model_path):
    client = openai.OpenAI(base_url=f"{floor}/v1", api_key="none", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    texts, usages = [], []
    for messages in (FIRST, SECOND, FIRST):  # cold, prefix reused, prefix reused again
        text, usage = "", None
        for chunk in client.chat.completions.create(
                model=model, messages=messages, max_tokens=24, stream=True,
                stream_options={"include_usage": True}):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            usage = chunk.usage or usage
        texts.append(text)
        usages.append(usage.completion_tokens)
    assert usages == [24, 24, 24]
    assert texts == tandem_greedy(embedded_model_path, [FIRST, SECOND, FIRST], 24)


def test_floor_refuses_what_it_cannot_serve(floor):
    r = httpx.post(f"{floor}/v1/chat/completions", json={"messages": FIRST})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "ValueError: only streamed requests are served"
    assert httpx.get(f"{floor}/v1/nothing").status_code == 404
    assert httpx.get(f"{floor}/health").json() == {"status": "ok"}
