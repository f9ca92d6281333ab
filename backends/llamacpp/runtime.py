"""llama.cpp's process-wide runtime and the facts read off a loaded model.

Everything that loads a GGUF through llama-cpp-python goes through here: the runner, the raw
benchmarks and the tests' references, so the load workaround and the log silencer exist once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import llama_cpp as L
from llama_cpp import llama_cpp as _lowlevel

from backends.base import ModelInfo

# llama.cpp keeps one process-wide pointer to the log callback: it must outlive every caller
_log_silencer = L.llama_log_callback(lambda level, text, user: None)
_backend_ready = False
_default_model_params = L.llama_model_default_params


def init_backend(verbose: bool = False) -> None:
    """Initialise llama.cpp once per process; unless `verbose`, silence its log first."""
    global _backend_ready
    if not _backend_ready:
        if not verbose:
            L.llama_log_set(_log_silencer, ctypes.c_void_p())
        L.llama_backend_init()
        _backend_ready = True


def physical_memory_bytes() -> int:
    """Physical memory of this machine in bytes (POSIX sysconf); 8 GiB where unknown."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_threads() -> int:
    """Worker threads for llama.cpp: the CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 4


def model_params() -> L.llama_model_params:
    """llama.cpp's default model parameters with extra buffer types off: AMX repacking
    crashes on CPUs whose kernel refuses AMX tiles (shared/notes/llamacpp.md §2)."""
    params = _default_model_params()
    params.use_extra_bufts = False
    return params


def load_model(path: str | Path) -> L.llama_model_p:
    """Load a GGUF with `model_params()` (initialising the backend, quietly, if needed); the
    caller frees it with `llama_model_free`. Raises ValueError if llama.cpp cannot load it."""
    init_backend()
    model = L.llama_model_load_from_file(str(path).encode(), model_params())
    if not model:
        raise ValueError(f"llama.cpp could not load {path} (not a GGUF model it supports?)")
    return model


@contextlib.contextmanager
def patched_default_params() -> Iterator[None]:
    """While active, llama-cpp-python's high-level `Llama` loads with `model_params()` (its
    constructor has no `use_extra_bufts` argument)."""
    original = _lowlevel.llama_model_default_params
    _lowlevel.llama_model_default_params = model_params
    try:
        yield
    finally:
        _lowlevel.llama_model_default_params = original


def meta(model: L.llama_model_p, key: str) -> str | None:
    """A GGUF metadata value as text (None if the model has no such key)."""
    buf = ctypes.create_string_buffer(512)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", errors="replace") if n >= 0 else None


def head_dim(model: L.llama_model_p) -> int:
    """Width of one attention head (embedding width / query heads)."""
    return L.llama_model_n_embd(model) // max(1, L.llama_model_n_head(model))


def kv_bytes_per_token(model: L.llama_model_p) -> int:
    """f16 K and V bytes one token takes across all layers."""
    return 2 * 2 * L.llama_model_n_layer(model) * L.llama_model_n_head_kv(model) * head_dim(model)


def rope_theta(model: L.llama_model_p, architecture: str) -> float:
    """RoPE base frequency from `<arch>.rope.freq_base`, else llama.cpp's default 10000."""
    value = meta(model, f"{architecture}.rope.freq_base")
    return float(value) if value else 10000.0


def model_info(model: L.llama_model_p, fallback_name: str, n_vocab: int) -> ModelInfo:
    """`ModelInfo` from a loaded model's metadata; `fallback_name` when it has no
    `general.name`."""
    architecture = meta(model, "general.architecture") or "unknown"
    return ModelInfo(
        name=meta(model, "general.name") or fallback_name,
        architecture=architecture,
        n_layers=L.llama_model_n_layer(model),
        n_kv_heads=L.llama_model_n_head_kv(model),
        head_dim=head_dim(model),
        n_vocab=n_vocab,
        n_ctx_train=L.llama_model_n_ctx_train(model),
        rope_theta=rope_theta(model, architecture),
    )
