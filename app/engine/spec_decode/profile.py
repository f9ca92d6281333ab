"""Measure the target's step-time curve t(n) through the runner protocol.

Like nano-vllm's `warmup_model`, on a scratch sequence before any request: prefill a short
context into slot 0, then time steps that compute n tokens after it (logits at all n, as a
verification step needs), rolling each back with `truncate`.
"""

from __future__ import annotations

import time

from backends.base import BatchItem, Runner

DEFAULT_POINTS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)


def measure_step_times(runner: Runner, points=DEFAULT_POINTS, context: int = 128,
                       repeats: int = 3, budget_s: float = 3.0) -> dict[int, float]:
    """{n: seconds of a step computing n tokens} at a `context`-token position.

    Each point is timed `repeats` times, the points taken in turn in each pass, and its
    time is the fastest: noise (another process starting, a neighbour on the host) only
    ever adds time, and a burst of it then hits one pass of every point rather than every
    repeat of one. A step of more tokens never costs less, so t(n) is then lowered to the
    least t(m) for m >= n: on a busy machine a median of three once gave t(3) = 47 ms over
    t(4) = 37 ms, a curve cached for good that made drafts of three look dearer than four.
    Points that would not fit the runner's batch or slot are skipped; once `budget_s`
    seconds have passed no step is started (but the first), and later passes repeat only
    the points the first one took.
    Leaves slot 0 empty. Raises RuntimeError from the runner.
    """
    max_n = min(max(points), runner.max_seq_tokens - context - 1,
                getattr(runner, "max_batch_tokens", max(points)))
    bs = runner.block_size
    table = list(range(min(runner.num_blocks, -(-(context + max_n) // bs))))
    tokens = [1 + (i * 7919) % max(2, runner.info.n_vocab - 1) for i in range(context + max_n)]
    deadline = time.perf_counter() + budget_s
    times: dict[int, list[float]] = {}
    try:
        runner.execute([BatchItem(0, tokens[:context], 0, table, [context - 1])])
        # one untimed step first: the first decode after a prefill pays for warm-up
        runner.execute([BatchItem(0, tokens[context:context + 1], context, table, [0])])
        runner.truncate(0, context)
        todo = [n for n in points if n <= max_n]
        for rep in range(repeats):
            for i, n in enumerate(todo):
                if (rep or i) and time.perf_counter() > deadline:  # one point at least
                    break
                t0 = time.perf_counter()
                runner.execute([BatchItem(0, tokens[context:context + n], context, table,
                                          list(range(n)))])
                times.setdefault(n, []).append(time.perf_counter() - t0)
                runner.truncate(0, context)
            todo = list(times)
    finally:
        runner.truncate(0, 0)
        runner.release(0, 0)
    out: dict[int, float] = {}
    least = float("inf")
    for n in sorted(times, reverse=True):
        least = min(least, *times[n])
        out[n] = least
    return dict(sorted(out.items()))
