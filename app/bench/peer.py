"""Side-by-side benchmark: `tandem serve` against llama-server, same model, threads, clients.

Each server is started alone on a free loopback port, driven by the same streaming clients
(`app.bench.http`), then stopped, so the two never compete for the cores. The same load also
runs on tandem's engine in a process of its own (no HTTP) to show what the server layer costs.
Scenarios: short prompts at concurrency 1 and 16, and 16 users sharing one long system prompt.
Repeated in rounds (`--repeat`, alternating the order); prints one JSON object per scenario
with each system's medians, the medians of the per-round ratios tandem/llama-server and tandem
HTTP/in-process, and every round's figures.

usage: python -m app.bench.peer [--model NAME] [--llama-server PATH] [--threads 2] [--repeat 3]
                              [--scenarios short_c1,short_c16] [--no-in-process]
                              [--tandem-args "--repack off"]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

from app.bench.http import run_http_bench, run_in_process_bench, served_model
from app.bench.server_process import free_port, running
from app.bench.stats import median
from models.registry import DEFAULT_MODEL

SCENARIOS = [  # (name, concurrency, system prompt tokens)
    ("short_c1", 1, 0),
    ("short_c16", 16, 0),
    ("shared_system_c16", 16, 600),
]


def llama_server_binary(given: str | None) -> str:
    """`given`, or the llama-server that installers/build_llama_server.sh builds or reuses."""
    return given or subprocess.run(
        ["bash", os.path.join(os.path.dirname(__file__), "..", "..", "installers",
                              "build_llama_server.sh")],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]


SEQS, SEQ_TOKENS = 16, 2048  # every server: 16 sequences of 2048 tokens


def tandem_cmd(path: str, port: int, threads: int) -> list[str]:
    """The `tandem serve` command line of the peer benchmarks on model file `path`."""
    return [sys.executable, "-m", "app.cli", "serve", "--model", path, "--port", str(port),
            "--threads", str(threads), "--max-concurrency", str(SEQS),
            "--ctx-size", str(SEQ_TOKENS)]


def llama_server_cmd(binary: str, path: str, port: int, threads: int) -> list[str]:
    """The llama-server command line with the same sequences, threads and model."""
    return [binary, "-m", path, "--port", str(port), "--host", "127.0.0.1",
            "-t", str(threads), "-tb", str(threads), "-np", str(SEQS),
            "-c", str(SEQS * SEQ_TOKENS)]


def add_peer_args(p: argparse.ArgumentParser) -> None:
    """The flags every peer benchmark takes: model, llama-server binary, threads, load."""
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--llama-server", default=None,
                   help="binary (default: build or reuse via installers/build_llama_server.sh)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tandem-args", default="",
                   help='more `tandem serve` flags, one string, e.g. "--spec off"')


def chosen(args) -> list[tuple[str, int, int]]:
    return [s for s in SCENARIOS if s[0] in args.scenarios]


def measure(url: str, model: str, args) -> dict[str, dict]:
    out = {}
    for name, concurrency, system in chosen(args):
        out[name] = run_http_bench(url, model, concurrency=concurrency, requests=args.requests,
                                   prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
                                   system_prompt_tokens=system, seed=args.seed)
    return out


def measure_in_process(path: str, args) -> dict[str, dict]:
    from app.config import EngineArgs
    from app.loader import load_engine
    from backends.base import RunnerConfig

    engine = load_engine(EngineArgs(path, runner=RunnerConfig(
        max_seqs=SEQS, seq_tokens=SEQ_TOKENS, n_threads=args.threads)))
    try:
        return {name: run_in_process_bench(engine, concurrency, args.requests,
                                           args.prompt_tokens, args.max_tokens, system,
                                           seed=args.seed)
                for name, concurrency, system in chosen(args)}
    finally:
        engine.shutdown()


def summarize(runs: dict[str, list[dict[str, dict]]], names: list[str]) -> list[dict]:
    """Per scenario: each system's median throughput and TTFT p50 over the repeats, and the
    medians of the per-repeat ratios (each pair measured back to back)."""
    def med(values: list[float]) -> float:
        return median(values, digits=3)

    lines = []
    for name in names:
        per = {who: [r[name] for r in rs] for who, rs in runs.items()}
        tput = {who: [r["throughput_tok_s"] for r in rs] for who, rs in per.items()}
        ttft = {who: [r["ttft_ms"]["p50"] for r in rs] for who, rs in per.items()}
        lines.append({
            "scenario": name,
            "repeats": len(tput["tandem"]),
            "throughput_tok_s": {who: med(v) for who, v in tput.items()},
            "ttft_p50_ms": {who: med(v) for who, v in ttft.items()},
            "throughput_ratio": med([a / b for a, b in
                                     zip(tput["tandem"], tput["llama_server"], strict=True)]),
            "ttft_p50_ratio": med([a / b for a, b in
                                   zip(ttft["tandem"], ttft["llama_server"], strict=True)]),
            "http_vs_in_process": med([a / b for a, b in zip(
                tput["tandem"], tput["tandem_in_process"], strict=True)])
            if "tandem_in_process" in tput else None,
            "tpot_p50_ms": {who: med([r["tpot_ms"]["p50"] for r in rs])
                            for who, rs in per.items()},
            "runs": per,
        })
    return lines


def main(argv: list[str] | None = None) -> int:
    from models.store import resolve_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_peer_args(p)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3,
                   help="rounds; each measures all three, in alternating order (default 3)")
    names = [name for name, _, _ in SCENARIOS]
    p.add_argument("--scenarios", default=",".join(names),
                   help=f"comma-separated subset of {', '.join(names)} (default: all)")
    p.add_argument("--no-in-process", action="store_true",
                   help="skip the in-process engine run (tandem and llama-server only)")
    p.add_argument("--in-process-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(args.scenarios) - set(names))
    if unknown or not args.scenarios:
        p.error(f"unknown scenario {', '.join(unknown) or '(none)'}: choose from {', '.join(names)}")
    path = str(resolve_model(args.model))
    if args.in_process_only:  # a child of the run below: a fresh process per measurement
        print(json.dumps(measure_in_process(path, args)))
        return 0
    binary = llama_server_binary(args.llama_server)

    def tandem() -> dict[str, dict]:
        port = free_port()
        cmd = tandem_cmd(path, port, args.threads) + shlex.split(args.tandem_args)
        with running(cmd, port) as url:
            return measure(url, served_model(url), args)

    def llama_server() -> dict[str, dict]:
        port = free_port()
        with running(llama_server_cmd(binary, path, port, args.threads), port) as url:
            return measure(url, served_model(url), args)

    def in_process() -> dict[str, dict]:
        cmd = [sys.executable, "-m", "app.bench.peer", "--in-process-only", "--model", path,
               "--threads", str(args.threads), "--requests", str(args.requests),
               "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens),
               "--seed", str(args.seed), "--scenarios", ",".join(args.scenarios)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    systems = {"tandem": tandem, "llama_server": llama_server, "tandem_in_process": in_process}
    if args.no_in_process:
        del systems["tandem_in_process"]
    runs: dict[str, list[dict[str, dict]]] = {who: [] for who in systems}
    for rep in range(args.repeat):
        # alternate the order so slow drift on a shared machine hits both sides alike
        for who in (list(systems) if rep % 2 == 0 else list(reversed(systems))):
            runs[who].append(systems[who]())
    for line in summarize(runs, args.scenarios):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
