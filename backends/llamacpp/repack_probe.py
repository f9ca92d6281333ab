"""The repacked-weights probe, run in a subprocess by `backends.llamacpp.repack`.

usage: python -m backends.llamacpp.repack_probe MODEL.gguf

Loads the model with llama.cpp's extra CPU buffer types, prefills 8 tokens (a batch of
rows: the repacked GEMM kernels) and decodes two single tokens (the GEMV kernels), checks
that the logits are finite, and prints {"weight_buffers": {type: MiB}} as its last line.
A crash (SIGILL from a kernel the CPU or OS refuses), an error or non-finite logits is a
failed probe: the caller sees the exit status.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def main(argv: list[str]) -> int:
    import llama_cpp as L

    from backends.llamacpp import runtime

    if len(argv) != 1:
        print("usage: python -m backends.llamacpp.repack_probe MODEL.gguf", file=sys.stderr)
        return 2
    model, buffers = runtime.load_model(argv[0], repack=True)
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 64
    cp.n_threads = cp.n_threads_batch = runtime.default_threads()
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        print("llama.cpp could not create a context", file=sys.stderr)
        return 1
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(8, 0, 1)
    try:
        steps = [list(range(8)), [8], [9]]  # positions: one 8-row step, two 1-row steps
        for positions in steps:
            for i, pos in enumerate(positions):
                batch.token[i] = (pos * 7919 + 11) % n_vocab
                batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = pos, 1, 0
                batch.logits[i] = i == len(positions) - 1
            batch.n_tokens = len(positions)
            if L.llama_decode(ctx, batch) != 0:
                print("llama_decode failed", file=sys.stderr)
                return 1
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            if not np.isfinite(row).all():
                print("non-finite logits", file=sys.stderr)
                return 1
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    print(json.dumps({"weight_buffers": buffers}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
