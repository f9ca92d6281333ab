"""Fixtures for the MLX backend tests: the embedded GGUF, an MLX runner (and one with a q8_0
KV pool), a llama.cpp reference and an exact f32 numpy reference.

MLX's CPU path is slow (about 100x numpy for matmuls), so tests use prompts of at most 32
tokens and a few decode steps; the runner and reference are loaded once per session.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gguf_path(embedded_model) -> str:
    """The embedded GGUF (see `tests/conftest.py:embedded_model` for when it is there)."""
    return str(embedded_model)


@pytest.fixture(scope="session")
def mlx_runner(gguf_path):
    pytest.importorskip("mlx.core")
    from backends.mlx.runner import MLXRunner

    runner = MLXRunner(gguf_path, max_seqs=8, num_blocks=32, block_size=16)
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def mlx_q8_runner(gguf_path):
    """`mlx_runner`'s twin with `kv_cache_type="q8_0"` (MLX 8-bit affine KV pools)."""
    pytest.importorskip("mlx.core")
    from backends.mlx.runner import MLXRunner

    runner = MLXRunner(gguf_path, max_seqs=8, num_blocks=32, block_size=16,
                       kv_cache_type="q8_0")
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def numpy_ref(gguf_path):
    from tests.mlx.numpy_ref import NumpyLlama

    return NumpyLlama(gguf_path)


@pytest.fixture(scope="session")
def llama_ref(gguf_path):
    pytest.importorskip("llama_cpp")
    from tests.mlx.llamacpp_ref import LlamaCppRef

    ref = LlamaCppRef(gguf_path)
    yield ref
    ref.close()
