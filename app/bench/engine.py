"""In-process benchmark of the engine at several concurrency levels.

Each level runs `requests` requests through `AsyncEngine`, at most `concurrency` at a time;
every request has a distinct random prompt of `prompt_tokens` tokens (after an optional
shared prefix of `shared_prefix_tokens`) and generates exactly `max_tokens` tokens (EOS
ignored). One warm-up request per level is excluded. Throughput is output tokens divided by
the level's wall time; TTFT and TPOT percentiles are over requests.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from app.bench.charts import ChartContext, bar_panel, figure, save, suptitle
from app.bench.load import run_request, run_requests
from app.bench.stats import median, percentiles, steady_decode_rate
from app.engine import AsyncEngine


def random_tokens(rng: random.Random, n: int, n_vocab: int, banned: set[int]) -> list[int]:
    # ids from the upper vocabulary: ordinary text pieces, never control tokens
    out = []
    while len(out) < n:
        t = rng.randrange(1000, n_vocab)
        if t not in banned:
            out.append(t)
    return out


async def run_level(engine: AsyncEngine, concurrency: int, requests: int, prompt_tokens: int,
                    max_tokens: int, shared_prefix: list[int], seed: int) -> dict:
    rng = random.Random(seed)
    banned = set(engine.tokenizer.eos_ids)
    n_vocab = engine.info.n_vocab

    # warm-up: excluded from the figures (its TTFT is reported: with a shared prefix at the
    # first level it is the cold-cache TTFT the cached ones compare against)
    warm_prompt = shared_prefix + random_tokens(rng, prompt_tokens, n_vocab, banned)
    warmup = (await run_request(engine, warm_prompt, max_tokens)).metrics
    prompts = [shared_prefix + random_tokens(rng, prompt_tokens, n_vocab, banned)
               for _ in range(requests)]
    start = time.perf_counter()
    traces = await run_requests(engine, prompts, max_tokens, concurrency)
    wall = time.perf_counter() - start
    metrics = [t.metrics for t in traces]
    out_tokens = sum(m.completion_tokens for m in metrics)
    tpots = [m.tpot for m in metrics if m.tpot]
    return {
        "concurrency": concurrency,
        "requests": requests,
        "prompt_tokens": len(prompts[0]),
        "max_tokens": max_tokens,
        "throughput_tok_s": round(out_tokens / wall, 2),
        "per_user_tok_s": round(1.0 / median(tpots, None), 2) if tpots else None,
        "decode_tok_s_aggregate": steady_decode_rate([t.token_times
                                                      for t in traces[:concurrency]]),
        "ttft_ms": percentiles([m.ttft for m in metrics if m.ttft is not None]),
        "tpot_ms": percentiles(tpots),
        "prefix_cached_tokens": sum(m.cached_tokens for m in metrics),
        "warmup_ttft_ms": round(warmup.ttft * 1000, 2),
        "wall_s": round(wall, 3),
    }


async def run_bench(engine: AsyncEngine, levels: list[int], requests: int, prompt_tokens: int,
                    max_tokens: int, shared_prefix_tokens: int = 0, seed: int = 0):
    """Yields one result dict per concurrency level."""
    rng = random.Random(seed + 10_000)
    shared = random_tokens(rng, shared_prefix_tokens, engine.info.n_vocab,
                           set(engine.tokenizer.eos_ids))
    for i, c in enumerate(levels):
        yield await run_level(engine, c, max(requests, 1), prompt_tokens, max_tokens,
                              shared, seed + i)


def plot(results: list[dict], path: str | Path, context: ChartContext, what: str):
    """Three panels over the concurrency levels (categories, in the order run): throughput
    (output tokens / wall time, prefill included), decode speed per user (1 / median TPOT)
    and TTFT p50 and p99; written to `path` as PNG. Works for in-process and HTTP results
    (the latter have no `per_user_tok_s`: it comes from `tpot_ms`). Returns the Figure."""
    levels = [str(r["concurrency"]) for r in results]
    per_user = [r.get("per_user_tok_s") or _from_tpot(r.get("tpot_ms")) for r in results]
    fig, axes = figure(3)
    suptitle(fig, context, what)
    bar_panel(axes[0], levels, {"throughput": [r["throughput_tok_s"] for r in results]},
              title="Throughput, all users\n(output tokens / wall time, prefill included)",
              ylabel="output tok/s", better="higher")
    bar_panel(axes[1], levels, {"per user": per_user},
              title="Decode speed per user\n(1 / median time per output token)",
              ylabel="tok/s per user", better="higher")
    bar_panel(axes[2], levels, {p: [(r.get("ttft_ms") or {}).get(p) for r in results]
                                for p in ("p50", "p99")},
              title="Time to first token\n(median and 99th percentile)",
              ylabel="TTFT, ms", better="lower")
    save(fig, path)
    return fig


def _from_tpot(tpot_ms: dict | None) -> float | None:
    p50 = (tpot_ms or {}).get("p50")
    return round(1000.0 / p50, 2) if p50 else None
