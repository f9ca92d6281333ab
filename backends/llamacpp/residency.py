"""Where the KV of the engine's blocks lives on llama.cpp, and how a cached prefix reaches a
new slot. Pure bookkeeping over `MemoryOps`; no llama.cpp import (unit-tested with a fake).

llama.cpp keeps KV per token cell, each cell tagged with the sequences that see it; engine
blocks (`block_size` tokens, block i = positions `i*block_size ..`) are accounting on top.
A cached block's KV lives:
- in running slots: sharing it adds the new slot's tag to those cells (unified:
  `seq_cp`, no copy) or copies the source's cells through host memory (split: `state_get` /
  `state_set`, then `seq_rm` past the prefix); freeing removes a tag (`seq_rm`);
- once no running sequence holds it, in host memory: a finished sequence's cached prefix is
  saved with `state_get` and its cells are freed. Idle KV must not stay in the buffer:
  llama.cpp attends over every cell up to the highest one in use, so parked prefixes would
  slow every decode (measured: 2x on SmolLM2 with 4k parked cells). A hit is restored with
  `state_set`: split, straight into the slot's stream; unified, into a scratch sequence whose
  cells are then tagged into the slot (`state_set` first clears its destination, so runs
  from several sources cannot be appended directly).
Facts relied on: shared/notes/llamacpp.md §1-2.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass
from typing import Protocol


class MemoryOps(Protocol):
    """Sequence-level KV operations (positions in tokens; `-1` ends mean "to the end")."""

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Make `dst` see `src`'s KV at positions `[p0, p1)`."""
        ...

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        """Drop `seq`'s KV at positions `[p0, p1)`."""
        ...

    def state_get(self, seq: int) -> Sized:
        """`seq`'s KV as a host-memory blob (`len` in bytes). Raises RuntimeError."""
        ...

    def state_set(self, seq: int, blob: Sized) -> None:
        """Replace `seq`'s KV with a blob from `state_get`. Raises RuntimeError."""
        ...


@dataclass(frozen=True, slots=True)
class Slot:
    """A running sequence's KV: the slot (llama.cpp sequence id) holding it."""

    index: int


@dataclass(frozen=True, slots=True)
class SavedPrefix:
    """A finished sequence's prefix saved to host memory: its id, in order of saving."""

    id: int


Source = Slot | SavedPrefix


@dataclass(slots=True)
class _Saved:
    blob: Sized
    blocks: list[int | None]  # block ids by index; None where evicted


def _common_prefix(blocks: list[int | None], block_ids: list[int]) -> int:
    n = 0
    while n < len(blocks) and n < len(block_ids) and blocks[n] == block_ids[n]:
        n += 1
    return n


