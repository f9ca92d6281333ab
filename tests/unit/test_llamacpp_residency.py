"""`backends.llamacpp.residency` over a fake `MemoryOps`: which KV every slot ends up with,
and the exact llama.cpp calls each layout makes. No model needed."""

from __future__ import annotations

import pytest

from backends.llamacpp.residency import SavedPrefix, Slot, SplitResidency, UnifiedResidency

BS = 16


class Blob:
    """A saved sequence: a copy of its cells, 10 bytes a cell."""

    def __init__(self, cells: dict[int, str]):
        self.cells = dict(cells)

    def __len__(self) -> int:
        return 10 * len(self.cells)


class FakeMemory:
    """Sequences as {position: label}; blobs as copies. Records every call."""

    def __init__(self):
        self.cells: dict[int, dict[int, str]] = {}
        self.calls: list[tuple] = []

    def compute(self, seq: int, start: int, end: int, label: str) -> None:
        self.cells.setdefault(seq, {}).update({p: f"{label}{p}" for p in range(start, end)})

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.calls.append(("cp", src, dst, p0, p1))
        src_cells = self.cells.get(src, {})
        self.cells.setdefault(dst, {}).update(
            {p: v for p, v in src_cells.items() if p0 <= p < p1})

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.calls.append(("rm", seq, p0, p1))
        hi = float("inf") if p1 < 0 else p1
        self.cells[seq] = {p: v for p, v in self.cells.get(seq, {}).items()
                           if not max(p0, 0) <= p < hi}

    def state_get(self, seq: int) -> Blob:
        self.calls.append(("get", seq))
        return Blob(self.cells.get(seq, {}))

    def state_set(self, seq: int, blob: Blob) -> None:
        self.calls.append(("set", seq))
        self.cells[seq] = dict(blob.cells)

    def seq(self, seq: int) -> dict[int, str]:
        return dict(sorted(self.cells.get(seq, {}).items()))


def computed(res, mem: FakeMemory, slot: int, blocks: list[int], n_tokens: int, label: str):
    res.before_compute()
    mem.compute(slot, 0, n_tokens, label)
    res.note_computed(slot, blocks, n_tokens)


def labels(label: str, start: int, end: int) -> dict[int, str]:
    return {p: f"{label}{p}" for p in range(start, end)}


def test_unified_release_saves_the_last_copy_then_restores_it_through_scratch():
    mem = FakeMemory()
    res = UnifiedResidency(mem, max_seqs=2, block_size=BS, scratch=2)
    computed(res, mem, 0, [5, 6, 7], 40, "a")
    assert res.held_blocks() == {5: {Slot(0)}, 6: {Slot(0)}, 7: {Slot(0)}}

    res.release(0, 2)  # blocks 5 and 6 are cached, 7 is dropped
    assert mem.calls == [("rm", 0, 32, -1), ("get", 0), ("rm", 0, -1, -1)]
    assert res.held_blocks() == {5: {SavedPrefix(0)}, 6: {SavedPrefix(0)}}
    assert res.saved_prefixes() == {0: [5, 6]}
    assert res.saved_bytes == 10 * 32
    assert mem.seq(0) == {}

    mem.calls.clear()
    assert res.share_blocks(1, [5, 6]) == 2
    assert mem.calls == [("set", 2), ("cp", 2, 1, 0, 32), ("rm", 2, -1, -1)]
    assert mem.seq(1) == labels("a", 0, 32) and mem.seq(2) == {}
    assert res.holders(5) == {Slot(1), SavedPrefix(0)}

    mem.calls.clear()
    res.evict([6])
    assert mem.calls == [("rm", 1, 16, 32)]
    assert res.slot_blocks(1) == [5, None] and res.saved_prefixes() == {0: [5, None]}
    res.evict([5])
    assert res.saved_prefixes() == {} and res.held_blocks() == {} and res.saved_bytes == 0


