"""llama.cpp's per-sequence state blob <-> DESIGN.md's backend-neutral KV layout.

Pure numpy, no llama.cpp import: the runner (`LlamaCppRunner.export_kv/import_kv`) fetches and
loads blobs with `llama_state_seq_get_data/set_data`; this module only reads and writes bytes.

Blob layout (packed little-endian, llama.cpp 0.3.36 `llama-kv-cache.cpp: state_write*`,
verified byte-exact, shared/notes/llamacpp.md §2):

    u32 magic 0xaf143cd8 | i32 seq_id | u32 n_stream
    per stream: u32 cell_count; if cell_count > 0:
        per cell: i32 pos | u32 n_seq_id (=1) | i32 seq_id
        u32 v_trans | u32 n_layer
        per layer: i32 k_type | u64 k_row_bytes | K rows [cells][kv_heads*head_dim]
        per layer, v_trans=0: i32 v_type | u64 v_row_bytes | V rows [cells][kv_heads*head_dim]
        per layer, v_trans=1: i32 v_type | u32 el_bytes | u32 kv_heads*head_dim | V [dim][cells]

Neutral layout: per layer (K, V), each `[tokens, kv_heads, head_dim]` float16, tokens in
position order, K post-RoPE in the rotate-half (Hugging Face) convention. A q8_0 cache moves
as its blocks, `[tokens, kv_heads * head_dim / 32]` of `backends.base.Q8_0_BLOCK`, K in the
cache's own order (not de-interleaved: that would cross blocks), bytes copied unchanged.

RoPE convention. llama.cpp ropes K before caching it, so cached K is post-RoPE. Models whose
llama.cpp rope type is NORM (`llama_model_rope_type` == 0: llama, deci, granite, smollm3,
mistral3, ...; list in `llama-model.cpp: llama_model_rope_type`) rotate adjacent pairs
(2i, 2i+1): the GGUF converter permutes HF's Q/K rows per head for them
(`conversion/llama.py: LlamaModel.permute`, HF row h*(d/2)+i -> GGUF row 2i+h), so the cached
K of a head is the HF K with its rotary halves interleaved. NEOX models (qwen2, qwen3, phi3,
gemma, ...) rotate (i, i+d/2) exactly like rotate-half and are stored as HF computes them.
Because NORM on (2i, 2i+1) equals rotate-half on (i, i+d/2), de-interleaving post-RoPE K is
exact (a permutation of f16 values: no rounding). V is never permuted.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from backends.base import KV_TRANSFER_DTYPES, LayerKV, kv_dtype_of, kv_row_bytes, kv_shape

STATE_MAGIC = 0xAF143CD8
GGML_TYPE_F16 = 1  # ggml_type enum values of the KV types that transfer
GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 = 2, 8  # q4_0 KV is only copied as is (`retarget_state`)
_GGML_TYPES = {GGML_TYPE_F16: "f16", GGML_TYPE_Q8_0: "q8_0"}
_GGML_TYPE_OF = {name: t for t, name in _GGML_TYPES.items()}
ROPE_TYPE_NORM = 0  # LLAMA_ROPE_TYPE_NORM: adjacent pairs -> K stored interleaved per head
ROPE_TYPE_NEOX = 2  # LLAMA_ROPE_TYPE_NEOX: half-offset pairs, already rotate-half
_F16 = np.dtype("<f2")


def rope_interleaved(rope_type: int) -> bool:
    """Whether cached K must be de-interleaved per head to reach the neutral layout.

    Raises ValueError for rope types whose K does not map onto the neutral layout (none,
    M-RoPE, vision: their blobs also carry extra per-cell fields)."""
    if rope_type == ROPE_TYPE_NORM:
        return True
    if rope_type == ROPE_TYPE_NEOX:
        return False
    raise ValueError(f"llama.cpp rope type {rope_type} has no neutral KV layout (only NORM 0 "
                     "and NEOX 2 are supported)")


def deinterleave_heads(k: np.ndarray, n_rot: int | None = None) -> np.ndarray:
    """llama.cpp NORM order -> rotate-half order, per head, over the last axis.

    k: `[..., head_dim]`. The first `n_rot` dims (default all) are rotary: llama.cpp pair
    (2i, 2i+1) becomes (i, i+n_rot/2); dims past `n_rot` are not rotated and stay. Returns a
    new array. Raises ValueError if `n_rot` is odd or exceeds head_dim."""
    d = k.shape[-1]
    r = d if n_rot is None else n_rot
    if r % 2 or not 0 < r <= d:
        raise ValueError(f"n_rot {r} must be even and in 1..{d}")
    return np.concatenate([k[..., 0:r:2], k[..., 1:r:2], k[..., r:]], axis=-1)


def interleave_heads(k: np.ndarray, n_rot: int | None = None) -> np.ndarray:
    """Inverse of `deinterleave_heads`: rotate-half order -> llama.cpp NORM order."""
    d = k.shape[-1]
    r = d if n_rot is None else n_rot
    if r % 2 or not 0 < r <= d:
        raise ValueError(f"n_rot {r} must be even and in 1..{d}")
    out = np.empty_like(k)
    out[..., 0:r:2] = k[..., : r // 2]
    out[..., 1:r:2] = k[..., r // 2 : r]
    out[..., r:] = k[..., r:]
    return out


@dataclass(slots=True)
class SeqState:
    """One sequence's KV as llama.cpp saved it, rows in cell order (not position order).

    seq_id: the source sequence (ignored by llama.cpp on load). n_stream: KV streams of the
    context (1 unified, n_seq_max split); must equal the loading context's. stream: the
    stream holding the cells (None when there are none). positions: int32 `[cells]`.
    v_trans: V saved transposed (flash attention off). keys / values: per layer float16
    `[cells, kv_heads, head_dim]` (V un-transposed here) or q8_0 blocks `[cells, blocks]`, or
    a tuple of such arrays to be written one after the other (`concat_states`).
    """

    seq_id: int
    n_stream: int
    stream: int | None
    positions: np.ndarray
    v_trans: bool
    keys: list[np.ndarray]
    values: list[np.ndarray]


class _Reader:
    def __init__(self, buf: memoryview):
        self.buf, self.off = buf, 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.off + size > len(self.buf):
            raise ValueError(f"state blob truncated at byte {self.off}")
        out = struct.unpack_from(fmt, self.buf, self.off)
        self.off += size
        return out

    def array(self, dtype: np.dtype | str, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        if self.off + dt.itemsize * count > len(self.buf):
            raise ValueError(f"state blob truncated at byte {self.off}")
        out = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.off)
        self.off += dt.itemsize * count
        return out


def parse_state(blob, n_kv_heads: int, head_dim: int) -> SeqState:
    """Parse a `llama_state_seq_get_data` blob (any buffer: bytes, ctypes array, ...).

    The returned arrays are views over `blob` (keep it alive; copy to outlive it): float16
    `[cells, n_kv_heads, head_dim]` for an f16 cache, q8_0 blocks `[cells, blocks]` for a
    q8_0 one. Raises ValueError for a bad magic, a truncated or over-long blob, cells in more
    than one stream, a cell with n_seq_id != 1, a KV type other than f16 or q8_0 (or a
    transposed q8_0 V), or rows that are not `n_kv_heads * head_dim` values."""
    r = _Reader(memoryview(blob).cast("B"))
    magic, seq_id, n_stream = r.take("<IiI")
    if magic != STATE_MAGIC:
        raise ValueError(f"not a llama.cpp sequence state (magic {magic:#x})")
    width = n_kv_heads * head_dim
    state = SeqState(seq_id, n_stream, None, np.zeros(0, np.int32), False, [], [])
    for s in range(n_stream):
        (cells,) = r.take("<I")
        if cells == 0:
            continue
        if state.stream is not None:
            raise ValueError("sequence has cells in more than one stream")
        state.stream = s
        meta = r.array("<i4", 3 * cells).reshape(cells, 3)  # pos, n_seq_id, seq_id
        if np.any(meta[:, 1] != 1):
            raise ValueError("cell with n_seq_id != 1 (not a per-sequence blob)")
        state.positions = meta[:, 0]
        v_trans, n_layer = r.take("<II")
        state.v_trans = bool(v_trans)
        for _ in range(n_layer):
            k_type, k_row = r.take("<iQ")
            dtype = _checked_type("K", k_type, k_row, width)
            shape = kv_shape(dtype, cells, n_kv_heads, head_dim)
            state.keys.append(r.array(KV_TRANSFER_DTYPES[dtype], math.prod(shape)).reshape(shape))
        for _ in range(n_layer):
            if v_trans:
                v_type, el, dim = r.take("<iII")
                if v_type != GGML_TYPE_F16:
                    raise ValueError("a transposed V must be f16")
                _checked_type("V", v_type, el * dim, width)
                v = r.array(_F16, dim * cells).reshape(dim, cells).T
                state.values.append(v.reshape(cells, n_kv_heads, head_dim))
            else:
                v_type, v_row = r.take("<iQ")
                dtype = _checked_type("V", v_type, v_row, width)
                shape = kv_shape(dtype, cells, n_kv_heads, head_dim)
                state.values.append(
                    r.array(KV_TRANSFER_DTYPES[dtype], math.prod(shape)).reshape(shape))
    if r.off != len(r.buf):
        raise ValueError(f"{len(r.buf) - r.off} unexpected bytes after the state")
    return state


def _checked_type(which: str, ggml_type: int, row_bytes: int, width: int) -> str:
    """The KV dtype name of a layer's ggml type, its row checked against `width` values."""
    dtype = _GGML_TYPES.get(ggml_type)
    if dtype is None:
        raise ValueError(f"{which} cache type {ggml_type} is not f16 or q8_0 (the KV types "
                         "that transfer)")
    want = kv_row_bytes(dtype, width)
    if row_bytes != want:
        raise ValueError(f"{which} row is {row_bytes} bytes, the model shape implies {want}")
    return dtype


