"""`tandem bench`: throughput, TTFT and TPOT at several concurrency levels, as JSON lines."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from app.commands.common import add_model_args, fail, load_engine, positive_int, user_errors
from app.commands.engine_flags import default_of, non_negative_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="benchmark the engine (in-process, or a server with --url)",
        description="Measure throughput, TTFT and TPOT at each concurrency level (requests in "
        "flight), in-process on the loaded model or against a running server (--url). Prints "
        "one JSON object per cell; --workload picks the prompts.")
    add_model_args(p)
    p.add_argument("--concurrency", default="1,4,16", metavar="N,N,...",
                   help="comma-separated concurrency levels, requests in flight (default: "
                   "1,4,16)")
    p.add_argument("--prompt-tokens", type=positive_int, default=128, metavar="TOKENS",
                   help="prompt length per request, tokens (default: 128)")
    p.add_argument("--max-tokens", type=positive_int, default=128, metavar="TOKENS",
                   help="output tokens per request, forced (default: 128)")
    p.add_argument("--requests", type=positive_int, default=16, metavar="N",
                   help="requests per level (default: 16)")
    p.add_argument("--shared-prefix-tokens", type=non_negative_int, default=0, metavar="TOKENS",
                   help="a common prefix (e.g. a system prompt) before every prompt, tokens "
                   "(default: 0)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the generated prompts (default: 0)")
    p.add_argument("--png", metavar="PATH", nargs="?", const="",
                   help="draw the results as a PNG chart into PATH; --png alone writes "
                   "<user data dir>/tandem/bench/<kind>-<time>.png (the path is printed on "
                   "stderr) (default: no chart)")
    p.add_argument("--baseline", choices=["raw"], default=None,
                   help="also measure raw llama.cpp decode at each level's batch size and "
                        "report ratios (decode_vs_raw) (default: none)")
    p.add_argument("--vs-mlx-lm", action="store_true",
                   help="with --backend mlx: compare against mlx-lm's stream_generate and "
                        "BatchGenerator (at the largest --concurrency level) on the same "
                        "converted model, plus prefix-hit TTFT (app/bench/mlx.py) "
                        "(default: off)")
    p.add_argument("--workload", default=None,
                   help="speculative-decoding benchmark: comma-separated workloads "
                        "(code-edit, prediction, file-edit, free, agent-loop, chat); --spec is "
                        "then a comma-separated list of modes, each compared with off in the "
                        "same run, and may name oracle (auto drafting the tokens off gave: the "
                        "ceiling of any proposer) "
                        "(app/bench/spec.py). With json-schema: the structured-output "
                        "benchmark (json-schema,free: constrained vs unconstrained, forced "
                        "drafts on and off, under --spec; app/bench/structured.py) "
                        "(default: none)")
    p.add_argument("--formats", default=None, metavar="FORMAT,...",
                   help="with --workload (speculative): also run the model requantized to "
                        "these weight formats (q8_0, q4_0, f16; made with `tandem models "
                        "convert` if missing) and report each cell's tokens/s against the "
                        "fastest plain (off) format (default: the model's own format only)")
    p.add_argument("--url", help="benchmark an OpenAI-compatible server instead (HTTP; "
                   "default: the engine in-process)")
    p.add_argument("--api-key", default=None,
                   help="bearer token for --url (default: $TANDEM_API_KEY)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        levels = [int(c) for c in args.concurrency.split(",") if c]
    except ValueError:
        return fail(f"--concurrency must be comma-separated integers, got {args.concurrency!r}")
    if not levels or min(levels) < 1:
        return fail("--concurrency levels must be >= 1")
    if args.vs_mlx_lm and (args.backend != "mlx" or args.url):
        return fail("--vs-mlx-lm needs --backend mlx and no --url")
    if args.exact and (args.url or args.baseline or args.vs_mlx_lm):
        return fail("--exact applies to the in-process llama.cpp engine: not with --url (start "
                    "the server with --exact), --baseline raw (it measures the default "
                    "library) or --vs-mlx-lm")
    if args.png == "":
        from app.bench.charts import default_chart_path

        args.png = str(default_chart_path("spec" if args.workload else "bench"))
    if args.png and (problem := unwritable(args.png)):
        return fail(f"--png {args.png}: {problem}")
    if args.workload:
        return _spec(args, levels)
    try:
        if args.vs_mlx_lm:
            from app.bench.mlx import run_comparison

            run_comparison(args.model, args.prompt_tokens, args.max_tokens, max(levels),
                           seed=args.seed, emit=lambda r: print(json.dumps(r), flush=True))
            return 0
        if args.url:
            import httpx

            try:
                results = _http(args, levels)
            except (httpx.HTTPError, RuntimeError) as exc:
                return fail(f"{args.url}: {exc or type(exc).__name__}")
        else:
            results = asyncio.run(_local(args, levels))
    except user_errors() as exc:
        return fail(str(exc))
    if args.png:
        from app.bench.engine import plot

        where = f"server {args.url}" if args.url else "in-process engine"
        plot(results, args.png, chart_context(args, results[0]), f"tandem bench: {where}")
        print(f"tandem: chart: {args.png}", file=sys.stderr)
    return 0


def chart_context(args: argparse.Namespace, first: dict | None = None):
    """The chart title's facts: model and format (from the file; a server's model by name
    only), tokens per request, and the machine (CPU model and cores; for --url the server).
    `first`: a result line, whose `prompt_tokens` (what was sent) is preferred."""
    from app.bench.charts import ChartContext, model_and_format

    if getattr(args, "url", None):
        model, fmt, machine = args.model, "", f"server {args.url}"
    else:
        from app.commands.doctor import chip
        from models.store import resolve_model

        try:
            model, fmt = model_and_format(resolve_model(args.model, pull_missing=False))
        except user_errors():  # the run found it; a title must not fail the run
            model, fmt = args.model, ""
        machine = f"{chip()} ({os.cpu_count()} cores)"
    if args.workload:
        tokens = f"{args.max_tokens} output tokens per request, greedy"
    else:
        first = first or {}
        prompt = round(first.get("prompt_tokens_mean") or first.get("prompt_tokens")
                       or args.prompt_tokens)
        tokens = f"{prompt} prompt + {args.max_tokens} output tokens per request"
    return ChartContext(model, fmt, tokens, machine)


async def _local(args: argparse.Namespace, levels: list[int]) -> list[dict]:
    from app.bench.engine import run_bench
    from app.progress import CellProgress

    raw = None
    if args.baseline == "raw":
        # measured first, with the engine not yet loaded
        from app.bench.llamacpp_raw import raw_decode_tok_s_subprocess
        from models.store import resolve_model

        raw = raw_decode_tok_s_subprocess(str(resolve_model(args.model)), levels,
                                          threads=args.threads)
    engine = load_engine(args, max_seqs=max(levels))
    results = []
    cells = CellProgress(len(levels))
    cells.start(_cell(levels[0], args.requests))
    try:
        async for result in run_bench(engine, levels, args.requests, args.prompt_tokens,
                                      args.max_tokens, args.shared_prefix_tokens, args.seed):
            described = engine.describe()
            result["kv_layout"] = described["kv_layout"]
            result["kv_cache_type"] = described["kv_cache_type"]
            result["exact"] = described["exact"]
            if raw is not None:
                c = result["concurrency"]
                result["raw_decode_tok_s"] = raw[c]
                # batch 1: one user's decode speed; batch c: the aggregate decode rate
                ours = result["per_user_tok_s"] if c == 1 else result["decode_tok_s_aggregate"]
                result["decode_vs_raw"] = round(ours / raw[c], 3) if ours else None
            print(json.dumps(result), flush=True)
            results.append(result)
            if len(results) < len(levels):
                cells.start(_cell(levels[len(results)], args.requests))
    finally:
        cells.close()
        engine.shutdown()
    return results


def _cell(concurrency: int, requests: int) -> str:
    return f"concurrency {concurrency}, {requests} requests"


def unwritable(path: str) -> str | None:
    """Why an output file cannot be written at `path` (checked before a long run), or None."""
    p = Path(path).expanduser()
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        return "is a directory"
    if not parent.is_dir():
        return f"no such directory: {parent}"
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        return "permission denied"
    return None


def _http(args: argparse.Namespace, levels: list[int]) -> list[dict]:
    from app.bench.http import run_http_bench
    from app.progress import CellProgress

    api_key = args.api_key if args.api_key is not None else os.environ.get("TANDEM_API_KEY")
    results = []
    cells = CellProgress(len(levels))
    try:
        for c in levels:
            cells.start(_cell(c, args.requests))
            result = run_http_bench(
                args.url, args.model, concurrency=c, requests=args.requests,
                prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
                system_prompt_tokens=args.shared_prefix_tokens, api_key=api_key,
            )
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        cells.close()
    return results


def _converted(path: Path, to: str) -> Path:
    """`path` requantized to `to` in the store, made now if missing (ValueError for an
    unknown format)."""
    from backends.llamacpp.quantize import TARGETS, quantize_gguf
    from models.store import gguf_conversion_path

    if to not in TARGETS:
        raise ValueError(f"--formats: unknown format {to!r}; choose among {', '.join(TARGETS)}")
    out = gguf_conversion_path(path, to)
    if not out.is_file():
        print(f"tandem: requantizing {path.name} to {to} (tandem models convert)...",
              file=sys.stderr)
        try:
            quantize_gguf(path, out, to)
        except RuntimeError as exc:  # llama.cpp's quantizer refused: a user error here
            raise ValueError(str(exc)) from None
    return out


def format_summary(rows: list[dict]) -> list[dict]:
    """One row per (workload, concurrency, format, mode) of a `--formats` run: its decode
    tok/s against the fastest plain (`off`) format of the same cell, `vs_best_plain`."""
    from app.bench.stats import ratio

    best: dict[tuple, float] = {}
    for r in rows:
        if r["mode"] == "off":
            key = (r["workload"], r["concurrency"])
            best[key] = max(best.get(key, 0.0), r["decode_tok_s"])
    return [{"summary": "formats", "workload": r["workload"], "concurrency": r["concurrency"],
             "format": r["format"], "mode": r["mode"], "decode_tok_s": r["decode_tok_s"],
             "vs_best_plain": ratio(r["decode_tok_s"], best[(r["workload"], r["concurrency"])])}
            for r in rows]


def _spec_model(args: argparse.Namespace, path: Path, levels: list[int], workloads: list[str],
                modes: list[str], structured: bool, fmt: str | None) -> list[dict] | None:
    """The speculative (or structured) benchmark on one model file: prints its rows (with
    `format` when `fmt` is given) and returns them; None after the structured benchmark,
    which prints its own."""
    from app.bench.spec import run_spec_bench
    from app.engine.spec_decode.step_times import OnlineStepTimes
    from app.spec_profile import load_profile, step_time_curve
    from backends.base import RunnerConfig
    from backends.loader import load_runner

    # the split layout: output independent of batch shape, so every mode's tokens match
    # file-edit's prompt is a 200-line file (~1,900 tokens) and its reply the file again
    seq_tokens = 4096 if "file-edit" in workloads else 2048
    if args.ctx_size != default_of("runner.seq_tokens"):
        seq_tokens = args.ctx_size
    runner_config = RunnerConfig(max_seqs=max(levels), seq_tokens=seq_tokens, kv_layout="split",
                                 n_threads=args.threads, kv_cache_type=args.kv_cache_type,
                                 flash_attn=args.flash_attn, repack=args.repack,
                                 exact=args.exact)
    runner, backend = load_runner(path, backend=args.backend, config=runner_config)
    tag = {"format": fmt} if fmt else {}

    def emit(row: dict) -> None:
        print(json.dumps({**tag, **row}), flush=True)

    draft_runner = None
    try:
        if structured:  # measured now, beside the cells it drives (the cache is not touched)
            from app.engine.spec_decode.controller import StepTimeCurve
            from app.engine.spec_decode.profile import measure_step_times

            curve, cached, online = StepTimeCurve(measure_step_times(runner)), False, None
        else:  # `auto` as the server runs it: the profile, refined per batch size as it runs
            profile = load_profile(runner, path, backend)
            curve, cached = profile.curve(), profile.cached

            def online() -> OnlineStepTimes:  # not saved: each cell starts where this run did
                return OnlineStepTimes(profile.points, profile.online)
        emit({"step_time_ratios": curve.ratios(), "t1_ms": round(curve(1) * 1e3, 2),
              "cached": cached, "exact": runner_config.exact})
        draft = None
        if args.draft_model:
            from app.config import EngineArgs
            from app.loader import load_draft

            draft_runner, draft_path = load_draft(
                EngineArgs(str(path), runner=runner_config, draft_model=args.draft_model),
                runner, backend)
            draft_curve, _ = step_time_curve(draft_runner, draft_path, backend)
            emit({"draft_step_time_ratios": draft_curve.ratios(),
                  "draft_t1_ms": round(draft_curve(1) * 1e3, 2)})
            draft = (draft_runner, draft_curve)
        if structured:
            from app.bench.structured import run_structured_bench

            run_structured_bench(runner, curve, workloads, levels, modes[0] if modes else "off",
                                 args.max_tokens, emit=emit)
            return None
        rows = run_spec_bench(runner, curve, workloads, levels, modes, args.max_tokens,
                              emit=emit, draft=draft, suffix_tokens=args.suffix_tokens,
                              num_draft_tokens=args.num_draft_tokens, online=online)
        return [{**tag, **r} for r in rows]
    finally:
        runner.close()
        if draft_runner is not None:
            draft_runner.close()


def _spec(args: argparse.Namespace, levels: list[int]) -> int:
    from app.bench.charts import model_and_format
    from app.bench.spec import ORACLE, WORKLOADS, plot_frontier
    from app.bench.structured import WORKLOADS as STRUCTURED
    from app.engine.config import SpecConfig
    from models.store import resolve_model

    workloads = [w for w in args.workload.split(",") if w]
    structured = any(w in STRUCTURED for w in workloads)
    known = ("free", *STRUCTURED) if structured else WORKLOADS
    if any(w not in known for w in workloads):
        return fail(f"--workload must be among {', '.join(WORKLOADS)}, or among "
                    f"{', '.join(('free', *STRUCTURED))}")
    modes = [m for m in args.spec.split(",") if m and m != "off"]
    formats = [f for f in (args.formats or "").split(",") if f]
    if formats and structured:
        return fail(f"--formats is for the speculative workloads ({', '.join(WORKLOADS)})")
    if structured and len(modes) > 1:
        return fail("the structured-output benchmark takes one --spec mode")
    if structured and ORACLE in modes:
        return fail("--spec oracle is for the speculative workloads "
                    f"({', '.join(WORKLOADS)})")
    if formats and args.png:
        return fail("--png draws one format's cells; leave it out with --formats")
    if args.kv_layout not in ("split", default_of("runner.kv_layout")):
        return fail("the speculative and structured benchmarks run the split KV layout (every "
                    "mode's tokens comparable); leave out --kv-layout")
    try:
        if args.exact:  # before `_converted` (llama.cpp's quantizer) loads llama.cpp
            from backends.llamacpp.exact import select_library

            select_library()
        for m in modes:
            SpecConfig(mode="auto" if m == ORACLE else m, num_draft_tokens=args.num_draft_tokens)
        path = resolve_model(args.model)
        paths = [path, *(_converted(path, f) for f in formats)]
    except user_errors() as exc:
        return fail(str(exc))
    results = []
    for p in paths:
        fmt = model_and_format(p)[1].removeprefix("GGUF ") if formats else None
        try:
            rows = _spec_model(args, p, levels, workloads, modes, structured, fmt)
        except user_errors() as exc:
            return fail(str(exc))
        if rows is None:  # the structured benchmark printed its rows
            return 0
        results += rows
    if formats:
        for row in format_summary(results):
            print(json.dumps(row), flush=True)
    if args.png and not formats:
        plot_frontier(results, args.png, chart_context(args))
        print(f"tandem: chart: {args.png}", file=sys.stderr)
    return 0
