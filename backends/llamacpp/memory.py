"""`residency.MemoryOps` on a llama.cpp context: the four KV-memory calls residency needs."""

from __future__ import annotations

import ctypes
import mmap

import llama_cpp as L
import numpy as np

Buffer = np.ndarray | ctypes.Array | bytes | bytearray  # a blob: any bytes-like object


def blob_pointer(blob: Buffer) -> ctypes._Pointer:
    """`blob`'s first byte as llama.cpp's `uint8_t *`, without a copy."""
    return np.frombuffer(blob, dtype=np.uint8).ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def host_blob(size: int) -> np.ndarray:
    """A writable `size`-byte uint8 array in pages of its own (an anonymous mmap), returned
    to the OS the moment the array is freed. Saved prefixes are megabytes each, live for
    minutes and come and go in other sizes beside each other; from malloc's heap (glibc
    raises its mmap threshold to the size of each large chunk freed, up to 32 MiB) their
    freed holes stayed in the server's RSS and grew it in steps (the soak bench, README)."""
    if size == 0:
        return np.empty(0, dtype=np.uint8)
    return np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)


class ContextMemory:
    """Sequence-level KV operations of one `llama_context`. Positions are token positions;
    `-1` as an end means "to the end", as a start "from 0"."""

    def __init__(self, ctx: L.llama_context_p):
        self._ctx = ctx
        self._mem = L.llama_get_memory(ctx)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Tag `src`'s cells at positions `[p0, p1)` with `dst` too (no copy in one stream)."""
        L.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        """Drop `seq` from its cells at positions `[p0, p1)`."""
        L.llama_memory_seq_rm(self._mem, seq, p0, p1)

    def state_get(self, seq: int) -> np.ndarray:
        """`seq`'s KV as a host-memory blob (uint8, `host_blob`). Its pages are first touched
        by llama.cpp's copy, which runs without the GIL: a blob is megabytes, and zero-filling
        it first (as a ctypes array does) would hold the GIL through thousands of page faults.
        Raises RuntimeError if llama.cpp cannot save it."""
        size = L.llama_state_seq_get_size(self._ctx, seq)
        blob = host_blob(size)
        if L.llama_state_seq_get_data(self._ctx, blob_pointer(blob), size, seq) != size:
            raise RuntimeError("llama.cpp could not save a sequence's KV")
        return blob

    def state_set(self, seq: int, blob: Buffer) -> None:
        """Replace `seq`'s KV with a blob from `state_get`. Raises RuntimeError if refused."""
        if L.llama_state_seq_set_data(self._ctx, blob_pointer(blob), len(blob), seq) == 0:
            raise RuntimeError("llama.cpp refused to restore a saved prefix")
