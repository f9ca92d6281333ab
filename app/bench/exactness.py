"""Same answer every time, at scale (issue 31): generated chat prompts, each compared bit for
bit, by logits, across every grouping of its tokens the engine can produce.

`python -m app.bench.exactness [--prompts 200] [--exact]` prints a JSON line of the
setting, one per comparison (prompts compared, bit-identical, with the reference's greedy
tokens, max |Δ logits|), then a summary line (`"summary": true`). Each prompt's reference is
the prompt in one step (up to 512 tokens) and its greedy continuation one token per step;
every comparison computes the logits of the same continuation (teacher-forced) grouped
another way:

- `prefix_hit`: the prompt's KV truncated to each hit length h (every h in 1..P-1 at
  `--hit-stride 1`; h = P-1 is a full prefix-cache hit, whose last token is recomputed),
  then positions h..P-2 in one step and the last prompt token with the continuation in
  one more, as after a prefix cache hit; a prompt matches if every hit length does;
- `spec_fixed_k` (k = 1..8): the continuation in verify steps of 1 + k tokens, logits at
  every position, every draft right;
- `spec_wrong_drafts`: verify steps of 1 + 4 tokens whose every third draft is wrong, the
  slot truncated after each rejection as speculative decoding does (rows after a wrong
  draft are not compared: they are discarded);
- `batched`: prompts prefilled one by one, then decoded together 16 at a time;
- `two_box`: the prompt less its last token prefilled on a second runner in chunks of
  `--chunk-tokens`, its KV exported and imported into the first (as the prefill worker
  streams it), then the last prompt token and the continuation.

Equal logits at every position make greedy and seeded output equal whatever the sampler
draws; `app.bench.exactness_engine` checks that through the engine as well. 0.0 means
bit-identical. `--exact` runs tandem's exact mode (`backends/llamacpp/exact.py`); without it,
the default settings (flash attention on), which are not invariant.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from app.bench.invariance import Probe, max_delta
from backends.base import Runner

SPEC_KS = tuple(range(1, 9))
WRONG_EVERY = 3  # spec_wrong_drafts: every third draft is wrong
WRONG_K = 4
BATCH = 16
WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name "
         "team minute idea body information back parent face others level office door "
         "health person art war history party result change morning reason research girl "
         "guy moment air teacher force education the a of and to in is you that it was for "
         "on are as with they at be this have from or one had by not what all were we when "
         "your can said there use each which she do how their if will up other about out "
         "many then them these so some her would make like him into has look two more write "
         "go see could no way than first been call who its now find long down did get come "
         "made may part def return print import class self list dict value key none true "
         "false while for range len if else elif try except raise with open file data").split()
SYSTEMS = ("You are a helpful assistant.",
           "You are a careful code reviewer. Answer briefly and name the line you mean.",
           "You answer questions about a company's internal handbook. " * 6)


def make_prompts(tokenizer, n: int, seed: int = 0, max_words: int = 160) -> list[list[int]]:
    """`n` chat prompts (token ids, chat template applied): user messages of 2 to
    `max_words` random words, three in four behind one of three shared system prompts, and
    one in five a second turn after an earlier prompt's conversation (sharing its whole
    prefix). Deterministic for a seed."""
    from app.prompts import chat_prompt_ids

    rng = random.Random(seed)
    conversations: list[list[dict]] = []
    prompts = []
    for i in range(n):
        words = rng.randint(2, max_words) if rng.random() < 0.8 else rng.randint(2, 12)
        user = {"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(words))
                + rng.choice(("?", ".", "!", ""))}
        if conversations and i % 5 == 4:
            earlier = rng.choice(conversations)
            reply = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
            messages = earlier + [{"role": "assistant", "content": reply}, user]
        else:
            system = rng.randrange(4)
            messages = ([{"role": "system", "content": SYSTEMS[system]}] if system < 3 else [])
            messages.append(user)
        conversations.append(messages)
        prompts.append(chat_prompt_ids(tokenizer, messages))
    return prompts


@dataclass
class Reference:
    """A prompt's greedy continuation (`tokens`, G ids) and its logits `[G, n_vocab]`:
    row i is the distribution `tokens[i]` was taken from."""

    prompt: list[int]
    tokens: list[int]
    logits: np.ndarray


class Steps(Probe):
    """Runs steps on one runner's slots; slot `s` owns blocks `s*span ..` (`Probe.item`)."""

    def __init__(self, runner: Runner) -> None:
        super().__init__(runner, runner.max_seq_tokens)

    def step(self, slot: int, tokens: list[int], start: int, rows: list[int]) -> np.ndarray:
        return np.array(self.runner.execute([self.item(slot, tokens, start, rows)]))

    def prefill(self, slot: int, tokens: list[int], start: int = 0, chunk: int | None = None,
                last_logits: bool = False) -> np.ndarray | None:
        """`tokens` from `start` in steps of `chunk` (default: the runner's step limit);
        the last position's logits `[1, n_vocab]` if asked."""
        chunk = chunk or self.runner.max_batch_tokens
        out = None
        for at in range(0, len(tokens), chunk):
            piece = tokens[at:at + chunk]
            last = last_logits and at + chunk >= len(tokens)
            got = self.step(slot, piece, start + at, [len(piece) - 1] if last else [])
            out = got if last else out
        return out


