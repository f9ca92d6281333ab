"""Peer benchmark: drive any OpenAI-compatible server with concurrent streaming clients.

The same load runs against tandem and llama-server (or vLLM, Ollama, ...): `requests`
chat requests, `concurrency` in flight at a time, each with a unique user prompt of about
`prompt_tokens` tokens after an optional shared system prompt of about
`system_prompt_tokens` tokens, and exactly `max_tokens` output tokens (`ignore_eos: true`,
which llama-server, vLLM and tandem honour). Every server gets the same sampling: greedy, no
repetition penalty, sent explicitly (`SAMPLING`), since tandem's default for a registry
model may add one (SmolLM2: 1.05) and llama-server's is none. Clients stream with raw httpx
(little client CPU next to the server on a small machine).

Measured per request, from the client's clock: TTFT (send -> first content delta) and TPOT
((last delta - first delta) / (output tokens - 1)); per run: throughput (output tokens / wall
time) and the prompt tokens the server reports it served from its cache
(`usage.prompt_tokens_details.cached_tokens`, or llama-server's `timings.cache_n`).
Prompt sizes are approximate (one common English word ~ one token); the reported
`prompt_tokens_mean` is what the server counted.

    python -m app.bench.http --url http://127.0.0.1:8000 --concurrency 1,16 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from app.bench.load import run_request
from app.bench.stats import percentiles
from app.sse_client import json_events

WORDS = (
    "the of and to in is was that for it with as his on be at by had are but from or have an "
    "they which one you were all we her she there would their will when who him been has more "
    "if no out so said what up its about than into them can only other new some could time "
    "these two may first then do any like my now over such our man me even most made after "
    "also did many before must through back years where much your way well down should because "
    "each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might "
    "us great old year off come since against go came right used take three"
).split()


# Greedy without a repetition penalty, under both names: `repetition_penalty` (tandem, vLLM)
# and `repeat_penalty` (llama-server, Ollama); each server ignores the name it does not know.
SAMPLING = {"temperature": 0, "repetition_penalty": 1.0, "repeat_penalty": 1.0}


class ServerHTTPError(RuntimeError):
    """The server answered a request with an error status; the message is one line:
    `HTTP 401: <the error body's message>`."""

    def __init__(self, status: int, body: str):
        try:
            detail = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = body
        self.status = status
        super().__init__(f"HTTP {status}: {' '.join(str(detail).split())[:300]}")


@dataclass
class ChatResult:
    ttft: float  # seconds
    tpot: float | None  # seconds per token after the first
    completion_tokens: int
    prompt_tokens: int | None
    cached_tokens: int | None


def base_url(url: str) -> str:
    """`http://host:port` from a URL that may end in `/` or `/v1`."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def make_text(n_words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(n_words, 0)))


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def stream_chat(
    http: httpx.AsyncClient, model: str, messages: list[dict[str, str]], max_tokens: int
) -> ChatResult:
    """One streamed, greedy chat request of `max_tokens` (`ignore_eos`) with usage: its TTFT
    and TPOT (seconds), completion, prompt and cached token counts. Raises ServerHTTPError
    for a non-200 answer, RuntimeError for an error event or a stream without content."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        **SAMPLING,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    start = time.perf_counter()
    first: float | None = None
    last = start
    deltas = 0
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise ServerHTTPError(r.status_code, (await r.aread()).decode(errors="replace"))
        async for event in json_events(r):
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = now if first is None else first
                    last = now
                    deltas += 1
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
    if first is None:
        raise RuntimeError("the server streamed no content")
    n = int(usage["completion_tokens"]) if usage else deltas
    cached = None
    if usage and isinstance(usage.get("prompt_tokens_details"), dict):
        cached = usage["prompt_tokens_details"].get("cached_tokens")
    if cached is None and timings and "cache_n" in timings:
        cached = int(timings["cache_n"])
    return ChatResult(
        ttft=first - start,
        tpot=(last - first) / (n - 1) if n > 1 else None,
        completion_tokens=n,
        prompt_tokens=int(usage["prompt_tokens"]) if usage else None,
        cached_tokens=cached,
    )


def make_conversations(requests: int, prompt_tokens: int, system_prompt_tokens: int,
                       seed: int) -> list[list[dict[str, str]]]:
    """The benchmark's chat requests: deterministic for a `seed`, each user prompt unique."""
    rng = random.Random(seed)
    system = (
        make_text(system_prompt_tokens, random.Random(seed + 1)) if system_prompt_tokens else ""
    )
    conversations = []
    for i in range(requests):
        user = f"Request {i} ({rng.randrange(10**9)}): " + make_text(max(prompt_tokens - 6, 1), rng)
        msgs = [{"role": "system", "content": system}] if system else []
        conversations.append([*msgs, {"role": "user", "content": user}])
    return conversations


async def drive(one: Callable[[list[dict[str, str]]], Awaitable[ChatResult]],
                conversations: list[list[dict[str, str]]], concurrency: int,
                inputs: dict[str, Any]) -> dict[str, Any]:
    """Run `one(messages)` over the conversations, `concurrency` at a time, and summarize:
    `inputs` plus throughput, TTFT/TPOT percentiles, cached and prompt token counts."""
    pending = list(reversed(conversations))
    results: list[ChatResult] = []

    async def worker() -> None:
        while pending:
            msgs = pending.pop()
            results.append(await one(msgs))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(conversations)))))
    wall = time.perf_counter() - t0
    total = sum(r.completion_tokens for r in results)
    prompts = [r.prompt_tokens for r in results if r.prompt_tokens is not None]
    cached = [r.cached_tokens for r in results if r.cached_tokens is not None]
    return {
        **inputs,
        "concurrency": concurrency,
        "requests": len(conversations),
        "throughput_tok_s": round(total / wall, 2) if wall > 0 else None,
        "ttft_ms": percentiles([r.ttft for r in results]),
        "tpot_ms": percentiles([r.tpot for r in results if r.tpot is not None]),
        "prefix_cached_tokens": sum(cached) if cached else None,
        "prompt_tokens_mean": round(sum(prompts) / len(prompts), 1) if prompts else None,
        "completion_tokens": total,
        "wall_s": round(wall, 3),
    }


