"""Requantize a GGUF file with llama.cpp's own quantizer (`llama_model_quantize`).

Why: the weight format decides what a multi-token step costs on CPU. K-quants and Q4_1 redo
the weight dot product per token in a step, while Q4_0, Q8_0 and F16 go through tiled
matmuls, so verify steps (speculative decoding) are much cheaper relative to a one-token step
(issue 30's t(n)/t(1) table). Requantizing an already quantized file cannot restore lost
precision: Q8_0 from Q4_K_M keeps Q4_K_M's quality at about twice the size; Q4_0 loses more.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

# target name -> llama_ftype (llama.h `LLAMA_FTYPE_MOSTLY_*`)
TARGETS = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
           "f16": "LLAMA_FTYPE_MOSTLY_F16"}


# weight formats whose multi-token steps go through llama.cpp's tiled CPU matmuls, so a
# verify step of n tokens costs far less than n one-token steps (issue 30's t(n)/t(1) table)
TILED_FORMATS = ("Q4_0", "Q8_0", "F16", "BF16", "F32")


def quantize_gguf(src: str | Path, dst: str | Path, to: str, n_threads: int | None = None
                  ) -> Path:
    """Write `src` requantized to `to` ("q8_0", "q4_0" or "f16") at `dst`, atomically (a
    temporary file beside `dst`, renamed when complete).

    Raises:
        ValueError: unknown `to`.
        RuntimeError: llama.cpp's quantizer failed (its log says why: e.g. an unsupported
            architecture or tensor shape); no file is left at `dst`.
    """
    import llama_cpp

    from backends.llamacpp.runtime import init_backend

    if to not in TARGETS:
        raise ValueError(f"unknown target format {to!r}; choose one of: {', '.join(TARGETS)}")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, TARGETS[to])
    params.nthread = n_threads or os.cpu_count() or 1
    params.allow_requantize = True  # the sources people have are already quantized
    init_backend()  # silences llama.cpp's per-tensor log
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(),
                                      ctypes.byref(params))
    if rc != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not quantize {src} to {to} (code {rc})")
    os.replace(tmp, dst)
    return dst
