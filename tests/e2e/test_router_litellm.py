"""Several tandem boxes behind one router: two `tandem serve` processes (the embedded model,
different ports) as two deployments of one model group in LiteLLM's Python `Router` (PyPI
`litellm`, what the LiteLLM proxy runs), with its load-aware strategies:
- `least-busy` (fewest requests in flight; a pick is reserved as it is made), four requests
  at once: two go to each box;
- `usage-based-routing-v2` (lowest tokens this minute), four requests one after the other:
  each box gets some (after a reply, the next goes to the box that has served fewer tokens).
Every reply is the embedded model's exact greedy text; each box's `/metrics` counts the
requests LiteLLM says it sent there, and its router gauges (`vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`) read 0 once the replies are in,
and 1 running request with its KV fraction on the box serving a stream.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import API_KEY, Server, _start_subprocess

# litellm's own pydantic models warn at import (ReadOnly TypedDict items)
pytestmark = [pytest.mark.model, pytest.mark.filterwarnings("ignore::UserWarning")]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
litellm = pytest.importorskip("litellm")

MSGS = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "max_tokens": 8, "extra_body": {"repetition_penalty": 1}}
REPLY = "L'Étoile, la Mar"  # SmolLM2-135M-Instruct Q4_1, greedy, 8 tokens
CHAT_OK = 'tandem_http_requests_total{path="/v1/chat/completions",status="200"}'


@pytest.fixture(scope="module")
def boxes(engine_kind: str, server: Server) -> Iterator[list[Server]]:
    """The session's real server and a second one started like it (the routing needs two
    processes, so the fake engine's in-process server is left out)."""
    if engine_kind != "real":
        pytest.skip("two `tandem serve` processes: the real engine only")
    with contextlib.contextmanager(_start_subprocess)(API_KEY) as second:
        yield [server, second]


def _router(boxes: list[Server], strategy: str) -> object:
    return litellm.Router(model_list=[
        {"model_name": "tandem",
         "litellm_params": {"model": f"openai/{box.model}", "api_base": f"{box.url}/v1",
                            "api_key": API_KEY}}
        for box in boxes], routing_strategy=strategy, num_retries=0)


def _served(boxes: list[Server]) -> list[float]:
    return [box.metric(CHAT_OK, default=0.0) for box in boxes]


def _scrape(box: Server) -> dict[tuple[str, str | None], float]:
    """One `/metrics` scrape: {(sample name, its model_name label or None): value}."""
    text = httpx.get(f"{box.url}/metrics", timeout=10).text
    return {(s.name, s.labels.get("model_name")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _check(boxes: list[Server], replies: list[object], before: list[float]) -> list[int]:
    """Requests per box: from LiteLLM's record of where each reply came from, equal to what
    each box's /metrics counted; every reply the exact greedy text."""
    assert [r.choices[0].message.content for r in replies] == [REPLY] * len(replies)
    where = collections.Counter(r._hidden_params["api_base"] for r in replies)
    counts = [where[f"{box.url}/v1"] for box in boxes]
    assert [a - b for a, b in zip(_served(boxes), before, strict=True)] == counts
    for box in boxes:
        for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                      "vllm:kv_cache_usage_perc"):
            assert box.metric(f'{gauge}{{model_name="{box.model}"}}') == 0.0
    return counts


async def test_least_busy_spreads_concurrent_requests(boxes: list[Server]) -> None:
    router = _router(boxes, "least-busy")
    before = _served(boxes)
    replies = await asyncio.gather(*[
        router.acompletion(model="tandem", messages=MSGS, **GREEDY) for _ in range(4)])
    assert _check(boxes, replies, before) == [2, 2]


async def test_usage_based_routing_reaches_both_boxes(boxes: list[Server]) -> None:
    from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER

    router = _router(boxes, "usage-based-routing-v2")
    before = _served(boxes)
    replies = []
    for _ in range(4):
        replies.append(await router.acompletion(model="tandem", messages=MSGS, **GREEDY))
        # the tokens a reply used are counted by a logging callback that runs in the
        # background; wait for it, so the next pick sees them
        await GLOBAL_LOGGING_WORKER.flush()
    assert min(_check(boxes, replies, before)) >= 1


async def test_gauges_show_the_busy_box(boxes: list[Server]) -> None:
    """While a reply streams through the router, the box serving it reports one running
    request and its KV usage as the fraction of its KV blocks in use; the other box, none."""
    await _idle(boxes)  # nothing left running from an earlier test on the session server
    router = _router(boxes, "least-busy")
    stream = await router.acompletion(model="tandem", messages=MSGS, stream=True,
                                      **{**GREEDY, "max_tokens": 400,
                                         "extra_body": {"repetition_penalty": 1,
                                                        "ignore_eos": True}})
    try:
        async for _ in stream:
            break  # the first token is out: the sequence holds its KV
        running = [box.metric(f'vllm:num_requests_running{{model_name="{box.model}"}}')
                   for box in boxes]
        assert sorted(running) == [0.0, 1.0]
        busy = boxes[running.index(1.0)]
        samples = _scrape(busy)  # one scrape: the sequence keeps growing
        usage = samples[("vllm:kv_cache_usage_perc", busy.model)]
        used, total = samples[("tandem_kv_blocks_used", None)], samples[
            ("tandem_kv_blocks_total", None)]
        assert 0 < usage == used / total <= 1
    finally:
        await stream.aclose()
        # the session server is shared: the 400-token reply must not run on under the
        # next tests' metric deltas
        await _idle(boxes)


async def _idle(boxes: list[Server], timeout_s: float = 120.0) -> None:
    """Wait until no box reports a running or waiting request. Raises TimeoutError."""
    async with asyncio.timeout(timeout_s):
        while any(box.metric(f'vllm:num_requests_{kind}{{model_name="{box.model}"}}')
                  for box in boxes for kind in ("running", "waiting")):
            await asyncio.sleep(0.2)
