"""Two-box bench on loopback: a `tandem prefill-worker` process prefills, this process decodes.

Per round, with a fresh prompt of `--prompt-tokens` (so neither box has it cached) and in
alternating order: TTFT on this box alone, and TTFT through the split. Reports the medians,
the split's overhead as a fraction of the single box's prefill (TTFT of a cold prompt is its
prefill plus one step), when the first KV frame arrived as a fraction of the worker's prefill,
the overlap fraction (`app.disagg.client._derive`), and the bytes on the wire against the KV
size the model's shape implies. `--fallback` adds one round in which the worker is stopped
(SIGSTOP) after its first chunk: that TTFT against local TTFT plus the deadline it waited.

On one machine both processes share the cores: the worker computes while this process reads
and imports, which a real second box would not make it do. `--pin` emulates two boxes:
the worker on core 0, this process (its single box included) on core 1, one thread each.

usage: python -m app.bench.two_box [--model NAME] [--prompt-tokens 2048] [--rounds 3]
                                   [--threads 2] [--pin] [--fallback]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time

from app.bench.stats import median
from app.bench.worker_process import WorkerProcess
from models.registry import DEFAULT_MODEL


def fresh_prompt(tokenizer, n: int, tag: int) -> list[int]:
    """`n` token ids no other `tag` shares (so no cache holds them)."""
    words = " ".join(f"w{tag}x{i}" for i in range(n))
    return tokenizer.encode(words, add_special=True)[:n]


async def time_to_first_token(engine, ids) -> tuple[float, object]:
    """(TTFT seconds, the request's metrics) of one greedy token."""
    from app.engine.types import SamplingParams

    t0 = time.perf_counter()
    ttft, metrics = None, None
    async for out in engine.generate(ids, SamplingParams(max_tokens=1, temperature=0.0)):
        if ttft is None and out.token_ids:
            ttft = time.perf_counter() - t0
        metrics = out.metrics
    return ttft, metrics


def _fallback_round(split, local, tokenizer, worker, n, tag) -> dict:
    ids = fresh_prompt(tokenizer, n, tag)
    local_ttft, _ = asyncio.run(time_to_first_token(local, fresh_prompt(tokenizer, n, tag + 1)))

    async def run():
        task = asyncio.create_task(time_to_first_token(split, ids))
        while True:
            reqs = list(split.engine.requests.values())
            if reqs and reqs[0].num_computed_tokens > 0:
                break
            await asyncio.sleep(0.005)
        worker.proc.send_signal(signal.SIGSTOP)
        return await task

    try:
        ttft, m = asyncio.run(run())
    finally:
        worker.proc.send_signal(signal.SIGCONT)
    info = m.remote_prefill
    return {"local_ttft_s": round(local_ttft, 3), "fallback_ttft_s": round(ttft, 3),
            "failure": info.get("failure"), "imported_tokens": info.get("imported_tokens"),
            "deadline_s": info.get("deadline_s"),
            "within_local_plus_deadline": ttft <= local_ttft + (info.get("deadline_s") or 0)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pin", action="store_true")
    p.add_argument("--fallback", action="store_true")
    args = p.parse_args(argv)
    prefix: tuple[str, ...] = ()
    if args.pin:
        args.threads = 1
        prefix = ("taskset", "-c", "0")
        os.sched_setaffinity(0, {1})

    from app.config import EngineArgs
    from app.disagg.peer import PeerConfig
    from app.disagg.policy import PolicyConfig
    from app.loader import load_engine
    from backends.base import RunnerConfig

    ctx = args.prompt_tokens + 256
    runner = RunnerConfig(max_seqs=2, seq_tokens=ctx, n_threads=args.threads)
    log_dir = tempfile.mkdtemp(prefix="tandem-two-box-")
    worker = WorkerProcess(log_dir, "--model", args.model, "--threads", str(args.threads),
                           "--ctx-size", str(ctx), prefix=prefix)
    try:
        peer = PeerConfig("127.0.0.1", worker.port, policy=PolicyConfig(mode="always"))
        local = load_engine(EngineArgs(model=args.model, runner=runner))
        split = load_engine(EngineArgs(model=args.model, runner=runner, prefill_peer=peer))
        info = local.info
        per_token = 2 * info.n_layers * info.n_kv_heads * info.head_dim * 2
        rounds = []
        for r in range(args.rounds):
            order = [("local", local), ("split", split)]
            if r % 2:
                order.reverse()
            row = {}
            for k, (name, engine) in enumerate(order):
                ids = fresh_prompt(local.tokenizer, args.prompt_tokens, 10 * r + k)
                ttft, m = asyncio.run(time_to_first_token(engine, ids))
                row[f"{name}_ttft_s"] = round(ttft, 3)
                if name == "split":
                    s = m.remote_prefill
                    if not s.get("ok"):
                        raise RuntimeError(f"remote prefill failed: {s}")
                    row.update({k2: round(v, 4) if isinstance(v, float) else v
                                for k2, v in s.items() if k2 not in ("remote", "reason")})
                    row["bytes_expected"] = (len(ids) - 1) * per_token
            row["overhead_fraction"] = round(
                (row["split_ttft_s"] - row["local_ttft_s"]) / row["local_ttft_s"], 3)
            rounds.append(row)
        summary = {
            "model": args.model, "prompt_tokens": args.prompt_tokens, "threads": args.threads,
            "pinned": args.pin,
            "kv_bytes_per_token": per_token,
            "local_ttft_s": median([r["local_ttft_s"] for r in rounds], 3),
            "split_ttft_s": median([r["split_ttft_s"] for r in rounds], 3),
            "overhead_fraction_of_prefill": median([r["overhead_fraction"] for r in rounds], 3),
            "first_frame_fraction": median([r["first_frame_fraction"] for r in rounds], 3),
            "overlap": median([r["overlap"] for r in rounds], 3),
            # what the split adds to the worker's own prefill: handshake, the last chunk's
            # transfer and import, the last prompt token
            "tail_s": median([r["split_ttft_s"] - r["worker_prefill_s"] for r in rounds], 3),
            "link_gbps": median([r["link_gbps"] for r in rounds], 3),
            "bytes": rounds[-1]["bytes"], "bytes_expected": rounds[-1]["bytes_expected"],
            "rounds": rounds,
        }
        if args.fallback:
            summary["fallback"] = _fallback_round(split, local, local.tokenizer, worker,
                                                  args.prompt_tokens, 1000)
        print(json.dumps(summary, indent=1))
        split.shutdown()
        local.shutdown()
    finally:
        worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