def test_unified_share_takes_runs_from_a_running_slot_then_a_saved_prefix():
    mem = FakeMemory()
    res = UnifiedResidency(mem, max_seqs=3, block_size=BS, scratch=3)
    computed(res, mem, 0, [5, 6, 7], 48, "a")
    res.release(0, 3)  # saved prefix 0: [5, 6, 7]
    assert res.share_blocks(1, [5, 6]) == 2  # slot 1 now runs blocks 5, 6
    mem.calls.clear()

    assert res.share_blocks(2, [5, 6, 7]) == 3
    assert mem.calls == [("cp", 1, 2, 0, 32),  # from the running slot, lowest first
                         ("set", 3), ("cp", 3, 2, 32, 48),  # the rest from host memory
                         ("rm", 3, -1, -1)]
    assert mem.seq(2) == labels("a", 0, 48)
    assert res.slot_blocks(2) == [5, 6, 7]


def test_release_saves_nothing_while_another_slot_holds_the_blocks():
    mem = FakeMemory()
    res = UnifiedResidency(mem, max_seqs=2, block_size=BS, scratch=2)
    computed(res, mem, 0, [5, 6], 32, "a")
    res.share_blocks(1, [5, 6])
    res.release(0, 2)
    assert res.saved_prefixes() == {} and ("get", 0) not in mem.calls
    assert res.held_blocks() == {5: {Slot(1)}, 6: {Slot(1)}}


def test_share_into_a_busy_slot_is_refused():
    mem = FakeMemory()
    res = UnifiedResidency(mem, max_seqs=2, block_size=BS, scratch=2)
    computed(res, mem, 0, [5], 8, "a")
    with pytest.raises(RuntimeError, match="slot 0 is not empty"):
        res.share_blocks(0, [5])


def test_split_copies_the_longest_run_and_exports_a_running_slot_once_per_step():
    mem = FakeMemory()
    res = SplitResidency(mem, max_seqs=4, block_size=BS)
    computed(res, mem, 0, [5, 6], 32, "b")
    res.release(0, 2)  # saved prefix 0: [5, 6]
    computed(res, mem, 1, [5, 6, 7], 48, "a")  # a running stream with a longer run
    mem.calls.clear()

    assert res.share_blocks(2, [5, 6, 7, 8]) == 3
    assert res.share_blocks(3, [5, 6, 7]) == 3
    assert mem.calls == [("get", 1), ("set", 2), ("rm", 2, 48, -1),
                         ("set", 3), ("rm", 3, 48, -1)]  # one export serves both
    assert mem.seq(2) == mem.seq(3) == labels("a", 0, 48)
    assert res.holders(7) == {Slot(1), Slot(2), Slot(3)}

    res.release(2, 3)
    res.release(3, 3)
    res.before_compute()  # slot 1's KV changes: its export is stale
    mem.calls.clear()
    assert res.share_blocks(2, [5, 6]) == 2
    assert mem.calls == [("get", 1), ("set", 2), ("rm", 2, 32, -1)]

    res.release(2, 0)
    mem.calls.clear()
    assert res.share_blocks(2, [9]) == 0  # nobody holds block 9
    assert mem.calls == [] and res.slot_blocks(2) == []


def test_split_restores_a_saved_prefix_when_no_stream_runs_it():
    mem = FakeMemory()
    res = SplitResidency(mem, max_seqs=2, block_size=BS)
    computed(res, mem, 0, [5, 6, 7], 40, "a")
    res.release(0, 2)
    mem.calls.clear()
    assert res.share_blocks(1, [5, 6]) == 2
    assert mem.calls == [("set", 1), ("rm", 1, 32, -1)]
    assert mem.seq(1) == labels("a", 0, 32)


@pytest.mark.parametrize("layout", ["unified", "split"])
def test_truncate_drops_positions_and_the_blocks_past_them(layout):
    mem = FakeMemory()
    res = (UnifiedResidency(mem, 1, BS, scratch=1) if layout == "unified"
           else SplitResidency(mem, 1, BS))
    computed(res, mem, 0, [5, 6, 7], 40, "a")
    mem.calls.clear()
    res.truncate(0, 20)
    assert mem.calls == [("rm", 0, 20, -1)]
    assert mem.seq(0) == labels("a", 0, 20)
    assert res.slot_blocks(0) == [5, 6]  # block 6 still holds positions 16..19
    assert res.held_blocks() == {5: {Slot(0)}, 6: {Slot(0)}}