async def _one_in_process(engine, messages: list[dict[str, str]], max_tokens: int) -> ChatResult:
    from app.prompts import chat_prompt_ids

    ids = chat_prompt_ids(engine.tokenizer, messages)
    trace = await run_request(engine, ids, max_tokens)
    if not trace.token_times:
        raise RuntimeError("the engine generated no tokens")
    return ChatResult(ttft=trace.ttft, tpot=trace.tpot, completion_tokens=len(trace.token_times),
                   prompt_tokens=len(ids), cached_tokens=trace.metrics.cached_tokens)


def run_in_process_bench(engine, concurrency: int, requests: int, prompt_tokens: int,
                         max_tokens: int, system_prompt_tokens: int = 0, *,
                         seed: int = 0) -> dict[str, Any]:
    """The same load as `run_http_bench`, on an `AsyncEngine` in this process (chat template
    applied, greedy, `max_tokens` each): what HTTP and SSE cost is the difference."""
    async def run() -> dict[str, Any]:
        await _one_in_process(engine, [{"role": "user", "content": "Hello"}], 4)  # warm-up
        conversations = make_conversations(requests, prompt_tokens, system_prompt_tokens, seed)
        inputs = {"url": "in-process", "model": engine.model_name,
                  "prompt_tokens": prompt_tokens,
                  "system_prompt_tokens": system_prompt_tokens, "max_tokens": max_tokens}
        return await drive(lambda msgs: _one_in_process(engine, msgs, max_tokens),
                           conversations, concurrency, inputs)

    return asyncio.run(run())


def run_http_bench(
    url: str,
    model: str,
    concurrency: int,
    requests: int,
    prompt_tokens: int,
    max_tokens: int,
    system_prompt_tokens: int = 0,
    api_key: str | None = None,
    *,
    seed: int = 0,
    warmup: bool = True,
) -> dict[str, Any]:
    """Run one load level against `url` (base URL, with or without `/v1`) and return
    `{"concurrency", "throughput_tok_s" (output tokens/s), "ttft_ms": {"p50", "p99"},
    "tpot_ms": {"p50", "p99"}, "prefix_cached_tokens", ...}` (plus the inputs,
    `prompt_tokens_mean`, `completion_tokens`, `wall_s`).

    A warm-up request (4 tokens, not measured) goes first unless `warmup=False`. Prompts are
    deterministic for a `seed`. Raises RuntimeError if any request fails (non-200 status or
    an error event) and httpx errors on connection failure. Blocking; do not call from a
    running event loop.
    """
    if concurrency < 1 or requests < 1 or max_tokens < 1:
        raise ValueError("concurrency, requests and max_tokens must be at least 1")

    async def run() -> dict[str, Any]:
        conversations = make_conversations(requests, prompt_tokens, system_prompt_tokens, seed)
        limits = httpx.Limits(
            max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1
        )
        timeout = httpx.Timeout(3600.0, connect=30.0)
        async with httpx.AsyncClient(
            base_url=base_url(url), headers=_headers(api_key), limits=limits, timeout=timeout
        ) as http:
            if warmup:
                await stream_chat(http, model, [{"role": "user", "content": "Hello"}], 4)
            inputs = {"url": base_url(url), "model": model, "prompt_tokens": prompt_tokens,
                      "system_prompt_tokens": system_prompt_tokens, "max_tokens": max_tokens}
            return await drive(lambda msgs: stream_chat(http, model, msgs, max_tokens),
                               conversations, concurrency, inputs)

    return asyncio.run(run())


def served_model(url: str, api_key: str | None = None) -> str:
    """The first model id `GET /v1/models` lists."""
    r = httpx.get(f"{base_url(url)}/v1/models", headers=_headers(api_key), timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m app.bench.http",
        description="Benchmark an OpenAI-compatible server with streaming clients; "
        "prints one JSON object per concurrency level.",
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model id (default: the first /v1/models lists)")
    p.add_argument("--concurrency", default="1,16", help="comma-separated levels (default 1,16)")
    p.add_argument("--requests", type=int, default=16, help="requests per level (default 16)")
    p.add_argument("--prompt-tokens", type=int, default=32, help="user prompt size (default 32)")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens (default 128)")
    p.add_argument("--system-prompt-tokens", type=int, default=0, help="shared system prompt size")
    p.add_argument("--api-key", default=None, help="default: $TANDEM_API_KEY or $OPENAI_API_KEY")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    api_key = args.api_key or os.environ.get("TANDEM_API_KEY") or os.environ.get("OPENAI_API_KEY")
    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
        model = args.model or served_model(args.url, api_key)
        for c in levels:
            result = run_http_bench(
                args.url,
                model,
                c,
                args.requests,
                args.prompt_tokens,
                args.max_tokens,
                args.system_prompt_tokens,
                api_key,
                seed=args.seed,
            )
            print(json.dumps(result), flush=True)
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        print(f"bench_http: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
