"""Sequence slots of the runner: which are empty, which park a finished sequence's KV.

A finished sequence's slot keeps the KV of its cached blocks ("parked") so later requests can
share it. Empty slots are handed out first; when none is left the least recently parked slot
is cleared, and blocks that were resident only there leave the prefix cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class SlotPool:
    """Args:
    num_slots: sequence slots the runner has (`Runner.max_seqs`).
    clear_slot: runner hook; empties a slot and returns block ids no longer resident.
    on_lost: called with those block ids (the block manager's `uncache`).
    """

    def __init__(
        self,
        num_slots: int,
        clear_slot: Callable[[int], list[int]],
        on_lost: Callable[[list[int]], None],
    ):
        self.empty: list[int] = list(range(num_slots - 1, -1, -1))  # pop() gives slot 0 first
        self.parked: OrderedDict[int, None] = OrderedDict()
        self._clear_slot = clear_slot
        self._on_lost = on_lost

    @property
    def num_available(self) -> int:
        return len(self.empty) + len(self.parked)

    def acquire(self) -> int | None:
        """An empty slot, clearing the least recently parked one if needed; None if all busy."""
        if self.empty:
            return self.empty.pop()
        if not self.parked:
            return None
        slot, _ = self.parked.popitem(last=False)
        lost = self._clear_slot(slot)
        if lost:
            self._on_lost(lost)
        return slot

    def release(self, slot: int, parked: bool) -> None:
        """Return a slot; `parked` if it still holds cached KV."""
        if parked:
            self.parked[slot] = None
        else:
            self.empty.append(slot)
