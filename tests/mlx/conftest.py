"""Fixtures for the MLX backend tests: the embedded GGUF, an MLX runner, a llama.cpp reference
and an exact f32 numpy reference.

MLX's CPU path is slow (about 100x numpy for matmuls), so tests use prompts of at most 32
tokens and a few decode steps; the runner and reference are loaded once per session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_CANDIDATES = ("/tmp/smollm2.gguf",)


def _find_gguf() -> str | None:
    env = os.environ.get("TANDEM_TEST_GGUF")
    if env:
        return env if Path(env).is_file() else None
    tandem = Path(sys.executable).with_name("tandem")
    if tandem.exists():
        try:
            out = subprocess.run([str(tandem), "models", "path", "smollm2-135m-instruct"],
                                 capture_output=True, text=True, timeout=60)
            path = out.stdout.strip().splitlines()[-1] if out.returncode == 0 else ""
            if path and Path(path).is_file():
                return path
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    return next((p for p in _CANDIDATES if Path(p).is_file()), None)


@pytest.fixture(scope="session")
def gguf_path() -> str:
    path = _find_gguf()
    if path is None:
        pytest.skip("embedded model GGUF not found (set TANDEM_TEST_GGUF)")
    return path


@pytest.fixture(scope="session")
def mlx_runner(gguf_path):
    pytest.importorskip("mlx.core")
    from backends.mlx.runner import MLXRunner

    runner = MLXRunner(gguf_path, max_seqs=8, num_blocks=32, block_size=16)
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
