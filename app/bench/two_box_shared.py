"""Several decode boxes sharing one prefill worker, on loopback: TTFT and fairness.

One `tandem prefill-worker` process; `max(--peers)` decode boxes in this process, each its
own engine with the worker as its prefill peer (`--prefill-policy always`, so every prompt
asks the worker). For each number of peers P in `--peers`, `--rounds` rounds: the first P
boxes each submit one fresh prompt of `--prompt-tokens` at the same moment (no cache holds
it). Per P it reports TTFT per request (median, max), each box's median TTFT, how many
prompts went remote and how many fell back (and why), and fairness:

    share_i   = prompt tokens box i got prefilled remotely / all prefilled remotely
    jain      = (sum x_i)^2 / (P * sum x_i^2), x_i = box i's prompt tokens / its total TTFT

(Jain's fairness index, R. Jain, D. Chiu, W. Hawe, DEC-TR-301, 1984: 1.0 when every box
gets the same throughput, 1/P when one gets all of it.) The worker serves prompts in arrival
order, so in one round the boxes' TTFTs differ by design; each round rotates which box
submits first, so over P rounds (or a multiple) the index measures whether any box is kept
waiting beyond its turn.

On one machine all of them share the cores, so the numbers are no measure of two real boxes;
on a loaded machine they are noise.

usage: python -m app.bench.two_box_shared [--model NAME] [--prompt-tokens 512]
                                          [--peers 1 2 4] [--rounds 3] [--threads 1]
                                          [--max-prompts 2] [--max-queue 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter

from app.bench.stats import median
from app.bench.two_box import fresh_prompt, time_to_first_token
from app.bench.worker_process import WorkerProcess
from models.registry import DEFAULT_MODEL


def jain(xs: list[float]) -> float:
    """Jain's fairness index of `xs` (1.0: all equal)."""
    total = sum(xs)
    squares = sum(x * x for x in xs)
    return total * total / (len(xs) * squares) if squares else 1.0


async def _round(boxes, prompts) -> list[tuple[float, object]]:
    return await asyncio.gather(*(time_to_first_token(b, ids)
                                  for b, ids in zip(boxes, prompts, strict=True)))


def measure(boxes, tokenizer, n_tokens: int, rounds: int, tag: int) -> dict:
    """One level: len(boxes) boxes, `rounds` concurrent rounds."""
    peers = len(boxes)
    ttfts: list[list[float]] = [[] for _ in boxes]
    remote_tokens = [0] * peers
    outcomes: Counter = Counter()
    for r in range(rounds):
        prompts = [fresh_prompt(tokenizer, n_tokens, tag + 100 * r + i) for i in range(peers)]
        # the box submitted first tends to reach the worker first: rotate who starts
        order = [(r + k) % peers for k in range(peers)]
        results = asyncio.run(_round([boxes[i] for i in order], [prompts[i] for i in order]))
        for i, (ttft, m) in sorted(zip(order, results, strict=True), key=lambda x: x[0]):
            ttfts[i].append(ttft)
            info = m.remote_prefill or {}
            if info.get("ok"):
                outcomes["remote"] += 1
                remote_tokens[i] += info.get("imported_tokens", 0)
            else:
                outcomes[info.get("failure", "local")] += 1
    flat = [t for box in ttfts for t in box]
    total_remote = sum(remote_tokens)
    return {
        "peers": peers,
        "requests": len(flat),
        "ttft_median_s": median(flat, 3),
        "ttft_max_s": round(max(flat), 3),
        "ttft_median_s_per_box": [median(box, 3) for box in ttfts],
        "outcomes": dict(outcomes),
        "share_per_box": [round(t / total_remote, 3) if total_remote else 0.0
                          for t in remote_tokens],
        "jain_fairness": round(jain([n_tokens * rounds / sum(box) for box in ttfts]), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--peers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-prompts", type=int, default=2)
    p.add_argument("--max-queue", type=int, default=4)
    args = p.parse_args(argv)

    from app.config import EngineArgs
    from app.disagg.peer import PeerConfig
    from app.disagg.policy import PolicyConfig
    from app.loader import load_engine
    from backends.base import RunnerConfig

    ctx = args.prompt_tokens + 256
    worker = WorkerProcess(tempfile.mkdtemp(prefix="tandem-two-box-shared-"), "--model",
                           args.model, "--threads", str(args.threads), "--ctx-size", str(ctx),
                           "--max-prompts", str(args.max_prompts), "--max-queue",
                           str(args.max_queue))
    boxes = []
    try:
        # generous deadlines: with P boxes a prompt may wait for P - 1 others
        peer = dict(connect_timeout_s=10.0, first_frame_timeout_s=60.0, frame_timeout_s=30.0,
                    policy=PolicyConfig(mode="always"))
        runner = RunnerConfig(max_seqs=1, seq_tokens=ctx, n_threads=args.threads)
        for _ in range(max(args.peers)):
            boxes.append(load_engine(EngineArgs(
                model=args.model, runner=runner,
                prefill_peer=PeerConfig("127.0.0.1", worker.port, **peer))))
        tokenizer = boxes[0].tokenizer
        t0 = time.perf_counter()
        levels = [measure(boxes[:n], tokenizer, args.prompt_tokens, args.rounds, 10_000 * n)
                  for n in args.peers]
        print(json.dumps({
            "model": args.model, "prompt_tokens": args.prompt_tokens,
            "threads": args.threads, "max_prompts": args.max_prompts,
            "max_queue": args.max_queue, "rounds": args.rounds,
            "seconds": round(time.perf_counter() - t0, 1), "levels": levels,
            "note": "one machine: worker and boxes share its cores; numbers on a loaded "
                    "machine are noise",
        }, indent=1))
    finally:
        for box in boxes:
            box.shutdown()
        worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
