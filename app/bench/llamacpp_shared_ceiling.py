"""Raw llama.cpp ceiling for `app.bench.peer`'s shared-system-prompt scenario.

Only the work that scenario needs at the least, through the low-level API, no engine: one
prompt of `--prompt` tokens, `--users - 1` more that reuse its first `--shared` tokens
(restored from a saved sequence, not recomputed) and compute their own `prompt - shared`,
then `--max-tokens - 1` decode steps of all users (their first token came from the prefill).
Split KV layout (a stream per sequence), batches of at most 512 tokens. Prints one JSON object
with output tokens/s per round; tandem's throughput in the scenario cannot exceed it.

usage: python -m app.bench.llamacpp_shared_ceiling [--model NAME] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import llama_cpp as L

from app.bench.llamacpp_raw import decode
from backends.llamacpp.repack import load_model_like_runner
from models.registry import DEFAULT_MODEL


def one_round(ctx, users: int, prompt: int, shared: int, max_tokens: int, n_vocab: int) -> float:
    mem = L.llama_get_memory(ctx)
    L.llama_memory_clear(mem, True)

    def tok(i: int) -> int:
        return (i * 7919) % (n_vocab - 100) + 50

    start = time.perf_counter()
    first = [(tok(p), p, 0, p == prompt - 1) for p in range(prompt)]
    for c in range(0, prompt, 512):
        decode(ctx, first[c:c + 512])
    size = L.llama_state_seq_get_size(ctx, 0)
    blob = (ctypes.c_uint8 * size)()
    L.llama_state_seq_get_data(ctx, blob, size, 0)
    for s in range(1, users):
        L.llama_state_seq_set_data(ctx, blob, size, s)
        L.llama_memory_seq_rm(mem, s, shared, -1)
    own = prompt - shared
    items = [(tok(5000 + 97 * s + p), shared + p, s, p == own - 1)
             for s in range(1, users) for p in range(own)]
    for c in range(0, len(items), 512):
        decode(ctx, items[c:c + 512])
    for k in range(max_tokens - 1):
        decode(ctx, [(tok(k + s), prompt + k, s, True) for s in range(users)])
    return users * max_tokens / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    from models.store import resolve_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--prompt", type=int, default=654, help="prompt tokens (app.bench.peer: 654)")
    p.add_argument("--shared", type=int, default=608, help="cached prefix (app.bench.peer: 608)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    model = load_model_like_runner(resolve_model(args.model))
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cp = L.llama_context_default_params()
    cp.n_ctx = args.users * 2048
    cp.n_batch = cp.n_ubatch = 512
    cp.n_seq_max, cp.kv_unified = args.users, False
    cp.n_threads = cp.n_threads_batch = args.threads
    ctx = L.llama_init_from_model(model, cp)
    rates = [round(one_round(ctx, args.users, args.prompt, args.shared, args.max_tokens,
                             n_vocab), 1) for _ in range(args.rounds)]
    print(json.dumps({"raw_shared_system_tok_s": rates}))
    L.llama_free(ctx)
    L.llama_model_free(model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
