"""The llama.cpp runner's KV export, de-interleaved to the neutral layout, against the MLX
runner's (already neutral: its GGUF loader un-permutes llama Q/K weights) on the embedded
model. They agree to llama.cpp's f16/Q8 activation noise, and disagree by more than the
signal itself without the per-head permutation."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from backends.base import BatchItem  # noqa: E402
from backends.llamacpp import kv_transfer as kvt  # noqa: E402
from backends.llamacpp.runner import LlamaCppRunner  # noqa: E402

TABLE = [30, 31]  # two 16-token blocks of the shared MLX runner's pool


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float32), b.astype(np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_llamacpp_export_matches_mlx_export(gguf_path, mlx_runner):
    lc = LlamaCppRunner(gguf_path, max_seqs=1, seq_tokens=256, block_size=16, n_threads=2)
    toks = lc.tokenizer.encode("The capital of France is Paris, and", add_special=True)
    n = len(toks)
    lc.execute([BatchItem(0, toks, 0, TABLE, [])])
    ours = lc.export_kv(0, TABLE, 0, n)
    lc.close()
    mlx_runner.execute([BatchItem(7, toks, 0, TABLE, [n - 1])])
    ref = mlx_runner.export_kv(7, TABLE, 0, n)
    k_err = [_rel(a[0], b[0]) for a, b in zip(ours, ref, strict=True)]
    v_err = [_rel(a[1], b[1]) for a, b in zip(ours, ref, strict=True)]
    raw_err = [_rel(kvt.interleave_heads(a[0]), b[0]) for a, b in zip(ours, ref, strict=True)]
    print(f"K rel err max {max(k_err):.4f}, V {max(v_err):.4f}, unpermuted K "
          f"min {min(raw_err):.3f}")
    # llama.cpp quantizes activations to Q8 for its Q4_1 matmuls, MLX runs f32
    assert max(k_err) < 0.05 and max(v_err) < 0.1
    assert min(raw_err) > 1.0  # K left in llama.cpp's interleaved order is another tensor
