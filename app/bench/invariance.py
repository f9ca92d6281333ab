"""Grouping invariance: does a token's logits depend on how the step around it was grouped?

`python -m app.bench.invariance --model M [--flash-attn on,off] [--kv-layout split]`
prints, for each setting, the max |Δ| of logits between computing the same tokens grouped
differently (issue 31's table), as JSON lines and then a table:

- prefill partitions (256+144, 200+200, 399+1, 393+7, 8 single tokens then 392) against the
  whole prompt in one step, comparing the last position's logits (one output row each, so
  only the attention/body path differs);
- a k-token verify step (k = 4, 8) against k one-token steps: with logits at every position
  (what speculative verify does), and with the last position's only (the body alone: the
  difference between the two rows is the output layer computing several rows at once);
- one sequence's decode step alone against the same step beside 15 other sequences;
- a control: the whole prompt again in one step (must be 0.0).

0.0 means bit-identical. Every row runs on one runner (one slot's KV, truncated to 0
between runs), on a seeded random prompt. Works on any backend the runner loader knows
(`--backend mlx`: keep `--prompt-tokens` small on Linux, where MLX runs on the CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

import numpy as np

from backends.base import BatchItem, Runner, RunnerConfig

PARTITIONS = ((256, 144), (200, 200), (399, 1), (393, 7), (1,) * 8 + (392,))
VERIFY_KS = (4, 8)
NEIGHBOURS = 15


class Probe:
    """Runs token groupings on one runner. Slot `s` owns blocks `s*span ..` (`span` blocks
    cover a whole sequence), so slots never share KV."""

    def __init__(self, runner: Runner, seq_tokens: int) -> None:
        self.runner = runner
        self.span = -(-seq_tokens // runner.block_size)

    def table(self, slot: int, n: int) -> list[int]:
        return list(range(slot * self.span, slot * self.span + -(-n // self.runner.block_size)))

    def item(self, slot: int, tokens: list[int], start: int, rows: list[int]) -> BatchItem:
        return BatchItem(slot, list(tokens), start, self.table(slot, start + len(tokens)), rows)

    def run(self, slot: int, tokens: list[int], chunks: tuple[int, ...],
            rows: str = "last", head: int = 0) -> np.ndarray:
        """Compute `tokens` from position 0 of an emptied `slot`: the first `head` tokens in
        one step with no logits, then one step per chunk size, with logits at the chunk's
        last position (`rows="last"`) or at every position ("every"). Returns the chunks'
        logits stacked `[rows, n_vocab]`."""
        self.runner.truncate(slot, 0)
        if head:
            self.runner.execute([self.item(slot, tokens[:head], 0, [])])
        out, start = [], head
        for size in chunks:
            chunk = tokens[start:start + size]
            wanted = list(range(size)) if rows == "every" else [size - 1]
            out.append(np.array(self.runner.execute([self.item(slot, chunk, start, wanted)])))
            start += size
        return np.concatenate(out) if out else np.empty((0, 0), np.float32)


def max_delta(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over all elements, as a float (0.0: bit-identical)."""
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def measure(runner: Runner, prompt_tokens: int = 400, seed: int = 0) -> Iterator[dict]:
    """The rows above for `runner`, each {"grouping", "max_abs_delta"}. Needs a runner with
    at least NEIGHBOURS + 1 slots of `prompt_tokens + 8` tokens for the batch row (skipped
    with fewer slots). Partitions are scaled when `prompt_tokens` is not 400."""
    rng = np.random.default_rng(seed)
    n_vocab = runner.info.n_vocab
    prompt = [int(t) for t in rng.integers(100, n_vocab - 100, prompt_tokens)]
    probe = Probe(runner, runner.max_seq_tokens)

    whole_last = probe.run(0, prompt, (prompt_tokens,))
    # the control: the same grouping again must be bit-identical, or nothing below means much
    yield {"grouping": f"{prompt_tokens} again (control)", "compared": "last position",
           "max_abs_delta": max_delta(probe.run(0, prompt, (prompt_tokens,)), whole_last)}
    for parts in PARTITIONS:
        parts = _scaled(parts, prompt_tokens)
        got = probe.run(0, prompt, parts)[-1:]
        yield {"grouping": " + ".join(_describe(parts)), "compared": "last position",
               "max_abs_delta": max_delta(got, whole_last)}

    for k in VERIFY_KS:
        drafts = [int(t) for t in rng.integers(100, n_vocab - 100, k)]
        seq = prompt + drafts
        one_step_all = probe.run(0, seq, (k,), "every", head=prompt_tokens)
        singles_all = probe.run(0, seq, (1,) * k, head=prompt_tokens)
        yield {"grouping": f"{k}-token verify step vs {k} one-token steps",
               "compared": "every position", "max_abs_delta": max_delta(one_step_all,
                                                                        singles_all)}
        one_step_last = probe.run(0, seq, (k,), head=prompt_tokens)
        yield {"grouping": f"{k}-token verify step vs {k} one-token steps",
               "compared": "last position only",
               "max_abs_delta": max_delta(one_step_last, singles_all[-1:])}

    if runner.max_seqs > NEIGHBOURS:
        yield {"grouping": f"a decode step alone vs beside {NEIGHBOURS} sequences",
               "compared": "last position", "max_abs_delta": _batched(probe, prompt, rng)}