def retarget_state(blob, seq_id: int, n_stream: int, stream: int) -> bytearray:
    """A copy of a one-sequence blob with its cells moved into `stream` of a context of
    `n_stream` streams (and every seq id set to `seq_id`), rows untouched: works for any KV
    type (f16, q8_0, q4_0, ...), transposed V or not. For f16 the bytes equal
    `build_state` of the parsed, retargeted state. An empty sequence stays empty.

    Used to move KV between two contexts of the same model and KV type (the plain-prefill
    context and a slot of the main one). Raises ValueError for a bad magic, a truncated or
    over-long blob, or cells in more than one stream."""
    r = _Reader(memoryview(blob).cast("B"))
    magic, _, src_streams = r.take("<IiI")
    if magic != STATE_MAGIC:
        raise ValueError(f"not a llama.cpp sequence state (magic {magic:#x})")
    body, cells = b"", 0
    for _ in range(src_streams):
        (count,) = r.take("<I")
        if count == 0:
            continue
        if cells:
            raise ValueError("sequence has cells in more than one stream")
        cells, begin = count, r.off
        r.off += 12 * cells  # pos, n_seq_id, seq_id per cell
        v_trans, n_layer = r.take("<II")
        for _ in range(n_layer):
            _, row = r.take("<iQ")
            r.off += cells * row
        for _ in range(n_layer):
            if v_trans:
                _, el, dim = r.take("<iII")
                r.off += el * dim * cells
            else:
                _, row = r.take("<iQ")
                r.off += cells * row
        if r.off > len(r.buf):
            raise ValueError(f"state blob truncated at byte {len(r.buf)}")
        body = bytearray(r.buf[begin:r.off])
        meta = np.frombuffer(body, "<i4", count=3 * cells).reshape(cells, 3)
        if np.any(meta[:, 1] != 1):
            raise ValueError("cell with n_seq_id != 1 (not a per-sequence blob)")
        meta[:, 2] = seq_id
    if r.off != len(r.buf):
        raise ValueError(f"{len(r.buf) - r.off} unexpected bytes after the state")
    out = bytearray(struct.pack("<IiI", STATE_MAGIC, seq_id, n_stream))
    for s in range(n_stream):
        out += struct.pack("<I", cells if s == stream else 0)
        if s == stream and cells:
            out += body
    return out


