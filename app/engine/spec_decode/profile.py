"""Measure the target's step-time curve t(n) through the runner protocol, and judge one.

Like nano-vllm's `warmup_model`, on a scratch sequence before any request: prefill a short
context into slot 0, then time steps that compute n tokens after it (logits at all n, as a
verification step needs), rolling each back with `truncate`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from backends.base import BatchItem, Runner

DEFAULT_POINTS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64)
# t(1)..t(CORE) decide whether drafts of copy-based proposers pay: measured first, always.
CORE = 8
# After the first pass over the core points, the measurement goes on for max(budget_s,
# BUDGET_STEPS x t(1)): a 90 ms step (1.5B Q8_0 on 2 cores) gets 5.4 s, a 17 ms one 3 s.
BUDGET_STEPS = 60
# A profile is not trusted when a step of two tokens costs more than this many of one (a
# CPU pays ~2; 16 was measured while another process ran) ...
MAX_T2_RATIO = 4.0
# ... or when a step of fewer tokens took more than this times a step of more.
MAX_INVERSION = 1.5


def core_points(runner: Runner, context: int = 128, points=DEFAULT_POINTS) -> list[int]:
    """The core points (n <= CORE) that fit `runner`: the ones a profile must have."""
    max_n = min(max(points), runner.max_seq_tokens - context - 1,
                getattr(runner, "max_batch_tokens", max(points)))
    return [n for n in points if n <= min(CORE, max_n)]


def time_steps(runner: Runner, points=DEFAULT_POINTS, context: int = 128, repeats: int = 3,
               budget_s: float = 3.0, budget_steps: float = BUDGET_STEPS
               ) -> dict[int, list[float]]:
    """{n: [seconds of each timed step computing n tokens]} at a `context`-token position.

    The core points (n <= CORE) first: one pass over all of them whatever it costs, then
    up to `repeats` - 1 more passes, then the longer points, pass after pass, up to
    `repeats` each; no step starts once max(`budget_s`, `budget_steps` x t(1)) seconds have
    passed since the first timed step. Points are taken in turn in each pass, so a burst of
    noise hits one pass of every point rather than every repeat of one. Points that would
    not fit the runner's batch or slot are skipped. Leaves slot 0 empty. Raises
    RuntimeError from the runner.
    """
    max_n = min(max(points), runner.max_seq_tokens - context - 1,
                getattr(runner, "max_batch_tokens", max(points)))
    bs = runner.block_size
    table = list(range(min(runner.num_blocks, -(-(context + max_n) // bs))))
    tokens = [1 + (i * 7919) % max(2, runner.info.n_vocab - 1) for i in range(context + max_n)]
    times: dict[int, list[float]] = {}

    def step(n: int) -> None:
        t0 = time.perf_counter()
        runner.execute([BatchItem(0, tokens[context:context + n], context, table,
                                  list(range(n)))])
        times.setdefault(n, []).append(time.perf_counter() - t0)
        runner.truncate(0, context)

    core = [n for n in points if n <= min(CORE, max_n)]
    tail = [n for n in points if CORE < n <= max_n]
    try:
        runner.execute([BatchItem(0, tokens[:context], 0, table, [context - 1])])
        # one untimed step first: the first decode after a prefill pays for warm-up
        runner.execute([BatchItem(0, tokens[context:context + 1], context, table, [0])])
        runner.truncate(0, context)
        start = time.perf_counter()
        for n in core:
            step(n)
        t1 = min(times[core[0]]) if core else 0.0
        deadline = start + max(budget_s, budget_steps * t1)
        passes = [core] * (repeats - 1) + [tail] + [None] * (repeats - 1)
        for todo in passes:
            if todo is None:  # a repeat of the tail: the points its first pass reached
                todo = [n for n in tail if n in times]
            for n in todo:
                if time.perf_counter() > deadline:
                    return times
                step(n)
    finally:
        runner.truncate(0, 0)
        runner.release(0, 0)
    return times


def fastest_monotone(times: Mapping[int, list[float]]) -> dict[int, float]:
    """{n: seconds}: each point's fastest step (noise only ever adds time), then lowered
    to the least t(m) for m >= n (a step of more tokens never costs less: on a busy machine
    a median of three once gave t(3) = 47 ms over t(4) = 37 ms)."""
    out: dict[int, float] = {}
    least = float("inf")
    for n in sorted(times, reverse=True):
        least = min(least, *times[n])
        out[n] = least
    return dict(sorted(out.items()))


def measure_step_times(runner: Runner, points=DEFAULT_POINTS, context: int = 128,
                       repeats: int = 3, budget_s: float = 3.0,
                       budget_steps: float = BUDGET_STEPS) -> dict[int, float]:
    """{n: seconds of a step computing n tokens}: `time_steps`, then `fastest_monotone`."""
    return fastest_monotone(time_steps(runner, points, context, repeats, budget_s,
                                       budget_steps))


def curve_problem(points: Mapping[int, float], core: list[int]) -> str | None:
    """Why a curve {n: seconds} (fastest times, before `fastest_monotone`) cannot be
    trusted, or None: a core point missing (a cached curve of one point was a bug), t(2) >
    MAX_T2_RATIO x t(1) (measured while the machine was busy), or a step of fewer tokens
    more than MAX_INVERSION x a step of more (noise, not the kernels)."""
    missing = [n for n in core if n not in points]
    if missing:
        return (f"{len(points)} point(s), t({', '.join(map(str, missing))}) missing")
    if 1 in points and 2 in points and points[2] > MAX_T2_RATIO * points[1]:
        return (f"t(2)/t(1) = {points[2] / points[1]:.1f} > {MAX_T2_RATIO:g}: measured while "
                "the machine was busy")
    ns = sorted(points)
    for i, n in enumerate(ns):
        later = min((points[m] for m in ns[i + 1:]), default=None)
        if later is not None and points[n] > MAX_INVERSION * later:
            m = next(m for m in ns[i + 1:] if points[m] == later)
            return (f"t({n}) = {points[n] * 1e3:.1f} ms > {MAX_INVERSION:g} x t({m}) = "
                    f"{later * 1e3:.1f} ms: measured while the machine was busy")
    return None