def _batched(probe: Probe, prompt: list[int], rng: np.random.Generator) -> float:
    runner, n = probe.runner, len(prompt)
    token = int(rng.integers(100, runner.info.n_vocab - 100))
    probe.run(0, prompt, (), head=n)
    alone = np.array(runner.execute([probe.item(0, [token], n, [0])]))
    probe.run(0, prompt, (), head=n)
    items = [probe.item(0, [token], n, [0])]
    for slot in range(1, NEIGHBOURS + 1):
        other = [int(t) for t in rng.integers(100, runner.info.n_vocab - 100, n)]
        probe.run(slot, other, (), head=n)
        items.append(probe.item(slot, [other[-1]], n, [0]))
    together = np.array(runner.execute(items))[:1]
    for slot in range(NEIGHBOURS + 1):
        runner.truncate(slot, 0)
    return max_delta(together, alone)


def _scaled(parts: tuple[int, ...], total: int) -> tuple[int, ...]:
    """`parts` (summing to 400) for a prompt of `total` tokens: single-token chunks and the
    small tail chunks stay as they are, the large ones take the rest."""
    if total == 400:
        return parts
    fixed = [p if p < 16 else 0 for p in parts]
    big = [i for i, p in enumerate(parts) if p >= 16]
    rest = total - sum(fixed)
    if rest < len(big):
        raise ValueError(f"--prompt-tokens {total} is too short for the partition {parts}")
    for j, i in enumerate(big):
        fixed[i] = rest // len(big) + (1 if j < rest % len(big) else 0)
    return tuple(fixed)


def _describe(parts: tuple[int, ...]) -> list[str]:
    singles = 0
    out = []
    for p in parts:
        if p == 1 and parts.count(1) > 1:
            singles += 1
            continue
        out.append(str(p))
    return ([f"{singles} single tokens"] if singles else []) + out


def _settings(args: argparse.Namespace) -> Iterator[dict]:
    if args.exact:  # one setting: the exact library is process-wide
        yield {"flash_attn": "off", "kv_layout": "split", "repack": "off",
               "kv_cache_type": "f16", "exact": True}
        return
    for flash in args.flash_attn.split(","):
        for layout in args.kv_layout.split(","):
            yield {"flash_attn": flash, "kv_layout": layout, "repack": args.repack,
                   "kv_cache_type": args.kv_cache_type}


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from backends.loader import load_runner
    from models.store import resolve_model

    p = argparse.ArgumentParser(prog="python -m app.bench.invariance",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="registry name or path")
    p.add_argument("--backend", choices=["llamacpp", "mlx"], default=None)
    p.add_argument("--flash-attn", default="on,off", help="comma-separated: on, off, auto")
    p.add_argument("--kv-layout", default="split", help="comma-separated: split, unified")
    p.add_argument("--repack", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--kv-cache-type", default="f16", choices=["f16", "q8_0", "q4_0"])
    p.add_argument("--prompt-tokens", type=int, default=400)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exact", action="store_true",
                   help="measure exact mode (backends/llamacpp/exact.py) instead: flash "
                        "attention and repacking off, split layout, f16 KV, llama.cpp built "
                        "without tinyBLAS (so --flash-attn, --kv-layout, --repack and "
                        "--kv-cache-type do not apply)")
    args = p.parse_args(argv)
    if args.exact:
        from backends.llamacpp.exact import select_library

        select_library()

    path = resolve_model(args.model)
    rows = []
    for setting in _settings(args):
        config = RunnerConfig(max_seqs=NEIGHBOURS + 1, seq_tokens=args.prompt_tokens + 16,
                              n_threads=args.threads, **setting)
        try:
            runner, backend = load_runner(path, backend=args.backend, config=config)
        except ValueError as exc:
            print(f"tandem: {setting}: {exc}", file=sys.stderr)
            continue
        try:
            for row in measure(runner, args.prompt_tokens, args.seed):
                row = {"model": path.name, "backend": backend, **setting, **row}
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            runner.close()
    table = Table(title=f"max |Δ logits| by grouping ({path.name}; 0.0 = bit-identical)")
    table.add_column("grouping")
    table.add_column("compared")
    columns = [s for s in _settings(args)]
    for s in columns:
        name = "exact" if s.get("exact") else f"fa {s['flash_attn']}, {s['kv_layout']}"
        table.add_column(name, justify="right")
    keys = list(dict.fromkeys((r["grouping"], r["compared"]) for r in rows))
    for key in keys:
        cells = []
        for s in columns:
            hit = [r for r in rows if (r["grouping"], r["compared"]) == key
                   and all(r[k] == v for k, v in s.items())]
            cells.append(f"{hit[0]['max_abs_delta']:.3g}" if hit else "-")
        table.add_row(*key, *cells)
    Console(stderr=True).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
