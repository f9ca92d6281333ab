"""Same answer every time, through the engine: the tokens and log-probabilities the engine
returns for generated prompts (`app.bench.exactness.make_prompts`), greedy and seeded,
compared across how the engine groups them.

Every prompt's reference is the prompt alone (one running request). Then all of them:
- `batched`: submitted together, up to 16 running, sharing steps and the prefix cache
  (prompts that share a conversation hit it);
- `cached`: submitted again on the same engine, every prompt served from the prefix cache;
- `prediction_fixed_k` (k = 2, 5, 8): alone again with speculation fixed at k drafts per
  step, each request carrying a prediction (Predicted Outputs) of its reference output
  with every fourth token wrong, so drafts are accepted and rejected.

`python -m app.bench.exactness_engine [--prompts 24] [--exact]` prints a JSON line per
comparison: prompts whose tokens and log-probabilities (the sampled token's and the top
2's, floats compared exactly) equal the reference's, and the run's prompt tokens served from
the prefix cache and draft tokens verified and accepted.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import replace

from app.engine.config import EngineConfig, SchedulerConfig, SpecConfig
from app.engine.engine import LLMEngine
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from backends.base import Runner

PREDICTION_KS = (2, 5, 8)
WRONG_EVERY = 4
FLAT = StepTimeCurve({1: 1.0, 64: 1.01})  # the controller would draft as much as it may


def sampling(i: int, generate: int, seeded: bool) -> SamplingParams:
    """Greedy, or seeded sampling (temperature 0.8, top-p 0.95, seed `i`); log-probs of
    the top 2."""
    if seeded:
        return SamplingParams(temperature=0.8, top_p=0.95, seed=i, max_tokens=generate,
                              ignore_eos=True, logprobs=2)
    return SamplingParams(temperature=0, max_tokens=generate, ignore_eos=True, logprobs=2)


Result = tuple[list[int], list[tuple]]  # (tokens, per token (logprob, top))
COUNTED = ("cached_tokens", "num_draft_tokens", "num_accepted_tokens")


def generate(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams],
             counts: dict[str, int] | None = None) -> list[Result]:
    """Submit every prompt at once and step until done; per prompt its tokens and
    log-probs. Adds the requests' `COUNTED` metrics into `counts` (the proof that a run
    hit the prefix cache, or drafted and rejected)."""
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, p)
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list[tuple]] = {}
    while engine.has_work():
        for o in engine.step():
            tokens.setdefault(o.request_id, []).extend(o.token_ids)
            for lp in o.logprobs or []:
                logprobs.setdefault(o.request_id, []).append(
                    (lp.token_id, lp.logprob, tuple((t, v) for t, _, v in lp.top)))
            if o.finished and o.metrics is not None and counts is not None:
                for name in COUNTED:
                    counts[name] = counts.get(name, 0) + getattr(o.metrics, name)
    return [(tokens[str(i)], logprobs.get(str(i), [])) for i in range(len(prompts))]


def _engine(runner: Runner, max_seqs: int, spec: str | None = None) -> LLMEngine:
    context = runner.max_seq_tokens
    config = EngineConfig(context_length=context, scheduler=SchedulerConfig(
        max_num_seqs=max_seqs, max_num_batched_tokens=runner.max_batch_tokens))
    speculator = Speculator(SpecConfig(mode=spec), FLAT, context) if spec else None
    return LLMEngine(runner, config, speculator=speculator)


def _one_by_one(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams],
                counts: dict[str, int]) -> list[Result]:
    return [generate(engine, [p], [q], counts)[0]
            for p, q in zip(prompts, params, strict=True)]


def compare(runner: Runner, prompts: list[list[int]], generate_tokens: int
            ) -> Iterable[dict]:
    """Per (sampling, comparison): {"comparison", "sampling", "prompts", "identical" (tokens
    and log-probs), "same_tokens", and the run's summed `COUNTED` metrics}."""
    for seeded in (False, True):
        kind = "seeded" if seeded else "greedy"
        params = [sampling(i, generate_tokens, seeded) for i in range(len(prompts))]
        # alone: one request at a time, on an engine of its own
        ref = [generate(_engine(runner, 1), [p], [q])[0]
               for p, q in zip(prompts, params, strict=True)]
        engine = _engine(runner, 16)
        counts: dict[str, dict[str, int]] = {"batched": {}, "cached": {}}
        runs = {"batched": generate(engine, prompts, params, counts["batched"]),
                "cached": generate(engine, prompts, params, counts["cached"])}
        for k in PREDICTION_KS:
            predicted = []
            for q, (tokens, _) in zip(params, ref, strict=True):
                guess = [t if (j + 1) % WRONG_EVERY else (t + 1) % runner.info.n_vocab
                         for j, t in enumerate(tokens)]
                predicted.append(replace(q, prediction=guess))
            name = f"prediction_fixed_{k}"
            counts[name] = {}
            runs[name] = _one_by_one(_engine(runner, 1, f"fixed:{k}"), prompts, predicted,
                                     counts[name])
        for name, got in runs.items():
            yield {"comparison": name, "sampling": kind, "prompts": len(prompts),
                   "identical": sum(g == r for g, r in zip(got, ref, strict=True)),
                   "same_tokens": sum(g[0] == r[0] for g, r in zip(got, ref, strict=True)),
                   **counts[name]}


def main(argv: list[str] | None = None) -> int:
    from app.bench.exactness import make_prompts
    from backends.base import RunnerConfig
    from backends.loader import load_runner
    from models.store import resolve_model

    p = argparse.ArgumentParser(prog="python -m app.bench.exactness_engine",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--generate", type=int, default=16)
    p.add_argument("--max-words", type=int, default=160, help="longest user message, words")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exact", action="store_true")
    args = p.parse_args(argv)
    from backends.llamacpp.exact import bench_settings

    settings = bench_settings(args.exact)
    config = RunnerConfig(max_seqs=16, seq_tokens=1024, kv_layout="split",
                          n_threads=args.threads, **settings)
    path = resolve_model(args.model)
    runner, _ = load_runner(path, backend="llamacpp", config=config)
    try:
        prompts = make_prompts(runner.tokenizer, args.prompts, args.seed, args.max_words)
        for row in compare(runner, prompts, args.generate):
            print(json.dumps({"exact": args.exact, **row}), flush=True)
    finally:
        runner.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
