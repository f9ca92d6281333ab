"""A paged KV pool that mlx-lm's model definitions use through their own cache protocol.

mlx-lm's attention layers (llama, qwen2, qwen3, ...) call, per layer and forward pass
(`mlx_lm/models/llama.py: Attention.__call__`, `models/base.py: create_attention_mask`):

    q = rope(q, offset=cache.offset); k = rope(k, offset=cache.offset)
    k, v = cache.update_and_fetch(k, v)      # in [B, kv_heads, L, head_dim]
    mask = cache.make_mask(L, ...)           # once per forward, from one layer's cache

`PagedLayerCache` answers those calls over one layer's pool: new K/V are scattered into the
pool rows of the engine's blocks and each row's blocks are gathered back for attention, with a
boolean mask for ragged rows. Batch rows are right-padded to the longest row; pad tokens write
into a trash row that no sequence reads. The geometry of one forward (`StepLayout`) is shared
by all layers. `QuantizedPagedLayerCache` keeps the same pools in MLX's affine 8 bits
(`--kv-cache-type q8_0` on MLX) and dequantizes the rows it gathers.

Pool writes are in place only while the pool buffer is *donatable* (no other live reference);
otherwise MLX copies the whole pool on every write (shared/notes/mlx.md §1, "MLX write cost").
So the pools are only ever held by their cache object, never exposed as views.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np


@dataclass(slots=True)
class StepLayout:
    """Index arrays of one forward pass over `B` rows padded to `L` tokens, reading `S` keys.

    offset: `[B]` int32, position of each row's first new token (RoPE offset).
    write_rows: `[B*L]` int32, pool row of each new token (row-major over `[B, L]`); pads map
        to the trash row.
    read_rows: `[B, S]` int32, pool rows of positions `0..S-1` of each row; positions past
        the row's end map to the trash row.
    mask: `[B, 1, L, S]` bool, key `j` visible to query `t` of row `b` iff
        `j <= offset[b] + t` (causal; pad queries see finite trash keys, never an empty row).
    """

    offset: mx.array
    write_rows: mx.array
    read_rows: mx.array
    mask: mx.array


def build_layout(starts: list[int], lengths: list[int], block_tables: list[list[int]],
                 block_size: int, num_blocks: int) -> StepLayout:
    """Layout for rows computing `lengths[b]` tokens from position `starts[b]` in the blocks
    `block_tables[b]` (engine block ids `< num_blocks`). The trash row is
    `num_blocks * block_size`. Raises ValueError if a table is too short or out of range."""
    B, L = len(starts), max(lengths)
    S = max(s + n for s, n in zip(starts, lengths, strict=True))
    trash = num_blocks * block_size
    write = np.full((B, L), trash, dtype=np.int32)
    read = np.full((B, S), trash, dtype=np.int32)
    for b, (s, n, table) in enumerate(zip(starts, lengths, block_tables, strict=True)):
        end = s + n
        bt = np.asarray(table, dtype=np.int64)
        if len(bt) * block_size < end:
            raise ValueError(f"block table of row {b} covers {len(bt) * block_size} positions, "
                             f"needs {end}")
        if len(bt) and (bt.min() < 0 or bt.max() >= num_blocks):
            raise ValueError(f"block id out of range [0, {num_blocks}) in row {b}")
        pos = np.arange(end)
        rows = bt[pos // block_size] * block_size + pos % block_size
        read[b, :end] = rows
        write[b, :n] = rows[s:]
    off = np.asarray(starts, dtype=np.int32)
    mask = np.arange(S)[None, None, :] <= (off[:, None, None] + np.arange(L)[None, :, None])
    return StepLayout(offset=mx.array(off), write_rows=mx.array(write.reshape(-1)),
                      read_rows=mx.array(read), mask=mx.array(mask[:, None]))


class PagedLayerCache:
    """mlx-lm cache object for one layer over a K and a V pool
    `[num_blocks*block_size + 1, kv_heads, head_dim]` (the last row is the trash row).

    The runner sets `layout` before each forward. K is stored after RoPE, in the Hugging Face
    rotate-half convention (the GGUF loader un-permutes llama Q/K weights).
    """

    def __init__(self, n_rows: int, kv_heads: int, head_dim: int, dtype: mx.Dtype,
                 v_head_dim: int | None = None):
        self.keys = mx.zeros((n_rows, kv_heads, head_dim), dtype=dtype)
        self.values = mx.zeros((n_rows, kv_heads, v_head_dim or head_dim), dtype=dtype)
        self.layout: StepLayout | None = None

    # -- the protocol mlx-lm models call -------------------------------------------------

    @property
    def offset(self) -> mx.array:
        """`[B]` int32 RoPE offsets of the current forward."""
        return self.layout.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Store new `[B, kv_heads, L, head_dim]` K/V; return every row's K/V
        `[B, kv_heads, S, head_dim]` for positions `0..S-1` (trash beyond a row's end)."""
        lay = self.layout
        self.write(lay.write_rows, _rows(keys), _rows(values))
        k, v = self.read(lay.read_rows)
        return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None):
        """`[B, 1, N, S]` bool mask of the current forward. Sliding windows are refused (no
        allowlisted architecture uses them)."""
        if window_size is not None:
            raise NotImplementedError("sliding-window attention is not supported by the "
                                      "paged MLX cache")
        return self.layout.mask

    def is_trimmable(self) -> bool:
        # Rollback is the engine's business (it rewrites positions); mlx-lm's own trim path
        # must not be used on this cache.
        return False

    def empty(self) -> bool:
        return False

    def __bool__(self) -> bool:
        # mlx-lm skips make_mask for a falsy cache (base.py: `if cache and ...`).
        return True

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    # -- pool access for the runner ------------------------------------------------------

    def write(self, rows: mx.array, k: mx.array, v: mx.array) -> None:
        """Scatter `[n, kv_heads, head_dim]` K/V into pool rows `rows` `[n]`, in place while
        the pools are donatable."""
        self.keys[rows] = k.astype(self.keys.dtype)
        self.values[rows] = v.astype(self.values.dtype)

    def read(self, rows: mx.array) -> tuple[mx.array, mx.array]:
        """Copies of pool rows `rows` (int32, any shape `R`) -> K, V `[*R, kv_heads,
        head_dim]`."""
        return self.keys[rows], self.values[rows]