def _segments(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _row(layer) -> tuple[int, int]:
    """(ggml type, bytes per token) of a layer's K or V (an array or its segments)."""
    a = _segments(layer)[0]
    return (_GGML_TYPE_OF[kv_dtype_of(a)],
            a.dtype.itemsize * math.prod(a.shape[1:]))


def build_state(state: SeqState) -> bytearray:
    """The blob `parse_state` reads back as `state`: the exact inverse (parse -> build
    reproduces llama.cpp's bytes). Written into one preallocated bytearray (ctypes loads it
    without a copy); a layer given as segments (`concat_states`) is written segment by
    segment, so appending a chunk copies the sequence's KV once, not three times."""
    cells = len(state.positions)
    head = struct.pack("<IiI", STATE_MAGIC, state.seq_id, state.n_stream)
    layers = list(zip(state.keys, state.values, strict=True))
    size = len(head) + 4 * state.n_stream + (
        12 * cells + 8 + sum(24 + cells * (_row(k)[1] + _row(v)[1]) for k, v in layers)
        if cells else 0)
    out = bytearray(size)
    buf = np.frombuffer(out, np.uint8)
    off = 0

    def put(data) -> None:
        nonlocal off
        raw = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else (
            np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        buf[off:off + raw.size] = raw
        off += raw.size

    put(head)
    for s in range(state.n_stream):
        if s != state.stream or cells == 0:
            put(struct.pack("<I", 0))
            continue
        meta = np.empty((cells, 3), "<i4")
        meta[:, 0], meta[:, 1], meta[:, 2] = state.positions, 1, state.seq_id
        put(struct.pack("<I", cells))
        put(meta.tobytes())
        put(struct.pack("<II", int(state.v_trans), len(state.keys)))
        for k in state.keys:
            put(struct.pack("<iQ", *_row(k)))
            for seg in _segments(k):
                put(seg)
        for v in state.values:
            segs = _segments(v)
            ggml_type, row_bytes = _row(v)
            if state.v_trans:
                if ggml_type != GGML_TYPE_F16:
                    raise ValueError("a transposed V must be f16")
                full = np.concatenate(segs) if len(segs) > 1 else segs[0]
                put(struct.pack("<iII", GGML_TYPE_F16, 2, row_bytes // 2))
                put(np.ascontiguousarray(full.reshape(cells, row_bytes // 2).T))
            else:
                put(struct.pack("<iQ", ggml_type, row_bytes))
                for seg in segs:
                    put(seg)
    if off != size:
        raise ValueError(f"state of {off} bytes, expected {size}")
    return out


def to_neutral(state: SeqState, start: int, n: int, interleaved: bool,
               n_rot: int | None = None) -> list[LayerKV]:
    """Positions `start .. start+n-1` of `state` in the neutral layout: per layer (K, V),
    new arrays `[n, kv_heads, head_dim]` float16, K de-interleaved if `interleaved`; a q8_0
    state's blocks `[n, blocks]` as they are (`interleaved` does not apply).

    Raises ValueError if the state does not hold each of those positions exactly once."""
    pos = state.positions.astype(np.int64)
    rows = np.full(n, -1, np.int64)
    inside = (pos >= start) & (pos < start + n)
    idx = pos[inside] - start
    if len(np.unique(idx)) != len(idx):
        raise ValueError("state holds a position twice")
    rows[idx] = np.flatnonzero(inside)
    if n and rows.min() < 0:
        raise ValueError(f"state does not hold positions {start}..{start + n - 1}")
    out = []
    for k, v in zip(state.keys, state.values, strict=True):
        k_rows = k[rows]
        if interleaved and k.dtype == _F16:
            k_rows = deinterleave_heads(k_rows, n_rot)
        out.append((k_rows, v[rows]))
    return out


def from_neutral(kv: list[LayerKV], start: int, *, seq_id: int, n_stream: int, stream: int,
                 v_trans: bool, interleaved: bool, n_rot: int | None = None) -> SeqState:
    """A `SeqState` holding neutral `kv` at positions `start ..`, cells in position order.

    kv: per layer (K, V) `[n, kv_heads, head_dim]` float16, or q8_0 blocks `[n, blocks]`
    (K in the cache's order: `interleaved` does not apply). Raises ValueError if layers
    differ in shape or dtype, or are neither."""
    if not kv:
        raise ValueError("no layers")
    shape, dtype = kv[0][0].shape, kv_dtype_of(kv[0][0])
    for k, v in kv:
        if k.shape != shape or v.shape != shape or len(shape) != (3 if dtype == "f16" else 2):
            raise ValueError(f"every K and V must be {dtype} of shape {shape}")
        if k.dtype != kv[0][0].dtype or v.dtype != kv[0][0].dtype:
            raise ValueError(f"every K and V must be {dtype}")
    interleave = interleaved and dtype == "f16"
    keys = [interleave_heads(k, n_rot) if interleave else k for k, _ in kv]
    return SeqState(seq_id, n_stream, stream, np.arange(start, start + shape[0], dtype=np.int32),
                    v_trans, keys, [v for _, v in kv])


def concat_states(head: SeqState, tail: SeqState) -> SeqState:
    """`head`'s cells followed by `tail`'s (same context layout), for appending a chunk to a
    sequence: llama.cpp's load first clears its destination, so a sequence's KV is reloaded
    whole. Layers come back as (head, tail) segments, copied only by `build_state`. Raises
    ValueError if layouts or layer counts differ."""
    if head.stream is None or not len(head.positions):
        return tail
    if (head.n_stream, head.stream, head.v_trans, len(head.keys)) != (
            tail.n_stream, tail.stream, tail.v_trans, len(tail.keys)):
        raise ValueError("states come from different context layouts")
    return SeqState(
        tail.seq_id, tail.n_stream, tail.stream,
        np.concatenate([head.positions, tail.positions]), tail.v_trans,
        [(*_segments(a), *_segments(b)) for a, b in zip(head.keys, tail.keys, strict=True)],
        [(*_segments(a), *_segments(b)) for a, b in zip(head.values, tail.values,
                                                        strict=True)])
