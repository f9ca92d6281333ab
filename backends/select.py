"""Automatic backend selection: which runner fits this machine, and why.

Rules (issue 5): Apple Silicon with mlx importable -> "mlx"; an NVIDIA driver (`nvidia-smi`
on PATH) -> "llamacpp" (CUDA build); otherwise "llamacpp" on the CPU. An explicit choice
(`--backend`) is validated: unknown names and backends that cannot load here are refused.

Nothing here imports mlx or llama_cpp at module import time; probes use
`importlib.util.find_spec` and package metadata, so `tandem doctor` stays fast.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import shutil
from dataclasses import dataclass

BACKENDS = ("llamacpp", "mlx")

# from a clone (tandem is not on PyPI): the installer adds the mlx extra on Apple Silicon
# and, with --dev, MLX's CPU build on Linux; or the extra itself, into the venv
MLX_INSTALL_HINT = ("from the clone: bash installers/install.sh (on Linux: --dev, MLX's CPU "
                    "build), or .venv/bin/pip install -e '.[mlx]'")

_PACKAGES = {"mlx": "mlx", "mlx_lm": "mlx-lm", "llama_cpp": "llama-cpp-python"}


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen backend and a one-line reason a user can act on."""

    backend: str
    reason: str


def is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def package_version(module: str) -> str | None:
    """Installed distribution version for a module name, or None if not installed."""
    try:
        return importlib.metadata.version(_PACKAGES.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return None


def mlx_available() -> bool:
    return module_available("mlx") and module_available("mlx_lm")


def llamacpp_available() -> bool:
    return module_available("llama_cpp")


def select_backend_with_reason(requested: str | None = None) -> Selection:
    """Pick a backend. Raises ValueError for an unknown or unavailable explicit request."""
    if requested is not None:
        if requested not in BACKENDS:
            raise ValueError(f"unknown backend {requested!r} (choose from {', '.join(BACKENDS)})")
        if requested == "mlx" and not mlx_available():
            raise ValueError(f"backend 'mlx' requested but mlx/mlx-lm are not installed "
                             f"({MLX_INSTALL_HINT})")
        if requested == "llamacpp" and not llamacpp_available():
            raise ValueError("backend 'llamacpp' requested but llama-cpp-python is not "
                             "installed")
        if requested == "mlx" and not is_apple_silicon():
            return Selection("mlx", "requested with --backend (CPU-only MLX: slow, for tests)")
        return Selection(requested, "requested with --backend")
    if is_apple_silicon():
        if mlx_available():
            return Selection("mlx", "Apple Silicon and mlx is installed (Metal, unified memory)")
        return Selection("llamacpp", "Apple Silicon but mlx is not installed "
                                     f"({MLX_INSTALL_HINT}, for the faster backend)")
    if has_nvidia_gpu():
        return Selection("llamacpp", "NVIDIA GPU found (nvidia-smi): llama.cpp with CUDA")
    return Selection("llamacpp", "no Apple Silicon or NVIDIA GPU: llama.cpp on the CPU")


def select_backend(requested: str | None = None) -> str:
    """Name of the backend to run ("mlx" or "llamacpp"); see `select_backend_with_reason`."""
    return select_backend_with_reason(requested).backend
