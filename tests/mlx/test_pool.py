"""Pool writes stay O(update), not O(pool): the pool buffer must remain donatable.

If anything keeps a second reference to a pool (a view, `state`, a debug handle), MLX copies
the whole pool on every scatter (shared/notes/mlx.md §1: 25 ms vs 176 ms for 32 vs 256 MiB
pools on CPU, against 0.22 ms when donated).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from backends.mlx.paged_cache import (  # noqa: E402
    PagedLayerCache,
    QuantizedPagedLayerCache,
    build_layout,
)

KV_HEADS, HEAD_DIM = 4, 64


def _median_write_ms(cache_cls, n_rows: int, via_model_protocol: bool,
                     repeats: int = 15) -> float:
    """Median time of storing 16 tokens: a bare `write`, or `update_and_fetch` as a model
    layer calls it (scatter, then gather of the row's 32 positions)."""
    cache = cache_cls(n_rows, KV_HEADS, HEAD_DIM, mx.float16)
    mx.eval(cache.keys, cache.values)
    k = mx.ones((16, KV_HEADS, HEAD_DIM), dtype=mx.float16)
    k4 = mx.ones((1, KV_HEADS, 16, HEAD_DIM), dtype=mx.float16)
    block_size = 16
    num_blocks = (n_rows - 1) // block_size
    times = []
    for i in range(repeats):
        first = (i * 2) % (num_blocks - 2)
        if via_model_protocol:
            cache.layout = build_layout([16], [16], [[first, first + 1]], block_size,
                                        num_blocks)
            mx.eval(cache.layout.write_rows, cache.layout.read_rows, cache.layout.mask)
            t = time.perf_counter()
            kk, vv = cache.update_and_fetch(k4, k4)
            mx.eval(kk, vv, cache.keys, cache.values)
        else:
            rows = mx.array(np.arange(16, dtype=np.int32) + first * block_size)
            mx.eval(rows)
            t = time.perf_counter()
            cache.write(rows, k, k)
            mx.eval(cache.keys, cache.values)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


@pytest.mark.parametrize("cache_cls", [PagedLayerCache, QuantizedPagedLayerCache])
@pytest.mark.parametrize("via_model_protocol", [False, True])
def test_write_time_does_not_grow_with_pool_size(cache_cls, via_model_protocol):
    small = 16 * 1024 + 1  # rows: 8 MiB per f16 pool (+ trash row), 4.25 MiB quantized
    big = 8 * 16 * 1024 + 1  # 64 MiB per f16 pool
    t_small = _median_write_ms(cache_cls, small, via_model_protocol)
    t_big = _median_write_ms(cache_cls, big, via_model_protocol)
    print(f"\n{cache_cls.__name__} write "
          f"({'update_and_fetch' if via_model_protocol else 'write'}): "
          f"{t_small:.3f} ms (small pools) vs {t_big:.3f} ms (8x the rows)")
    assert t_big < 3 * t_small + 0.5  # +0.5 ms absorbs scheduler noise on shared CPUs


def test_a_live_view_does_make_writes_copy():
    """Guards the test above: with a second reference the write time does scale."""
    n = 8 * 16 * 1024
    cache = PagedLayerCache(n, KV_HEADS, HEAD_DIM, mx.float16)
    mx.eval(cache.keys, cache.values)
    k = mx.ones((16, KV_HEADS, HEAD_DIM), dtype=mx.float16)
    rows = mx.arange(16)
    donated, held = [], []
    for _ in range(5):
        t = time.perf_counter()
        cache.write(rows, k, k)
        mx.eval(cache.keys, cache.values)
        donated.append(time.perf_counter() - t)
    for _ in range(5):
        # a slice shares the pool buffer (assigning `cache.keys` to a name would not: the
        # in-place `keys[rows] = ...` rebinds that same Python object)
        view = cache.keys[:1]
        mx.eval(view)
        t = time.perf_counter()
        cache.write(rows, k, k)
        mx.eval(cache.keys, cache.values)
        held.append(time.perf_counter() - t)
        del view
    print(f"\nwrite into a 64 MiB pool: {np.median(donated) * 1e3:.3f} ms donated, "
          f"{np.median(held) * 1e3:.3f} ms with a live view")
    assert np.median(held) > 2 * np.median(donated)


def test_layout_masks_ragged_rows():
    lay = build_layout(starts=[0, 5], lengths=[3, 1], block_tables=[[2], [0]], block_size=8,
                       num_blocks=4)
    mask = np.array(lay.mask)
    assert mask.shape == (2, 1, 3, 6)
    assert mask[0, 0, 0].tolist() == [True, False, False, False, False, False]
    assert mask[0, 0, 2].tolist() == [True, True, True, False, False, False]
    assert mask[1, 0, 0].tolist() == [True] * 6
    write = np.array(lay.write_rows).reshape(2, 3)
    assert write[0].tolist() == [16, 17, 18]
    assert write[1].tolist() == [5, 32, 32]  # pads go to the trash row (4 * 8)
    assert np.array(lay.offset).tolist() == [0, 5]
    with pytest.raises(ValueError):
        build_layout([0], [9], [[0]], 8, 4)
