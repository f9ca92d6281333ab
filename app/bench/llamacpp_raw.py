"""The raw llama.cpp ceiling on this machine, for `tandem bench --baseline raw`.

Decode tokens/s at batch size B: B sequences, one token each per `llama_decode` call, no
sampling and no Python beyond filling the batch; the better of a unified KV cache and one KV
stream per sequence (the engine can run either). Same method as
shared/tools/llama_raw_bench.py (which measures unified only); an engine cannot beat it on the
same model and threads.
"""

from __future__ import annotations

import time

import llama_cpp as L

from app.bench.stats import median
from backends.llamacpp.repack import load_model_like_runner
from backends.llamacpp.runtime import default_threads


def raw_decode_tok_s(model_path: str, batch_sizes: list[int], threads: int | None = None,
                     steps: int = 32, context_tokens: int = 64) -> dict[int, float]:
    """Decode tokens/s for each batch size: median of 3 timed runs of `steps` steps, in the
    faster of the two KV layouts."""
    model = load_model_like_runner(model_path)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    tokens = [(i * 7919) % (n_vocab - 100) + 50 for i in range(context_tokens + 3 * steps + 64)]
    threads = threads or default_threads()
    result = {}
    try:
        for b in batch_sizes:
            result[b] = 0.0
            for unified in (True, False):
                cp = L.llama_context_default_params()
                cp.n_ctx = 8192 if unified else b * 512  # split: 512 cells per stream
                cp.n_batch, cp.n_ubatch = 2048, 512
                cp.n_seq_max, cp.kv_unified = b, unified
                cp.n_threads = cp.n_threads_batch = threads
                ctx = L.llama_init_from_model(model, cp)
                try:
                    rate = _median_decode_rate(ctx, b, tokens, context_tokens, steps)
                finally:
                    L.llama_free(ctx)
                result[b] = max(result[b], rate)
    finally:
        L.llama_model_free(model)
    return result


def _median_decode_rate(ctx, b: int, tokens: list[int], context_tokens: int,
                        steps: int) -> float:
    for s in range(b):
        decode(ctx, [(tokens[p], p, s, p == context_tokens - 1) for p in range(context_tokens)])
    rates = []
    for rep in range(3):  # median of 3: single runs are noisy on shared cores
        first = context_tokens + rep * steps
        start = time.perf_counter()
        for k in range(steps):
            decode(ctx, [(tokens[(k + s) % len(tokens)], first + k, s, True) for s in range(b)])
        rates.append(b * steps / (time.perf_counter() - start))
    return median(rates, digits=1)


def decode(ctx, items: list[tuple[int, int, int, bool]]) -> None:
    """One `llama_decode` of `(token, position, sequence id, want logits)` items.
    Raises RuntimeError if llama.cpp fails."""
    batch = L.llama_batch_init(len(items), 0, 1)
    try:
        for i, (tok, pos, seq, logits) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens = len(items)
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
    finally:
        L.llama_batch_free(batch)


def raw_decode_tok_s_subprocess(model_path: str, batch_sizes: list[int],
                                threads: int | None = None) -> dict[int, float]:
    """`raw_decode_tok_s` in a fresh interpreter: measured in the same process, the raw
    contexts leave it measurably slower for the engine that follows (~25% on 2 cores)."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "app.bench.llamacpp_raw", model_path,
           ",".join(map(str, batch_sizes))]
    if threads:
        cmd.append(str(threads))
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return {int(k): v for k, v in json.loads(out.stdout).items()}


if __name__ == "__main__":
    import json
    import sys

    _threads = int(sys.argv[3]) if len(sys.argv) > 3 else None
    _sizes = [int(b) for b in sys.argv[2].split(",")]
    print(json.dumps(raw_decode_tok_s(sys.argv[1], _sizes, threads=_threads)))
