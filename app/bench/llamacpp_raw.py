"""The raw llama.cpp ceiling on this machine, for `tandem bench --baseline raw` and
`app.bench.kv_quant`.

Decode tokens/s at batch size B (`raw_decode_tok_s`): B sequences, one token each per
`llama_decode` call, no sampling and no Python beyond filling the batch; the better of a
unified KV cache and one KV stream per sequence (the engine can run either). Same method as
shared/tools/llama_raw_bench.py (which measures unified only); an engine cannot beat it on the
same model and threads.

Decode tokens/s per KV cache type (`kv_decode_tok_s`): one sequence, a context per type
(`kv_context`: the runner's KV type and flash attention), the same prompt prefilled, then
one-token steps.
"""

from __future__ import annotations

import time

import llama_cpp as L
import numpy as np

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


def kv_context(model, kv_type: str, flash_attn: str, n_ctx: int, n_batch: int, threads: int):
    """A one-sequence context of `n_ctx` tokens on `model` with KV cache type `kv_type`
    (f16 | q8_0 | q4_0, K and V), flash attention `flash_attn` (auto | on | off), batches of
    `n_batch` tokens. The caller frees it with `llama_free`. Raises ValueError if llama.cpp
    cannot create it."""
    from backends.llamacpp.runner import FLASH_ATTN_TYPE, GGML_KV_TYPE

    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_seq_max = n_ctx, 1
    cp.n_batch = cp.n_ubatch = n_batch
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = FLASH_ATTN_TYPE[flash_attn]
    cp.type_k = cp.type_v = GGML_KV_TYPE[kv_type]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise ValueError(f"llama.cpp could not create a {kv_type} KV context")
    return ctx


def prefill(ctx, tokens: list[int], n_batch: int) -> None:
    """Empty `ctx` (sequence 0) and compute `tokens` from position 0 in steps of `n_batch`,
    logits for the last token only."""
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    for s in range(0, len(tokens), n_batch):
        decode(ctx, [(tokens[p], p, 0, p == len(tokens) - 1)
                     for p in range(s, min(s + n_batch, len(tokens)))])


def last_logits(ctx, n_vocab: int) -> np.ndarray:
    """The logits of the last token the latest `llama_decode` computed them for: float32
    `[n_vocab]`, a copy."""
    return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), (n_vocab,)).copy()


def kv_decode_tok_s(model_path: str, kv_types: list[str], flash_attn: list[str],
                    tokens: list[int], decode_tokens: int, rounds: int, threads: int,
                    n_batch: int) -> dict[str, float]:
    """{KV type: decode tokens/s} of llama.cpp alone: the model loaded as the runner loads
    it, a `kv_context` per type (`flash_attn[i]` for `kv_types[i]`), `tokens` prefilled,
    then `decode_tokens` one-token steps (the text's tokens again: the time does not depend
    on which); the median of `rounds` rounds whose order of types alternates."""
    model = load_model_like_runner(model_path)
    n_ctx = -(-(len(tokens) + decode_tokens + 1) // 256) * 256
    contexts = []
    try:
        for t, fa in zip(kv_types, flash_attn, strict=True):
            contexts.append(kv_context(model, t, fa, n_ctx, n_batch, threads))
        rates: list[list[float]] = [[] for _ in kv_types]
        for rnd in range(rounds):
            order = range(len(kv_types)) if rnd % 2 == 0 else reversed(range(len(kv_types)))
            for i in order:
                prefill(contexts[i], tokens, n_batch)
                start = time.perf_counter()
                for k in range(decode_tokens):
                    decode(contexts[i], [(tokens[k % len(tokens)], len(tokens) + k, 0, True)])
                rates[i].append(decode_tokens / (time.perf_counter() - start))
        return {t: median(r, digits=1) for t, r in zip(kv_types, rates, strict=True)}
    finally:
        for ctx in contexts:
            L.llama_free(ctx)
        L.llama_model_free(model)


def _in_subprocess(args: dict) -> object:
    """`main`'s JSON answer to `args` from a fresh interpreter: measured in the same
    process, raw contexts leave it measurably slower for the engine that follows (~25% on 2
    cores), and an engine's loaded models slow the raw measurement."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "app.bench.llamacpp_raw", json.dumps(args)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def kv_decode_tok_s_subprocess(**kwargs) -> dict[str, float]:
    """`kv_decode_tok_s(**kwargs)` in a fresh interpreter (`_in_subprocess`)."""
    return _in_subprocess({"kv": kwargs})


def raw_decode_tok_s_subprocess(model_path: str, batch_sizes: list[int],
                                threads: int | None = None) -> dict[int, float]:
    """`raw_decode_tok_s` in a fresh interpreter (`_in_subprocess`)."""
    out = _in_subprocess({"batch": {"model_path": model_path, "batch_sizes": batch_sizes,
                                    "threads": threads}})
    return {int(k): v for k, v in out.items()}  # type: ignore[union-attr]


def main(spec: str) -> object:
    """The answer to a JSON `spec`: {"batch": raw_decode_tok_s's arguments} or {"kv":
    kv_decode_tok_s's}."""
    import json

    args = json.loads(spec)
    if "batch" in args:
        return raw_decode_tok_s(**args["batch"])
    return kv_decode_tok_s(**args["kv"])


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main(sys.argv[1])))