def reference(steps: Steps, prompt: list[int], generate: int) -> Reference:
    """Greedy: the prompt in one step (steps of the runner's `max_batch_tokens` beyond it),
    then one token per step. Raises ValueError if prompt and continuation exceed a slot."""
    if len(prompt) + generate > steps.runner.max_seq_tokens:
        raise ValueError(f"a {len(prompt)}-token prompt and {generate} more tokens do not "
                         f"fit a slot of {steps.runner.max_seq_tokens}")
    steps.runner.truncate(0, 0)
    rows = [steps.prefill(0, prompt, last_logits=True)[0]]
    tokens = [int(np.argmax(rows[0]))]
    while len(tokens) < generate:
        rows.append(steps.step(0, [tokens[-1]], len(prompt) + len(tokens) - 1, [0])[0])
        tokens.append(int(np.argmax(rows[-1])))
    steps.runner.truncate(0, 0)
    return Reference(prompt, tokens, np.stack(rows))


def _continuation(steps: Steps, ref: Reference, slot: int = 0) -> np.ndarray:
    """With the prompt less its last token in `slot`: the last prompt token and the
    continuation (less its last token) in one step, logits at every position `[G, V]`."""
    p = len(ref.prompt)
    return steps.step(slot, [ref.prompt[-1]] + ref.tokens[:-1], p - 1, list(range(len(ref.tokens))))


def prefix_hits(steps: Steps, ref: Reference, stride: int = 1) -> Iterator[np.ndarray]:
    """Per hit length h (1..P-1 by `stride`, always P-1): the cold prompt's KV kept up to h
    (the prefix cache), h..P-2 in one step, then `_continuation`."""
    p = len(ref.prompt)
    steps.runner.truncate(0, 0)
    steps.prefill(0, ref.prompt[:-1])
    hits = sorted(set(range(1, p - 1, stride)) | {p - 1})
    for h in reversed(hits):  # truncating only shortens: recompute h..P-2, keep the rest
        steps.runner.truncate(0, h)
        if h < p - 1:
            steps.prefill(0, ref.prompt[h:-1], start=h)
        yield _continuation(steps, ref)
    steps.runner.truncate(0, 0)


def speculative(steps: Steps, ref: Reference, k: int, wrong_every: int = 0,
                rng: random.Random | None = None) -> np.ndarray:
    """With the prompt less its last token in slot 0 (left so): the continuation's logits
    from verify steps of the last token + `k` drafts, logits at every position. With
    `wrong_every`, every `wrong_every`-th draft (counted over the run) is replaced by
    another token, the rows after it discarded and the slot truncated to the accepted
    tokens, as a rejection does. Returns `[G, V]`."""
    p, gen = len(ref.prompt), ref.tokens
    rows: list[np.ndarray] = []
    drafted = 0
    last = ref.prompt[-1]
    while len(rows) < len(gen):
        done = len(rows)
        drafts = list(gen[done:done + k])[: len(gen) - done - 1]
        wrong_at = None
        for j in range(len(drafts)):
            drafted += 1
            if wrong_every and drafted % wrong_every == 0:
                shift = 1 + (rng.randrange(1000) if rng else 0)
                drafts[j] = (drafts[j] + shift) % steps.runner.info.n_vocab
                wrong_at = j
                break
        got = steps.step(0, [last] + drafts, p - 1 + done, list(range(1 + len(drafts))))
        keep = len(drafts) + 1 if wrong_at is None else wrong_at + 1
        rows.extend(got[:keep])
        steps.runner.truncate(0, p + done + keep - 1)
        last = gen[done + keep - 1]
    steps.runner.truncate(0, p - 1)
    return np.stack(rows[:len(gen)])


def batched(steps: Steps, refs: list[Reference]) -> list[np.ndarray]:
    """Each prompt prefilled alone in its own slot, then every decode step shared by all
    (teacher-forced). Returns each prompt's `[G, V]`."""
    runner = steps.runner
    firsts = []
    for slot, ref in enumerate(refs):
        runner.truncate(slot, 0)
        firsts.append(steps.prefill(slot, ref.prompt, last_logits=True)[0])
    out = [[f] for f in firsts]
    for i in range(1, max(len(r.tokens) for r in refs)):
        live = [(s, r) for s, r in enumerate(refs) if i < len(r.tokens)]
        items = [steps.item(s, [r.tokens[i - 1]], len(r.prompt) + i - 1, [0]) for s, r in live]
        got = np.array(runner.execute(items))
        for row, (s, _) in zip(got, live, strict=True):
            out[s].append(row)
    for slot in range(len(refs)):
        runner.truncate(slot, 0)
    return [np.stack(o) for o in out]


