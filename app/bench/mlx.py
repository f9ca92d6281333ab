"""tandem's MLX backend against mlx-lm's own generators on the same converted model, one process.

Measured in one run, on the same MLX model directory (`tandem models convert NAME --to mlx`)
and the same random prompts (token ids from the upper vocabulary, never control tokens):

- single stream: mlx-lm `stream_generate` vs our `AsyncEngine` (backend mlx), one request;
- aggregate at concurrency C: mlx-lm `BatchGenerator` with C prompts inserted together vs C
  concurrent requests to our engine;
- prefix hit: our engine's TTFT for a prompt seen before (its full blocks come from the prefix
  cache) against the same prompt cold.

Decode tok/s of one request is (output tokens - 1) / (last token time - first token time), the
same definition on both sides, so prefill is excluded; the aggregate is the sum over the
concurrent requests. Output length is forced (EOS ignored: mlx-lm's stop set is emptied, our
requests use `ignore_eos`), greedy. Each figure is the median of `reps` repetitions with fresh
prompts; ratios are ours / mlx-lm. mlx-lm runs first and is freed before our engine loads.

Run: `python -m app.bench.mlx [--model NAME|GGUF|DIR]` or
`tandem bench --backend mlx --vs-mlx-lm --prompt-tokens 32 --max-tokens 16 --concurrency 4`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

from app.bench.engine import random_tokens
from app.bench.load import run_requests
from app.bench.stats import decode_rate, median, ratio
from models.registry import DEFAULT_MODEL


def mlx_model_dir(model: str) -> Path:
    """An MLX model directory for `model`: a directory as it is, else (registry name or .gguf)
    the store's up-to-date conversion, converting first if needed. Raises the store's errors,
    FileNotFoundError, ValueError (unsupported model)."""
    p = Path(model).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise FileNotFoundError(f"{model}: no config.json (not an MLX model directory)")
        return p
    from backends.mlx.convert import convert_gguf_to_mlx, is_current
    from models.store import mlx_conversion_dir, resolve_model

    gguf = resolve_model(model)
    out = mlx_conversion_dir(gguf)
    return out if is_current(out, gguf) else convert_gguf_to_mlx(gguf)


# -- mlx-lm ---------------------------------------------------------------------------------


def mlxlm_single(model, tokenizer, prompt: list[int], max_tokens: int) -> dict:
    """One `stream_generate` run: decode tok/s and TTFT (ms)."""
    from mlx_lm.generate import stream_generate

    times = []
    start = time.perf_counter()
    for _ in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        times.append(time.perf_counter())
    return {"decode_tok_s": decode_rate(len(times), times[0], times[-1]),
            "ttft_ms": (times[0] - start) * 1000, "tokens": len(times)}


def mlxlm_batch(model, prompts: list[list[int]], max_tokens: int) -> dict:
    """All `prompts` inserted into one `BatchGenerator` at once (no stop tokens): the summed
    per-sequence decode tok/s."""
    from mlx_lm.generate import BatchGenerator

    n = len(prompts)
    gen = BatchGenerator(model, max_tokens=max_tokens, stop_tokens=None,
                         completion_batch_size=n, prefill_batch_size=n)
    try:
        gen.insert(prompts, [max_tokens] * n)
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        count: dict[int, int] = {}
        while responses := gen.next_generated():
            now = time.perf_counter()
            for r in responses:
                first.setdefault(r.uid, now)
                last[r.uid] = now
                count[r.uid] = count.get(r.uid, 0) + 1
    finally:
        gen.close()
    return {"decode_tok_s": sum(decode_rate(count[u], first[u], last[u]) for u in count),
            "tokens": sum(count.values())}


# -- tandem ---------------------------------------------------------------------------------


def load_tandem_engine(model_dir: Path, max_seqs: int, kv_tokens: int = 4096,
                       n_ctx: int = 1024):
    """Our `AsyncEngine` on the MLX runner over `model_dir` (a converted directory is passed
    to the runner directly: `app.loader.load_engine` resolves registry names and GGUF files)."""
    from app.engine.async_engine import AsyncEngine
    from app.engine.engine import EngineConfig, LLMEngine
    from app.engine.scheduler import SchedulerConfig
    from backends.mlx.runner import load_mlx_runner

    runner = load_mlx_runner(str(model_dir), max_seqs=max(2 * max_seqs, 16),
                             num_blocks=kv_tokens // 16, block_size=16)
    config = EngineConfig(context_length=n_ctx,
                          scheduler=SchedulerConfig(max_num_seqs=max_seqs,
                                                    max_num_batched_tokens=512),
                          enable_prefix_caching=True)
    return AsyncEngine(LLMEngine(runner, config), model_dir.name, "mlx")


async def tandem_requests(engine, prompts: list[list[int]], max_tokens: int) -> list:
    """Run `prompts` concurrently (greedy, forced length); their `RequestMetrics`."""
    return [t.metrics for t in await run_requests(engine, prompts, max_tokens)]


def _tandem_rate(metrics: list) -> float:
    return sum(decode_rate(m.completion_tokens, m.first_token_time, m.finish_time)
               for m in metrics)


# -- the comparison ---------------------------------------------------------------------------


def run_comparison(model: str = DEFAULT_MODEL, prompt_tokens: int = 32, max_tokens: int = 16,
                   concurrency: int = 4, reps: int = 3, prefix_tokens: int = 64,
                   seed: int = 0, emit: Callable[[dict], None] | None = None) -> list[dict]:
    """Measure mlx-lm then tandem (see the module docstring); returns the result dicts, also
    passed one by one to `emit` as they are ready (e.g. to print JSON lines).

    prefix_tokens: length of the shared part of the prefix-hit prompt; the prompt has one
        more token, so every full block of it can come from the cache.
    Raises FileNotFoundError / ValueError (model), ImportError (mlx or mlx-lm missing).
    """
    from backends.mlx.thread import run_on_mlx_thread

    # mlx-lm runs on a thread whose MLX streams are cleared before it ends
    return run_on_mlx_thread(_compare, model, prompt_tokens, max_tokens, concurrency, reps,
                             prefix_tokens, seed, emit)


def _compare(model: str, prompt_tokens: int, max_tokens: int, concurrency: int, reps: int,
             prefix_tokens: int, seed: int, emit: Callable[[dict], None] | None) -> list[dict]:
    import mlx.core as mx
    import mlx_lm
    from mlx_lm import load as mlxlm_load

    emit = emit or (lambda r: None)
    results: list[dict] = []

    def out(r: dict) -> None:
        results.append(r)
        emit(r)

    model_dir = mlx_model_dir(model)
    header = {"bench": "mlx_vs_mlx_lm", "model_dir": str(model_dir),
              "device": str(mx.default_device()), "metal": bool(mx.metal.is_available()),
              "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
              "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
              "concurrency": concurrency, "reps": reps,
              "loadavg_1m_start": round(os.getloadavg()[0], 2)}
    if not mx.metal.is_available():
        header["note"] = "MLX CPU path (no Metal): absolute tok/s are not representative"

    lm_model, lm_tok = mlxlm_load(str(model_dir))
    lm_tok.eos_token_ids = set()  # forced output length, like ignore_eos on our side
    n_vocab = lm_model.model.embed_tokens.weight.shape[0]
    rng = random.Random(seed)
    banned: set[int] = set()

    def prompts(n: int, length: int) -> list[list[int]]:
        return [random_tokens(rng, length, n_vocab, banned) for _ in range(n)]

    single_prompts = [prompts(1, prompt_tokens)[0] for _ in range(reps)]
    batch_prompts = [prompts(concurrency, prompt_tokens) for _ in range(reps)]
    warm = prompts(1, prompt_tokens)[0]

    # mlx-lm, warmed up first (first calls allocate and build kernels)
    mlxlm_single(lm_model, lm_tok, warm, 4)
    mlxlm_batch(lm_model, [warm] * concurrency, 4)
    lm_single = [mlxlm_single(lm_model, lm_tok, p, max_tokens) for p in single_prompts]
    lm_batch = [mlxlm_batch(lm_model, ps, max_tokens) for ps in batch_prompts]
    del lm_model, lm_tok
    gc.collect()
    mx.clear_cache()

    engine = load_tandem_engine(model_dir, max_seqs=concurrency)
    try:
        loop = asyncio.new_event_loop()
        try:
            run = loop.run_until_complete
            run(tandem_requests(engine, [warm], 4))
            run(tandem_requests(engine, prompts(concurrency, prompt_tokens), 4))
            ours_single = [run(tandem_requests(engine, [p], max_tokens))[0]
                           for p in single_prompts]
            ours_batch = [run(tandem_requests(engine, ps, max_tokens)) for ps in batch_prompts]
            # prefix hit: a prompt cold, then the same prompt again (blocks from the cache)
            cold, hit = [], []
            for _ in range(reps):
                p = prompts(1, prefix_tokens + 1)[0]
                cold.append(run(tandem_requests(engine, [p], 1))[0])
                hit.append(run(tandem_requests(engine, [p], 1))[0])
        finally:
            loop.close()
    finally:
        engine.shutdown()

    header["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    out(header)
    lm1 = median([r["decode_tok_s"] for r in lm_single])
    us1 = median([_tandem_rate([m]) for m in ours_single])
    out({"bench": "single_stream_decode", "concurrency": 1,
         "mlx_lm_decode_tok_s": lm1, "tandem_decode_tok_s": us1, "ratio": ratio(us1, lm1),
         "mlx_lm_ttft_ms": median([r["ttft_ms"] for r in lm_single]),
         "tandem_ttft_ms": median([m.ttft * 1000 for m in ours_single]),
         "mlx_lm_runs": [round(r["decode_tok_s"], 2) for r in lm_single],
         "tandem_runs": [round(_tandem_rate([m]), 2) for m in ours_single]})
    lmc = median([r["decode_tok_s"] for r in lm_batch])
    usc = median([_tandem_rate(ms) for ms in ours_batch])
    out({"bench": "aggregate_decode", "concurrency": concurrency,
         "mlx_lm_decode_tok_s": lmc, "tandem_decode_tok_s": usc, "ratio": ratio(usc, lmc),
         "mlx_lm_runs": [round(r["decode_tok_s"], 2) for r in lm_batch],
         "tandem_runs": [round(_tandem_rate(ms), 2) for ms in ours_batch],
         "mlx_lm_scaling": ratio(lmc, lm1), "tandem_scaling": ratio(usc, us1),
         "output_tokens_per_run": {"mlx_lm": lm_batch[0]["tokens"],
                                   "tandem": sum(m.completion_tokens for m in ours_batch[0])}})
    cold_ms = median([m.ttft * 1000 for m in cold])
    hit_ms = median([m.ttft * 1000 for m in hit])
    out({"bench": "prefix_hit_ttft", "prompt_tokens": prefix_tokens + 1,
         "cached_tokens": [m.cached_tokens for m in hit],
         "cold_cached_tokens": [m.cached_tokens for m in cold],
         "cold_ttft_ms": cold_ms, "hit_ttft_ms": hit_ms,
         "hit_vs_cold": ratio(hit_ms, cold_ms),
         "cold_runs_ms": [round(m.ttft * 1000, 2) for m in cold],
         "hit_runs_ms": [round(m.ttft * 1000, 2) for m in hit]})
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.bench.mlx", description=__doc__.split("\n")[0])
    p.add_argument("--model", "-m", default=DEFAULT_MODEL,
                   help="registry name, .gguf (its MLX conversion is used) or MLX directory")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16, help="output tokens, forced")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--prefix-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.concurrency < 1 or a.max_tokens < 2 or a.prompt_tokens < 1 or a.reps < 1:
        p.error("need --concurrency >= 1, --max-tokens >= 2, --prompt-tokens >= 1, --reps >= 1")
    run_comparison(a.model, a.prompt_tokens, a.max_tokens, a.concurrency, a.reps,
                   a.prefix_tokens, a.seed, emit=lambda r: print(json.dumps(r), flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
