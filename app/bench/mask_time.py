"""Grammar mask time per mask row at a model's full logits width, without the engine.

For each schema of the structured-output bench (`app.bench.structured.SCHEMAS`) a valid
instance (`INSTANCES`, written as the grammar's whitespace allows) is tokenized by the model
and walked by fresh matchers (one per timing below), token by token. At every position:
- `fill`: the one-row mask (`constrain.mask.fill_masks`), as a sequence without drafts gets;
  `fill_default_slices` the same mask from a vocabulary view with llguidance's own slices
  (the baseline of `vocab.STRING_SLICES`), whose masks must be equal (`masks_equal`);
- `fill_cold` (first pass only): the same fill right after reading `COLD_BYTES` of memory
  (its own matcher: a matcher fills a state it filled before from its own cache),
  as a decode step's weights stream through the caches before the engine fills the next
  masks: what the fill costs inside `tandem serve` on this machine;
- `apply`: that row applied to a logits row of the model's width (`apply_masks`), and the
  baseline `apply_unpacked` (unpack the whole row, one masked copy) on the same row, so the
  ratio comes from one run;
- where the grammar forces tokens (`forced`): one fill of 1 + k rows, the mask a sequence
  carrying those k forced drafts gets, reported per row and per sequence.
Timings are per call, in microseconds (p50/p99 over all positions of all schemas, `rounds`
passes). Nothing else should run: llama.cpp is only used for its vocabulary.

usage: python -m app.bench.mask_time [--model NAME_OR_PATH] [--rounds N]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from app.bench.stats import percentiles, ratio
from app.bench.structured import SCHEMAS
from app.engine.constrain import GrammarCompiler, ResponseFormat
from app.engine.constrain.mask import (
    MaskRequest,
    apply_masks,
    apply_unpacked,
    fill_masks,
)
from models.registry import DEFAULT_MODEL

COLD_BYTES = 256 << 20  # read before a `fill_cold`: 8x this machine's 32 MiB L3

# One valid output per schema of `SCHEMAS`, in order.
INSTANCES: list[dict] = [
    {"id": 4211, "customer": "Ada Lovelace", "items": [{"sku": "AB-12", "qty": 2},
                                                        {"sku": "ZX-9", "qty": 1}],
     "status": "shipped"},
    {"name": "Kenji Sato", "age": 34, "email": "kenji.sato@example.com", "country": "Japan",
     "languages": ["Japanese", "English"], "active": True},
    {"city": "Lyon", "date": "2026-12-04", "temperature_c": 7, "conditions": "rain",
     "wind": {"speed_kmh": 18, "direction": "W"}},
    {"title": "Crash when the config file is empty", "severity": "high",
     "component": "parser", "steps": ["create an empty config", "run tandem serve"],
     "reproducible": True},
]


def _timed(fn, *args) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def measure(tokenizer, width: int, eos: list[int], rounds: int = 3, seed: int = 0,
            cold_bytes: int = COLD_BYTES) -> dict:
    """The module docstring's timings for a model's `tokenizer` with `width` logits
    (`cold_bytes` = 0: no `fill_cold`)."""
    compiler = GrammarCompiler(tokenizer, width)
    baseline = GrammarCompiler(tokenizer, width, slices=None)
    rng = np.random.default_rng(seed)
    source = rng.standard_normal(width).astype(np.float32)
    row = np.empty((1, width), dtype=np.float32)
    cold = np.ones(cold_bytes // 8, dtype=np.int64) if cold_bytes else None
    t: dict[str, list[float]] = {k: [] for k in
                                 ("fill", "fill_cold", "fill_default_slices", "apply",
                                  "apply_unpacked", "forced_row", "forced_seq")}
    positions = forced_positions = forced_rows = 0
    masks_equal = True
    for rnd in range(rounds):
        for k, ((_, schema), instance) in enumerate(zip(SCHEMAS, INSTANCES, strict=True)):
            fmt = ResponseFormat("json_schema", schema, f"s{k}")
            # one matcher per timing: a matcher fills a state it filled before from its own
            # cache, so each is timed on its first fill of every state
            matchers = {"fill": compiler.compile(fmt).matcher(),
                        "fill_default_slices": baseline.compile(fmt).matcher(),
                        "forced": compiler.compile(fmt).matcher()}
            if cold is not None and rnd == 0:
                matchers["fill_cold"] = compiler.compile(fmt).matcher()
            ids = tokenizer.encode(json.dumps(instance), add_special=False,
                                   parse_special=False)
            for token in [*ids, None]:
                masks = {}
                pair = ["fill", "fill_default_slices"]
                for name in pair[::1 if positions % 2 else -1]:  # alternate which is first
                    s, masks[name] = _timed(fill_masks, [MaskRequest(matchers[name], 0, [])],
                                            1, width)
                    t[name].append(s)
                bitmask = masks["fill"]
                masks_equal = masks_equal and np.array_equal(bitmask,
                                                             masks["fill_default_slices"])
                if "fill_cold" in matchers:
                    int(cold.sum())  # evicts the vocabulary trie and the lexer's tables
                    t["fill_cold"].append(_timed(
                        fill_masks, [MaskRequest(matchers["fill_cold"], 0, [])], 1, width)[0])
                for name, fn in (("apply", apply_masks), ("apply_unpacked", apply_unpacked)):
                    np.copyto(row[0], source)
                    t[name].append(_timed(fn, row, bitmask, [0], eos)[0])
                forced = matchers["forced"].forced_tokens()
                if forced:
                    s, _ = _timed(fill_masks, [MaskRequest(matchers["forced"], 0, forced)],
                                  len(forced) + 1, width)
                    t["forced_seq"].append(s)
                    t["forced_row"].append(s / (len(forced) + 1))
                    forced_positions += 1
                    forced_rows += len(forced) + 1
                positions += 1
                for name, m in matchers.items():
                    if token is not None and not m.consume(token):
                        raise RuntimeError(f"schema {k}: the grammar refused token {token} of "
                                           f"the instance ({name}: {m.error})")
    us = {k: percentiles(v, 1e6) for k, v in t.items()}
    return {"width": width, "positions": positions, "forced_positions": forced_positions,
            "forced_rows": forced_rows, "masks_equal": masks_equal, "us": us,
            "fill_speedup_p50": ratio(us["fill_default_slices"]["p50"], us["fill"]["p50"]),
            "fill_speedup_p99": ratio(us["fill_default_slices"]["p99"], us["fill"]["p99"]),
            "apply_speedup_p50": ratio(us["apply_unpacked"]["p50"], us["apply"]["p50"]),
            "apply_speedup_p99": ratio(us["apply_unpacked"]["p99"], us["apply"]["p99"])}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m app.bench.mask_time", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="registry name or .gguf path")
    p.add_argument("--rounds", type=int, default=3, help="passes over the instances")
    args = p.parse_args(argv)
    from backends.llamacpp.runner import LlamaCppRunner
    from models.store import resolve_model

    path = str(resolve_model(args.model, pull_missing=False))
    runner = LlamaCppRunner(path, max_seqs=1, seq_tokens=256, kv_layout="split")
    tok = runner.tokenizer
    out = measure(tok, runner.info.n_vocab, sorted(tok.eos_ids), args.rounds)
    print(json.dumps({"model": args.model, **out}))


if __name__ == "__main__":
    main()
