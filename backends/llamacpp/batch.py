"""A reusable `llama_batch` over numpy arrays, filled from the engine's `BatchItem`s."""

from __future__ import annotations

import ctypes
from itertools import pairwise

import llama_cpp as L
import numpy as np

from backends.base import BatchItem


class TokenBatch:
    """Holds up to `capacity` tokens; `fill` writes items with numpy (no per-token ctypes
    calls), `logits` reads the wanted rows back in the caller's item order."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._tok = np.zeros(capacity, dtype=np.int32)
        self._pos = np.zeros(capacity, dtype=np.int32)
        self._nseq = np.ones(capacity, dtype=np.int32)
        self._seq = np.zeros(capacity, dtype=np.int32)
        self._want = np.zeros(capacity, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        base = self._seq.ctypes.data
        self._seq_ptrs = (i32p * (capacity + 1))(
            *[ctypes.cast(base + 4 * i, i32p) for i in range(capacity)])
        self.batch = L.llama_batch(
            n_tokens=0,
            token=self._tok.ctypes.data_as(i32p),
            embd=None,
            pos=self._pos.ctypes.data_as(i32p),
            n_seq_id=self._nseq.ctypes.data_as(i32p),
            seq_id=self._seq_ptrs,
            logits=self._want.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )
        self.n_outputs = 0
        self._view: np.ndarray | None = None  # llama.cpp's logits buffer, see `logits`
        self._view_addr = 0
        self._order: list[int] | None = None
        self._rows_per_item: list[int] = []

    def fill(self, items: list[BatchItem], slot_order: bool = False) -> None:
        """Write `items` (one sequence id per token: the item's slot). `slot_order`: lay them
        out by increasing slot, as llama.cpp's split layout builds a micro-batch from
        consecutive, increasing sequence ids (`split_equal(sequential)`; out of order it
        splits into more). Raises ValueError past `capacity` tokens, writing nothing."""
        total = sum(len(item.tokens) for item in items)
        if total > self.capacity:
            raise ValueError(f"step of {total} tokens exceeds max_batch_tokens")
        self._order = None
        if slot_order and any(a.slot > b.slot for a, b in pairwise(items)):
            self._order = sorted(range(len(items)), key=lambda i: items[i].slot)
            items = [items[i] for i in self._order]
        n = 0
        for item in items:
            k = len(item.tokens)
            if k == 1:  # a decode: scalar writes cost a fraction of slice assignments
                self._tok[n] = item.tokens[0]
                self._pos[n] = item.start_pos
                self._seq[n] = item.slot
                self._want[n] = 1 if item.logits_indices else 0
                n += 1
                continue
            self._tok[n:n + k] = item.tokens
            self._pos[n:n + k] = np.arange(item.start_pos, item.start_pos + k, dtype=np.int32)
            self._seq[n:n + k] = item.slot
            self._want[n:n + k] = 0
            for j in item.logits_indices:
                self._want[n + j] = 1
            n += k
        self._rows_per_item = [len(item.logits_indices) for item in items]
        self.n_outputs = sum(self._rows_per_item)
        self.batch.n_tokens = n

    def logits(self, ctx: L.llama_context_p, n_vocab: int) -> np.ndarray:
        """float32 `[n_outputs, n_vocab]` after `llama_decode`, rows in the item order given to
        `fill`: a view of llama.cpp's buffer (valid until the next decode), or a copy if the
        items were reordered. Raises RuntimeError if llama.cpp has no logits buffer."""
        if self.n_outputs == 0:
            return np.empty((0, n_vocab), dtype=np.float32)
        ptr = L.llama_get_logits(ctx)
        if not ptr:
            raise RuntimeError("llama.cpp returned no logits for the step")
        addr = ctypes.addressof(ptr.contents)
        view = self._view
        if view is None or addr != self._view_addr or view.shape[0] < self.n_outputs \
                or view.shape[1] != n_vocab:
            # llama.cpp keeps its output buffer until a step needs more rows than it holds,
            # so a view of the largest step seen at this address stays valid
            view = self._view = np.ctypeslib.as_array(ptr, shape=(self.n_outputs, n_vocab))
            self._view_addr = addr
        logits = view[:self.n_outputs]
        if self._order is None:
            return logits
        starts = np.cumsum([0] + self._rows_per_item)
        rows: list[range] = [range(0)] * len(self._order)
        for k, orig in enumerate(self._order):
            rows[orig] = range(starts[k], starts[k + 1])
        return logits[[r for rs in rows for r in rs]]
