"""What a quantized KV cache (`--kv-cache-type q8_0 | q4_0`) costs against f16, in one run.

For each KV cache type the same model is loaded through `LlamaCppRunner` (split layout, one
sequence, the runner's defaults otherwise: repacked weights where this machine's probe says
so, flash attention as the type needs) and measured on one fixed text (`fixed_text`: built
from a seeded generator, so every run and machine reads the same words; its first
`--tokens` tokens):
- quality, teacher-forced: the text's tokens are computed in 512-token chunks with the
  next-token logits of every position; against f16's at the same positions: greedy
  agreement (fraction of positions whose argmax equals f16's) and the mean KL divergence
  KL(p_f16 || p_type) in nats;
- memory: KV bytes per token (the type's arithmetic, `kv_plan.kv_token_bytes`) and as
  llama.cpp saves it (a sequence's state blob per cell, 12 bytes of cell metadata included,
  read back from llama.cpp); sequences of `--seq-tokens` that the "auto" layout fits in the
  budget the default serve's f16 KV takes (16 x 8192 tokens), and the context 16 sequences
  get in it;
- speed: prefill tokens/s (the text, logits of each chunk's last token only, as the engine
  prefills) and decode tokens/s (greedy, `--decode-tokens` one-token steps after the text),
  the median of `--rounds` rounds whose order of types alternates, and the ratios to f16.
  Noisy on a busy machine: compare ratios from one run, on a quiet one;
- llama.cpp alone: the same decode after the same text through llama-cpp-python's low-level
  API (`llamacpp_raw.kv_decode_tok_s`: the weights loaded as the runner loads them, a
  context per type with the runner's flash attention setting, no tandem code between the
  steps), in the same run after the runner's rounds, in a fresh interpreter;
  `raw_decode_ratio` is what llama.cpp's own kernels give a quantized cache on this machine,
  `decode_vs_raw` the runner's decode against llama.cpp alone's for the same type.

`--backend mlx` measures the MLX runner instead: its f16 pool against its q8_0 one (MLX's
affine 8 bits, group 64), the same quality and speed figures, and the pool's bytes per token
as allocated (no layout planning: the MLX pool is one shared pool of tokens). MLX on a CPU is
slow: use a few hundred tokens (`--tokens 300 --decode-tokens 16`).

Prints one JSON object. usage: python -m app.bench.kv_quant [--model NAME_OR_PATH]
[--tokens 2000] [--threads N] [--rounds 2] [--backend llamacpp|mlx]
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from app.bench.llamacpp_raw import kv_decode_tok_s_subprocess
from app.bench.stats import median
from backends.base import KV_CACHE_TYPES, BatchItem
from backends.llamacpp.kv_plan import kv_token_bytes, plan_kv
from models.registry import DEFAULT_MODEL

CHUNK = 512  # tokens per teacher-forced / prefill step (the runner's max_batch_tokens)
KL_ROWS = 64  # rows per float64 softmax (bounds memory at a 152k vocabulary)
DEFAULT_SERVE = (16, 8192)  # sequences x tokens of the default serve: the memory budget

_SUBJECTS = ("the harbour master", "a retired surveyor", "the night train", "our committee",
             "the youngest apprentice", "a careful reader", "the old lighthouse", "the river",
             "every clockmaker in town", "the mayor's cousin", "a migrating flock",
             "the printing press")
_VERBS = ("noticed", "measured", "forgot", "described", "repaired", "questioned",
          "followed", "ignored", "counted", "painted", "rebuilt", "explained")
_OBJECTS = ("the crooked bridge", "a ledger of tides", "three brass keys", "the winter "
            "accounts", "a map with no north", "the bakery's chimney", "forty paper lanterns",
            "the quiet archive", "an unfinished letter", "the copper weathervane",
            "a box of seeds", "the eastern road")
_CLAUSES = ("because the weather turned", "although nobody asked", "before the bells rang",
            "while the market was closing", "as the fog lifted", "after a long argument",
            "when the ink ran out", "since the tide was low", "until the lamps were lit",
            "even though it was Sunday")
_CODE = ('''
def {name}(values, limit={n}):
    """Return the running total of values, stopping at limit."""
    total = 0
    out = []
    for v in values:
        if total + v > limit:
            break
        total += v
        out.append(total)
    return out
''', '''
class {cname}:
    def __init__(self, size={n}):
        self.size = size
        self.items = []

    def push(self, item):
        if len(self.items) >= self.size:
            self.items.pop(0)
        self.items.append(item)
''')


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def fixed_text(seed: int = 2026, paragraphs: int = 40) -> str:
    """A deterministic English text with some Python in it (about 3,100 tokens for
    SmolLM2's and Qwen2.5's tokenizers at the defaults): paragraphs of generated sentences, numbers and dates,
    every fifth paragraph a short function or class. Same words on every machine and
    Python 3 version (`random.Random(seed)` with `choice`/`randint` is stable)."""
    rng = random.Random(seed)
    out = []
    for p in range(paragraphs):
        if p % 5 == 4:
            name = rng.choice(("running_total", "clip_sum", "prefix_sums", "bounded_add"))
            out.append(rng.choice(_CODE).format(name=name, n=rng.randint(10, 999),
                                                cname=name.title().replace("_", "")).strip())
            continue
        sentences = []
        for _ in range(rng.randint(3, 6)):
            s = (f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
                 f"{rng.choice(_CLAUSES)}")
            if rng.random() < 0.3:
                day = rng.randint(1, 28)
                s += f", on the {_ordinal(day)} of {rng.choice(('March', 'June', 'October'))}"
            if rng.random() < 0.2:
                s += f", and {rng.randint(2, 97)} of them were {rng.choice(('late', 'missing', 'new'))}"
            sentences.append(s[0].upper() + s[1:] + ".")
        out.append(" ".join(sentences))
    return "\n\n".join(out) + "\n"


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def compare_logits(ref: np.ndarray, other: np.ndarray) -> tuple[int, float]:
    """(positions whose argmax agrees, sum over positions of KL(softmax(ref) ||
    softmax(other)) in nats) for float32 logits `[positions, n_vocab]`."""
    agree, kl = int((ref.argmax(1) == other.argmax(1)).sum()), 0.0
    for i in range(0, len(ref), KL_ROWS):
        lp, lq = _log_softmax(ref[i:i + KL_ROWS]), _log_softmax(other[i:i + KL_ROWS])
        kl += float((np.exp(lp) * (lp - lq)).sum())
    return agree, kl


def _runner(path: str, kv_cache_type: str, seq_tokens: int, threads: int | None):
    from backends.llamacpp.runner import LlamaCppRunner

    return LlamaCppRunner(path, max_seqs=1, seq_tokens=seq_tokens, kv_layout="split",
                          max_batch_tokens=CHUNK, n_threads=threads,
                          kv_cache_type=kv_cache_type)


def _chunks(tokens: list[int], all_logits: bool, table: list[int]) -> list[BatchItem]:
    return [BatchItem(0, tokens[s:s + CHUNK], s, table,
                      list(range(len(tokens[s:s + CHUNK]))) if all_logits
                      else [len(tokens[s:s + CHUNK]) - 1])
            for s in range(0, len(tokens), CHUNK)]


def _timed_pass(runner, tokens: list[int], decode_tokens: int, table: list[int]
                ) -> tuple[float, float]:
    """Prefill `tokens` into an empty slot 0 (blocks `table`), then greedy-decode; (prefill
    tokens/s, decode tokens/s). Leaves the slot empty."""
    runner.release(0, 0)
    t0 = time.perf_counter()
    for item in _chunks(tokens, all_logits=False, table=table):
        logits = runner.execute([item])
    prefill = len(tokens) / (time.perf_counter() - t0)
    pos = len(tokens)
    t0 = time.perf_counter()
    for _ in range(decode_tokens):
        nxt = int(np.argmax(logits[-1]))
        logits = runner.execute([BatchItem(0, [nxt], pos, table, [0])])
        pos += 1
    decode = decode_tokens / (time.perf_counter() - t0)
    runner.release(0, 0)
    return prefill, decode


def _text_tokens(tokenizer, n_tokens: int) -> list[int]:
    """The first `n_tokens` tokens of `fixed_text`. Raises ValueError if it is shorter."""
    tokens = tokenizer.encode(fixed_text(), add_special=True)
    if len(tokens) < n_tokens:
        raise ValueError(f"the fixed text is {len(tokens)} tokens, fewer than {n_tokens}")
    return tokens[:n_tokens]


def _quality(runners: dict, tokens: list[int], table: list[int]
             ) -> tuple[dict[str, int], dict[str, float]]:
    """Teacher-forced over `tokens` in slot 0 of every runner ({type: runner}, f16 first):
    per type, (positions whose argmax agrees with f16's, summed KL(p_f16 || p_type))."""
    ref = runners["f16"]
    agree, kl = dict.fromkeys(runners, 0), dict.fromkeys(runners, 0.0)
    for item in _chunks(tokens, all_logits=True, table=table):
        base = np.array(ref.execute([item]), copy=True)
        for t, r in runners.items():
            a, k = compare_logits(base, base if r is ref else r.execute([item]))
            agree[t] += a
            kl[t] += k
    return agree, kl


def _speeds(runners: dict, tokens: list[int], decode_tokens: int, rounds: int,
            table: list[int]) -> dict[str, tuple[float, float]]:
    """{type: (median prefill tokens/s, median decode tokens/s)} over `rounds` rounds whose
    order of types alternates."""
    speeds: dict[str, list[tuple[float, float]]] = {t: [] for t in runners}
    for rnd in range(rounds):
        order = list(runners) if rnd % 2 == 0 else list(runners)[::-1]
        for t in order:
            speeds[t].append(_timed_pass(runners[t], tokens, decode_tokens, table))
    return {t: (median([p for p, _ in v]), median([d for _, d in v]))
            for t, v in speeds.items()}


def measure(path: str, n_tokens: int = 2000, threads: int | None = None, rounds: int = 2,
            decode_tokens: int = 64, seq_tokens: int = 8192) -> dict:
    """The JSON object this module prints (see the module docstring). Loads the three
    runners at once (the weights' pages are shared: mapped from one file); llama.cpp alone
    runs in a child process."""
    ctx = -(-(n_tokens + decode_tokens + 1) // 256) * 256
    runners = {t: _runner(path, t, ctx, threads) for t in KV_CACHE_TYPES}
    try:
        ref = runners["f16"]
        tokens = _text_tokens(ref.tokenizer, n_tokens)
        info = ref.info
        table = list(range(n_tokens + decode_tokens + 1))  # blocks of >= 1 token: enough
        agree, kl = _quality(runners, tokens, table)
        state_bytes = {}
        for t, r in runners.items():
            state_bytes[t] = len(r._memory.state_get(0))
            r.release(0, 0)
            state_bytes[t] = (state_bytes[t] - len(r._memory.state_get(0))) / n_tokens
        speeds = _speeds(runners, tokens, decode_tokens, rounds, table)
        raw = kv_decode_tok_s_subprocess(
            model_path=path, kv_types=list(runners),
            flash_attn=[r.flash_attn for r in runners.values()], tokens=tokens,
            decode_tokens=decode_tokens, rounds=rounds, threads=ref.n_threads, n_batch=CHUNK)
        budget = DEFAULT_SERVE[0] * DEFAULT_SERVE[1] * kv_token_bytes(
            info.n_layers, info.n_kv_heads, info.head_dim, "f16")
        out: dict = {"model": info.name, "path": path, "tokens": n_tokens,
                     "threads": ref.n_threads, "rounds": rounds, "decode_tokens": decode_tokens,
                     "repack": ref.repack.repack, "plain_prefill": ref.plain_prefill is not None,
                     "budget_bytes": budget, "types": {}}
        f16 = None
        for t, r in runners.items():
            bpt = kv_token_bytes(info.n_layers, info.n_kv_heads, info.head_dim, t)
            seqs = plan_kv(max_seqs=255, seq_tokens=seq_tokens, kv_tokens=None,
                           kv_layout="auto", block_size=1, max_batch_tokens=CHUNK,
                           n_ctx_train=max(seq_tokens, info.n_ctx_train),
                           kv_bytes_per_token=bpt, split_kv_bytes=budget).max_seqs
            prefill, decode = speeds[t]
            row = {"greedy_agreement": agree[t] / n_tokens, "mean_kl_nats": kl[t] / n_tokens,
                   "kv_bytes_per_token": bpt, "state_bytes_per_token": state_bytes[t],
                   "flash_attn": r.flash_attn,
                   f"sequences_x_{seq_tokens}": seqs,
                   "context_at_16_sequences": budget // (16 * bpt),
                   "prefill_tok_s": round(prefill, 1), "decode_tok_s": round(decode, 1),
                   "raw_decode_tok_s": round(raw[t], 1)}
            f16 = f16 or (bpt, seqs, prefill, decode, raw[t])
            row.update({"kv_bytes_ratio": bpt / f16[0], "sequences_ratio": seqs / f16[1],
                        "prefill_ratio": round(prefill / f16[2], 3),
                        "decode_ratio": round(decode / f16[3], 3),
                        "raw_decode_ratio": round(raw[t] / f16[4], 3),
                        "decode_vs_raw": round(decode / raw[t], 3)})
            out["types"][t] = row
        return out
    finally:
        for r in runners.values():
            r.close()


def measure_mlx(path: str, n_tokens: int = 300, rounds: int = 2,
                decode_tokens: int = 16) -> dict:
    """The JSON object of `--backend mlx`: the MLX runner with an f16 and a q8_0 (MLX affine
    8-bit) pool, one sequence; quality and speed as `measure`, and the pool's KV bytes per
    token as allocated (its f16 mode holds the activations' dtype: f32 on the CPU)."""
    from backends.loader import MLX_BLOCK_SIZE
    from backends.mlx.runner import KV_CACHE_TYPES as MLX_TYPES
    from backends.mlx.runner import MLXRunner

    num_blocks = -(-(n_tokens + decode_tokens + 1) // MLX_BLOCK_SIZE)
    runners = {t: MLXRunner(path, 1, num_blocks, MLX_BLOCK_SIZE, kv_cache_type=t)
               for t in MLX_TYPES}
    try:
        ref = runners["f16"]
        tokens = _text_tokens(ref.tokenizer, n_tokens)
        table = list(range(num_blocks))
        agree, kl = _quality(runners, tokens, table)
        speeds = _speeds(runners, tokens, decode_tokens, rounds, table)
        n_rows = num_blocks * MLX_BLOCK_SIZE + 1  # + the trash row
        out: dict = {"backend": "mlx", "model": ref.info.name, "path": path, "tokens": n_tokens,
                     "rounds": rounds, "decode_tokens": decode_tokens, "types": {}}
        f16 = None
        for t, r in runners.items():
            bpt = r.kv_bytes / n_rows
            prefill, decode = speeds[t]
            f16 = f16 or (bpt, prefill, decode)
            out["types"][t] = {
                "greedy_agreement": agree[t] / n_tokens, "mean_kl_nats": kl[t] / n_tokens,
                "kv_bytes_per_token": bpt, "kv_bytes_ratio": bpt / f16[0],
                "prefill_tok_s": round(prefill, 1), "decode_tok_s": round(decode, 1),
                "decode_ms_per_token": round(1e3 / decode, 1),
                "prefill_ratio": round(prefill / f16[1], 3),
                "decode_ratio": round(decode / f16[2], 3)}
        return out
    finally:
        for r in runners.values():
            r.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.bench.kv_quant", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="registry name or .gguf path")
    p.add_argument("--tokens", type=int, default=2000, help="tokens of the fixed text")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds per type")
    p.add_argument("--decode-tokens", type=int, default=64, help="decode steps timed")
    p.add_argument("--backend", choices=("llamacpp", "mlx"), default="llamacpp",
                   help="mlx: the MLX runner's f16 and q8_0 (MLX 8-bit affine) pools")
    args = p.parse_args(argv)
    if args.backend == "mlx" and args.threads is not None:
        p.error("--threads is for the llamacpp backend")
    from models.store import resolve_model

    path = str(resolve_model(args.model, pull_missing=False))
    if args.backend == "mlx":
        result = measure_mlx(path, args.tokens, args.rounds, args.decode_tokens)
    else:
        result = measure(path, args.tokens, args.threads, args.rounds, args.decode_tokens)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
