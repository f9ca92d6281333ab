"""`TokenBatch`: what `fill` writes into the llama_batch arrays, and the logits rows
`logits` returns from llama.cpp's output buffer (a view kept while the buffer stays)."""

import ctypes

import numpy as np
import pytest

import backends.llamacpp.batch as batch_mod
from backends.base import BatchItem
from backends.llamacpp.batch import TokenBatch


def _arrays(b: TokenBatch, n: int):
    return (b._tok[:n].tolist(), b._pos[:n].tolist(), b._seq[:n].tolist(), b._want[:n].tolist())


def test_fill_writes_decodes_and_chunks():
    b = TokenBatch(16)
    # first a step wanting logits everywhere, so stale flags would show below
    b.fill([BatchItem(0, [5, 5, 5, 5, 5], 0, [], [0, 1, 2, 3, 4])])
    b.fill([BatchItem(3, [7], 10, [], [0]),
            BatchItem(1, [1, 2, 3], 0, [], [2]),
            BatchItem(5, [9], 4, [], [])])
    assert _arrays(b, 5) == ([7, 1, 2, 3, 9], [10, 0, 1, 2, 4], [3, 1, 1, 1, 5],
                             [1, 0, 0, 1, 0])
    assert (b.batch.n_tokens, b.n_outputs) == (5, 2)


def test_fill_in_slot_order_for_the_split_layout():
    b = TokenBatch(16)
    b.fill([BatchItem(4, [7], 9, [], [0]), BatchItem(2, [8, 9], 3, [], [1])], slot_order=True)
    assert _arrays(b, 3) == ([8, 9, 7], [3, 4, 9], [2, 2, 4], [0, 1, 1])


def test_fill_past_capacity_writes_nothing():
    b = TokenBatch(4)
    b.fill([BatchItem(0, [1], 0, [], [0])])
    with pytest.raises(ValueError, match="exceeds max_batch_tokens"):
        b.fill([BatchItem(1, [2, 3, 4], 0, [], [2]), BatchItem(2, [5, 6], 0, [], [1])])
    assert _arrays(b, 1) == ([1], [0], [0], [1]) and b.batch.n_tokens == 1


class FakeOutputs:
    """Stands in for llama.cpp's output buffer: `llama_get_logits` returns `current`."""

    def __init__(self, monkeypatch, rows: int, n_vocab: int):
        self.n_vocab = n_vocab
        self.buffers = []
        self.current = self.new(rows)
        monkeypatch.setattr(batch_mod.L, "llama_get_logits",
                            lambda ctx: ctypes.cast(self.current, ctypes.POINTER(ctypes.c_float)))

    def new(self, rows: int):
        buf = (ctypes.c_float * (rows * self.n_vocab))()
        np.ctypeslib.as_array(buf)[:] = np.arange(rows * self.n_vocab) + 100 * len(self.buffers)
        self.buffers.append(buf)
        return buf


def test_logits_follow_the_output_buffer(monkeypatch):
    out = FakeOutputs(monkeypatch, rows=4, n_vocab=3)
    b = TokenBatch(8)
    b.fill([BatchItem(0, [1, 2], 0, [], [0, 1])])
    assert b.logits(None, 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    kept = b._view
    b.fill([BatchItem(0, [3], 2, [], [0])])
    one = b.logits(None, 3)
    assert one.tolist() == [[0, 1, 2]] and np.shares_memory(one, np.ctypeslib.as_array(out.current))
    assert b._view is kept  # the same buffer: no new view
    # llama.cpp reallocated its buffer (a step needed more rows): the rows come from the new one
    out.current = out.new(rows=4)
    assert b.logits(None, 3).tolist() == [[100, 101, 102]]
    b.fill([BatchItem(0, [1, 2, 3], 0, [], [0, 1, 2])])
    assert b.logits(None, 3).tolist() == [[100, 101, 102], [103, 104, 105], [106, 107, 108]]


def test_logits_of_reordered_items_come_back_in_item_order(monkeypatch):
    FakeOutputs(monkeypatch, rows=4, n_vocab=2)
    b = TokenBatch(8)
    b.fill([BatchItem(3, [1], 0, [], [0]), BatchItem(1, [2, 3], 0, [], [0, 1])], slot_order=True)
    # llama.cpp's rows are slot 1's two, then slot 3's
    assert b.logits(None, 2).tolist() == [[4, 5], [0, 1], [2, 3]]


def test_no_logits_buffer_is_an_error(monkeypatch):
    monkeypatch.setattr(batch_mod.L, "llama_get_logits",
                        lambda ctx: ctypes.POINTER(ctypes.c_float)())
    b = TokenBatch(4)
    b.fill([BatchItem(0, [1], 0, [], [0])])
    with pytest.raises(RuntimeError, match="llama.cpp returned no logits for the step"):
        b.logits(None, 3)
