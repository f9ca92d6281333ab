"""Grammar masks computed while the runner computes the step, and what they cost.

A step's masks need only its requests' grammar states and drafts, both fixed once the
batch is built; the step's logits are not needed until sampling. So `MaskPipeline.start`
hands the fill to a worker thread before `runner.execute`, and `result` collects it after:
llguidance releases the GIL while it fills, and llama.cpp and MLX release it while they
compute, so the two run side by side. Only where a core is spare (`spare_core`): on a CPU
whose every core runs a llama.cpp worker, a mask thread stalls the step's barriers, so the
fill then runs on the engine's thread before the step (inline). (A mask for step t+1 cannot start during step t: it
needs the token step t samples.) While a fill runs its matchers belong to the worker; the
engine's thread waits in `runner.execute` and touches none of them.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from app.engine.constrain.mask import MaskRequest, fill_masks

# Upper bounds (seconds) of the per-sequence mask time histogram (`MaskStats.buckets`).
MASK_BUCKETS = (2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 1e-1)
RECENT = 1 << 16  # per-sequence samples kept for percentiles


class MaskStats:
    """Grammar mask time of one engine, per constrained sequence and step.

    A step's masks are filled in one batched call and applied in one pass; each of its
    constrained sequences is observed once with its share: (fill + apply seconds) / number
    of sequences. `buckets[i]` counts observations <= `MASK_BUCKETS[i]` (the last, the rest),
    `count` and `sum_s` all of them; `fill_s`, `apply_s` are totals, `wait_s` the part of the
    fills the engine waited for after the runner returned (what overlapping did not hide).
    `recent_fill_s` / `recent_apply_s`: the last `RECENT` per-sequence shares, for
    percentiles. Written by the step thread; `snapshot` copies it for other threads.
    """

    def __init__(self) -> None:
        self.buckets = [0] * (len(MASK_BUCKETS) + 1)
        self.count = 0
        self.sum_s = 0.0
        self.fill_s = self.apply_s = self.wait_s = 0.0
        self.recent_fill_s: deque[float] = deque(maxlen=RECENT)
        self.recent_apply_s: deque[float] = deque(maxlen=RECENT)

    def observe(self, num_seqs: int, fill_s: float, apply_s: float, wait_s: float) -> None:
        """One step's masks for `num_seqs` (>= 1) constrained sequences."""
        self.fill_s += fill_s
        self.apply_s += apply_s
        self.wait_s += wait_s
        fill, apply = fill_s / num_seqs, apply_s / num_seqs
        share = fill + apply
        i = next((i for i, b in enumerate(MASK_BUCKETS) if share <= b), len(MASK_BUCKETS))
        self.buckets[i] += num_seqs
        self.count += num_seqs
        self.sum_s += share * num_seqs
        self.recent_fill_s.extend([fill] * num_seqs)
        self.recent_apply_s.extend([apply] * num_seqs)

    def snapshot(self) -> dict[str, object]:
        return {"buckets": list(self.buckets), "count": self.count, "sum_s": self.sum_s,
                "fill_s": self.fill_s, "apply_s": self.apply_s, "wait_s": self.wait_s}


class PendingMasks:
    """A fill under way: its requests, the rows they cover, and the future bitmask."""

    __slots__ = ("requests", "rows", "future", "bitmask", "fill_s", "wait_s")

    def __init__(self, requests: list[MaskRequest], rows: list[int],
                 future: Future | None, bitmask: np.ndarray | None = None,
                 fill_s: float = 0.0):
        self.requests, self.rows, self.future = requests, rows, future
        self.bitmask, self.fill_s, self.wait_s = bitmask, fill_s, 0.0

    def result(self) -> np.ndarray:
        """The bitmask ``[num_rows, words]`` int32; waits for the worker if needed and
        re-raises what the fill raised."""
        if self.bitmask is None:
            t0 = time.perf_counter()
            self.bitmask, self.fill_s = self.future.result()
            self.wait_s = time.perf_counter() - t0
        return self.bitmask


class MaskPipeline:
    """Starts mask fills on one worker thread (`overlap`), or fills them at once."""

    def __init__(self, overlap: bool = True):
        self.overlap = overlap
        self._pool: ThreadPoolExecutor | None = None

    def start(self, requests: list[MaskRequest], rows: list[int], num_rows: int,
              width: int) -> PendingMasks:
        """Begin filling the masks of `requests` (`fill_masks`) for a step of `num_rows`
        logits rows of `width`."""
        if not self.overlap:
            return PendingMasks(requests, rows, None, *_timed_fill(requests, num_rows, width))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="tandem-mask")
        return PendingMasks(requests, rows,
                            self._pool.submit(_timed_fill, requests, num_rows, width))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def spare_core(runner: object) -> bool:
    """Whether a mask thread can run beside `runner` without taking a core its compute
    threads use: True unless the runner has CPU threads (`n_threads`, llama.cpp) for every
    core of the process."""
    threads = getattr(runner, "n_threads", None)
    if not isinstance(threads, int):
        return True  # the GPU computes (MLX) or the runner is not CPU-bound
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) > threads


def _timed_fill(requests: list[MaskRequest], num_rows: int,
                width: int) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    bitmask = fill_masks(requests, num_rows, width)
    return bitmask, time.perf_counter() - t0
