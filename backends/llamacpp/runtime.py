"""llama.cpp's process-wide runtime and the facts read off a loaded model.

Everything that loads a GGUF through llama-cpp-python goes through here: the runner, the raw
benchmarks and the tests' references, so the load workaround and the log silencer exist once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import llama_cpp as L
from llama_cpp import llama_cpp as _lowlevel

from backends.base import ModelInfo
from backends.llamacpp.kv_plan import kv_token_bytes

# llama.cpp logs "<buffer type> model buffer size = <x> MiB" while it loads weights
_BUFFER_LINE = re.compile(r"(\S+) model buffer size =\s*([0-9.]+) MiB")


class _LoadLog:
    """The process-wide llama.cpp log callback: silent (or passed to stderr when verbose),
    and while `recording`, it keeps the weight buffer sizes llama.cpp reports."""

    def __init__(self) -> None:
        self.verbose = False
        self.recording: dict[str, float] | None = None
        # llama.cpp keeps one process-wide pointer to the callback: it must outlive every caller
        self.callback = L.llama_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes, user: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace")
        if self.recording is not None and (match := _BUFFER_LINE.search(line)):
            self.recording[match.group(1)] = float(match.group(2))
        if self.verbose:
            sys.stderr.write(line)


_load_log = _LoadLog()
_backend_ready = False
_default_model_params = L.llama_model_default_params


def free_native(owner: object) -> None:
    """Free `owner._ctx` (a llama context) and then `owner._model` (its weights) where set,
    and clear them: idempotent, safe from `close()` and `__del__` alike."""
    if getattr(owner, "_ctx", None):
        L.llama_free(owner._ctx)
        owner._ctx = None
    if getattr(owner, "_model", None):
        L.llama_model_free(owner._model)
        owner._model = None


def init_backend(verbose: bool = False) -> None:
    """Initialise llama.cpp once per process; unless `verbose`, silence its log first."""
    global _backend_ready
    _load_log.verbose = _load_log.verbose or verbose
    if not _backend_ready:
        L.llama_log_set(_load_log.callback, ctypes.c_void_p())
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


def model_params(repack: bool = False) -> L.llama_model_params:
    """llama.cpp's default model parameters; `repack` keeps its extra CPU buffer types
    (weights copied at load into the interleaved layouts its GEMV/GEMM kernels read
    faster, as llama-server does). Off by default: only `backends.llamacpp.repack` decides,
    after its probe, that this machine runs them (shared/notes/llamacpp.md)."""
    params = _default_model_params()
    params.use_extra_bufts = repack
    return params


def load_model(path: str | Path, repack: bool = False) -> tuple[L.llama_model_p, dict[str, float]]:
    """Load a GGUF with `model_params(repack)` (initialising the backend, quietly, if
    needed). Returns (model, weight buffers {llama.cpp buffer type: MiB}, e.g.
    {"CPU_Mapped": 85.3, "CPU_REPACK": 57.0}); the caller frees the model with
    `llama_model_free`. Raises ValueError if llama.cpp cannot load it."""
    init_backend()
    buffers: dict[str, float] = {}
    _load_log.recording = buffers
    try:
        model = L.llama_model_load_from_file(str(path).encode(), model_params(repack))
    finally:
        _load_log.recording = None
    if not model:
        raise ValueError(f"llama.cpp could not load {path} (not a GGUF model it supports?)")
    return model, buffers


@contextlib.contextmanager
def patched_default_params(repack: bool = False) -> Iterator[None]:
    """While active, llama-cpp-python's high-level `Llama` loads with `model_params(repack)`
    (its constructor has no `use_extra_bufts` argument)."""
    original = _lowlevel.llama_model_default_params
    _lowlevel.llama_model_default_params = lambda: model_params(repack)
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


def kv_bytes_per_token(model: L.llama_model_p, kv_cache_type: str = "f16") -> int:
    """K and V bytes one token takes across all layers in `kv_cache_type` (f16, q8_0,
    q4_0; `kv_plan.kv_token_bytes`). Raises ValueError for a type the rows cannot take."""
    return kv_token_bytes(L.llama_model_n_layer(model), L.llama_model_n_head_kv(model),
                          head_dim(model), kv_cache_type)


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