class PrefixResidency:
    """Which slots and saved prefixes hold each engine block, and the moves between them.

    Invariant: block b is at index i of a slot's (or saved prefix's) block list exactly when
    that source is among `holders(b)`. Subclasses decide how a prefix is shared into a slot.
    """

    def __init__(self, mem: MemoryOps, max_seqs: int, block_size: int,
                 max_saved_bytes: int | None = None):
        """`max_saved_bytes`: host memory saved prefixes may hold (None: no cap); past it the
        oldest are dropped (their blocks are then recomputed on a hit, as for any block
        `share_blocks` cannot supply)."""
        self._mem = mem
        self.block_size = block_size
        self.max_saved_bytes = max_saved_bytes
        self._slot_blocks: list[list[int | None]] = [[] for _ in range(max_seqs)]
        self._holders: dict[int, set[Source]] = {}
        self._saved: dict[int, _Saved] = {}
        self._next_saved = 0

    # -- queries ---------------------------------------------------------------------------

    def holders(self, block_id: int) -> frozenset[Source]:
        """The running slots and saved prefixes holding `block_id` (empty if none)."""
        return frozenset(self._holders.get(block_id, ()))

    def held_blocks(self) -> dict[int, frozenset[Source]]:
        """Every block some source holds, with its holders."""
        return {b: frozenset(hs) for b, hs in self._holders.items()}

    def slot_blocks(self, slot: int) -> list[int | None]:
        """The blocks `slot`'s KV covers, by index (None where evicted); a copy."""
        return list(self._slot_blocks[slot])

    def saved_prefixes(self) -> dict[int, list[int | None]]:
        """Saved prefix id -> its block ids by index (None where evicted); copies."""
        return {i: list(s.blocks) for i, s in self._saved.items()}

    @property
    def saved_bytes(self) -> int:
        """Host memory held by saved prefixes (bytes)."""
        return sum(len(s.blob) for s in self._saved.values())

    # -- changes ---------------------------------------------------------------------------

    def before_compute(self) -> None:
        """The slots' KV is about to change (a step runs)."""

    def note_computed(self, slot: int, block_table: list[int], end_pos: int) -> None:
        """`slot` now has KV for positions `0 .. end_pos-1`, in the blocks of `block_table`."""
        held = self._slot_blocks[slot]
        for i in range(len(held), -(-end_pos // self.block_size)):
            held.append(block_table[i])
            self._holders.setdefault(block_table[i], set()).add(Slot(slot))

    def share_blocks(self, slot: int, block_ids: list[int]) -> int:
        """Make cached `block_ids` the first blocks of empty `slot`; returns how many leading
        ones it now holds. Raises RuntimeError if the slot is not empty."""
        if self._slot_blocks[slot]:
            raise RuntimeError(f"slot {slot} is not empty")
        return self._share(slot, block_ids)

    def _share(self, slot: int, block_ids: list[int]) -> int:
        raise NotImplementedError

    def release(self, slot: int, n_keep_blocks: int) -> None:
        """Free `slot`; its first `n_keep_blocks` blocks stay restorable (saved to host memory
        if this slot is the last holder of any of them) until `evict`."""
        bs = self.block_size
        held = self._slot_blocks[slot]
        self._mem.seq_rm(slot, n_keep_blocks * bs, -1)
        for block_id in held[n_keep_blocks:]:
            self._drop(block_id, Slot(slot))
        del held[n_keep_blocks:]
        self._forget_export(slot)
        if any(b is not None and self._holders[b] == {Slot(slot)} for b in held):
            saved = SavedPrefix(self._next_saved)
            self._next_saved += 1
            self._saved[saved.id] = _Saved(self._mem.state_get(slot), list(held))
            for block_id in held:
                if block_id is not None:
                    self._holders[block_id].add(saved)
        self._mem.seq_rm(slot, -1, -1)
        for block_id in held:
            self._drop(block_id, Slot(slot))
        held.clear()
        self._enforce_saved_cap()

    def evict(self, block_ids: list[int]) -> None:
        """Drop these blocks' KV everywhere; a saved prefix left with no block is deleted.

        One pass over each source holding any of them (blocks are often one token, and an
        allocation evicts hundreds at once); a running slot's KV is removed in contiguous
        position ranges, one `seq_rm` per run."""
        bs = self.block_size
        gone: dict[Source, set[int]] = {}
        for block_id in block_ids:
            for source in self._holders.pop(block_id, ()):
                gone.setdefault(source, set()).add(block_id)
        # running slots first, then saved prefixes, each in id order
        for source in sorted(gone, key=_source_order):
            ids = gone[source]
            if isinstance(source, Slot):
                held = self._slot_blocks[source.index]
                index = [i for i, b in enumerate(held) if b in ids]
                for first, last in _runs(index):
                    self._mem.seq_rm(source.index, first * bs, (last + 1) * bs)
                for i in index:
                    held[i] = None
            else:
                blocks = self._saved[source.id].blocks
                for i, b in enumerate(blocks):
                    if b in ids:
                        blocks[i] = None
                self._prune_saved(source.id)

    def truncate(self, slot: int, n_tokens: int) -> None:
        """Keep only positions `0 .. n_tokens-1` of `slot`'s KV, and the blocks covering
        them."""
        self._forget_export(slot)
        held = self._slot_blocks[slot]
        self._mem.seq_rm(slot, n_tokens, -1)
        keep = -(-n_tokens // self.block_size)
        for block_id in held[keep:]:
            self._drop(block_id, Slot(slot))
        del held[keep:]

    # -- helpers ---------------------------------------------------------------------------

    def _prune_saved(self, saved_id: int) -> None:
        """After an eviction: keep saved prefix `saved_id` only while it can serve a hit no
        other saved prefix serves. The block manager's lookup stops at its first missing
        block (`BlockManager.find_cached_prefix`), so only the leading run of blocks is
        reachable; blocks after a gap are released. A prefix whose whole reachable run
        another saved prefix also holds (a hot shared system prompt, saved again with every
        finished request) is deleted: without this, every finished request that shared it
        stayed in host memory for good."""
        saved = self._saved[saved_id]
        blocks = saved.blocks
        n = next((i for i, b in enumerate(blocks) if b is None), len(blocks))
        for i in range(n, len(blocks)):
            self._drop(blocks[i], SavedPrefix(saved_id))
            blocks[i] = None
        covered = n > 0 and any(
            other != saved_id and self._saved[other].blocks[:n] == blocks[:n]
            for other in self._saved_ids(blocks[n - 1]))
        if n == 0 or covered:
            self._delete_saved(saved_id)

    def _delete_saved(self, saved_id: int) -> None:
        for block_id in self._saved.pop(saved_id).blocks:
            self._drop(block_id, SavedPrefix(saved_id))

    def _enforce_saved_cap(self) -> None:
        """Drop the oldest saved prefixes while their bytes exceed `max_saved_bytes`."""
        if self.max_saved_bytes is None:
            return
        total = self.saved_bytes
        for saved_id in sorted(self._saved):
            if total <= self.max_saved_bytes:
                break
            total -= len(self._saved[saved_id].blob)
            self._delete_saved(saved_id)

    def _hold(self, slot: int, block_ids: list[int]) -> None:
        for block_id in block_ids:
            self._slot_blocks[slot].append(block_id)
            self._holders.setdefault(block_id, set()).add(Slot(slot))

    def _drop(self, block_id: int | None, source: Source) -> None:
        holders = self._holders.get(block_id) if block_id is not None else None
        if holders is not None:
            holders.discard(source)
            if not holders:
                del self._holders[block_id]

    def _running(self, block_id: int | None) -> list[int]:
        """Slots holding the block, lowest first."""
        return sorted(s.index for s in self._holders.get(block_id, ()) if isinstance(s, Slot))

    def _saved_ids(self, block_id: int | None) -> list[int]:
        """Saved prefixes holding the block, oldest first."""
        return sorted(s.id for s in self._holders.get(block_id, ())
                      if isinstance(s, SavedPrefix))

    def _forget_export(self, slot: int) -> None:
        """`slot`'s KV changes: forget any copy of it taken this step."""


def _runs(index: list[int]) -> list[tuple[int, int]]:
    """Ascending indices as (first, last) runs of consecutive ones: [2, 3, 4, 7] ->
    [(2, 4), (7, 7)]."""
    runs: list[tuple[int, int]] = []
    for i in index:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _source_order(source: Source) -> tuple[int, int]:
    return (0, source.index) if isinstance(source, Slot) else (1, source.id)


class UnifiedResidency(PrefixResidency):
    """One pool of cells: sharing tags the source's cells with the new slot (no copy); a
    saved prefix is restored into sequence `scratch` first, then tagged from there."""

    def __init__(self, mem: MemoryOps, max_seqs: int, block_size: int, scratch: int,
                 max_saved_bytes: int | None = None):
        super().__init__(mem, max_seqs, block_size, max_saved_bytes)
        self.scratch = scratch

    def _share(self, slot: int, block_ids: list[int]) -> int:
        bs = self.block_size
        restored = None  # saved prefix currently loaded in the scratch sequence
        i = 0
        while i < len(block_ids):
            block_id = block_ids[i]
            running = self._running(block_id)
            if running:
                src, blocks = running[0], self._slot_blocks[running[0]]
            else:
                saved = self._saved_ids(block_id)
                if not saved:  # dropped under the saved-prefix cap: the engine recomputes
                    break
                if restored != saved[0]:
                    self._mem.state_set(self.scratch, self._saved[saved[0]].blob)
                    restored = saved[0]
                src, blocks = self.scratch, self._saved[saved[0]].blocks
            if not (i < len(blocks) and blocks[i] == block_id):
                raise RuntimeError(f"block {block_id} is not at index {i} of its source")
            j = i + 1  # extend the run while the same source holds the next block there
            while j < len(block_ids) and j < len(blocks) and blocks[j] == block_ids[j]:
                j += 1
            self._mem.seq_cp(src, slot, i * bs, j * bs)
            i = j
        if restored is not None:
            self._mem.seq_rm(self.scratch, -1, -1)
        self._hold(slot, block_ids[:i])
        return i


class SplitResidency(PrefixResidency):
    """One stream per slot: sharing copies the longest run of the wanted blocks that one
    source holds from block 0 (a running stream or a saved prefix) into the slot's stream,
    through host memory (llama.cpp's cross-stream `seq_cp` copies the whole stream buffer,
    this only the cells in use). One copy of a running slot serves every slot admitted from
    it before it computes again."""

    def __init__(self, mem: MemoryOps, max_seqs: int, block_size: int,
                 max_saved_bytes: int | None = None):
        super().__init__(mem, max_seqs, block_size, max_saved_bytes)
        self._exports: dict[int, Sized] = {}

    def before_compute(self) -> None:
        self._exports.clear()

    def _forget_export(self, slot: int) -> None:
        self._exports.pop(slot, None)

    def _share(self, slot: int, block_ids: list[int]) -> int:
        best, source = 0, None
        first = block_ids[0] if block_ids else None
        for src in self._running(first):
            n = _common_prefix(self._slot_blocks[src], block_ids)
            if n > best:
                best, source = n, Slot(src)
        for saved_id in self._saved_ids(first):
            n = _common_prefix(self._saved[saved_id].blocks, block_ids)
            if n > best:
                best, source = n, SavedPrefix(saved_id)
        if source is None:
            return 0
        if isinstance(source, Slot):
            blob = self._exports.get(source.index)
            if blob is None:
                blob = self._exports[source.index] = self._mem.state_get(source.index)
        else:
            blob = self._saved[source.id].blob
        self._mem.state_set(slot, blob)
        self._mem.seq_rm(slot, best * self.block_size, -1)
        self._hold(slot, block_ids[:best])
        return best
