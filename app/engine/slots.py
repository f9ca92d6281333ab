"""Sequence slots of the runner: a free list, lowest slot first."""

from __future__ import annotations


class SlotPool:
    """Hands out the runner's `num_slots` sequence slots (`Runner.max_seqs`)."""

    def __init__(self, num_slots: int):
        self.free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() gives slot 0 first

    @property
    def num_available(self) -> int:
        return len(self.free)

    def acquire(self) -> int | None:
        """A free slot, or None if all are busy."""
        return self.free.pop() if self.free else None

    def release(self, slot: int) -> None:
        self.free.append(slot)
