"""Step time by tokens in the step and context length, flash attention on and off.

`python -m app.bench.step_context --model PATH [--flash-attn on,off] [--contexts 256,1024,2200]`
prints one JSON line per (flash attention, context): t(n) in ms for n = 1, 2, 4, 8, 16 tokens
(one sequence, logits at every token, as a verify step), the fastest of `--repeats`, and
t(n)/t(1). Why: the start-up profile measures t(n) at a 128-token context, and on a CPU
llama.cpp's flash-attention kernel handles each query row of a step on its own, reading the
sequence's whole KV cache per row; at a long context a verify step of n tokens costs more
than the profile says with it on, less with it off (README, "Predicted Outputs on a whole
file"). Raises what the runner raises (a file llama.cpp cannot load).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from backends.base import BatchItem, RunnerConfig
from backends.loader import load_runner

POINTS = (1, 2, 4, 8, 16)
CHUNK = 256  # prefill chunk, within the runner's batch


def step_times(runner, contexts: list[int], repeats: int) -> list[dict]:
    """[{context, t_ms: {n: ms}, ratio: {n: t(n)/t(1)}}] on slot 0, the contexts in
    increasing order, each prefilled on top of the last; leaves slot 0 empty."""
    total = max(contexts) + max(POINTS)
    tokens = [1 + (i * 7919) % (runner.info.n_vocab - 1) for i in range(total)]
    table = list(range(-(-total // runner.block_size)))
    rows, done = [], 0
    try:
        for context in sorted(contexts):
            while done < context:
                n = min(CHUNK, context - done)
                runner.execute([BatchItem(0, tokens[done:done + n], done, table, [n - 1])])
                done += n
            best: dict[int, float] = {}
            for _ in range(repeats):  # points in turn: a burst of noise hits one pass of each
                for n in POINTS:
                    t0 = time.perf_counter()
                    runner.execute([BatchItem(0, tokens[context:context + n], context, table,
                                              list(range(n)))])
                    best[n] = min(best.get(n, float("inf")), time.perf_counter() - t0)
                    runner.truncate(0, context)
            rows.append({"context": context,
                         "t_ms": {n: round(t * 1e3, 1) for n, t in best.items()},
                         "ratio": {n: round(t / best[1], 2) for n, t in best.items()}})
    finally:
        runner.truncate(0, 0)
        runner.release(0, 0)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a .gguf file")
    p.add_argument("--flash-attn", default="on,off", help="comma-separated: auto, on, off")
    p.add_argument("--contexts", default="256,1024,2200", help="comma-separated tokens")
    p.add_argument("--threads", type=int, default=None,
                   help="llama.cpp threads (default: all available CPUs)")
    p.add_argument("--repeats", type=int, default=3,
                   help="passes over the points; each point's fastest counts (default: 3)")
    args = p.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",") if c]
    for fa in [f for f in args.flash_attn.split(",") if f]:
        config = RunnerConfig(max_seqs=1, seq_tokens=max(contexts) + max(POINTS) + 1,
                              kv_layout="split", n_threads=args.threads, flash_attn=fa)
        runner, _ = load_runner(Path(args.model), backend="llamacpp", config=config)
        try:
            for row in step_times(runner, contexts, args.repeats):
                print(json.dumps({"model": Path(args.model).name, "flash_attn": fa, **row}),
                      flush=True)
        finally:
            runner.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