def test_evict_removes_a_slots_blocks_in_one_range_per_run():
    mem = FakeMemory()
    res = SplitResidency(mem, max_seqs=1, block_size=1)
    computed(res, mem, 0, [10, 11, 12, 13, 14, 15], 6, "a")
    mem.calls.clear()
    res.evict([13, 11, 12, 15])
    assert mem.calls == [("rm", 0, 1, 4), ("rm", 0, 5, 6)]
    assert res.slot_blocks(0) == [10, None, None, None, 14, None]
    assert mem.seq(0) == {0: "a0", 4: "a4"}
    assert res.held_blocks() == {10: {Slot(0)}, 14: {Slot(0)}}


def test_evict_deletes_a_saved_prefix_once_no_hit_can_reach_it():
    mem = FakeMemory()
    res = SplitResidency(mem, max_seqs=1, block_size=1)
    computed(res, mem, 0, [10, 11, 12], 3, "a")
    res.release(0, 3)
    res.evict([12])
    assert res.saved_prefixes() == {0: [10, 11, None]}
    # a lookup stops at its first missing block: with block 10 gone, 11 is unreachable
    res.evict([10])
    assert res.saved_prefixes() == {} and res.saved_bytes == 0
    assert res.held_blocks() == {}


def test_saved_prefixes_stay_bounded_when_requests_share_a_hot_prefix():
    """Issue 33's soak: every finished request sharing a system prompt used to stay saved
    (RSS +5.5 MB a request on SmolLM2)."""
    mem = FakeMemory()
    res = SplitResidency(mem, max_seqs=1, block_size=1)
    system = [1, 2, 3, 4]
    for i in range(20):
        tail = [100 + 2 * i, 101 + 2 * i]
        res.share_blocks(0, system)  # the shared system prompt: a prefix-cache hit
        computed(res, mem, 0, system + tail, 6, f"r{i}")
        res.release(0, 6)
        if i >= 2:  # the block manager evicts the oldest tails (LRU); the system stays hot
            res.evict([100 + 2 * (i - 2), 101 + 2 * (i - 2)])
    # what is restorable: the system prompt and the last two tails, in the last two blobs
    assert res.saved_prefixes() == {18: [1, 2, 3, 4, 136, 137], 19: [1, 2, 3, 4, 138, 139]}
    assert res.saved_bytes == 2 * 6 * 10  # 10 bytes a cell
    assert res.share_blocks(0, system + [138, 139]) == 6
    assert mem.seq(0) == labels("r19", 0, 6)


def test_the_oldest_saved_prefixes_go_past_the_cap_and_hits_on_them_are_recomputed():
    mem = FakeMemory()
    res = SplitResidency(mem, max_seqs=1, block_size=1, max_saved_bytes=60)
    for i, blocks in enumerate([[10, 11, 12], [20, 21, 22], [30, 31, 32]]):
        computed(res, mem, 0, blocks, 3, f"r{i}")
        res.release(0, 3)
    assert res.saved_prefixes() == {1: [20, 21, 22], 2: [30, 31, 32]}
    assert res.saved_bytes == 60
    assert res.share_blocks(0, [10, 11]) == 0  # dropped: the engine recomputes it


def test_unified_shares_what_is_resident_and_stops_at_a_dropped_block():
    mem = FakeMemory()
    res = UnifiedResidency(mem, max_seqs=1, block_size=1, scratch=1, max_saved_bytes=30)
    computed(res, mem, 0, [10, 11, 12], 3, "a")
    res.release(0, 3)
    computed(res, mem, 0, [20, 21, 22], 3, "b")
    res.release(0, 3)
    assert res.saved_prefixes() == {1: [20, 21, 22]}
    assert res.share_blocks(0, [10, 11]) == 0
    assert res.share_blocks(0, [20, 21]) == 2
    assert mem.seq(0) == labels("b", 0, 2)