# `--kv-cache-type q8_0` on MLX: MLX's affine 8-bit quantization (mlx-lm's QuantizedKVCache),
# not llama.cpp's block_q8_0. Scales and biases are f16 whatever the compute dtype, so a
# group of 64 values takes 64 + 4 bytes: 0.53x f16, as llama.cpp's q8_0 (34 bytes per 32).
KV_BITS = 8
KV_SCALE_DTYPE = mx.float16


def kv_group_size(*dims: int) -> int:
    """The quantization group of head dims `dims`: 64 where it divides them all, else 32.
    Raises ValueError if 32 does not divide them either."""
    for g in (64, 32):
        if all(d % g == 0 for d in dims):
            return g
    raise ValueError(f"--kv-cache-type q8_0 on MLX needs head dims divisible by 32, not "
                     f"{', '.join(map(str, dims))}")


class QuantizedPagedLayerCache(PagedLayerCache):
    """`PagedLayerCache` over pools quantized with `mx.quantize` (affine, `KV_BITS` bits,
    group `kv_group_size(head_dim)`): `keys` and `values` are each a triplet of arrays
    (packed uint32 `[n_rows, kv_heads, head_dim*bits/32]`, scales and biases
    `KV_SCALE_DTYPE` `[n_rows, kv_heads, head_dim/group]`). Rows are quantized on `write`
    and dequantized to `dtype` on `read`, so the models see plain K/V (this class has no
    `bits` attribute: mlx-lm would then expect quantized tuples from `update_and_fetch`).
    Raises ValueError as `kv_group_size`."""

    def __init__(self, n_rows: int, kv_heads: int, head_dim: int, dtype: mx.Dtype,
                 v_head_dim: int | None = None):
        v_head_dim = v_head_dim or head_dim
        self.group_size = kv_group_size(head_dim, v_head_dim)
        self.dtype = dtype
        self.keys = self._zeros(n_rows, kv_heads, head_dim)
        self.values = self._zeros(n_rows, kv_heads, v_head_dim)
        self.layout = None

    def _zeros(self, n_rows: int, kv_heads: int, dim: int) -> tuple[mx.array, ...]:
        per_word = 32 // KV_BITS
        groups = dim // self.group_size
        return (mx.zeros((n_rows, kv_heads, dim // per_word), dtype=mx.uint32),
                mx.zeros((n_rows, kv_heads, groups), dtype=KV_SCALE_DTYPE),
                mx.zeros((n_rows, kv_heads, groups), dtype=KV_SCALE_DTYPE))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.keys, *self.values))

    def write(self, rows: mx.array, k: mx.array, v: mx.array) -> None:
        """Quantize `[n, kv_heads, head_dim]` K/V and scatter them into pool rows `rows`
        `[n]`, in place while the pools are donatable."""
        for pool, x in ((self.keys, k), (self.values, v)):
            parts = mx.quantize(x.astype(KV_SCALE_DTYPE), group_size=self.group_size,
                                bits=KV_BITS)
            for dst, part in zip(pool, parts, strict=True):
                dst[rows] = part

    def read(self, rows: mx.array) -> tuple[mx.array, mx.array]:
        """Pool rows `rows` (int32, any shape `R`) dequantized to `dtype` -> K, V
        `[*R, kv_heads, head_dim]`."""
        return tuple(mx.dequantize(*(a[rows] for a in pool), group_size=self.group_size,
                                   bits=KV_BITS, dtype=self.dtype)
                     for pool in (self.keys, self.values))


def _rows(x: mx.array) -> mx.array:
    """`[B, H, L, D]` -> `[B*L, H, D]`, row-major over (B, L) like `StepLayout.write_rows`."""
    B, H, L, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B * L, H, D)
