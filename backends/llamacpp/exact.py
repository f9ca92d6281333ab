"""Exact mode: llama.cpp settings under which a token's logits do not depend on how the
step around it was grouped (issue 31; README, "Same answer every time").

On llama.cpp's CPU backend three things make a token's logits depend on its step's shape
(README, "Grouping invariance", read in ggml-cpu of the wheel the installer builds):
flash attention picks a kernel by the number of queries in a step; llamafile's tinyBLAS
(`llamafile_sgemm`) takes every matmul of 2 or more columns, `vec_dot` the 1-column ones,
and the two sum in different orders; repacked weights use a GEMM for 4 or more rows and a
GEMV below. Exact mode turns all three off: flash attention off and plain weights are
context settings, and tinyBLAS is a build option (`GGML_LLAMAFILE=OFF`), so it loads a
second llama.cpp library that the installer builds without it (`install.sh --exact`, also
part of `--dev`). Every matmul then computes each output element as one `vec_dot` over
the whole row, whatever else shares the step (read and measured on x86-64; an ARM build
with int8 matrix-multiply kernels computes two rows per `vec_dot`, which is not measured).

The library is chosen by llama-cpp-python when it is first imported
(`LLAMA_CPP_LIB_PATH`), so `select_library()` must run before anything imports
`llama_cpp`; the CLI does that for `--exact`. This module imports nothing of llama.cpp.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LIB_ENV = "TANDEM_EXACT_LIB"  # a directory holding the exact build's libllama.so and ggml
LIB_DIR_NAME = "tandem-llama-exact"  # under the venv's lib/, where install.sh puts it
INSTALL_HINT = "bash installers/install.sh --exact"
NOT_ON_MLX = ("--exact is for the llamacpp backend; the MLX backend's grouping invariance is "
              "not measured yet")


def library_dir() -> Path:
    """Where the exact build's shared libraries are: $TANDEM_EXACT_LIB, else
    `<venv>/lib/tandem-llama-exact`."""
    return Path(os.environ.get(LIB_ENV) or Path(sys.prefix) / "lib" / LIB_DIR_NAME)


def installed(lib: Path | None = None) -> bool:
    """Whether the exact build's libllama is in `lib` (default: `library_dir()`)."""
    lib = lib or library_dir()
    return (lib / "libllama.so").is_file() or (lib / "libllama.dylib").is_file()


def select_library() -> Path:
    """Make the exact build the llama.cpp library this process loads. Returns its
    directory. Raises ValueError when it is not installed, or when `llama_cpp` was
    already imported with another library (it cannot be swapped in a running process)."""
    lib = library_dir()
    if not installed(lib):
        raise ValueError(f"--exact needs llama.cpp built without llamafile's tinyBLAS, "
                         f"which is not installed at {lib}; run `{INSTALL_HINT}`")
    if "llama_cpp" in sys.modules:
        if os.environ.get("LLAMA_CPP_LIB_PATH") != str(lib):
            raise ValueError("--exact must choose the llama.cpp library before llama.cpp "
                             "is loaded, and this process loaded the default one: start "
                             "a new process with --exact")
        return lib
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib)
    return lib


def bench_settings(exact: bool) -> dict[str, object]:
    """The `RunnerConfig` settings of an exactness bench: exact mode's (the exact library
    selected first, so call this before anything imports `llama_cpp`), or tandem's defaults
    (flash attention on, repacking auto). Raises as `select_library`."""
    if not exact:
        return {"flash_attn": "on", "repack": "auto"}
    select_library()
    return {"flash_attn": "off", "repack": "off", "exact": True}


def library_is_exact(system_info: str) -> bool:
    """Whether a llama.cpp library whose `llama_print_system_info()` is `system_info`
    was built without tinyBLAS (ggml-cpu lists "LLAMAFILE = 1" when built with it)."""
    return "LLAMAFILE = 1" not in system_info


def resolve(*, flash_attn: str, repack: str, kv_cache_type: str, kv_layout: str
            ) -> tuple[str, str]:
    """Exact mode's (flash_attn, repack) from the requested ones: "auto" becomes "off".
    Raises ValueError naming the setting that exact mode cannot keep: flash attention or
    repacked weights "on", a quantized KV cache (llama.cpp quantizes V only with flash
    attention) or the unified layout (a sequence's attention then runs beside others')."""
    conflicts = []
    if flash_attn == "on":
        conflicts.append("flash attention on (its kernel depends on the queries in a step)")
    if repack == "on":
        conflicts.append("--repack on (a GEMM for 4+ rows, a GEMV below)")
    if kv_cache_type != "f16":
        conflicts.append(f"--kv-cache-type {kv_cache_type} (a quantized V needs flash "
                         "attention)")
    if kv_layout == "unified":
        conflicts.append("--kv-layout unified (sequences share one attention stream)")
    if conflicts:
        raise ValueError("--exact cannot be combined with " + "; ".join(conflicts))
    return "off", "off"