def two_box(steps: Steps, worker: Steps, ref: Reference, chunk: int) -> np.ndarray:
    """The prompt less its last token computed on `worker` in `chunk`-token steps, its KV
    exported chunk by chunk and imported into slot 0 of `steps`, then `_continuation`."""
    p = len(ref.prompt)
    worker.runner.truncate(0, 0)
    steps.runner.truncate(0, 0)
    table = steps.item(0, ref.prompt, 0, []).block_table
    for at in range(0, p - 1, chunk):
        n = min(chunk, p - 1 - at)
        worker.prefill(0, ref.prompt[at:at + n], start=at)
        kv = worker.runner.export_kv(0, table, at, n)
        steps.runner.import_kv(0, table, at, kv)
    got = _continuation(steps, ref)
    worker.runner.truncate(0, 0)
    steps.runner.truncate(0, 0)
    return got


class Tally:
    """Per comparison: prompts compared, prompts whose every row was bit-identical (and
    whose greedy tokens were the reference's), and the max |Δ| seen."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def add(self, name: str, ref: Reference, *got: np.ndarray) -> float:
        """One prompt's result(s) for `name`: it matches if every array in `got` does."""
        d = max(max_delta(g, ref.logits) for g in got)
        same = all([int(t) for t in np.argmax(g, axis=1)] == ref.tokens for g in got)
        r = self.rows.setdefault(name, {"comparison": name, "prompts": 0, "identical": 0,
                                        "same_greedy_tokens": 0, "max_abs_delta": 0.0})
        r["prompts"] += 1
        r["identical"] += d == 0.0
        r["same_greedy_tokens"] += same
        r["max_abs_delta"] = max(r["max_abs_delta"], d)
        return d


def run_suite(runner: Runner, worker: Runner | None, prompts: list[list[int]], generate: int,
              hit_stride: int = 1, chunk_tokens: int = 64,
              progress: Callable[[dict], None] | None = None) -> Tally:
    """Every comparison above for every prompt; `worker` None skips `two_box`."""
    steps, tally = Steps(runner), Tally()
    wsteps = Steps(worker) if worker is not None else None
    rng = random.Random(0)
    for start in range(0, len(prompts), BATCH):
        refs = [reference(steps, p, generate) for p in prompts[start:start + BATCH]]
        for ref in refs:
            tally.add("prefix_hit", ref, *prefix_hits(steps, ref, hit_stride))
            steps.prefill(0, ref.prompt[:-1])  # one prompt for every speculative run
            for k in SPEC_KS:
                tally.add(f"spec_fixed_{k}", ref, speculative(steps, ref, k))
            tally.add("spec_wrong_drafts", ref,
                      speculative(steps, ref, WRONG_K, WRONG_EVERY, rng))
            steps.runner.truncate(0, 0)
            if wsteps is not None:
                tally.add("two_box", ref, two_box(steps, wsteps, ref, chunk_tokens))
        for ref, got in zip(refs, batched(steps, refs), strict=True):
            tally.add("batched", ref, got)
        if progress:
            progress({"prompts_done": start + len(refs)})
    return tally


def main(argv: list[str] | None = None) -> int:
    from backends.base import RunnerConfig
    from backends.loader import load_runner
    from models.store import resolve_model

    p = argparse.ArgumentParser(prog="python -m app.bench.exactness",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="registry name or path")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--generate", type=int, default=16, help="continuation tokens per prompt")
    p.add_argument("--max-words", type=int, default=160, help="longest user message, words")
    p.add_argument("--hit-stride", type=int, default=1,
                   help="prefix-cache hit lengths compared: every STRIDE-th (1: every one)")
    p.add_argument("--chunk-tokens", type=int, default=64, help="two-box chunk size")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exact", action="store_true", help="tandem's exact mode")
    args = p.parse_args(argv)
    from backends.llamacpp.exact import bench_settings

    settings = bench_settings(args.exact)
    path = resolve_model(args.model)
    config = RunnerConfig(max_seqs=BATCH, seq_tokens=1024, kv_layout="split",
                          n_threads=args.threads, **settings)
    runner, _ = load_runner(path, backend="llamacpp", config=config)
    worker, _ = load_runner(path, backend="llamacpp", config=replace(config, max_seqs=1))
    try:
        prompts = make_prompts(runner.tokenizer, args.prompts, args.seed, args.max_words)
        lengths = sorted(len(x) for x in prompts)
        print(json.dumps({"model": path.name, "exact": args.exact, "prompts": len(prompts),
                          "prompt_tokens_min_median_max": [lengths[0], lengths[len(lengths) // 2],
                                                           lengths[-1]],
                          "generate": args.generate, "hit_stride": args.hit_stride}),
              flush=True)
        tally = run_suite(runner, worker, prompts, args.generate, args.hit_stride,
                          args.chunk_tokens,
                          progress=lambda r: print(json.dumps(r), file=sys.stderr, flush=True))
    finally:
        worker.close()
        runner.close()
    for row in tally.rows.values():
        print(json.dumps(row), flush=True)
    ok = all(r["identical"] == r["prompts"] for r in tally.rows.values())
    print(json.dumps({"summary": True, "all_identical": ok,
                      "comparisons": len(tally.rows)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
