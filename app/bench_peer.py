"""Side-by-side benchmark: `tandem serve` against llama-server, same model, threads, clients.

Each server is started alone on a free loopback port, driven by the same streaming clients
(`app.bench_http`), then stopped, so the two never compete for the cores. Last, the same load
runs on tandem's engine in this process (no HTTP) to show what the server layer costs.
Scenarios: short prompts at concurrency 1 and 16, and 16 users sharing one long system prompt.
Prints one JSON object per scenario with the three results and the ratios
tandem/llama-server and tandem HTTP/in-process.

usage: python -m app.bench_peer [--model NAME] [--llama-server PATH] [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import httpx

from app.bench_http import run_http_bench, run_in_process_bench, served_model
from models.registry import DEFAULT_MODEL

SCENARIOS = [  # (name, concurrency, system prompt tokens)
    ("short_c1", 1, 0),
    ("short_c16", 16, 0),
    ("shared_system_c16", 16, 600),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(cmd: list[str], port: int, timeout: float = 120.0):
    """Start a server process and wait until GET /health answers 200."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {' '.join(cmd)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {timeout:.0f} s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def measure(url: str, model: str, args) -> dict[str, dict]:
    out = {}
    for name, concurrency, system in SCENARIOS:
        out[name] = run_http_bench(url, model, concurrency=concurrency, requests=args.requests,
                                   prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
                                   system_prompt_tokens=system, seed=args.seed)
    return out


def measure_in_process(path: str, args) -> dict[str, dict]:
    from app.engine import AsyncEngine

    engine = AsyncEngine.from_model(path, n_ctx=2048, max_seqs=16, threads=args.threads)
    try:
        return {name: run_in_process_bench(engine, concurrency, args.requests,
                                           args.prompt_tokens, args.max_tokens, system,
                                           seed=args.seed)
                for name, concurrency, system in SCENARIOS}
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    from models.store import resolve_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--llama-server", default=None,
                   help="binary (default: build or reuse via installers/build_llama_server.sh)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    path = str(resolve_model(args.model))
    binary = args.llama_server or subprocess.run(
        ["bash", os.path.join(os.path.dirname(__file__), "..", "installers",
                              "build_llama_server.sh")],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]

    port = free_port()
    # 16 sequences of 2048 tokens on both sides (llama-server: -np 16 -c 32768)
    tandem_cmd = [sys.executable, "-m", "app.cli", "serve", "--model", path, "--port", str(port),
                  "--threads", str(args.threads), "--max-concurrency", "16", "--ctx-size", "2048"]
    with running(tandem_cmd, port) as url:
        ours = measure(url, served_model(url), args)
    port = free_port()
    # -np 16 slots, each with room for the long system prompt and the reply
    peer_cmd = [binary, "-m", path, "--port", str(port), "--host", "127.0.0.1",
                "-t", str(args.threads), "-tb", str(args.threads), "-np", "16",
                "-c", str(16 * 2048)]
    with running(peer_cmd, port) as url:
        theirs = measure(url, served_model(url), args)
    local = measure_in_process(path, args)  # last: llama.cpp stays loaded in this process

    for name, _, _ in SCENARIOS:
        a, b, c = ours[name], theirs[name], local[name]
        print(json.dumps({
            "scenario": name,
            "tandem": a,
            "llama_server": b,
            "tandem_in_process": c,
            "throughput_ratio": round(a["throughput_tok_s"] / b["throughput_tok_s"], 3),
            "ttft_p50_ratio": round(a["ttft_ms"]["p50"] / b["ttft_ms"]["p50"], 3),
            "http_vs_in_process": round(a["throughput_tok_s"] / c["throughput_tok_s"], 3),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
