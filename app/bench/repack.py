"""Repacked weights against plain ones, phase by phase, in one process and one run.

For each variant (llama.cpp's extra CPU buffer types on, and off) the same model is loaded
and measured with the runner's context settings (split KV, 16 sequences, n_batch = n_ubatch
= 512, flash attention auto):
- prefill: one `llama_decode` of n prompt tokens on an empty sequence, for every chunk size
  the scheduler hands out (it cuts prompts into chunks of at most 512 tokens, less what the
  step's decodes take), tokens/s;
- decode: t(n), one step of n tokens of one sequence (a verify step), and a step of B
  sequences with one token each, ms.
Rounds alternate the order of the variants; each figure is the median over rounds of the
fastest of `--repeats` timings. Prints one JSON object with both variants and the ratios
on/off (prefill: tokens/s ratio; decode: speed ratio = t_off / t_on).

usage: python -m app.bench.repack [--model NAME] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import time

import llama_cpp as L

from app.bench.stats import median
from backends.llamacpp import runtime
from models.registry import DEFAULT_MODEL

PREFILL_CHUNKS = (16, 32, 64, 128, 256, 512)
VERIFY_TOKENS = (1, 2, 4, 8)
DECODE_SEQS = (1, 4, 16)
SEQS, SEQ_TOKENS, BATCH = 16, 1024, 512


class Variant:
    """One model load (repacked or not) with a runner-shaped context."""

    def __init__(self, path: str, repack: bool, threads: int):
        self.model, self.buffers = runtime.load_model(path, repack)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_seq_max, cp.kv_unified = SEQS * SEQ_TOKENS, SEQS, False
        cp.n_batch = cp.n_ubatch = cp.n_outputs_max = BATCH
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create the context")
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(BATCH, 0, 1)
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.tokens = [(i * 7919) % (n_vocab - 100) + 50 for i in range(BATCH + 64)]

    def decode(self, items: list[tuple[int, int, int]]) -> float:
        """One step of (token index, position, sequence) items, last of each sequence with
        logits; seconds."""
        b = self.batch
        for i, (t, pos, seq) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = self.tokens[t], pos, 1, seq
            b.logits[i] = i == len(items) - 1 or items[i + 1][2] != seq
        b.n_tokens = len(items)
        start = time.perf_counter()
        if L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        return time.perf_counter() - start

    def clear(self) -> None:
        L.llama_memory_clear(self.mem, True)

    def prefill_s(self, n: int) -> float:
        self.clear()
        return self.decode([(p, p, 0) for p in range(n)])

    def verify_s(self, n: int, context: int = 64) -> float:
        self.clear()
        self.decode([(p, p, 0) for p in range(context)])
        return self.decode([(context + i, context + i, 0) for i in range(n)])

    def batch_s(self, seqs: int, context: int = 32) -> float:
        self.clear()
        for s in range(seqs):
            self.decode([(p + s, p, s) for p in range(context)])
        return self.decode([(context + s, context, s) for s in range(seqs)])

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


def measure(v: Variant, repeats: int) -> dict[str, dict[int, float]]:
    def best(fn, *a) -> float:
        return min(fn(*a) for _ in range(repeats))

    return {
        "prefill_tok_s": {n: n / best(v.prefill_s, n) for n in PREFILL_CHUNKS},
        "verify_ms": {n: 1000 * best(v.verify_s, n) for n in VERIFY_TOKENS},
        "decode_batch_ms": {b: 1000 * best(v.batch_s, b) for b in DECODE_SEQS},
    }


def main(argv: list[str] | None = None) -> int:
    from models.store import resolve_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3, help="timings per point and round")
    args = p.parse_args(argv)
    path = str(resolve_model(args.model))
    runtime.init_backend()
    variants = {"on": Variant(path, True, args.threads), "off": Variant(path, False, args.threads)}
    rounds: dict[str, list] = {"on": [], "off": []}
    try:
        for r in range(args.rounds):
            for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
                rounds[name].append(measure(variants[name], args.repeats))
    finally:
        buffers = {name: v.buffers for name, v in variants.items()}
        for v in variants.values():
            v.close()

    def med(name: str, kind: str) -> dict[int, float]:
        keys = rounds[name][0][kind]
        return {k: median([r[kind][k] for r in rounds[name]], digits=2) for k in keys}

    out: dict = {"model": args.model, "threads": args.threads, "rounds": args.rounds,
                 "weight_buffers": buffers}
    for kind in ("prefill_tok_s", "verify_ms", "decode_batch_ms"):
        on, off = med("on", kind), med("off", kind)
        rate = kind == "prefill_tok_s"  # tokens/s: on/off; times: off/on
        out[kind] = {"on": on, "off": off, "speed_ratio_on_off": {
            k: round(on[k] / off[k] if rate else off[k] / on[k], 3) for k in on}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
