"""Backend selection rules (no mlx or llama.cpp needed: probes are monkeypatched)."""

from __future__ import annotations

import pytest

from backends import select


@pytest.fixture
def machine(monkeypatch):
    def set_(apple=False, nvidia=False, mlx=True, llamacpp=True):
        monkeypatch.setattr(select, "is_apple_silicon", lambda: apple)
        monkeypatch.setattr(select, "has_nvidia_gpu", lambda: nvidia)
        monkeypatch.setattr(select, "mlx_available", lambda: mlx)
        monkeypatch.setattr(select, "llamacpp_available", lambda: llamacpp)
    return set_


def test_apple_silicon_with_mlx_runs_mlx(machine):
    machine(apple=True)
    sel = select.select_backend_with_reason()
    assert sel.backend == "mlx" and "Apple Silicon" in sel.reason


def test_apple_silicon_without_mlx_falls_back(machine):
    machine(apple=True, mlx=False)
    sel = select.select_backend_with_reason()
    assert sel.backend == "llamacpp" and "not installed" in sel.reason


def test_nvidia_runs_llamacpp_cuda(machine):
    machine(nvidia=True)
    sel = select.select_backend_with_reason()
    assert sel.backend == "llamacpp" and "CUDA" in sel.reason


def test_plain_cpu_runs_llamacpp(machine):
    machine()  # mlx[cpu] installed on Linux must not win
    assert select.select_backend() == "llamacpp"


def test_explicit_override(machine):
    machine()
    assert select.select_backend("mlx") == "mlx"
    assert select.select_backend("llamacpp") == "llamacpp"


def test_explicit_override_is_validated(machine):
    machine(mlx=False)
    with pytest.raises(ValueError, match="not installed"):
        select.select_backend("mlx")
    with pytest.raises(ValueError, match="unknown backend"):
        select.select_backend("cuda")

