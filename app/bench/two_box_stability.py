"""Decode stability under long prompts: inter-token latency of running streams while
2K-token prompts keep arriving, one box using both cores against two boxes on one machine
(the prefill worker pinned to core 0, the decode box to core 1, one thread each).

On one box every long prompt's prefill chunks share steps with the running streams, so each
chunk stalls them; with a prefill worker the decode box only pauses to import each chunk.
Reports ITL p50/p99 (ms) of the running streams over the window in which the long prompts
arrive, their decode tok/s, and the long prompts' TTFT, for both; ratios two-box / one-box.

usage: python -m app.bench.two_box_stability [--model NAME] [--streams 4]
                                             [--long-prompts 3] [--prompt-tokens 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

from app.bench.stats import median, percentiles, ratio
from app.bench.two_box import fresh_prompt, time_to_first_token
from app.bench.worker_process import WorkerProcess
from models.registry import DEFAULT_MODEL


async def _scenario(engine, args) -> dict:
    from app.engine.types import SamplingParams

    tok = engine.tokenizer
    stamps: list[list[float]] = [[] for _ in range(args.streams)]
    window: list[float] = []
    decode = SamplingParams(max_tokens=100000, temperature=0.0, ignore_eos=True)

    async def stream(i: int, started: asyncio.Event, stop: asyncio.Event) -> None:
        ids = tok.encode(f"Story {i}: once upon a time", add_special=True)
        gen = engine.generate(ids, decode)
        async for out in gen:
            if out.token_ids:
                stamps[i].append(time.perf_counter())
                started.set()
            if stop.is_set():
                break
        await gen.aclose()

    stop = asyncio.Event()
    starts = [asyncio.Event() for _ in range(args.streams)]
    tasks = [asyncio.create_task(stream(i, starts[i], stop)) for i in range(args.streams)]
    for e in starts:
        await e.wait()
    await asyncio.sleep(1.0)  # steady decoding first
    ttfts = []
    window.append(time.perf_counter())
    for k in range(args.long_prompts):
        ttft, _ = await time_to_first_token(engine, fresh_prompt(tok, args.prompt_tokens, k))
        ttfts.append(ttft)
    window.append(time.perf_counter())
    stop.set()
    await asyncio.gather(*tasks)
    lo, hi = window
    gaps, tokens = [], 0
    for s in stamps:
        inside = [t for t in s if lo <= t <= hi]
        tokens += len(inside)
        gaps += [b - a for a, b in zip(inside, inside[1:], strict=False)]
    return {"itl_ms": percentiles(gaps), "decode_tok_s": round(tokens / (hi - lo), 2),
            "long_prompt_ttft_s": median(ttfts, 3), "window_s": round(hi - lo, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--long-prompts", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=2048)
    args = p.parse_args(argv)

    from app.config import EngineArgs
    from app.disagg.peer import PeerConfig
    from app.disagg.policy import PolicyConfig
    from app.loader import load_engine
    from backends.base import RunnerConfig

    ctx = args.prompt_tokens + 256
    one = load_engine(EngineArgs(model=args.model, runner=RunnerConfig(
        max_seqs=args.streams + 1, seq_tokens=ctx, n_threads=2)))
    try:
        one_box = asyncio.run(_scenario(one, args))
    finally:
        one.shutdown()

    worker = WorkerProcess(tempfile.mkdtemp(prefix="tandem-two-box-"), "--model", args.model,
                           "--threads", "1", "--ctx-size", str(ctx),
                           prefix=("taskset", "-c", "0"))
    os.sched_setaffinity(0, {1})
    try:
        peer = PeerConfig("127.0.0.1", worker.port, policy=PolicyConfig(mode="always"))
        split = load_engine(EngineArgs(model=args.model, prefill_peer=peer, runner=RunnerConfig(
            max_seqs=args.streams + 1, seq_tokens=ctx, n_threads=1)))
        try:
            two_box = asyncio.run(_scenario(split, args))
        finally:
            split.shutdown()
    finally:
        worker.stop()
    print(json.dumps({
        "model": args.model, "streams": args.streams, "long_prompts": args.long_prompts,
        "prompt_tokens": args.prompt_tokens,
        "one_box_2_cores": one_box, "two_box_1_core_each": two_box,
        "itl_p99_ratio": ratio(two_box["itl_ms"]["p99"], one_box["itl_ms"]["p99"]),
        "itl_p50_ratio": ratio(two_box["itl_ms"]["p50"], one_box["itl_ms"]["p50"]),
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
