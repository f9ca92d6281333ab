"""The two-box layout conversions are exact: llama.cpp's cached KV -> neutral -> an MLX
runner's pool -> neutral -> back into llama.cpp gives the same K/V bit for bit and the same
llama.cpp state bytes, for a llama-architecture model (K rows interleaved per head in
llama.cpp, NORM rope) and a qwen2 one (NEOX rope, no permutation)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from backends.base import BatchItem  # noqa: E402
from backends.llamacpp import kv_transfer as kvt  # noqa: E402
from backends.llamacpp.memory import ContextMemory  # noqa: E402
from backends.llamacpp.runner import LlamaCppRunner  # noqa: E402
from backends.mlx.runner import MLXRunner  # noqa: E402
from tests.conftest import store_model  # noqa: E402

TABLE = [3, 4]  # two 16-token blocks


@pytest.mark.parametrize("model, interleaved", [("smollm2-135m-instruct", True),
                                                ("qwen2.5-coder-0.5b-instruct", False)])
def test_llamacpp_neutral_mlx_neutral_llamacpp_is_the_identity(model, interleaved):
    path = str(store_model(model))
    lc = LlamaCppRunner(path, max_seqs=2, seq_tokens=256, block_size=16, n_threads=2)
    assert lc._kv_facts()[0] is interleaved
    toks = lc.tokenizer.encode("The capital of France is Paris, and", add_special=True)
    n = len(toks)
    lc.execute([BatchItem(0, toks, 0, TABLE, [])])
    blob = bytes(ContextMemory(lc._ctx).state_get(0))
    sent = lc.export_kv(0, TABLE, 0, n)

    mlx = MLXRunner(path, max_seqs=1, num_blocks=8, block_size=16)
    mlx.import_kv(0, TABLE, 0, sent)
    back = mlx.export_kv(0, TABLE, 0, n)
    mlx.close()
    for (k0, v0), (k1, v1) in zip(sent, back, strict=True):
        assert k1.dtype == np.float16 and k1.shape == k0.shape
        assert k0.view(np.uint16).tobytes() == k1.view(np.uint16).tobytes()
        assert v0.view(np.uint16).tobytes() == v1.view(np.uint16).tobytes()

    lc.import_kv(1, TABLE, 0, back)
    again = bytes(ContextMemory(lc._ctx).state_get(1))
    # the same cells in llama.cpp's own layout; only the stream and sequence id name slot 1
    assert len(again) == len(blob)
    a, b = (kvt.parse_state(x, lc.info.n_kv_heads, lc.info.head_dim) for x in (blob, again))
    assert (a.stream, b.stream, a.positions.tolist()) == (0, 1, b.positions.tolist())
    for x, y in zip(a.keys + a.values, b.keys + b.values, strict=True):
        assert x.tobytes() == y.tobytes()
    lc.close()
