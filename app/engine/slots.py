"""Sequence slots of the runner: a free list, lowest slot first."""

from __future__ import annotations

import heapq


class SlotPool:
    """Hands out the runner's `num_slots` sequence slots (`Runner.max_seqs`), lowest free
    slot first: with one KV stream per slot, llama.cpp batches consecutive slot ids in one
    micro-batch, so keeping busy slots packed at the bottom keeps steps in one piece."""

    def __init__(self, num_slots: int):
        self.free: list[int] = list(range(num_slots))  # a heap

    @property
    def num_available(self) -> int:
        return len(self.free)

    def acquire(self) -> int | None:
        """The lowest free slot, or None if all are busy."""
        return heapq.heappop(self.free) if self.free else None

    def release(self, slot: int) -> None:
        heapq.heappush(self.free, slot)
