"""Loading a second model on demand while another streams (issue 32's goal: the running
stream's inter-token latency p99 during the load at most 2x its p99 before; no request
fails).

A `tandem serve` child runs on a temporary model store (TANDEM_HOME) holding a link to the
first model and one to `--second` (default: the first model's file again, under another
name), with `--max-loaded-models 2` so both fit. The second model is loaded once and
unloaded again (Ollama's `keep_alive: 0`) so its first-load probes and profiles are cached,
as they are on a machine that served it before. Then one greedy stream of `--tokens`
tokens runs on the first model; after `--before` tokens a chat request (one token) names
the second model, which loads it. Inter-token gaps of the stream (seconds between content
chunks) are split at that request: before it, during the load (from the request until
`/tandem/ps` lists the second model as loaded, polled every 20 ms), and during the second
model's reply (its prefill and token, after the load). Numbers are noisy on a shared
machine: compare the ratio from one run.

Prints one JSON object: `before`, `during` and `second_reply` ({"n", "p50", "p99"} in
ms), `p99_ratio` (during / before), `load_s` (request to loaded), `second_reply_s`
(request to its reply),
`stream_ok` / `second_ok`, and the settings.

usage: python -m app.bench.model_swap [--model NAME_OR_PATH] [--second PATH]
[--tokens 600] [--before 100] [--ctx-size 1024] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from app.bench.server_process import free_port, running
from app.bench.stats import percentiles, ratio
from models.registry import DEFAULT_MODEL
from models.store import link_model, resolve_model

ASK = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
SECOND = "swap-second"


def _store(first: Path, second: Path, home: Path) -> None:
    models = home / "models"
    models.mkdir(parents=True)
    link_model(first, models)
    (models / f"{SECOND}.gguf").symlink_to(second)


def _stream(url: str, model: str, tokens: int, arrivals: list[float], before: int,
            reached: threading.Event, result: dict) -> None:
    body = {"model": model, "messages": ASK, "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0, "stream": True}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choice = json.loads(line[6:])["choices"][0]
                if choice["delta"].get("content"):
                    arrivals.append(time.perf_counter())
                    if len(arrivals) == before:
                        reached.set()
                if choice["finish_reason"]:
                    result["finish_reason"] = choice["finish_reason"]
        result["status"] = r.status_code
    finally:
        reached.set()


def _watch_load(url: str, loaded_at: list[float], timeout: float = 600.0) -> None:
    """Append the time `SECOND` is first listed as loaded (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ps = httpx.get(f"{url}/tandem/ps?loaded=true", timeout=10).json()["models"]
        if any(m["name"] == SECOND for m in ps):
            loaded_at.append(time.perf_counter())
            return
        time.sleep(0.02)


def measure(url: str, first: str, tokens: int, before: int) -> dict:
    """One stream on `first`, the second model requested after `before` tokens."""
    warm = {"model": SECOND, "messages": ASK, "max_tokens": 1}
    httpx.post(f"{url}/v1/chat/completions", json=warm, timeout=600).raise_for_status()
    httpx.post(f"{url}/api/generate", json={"model": SECOND, "keep_alive": 0},
               timeout=600).raise_for_status()
    deadline = time.monotonic() + 60
    while any(m["name"] == SECOND for m in
              httpx.get(f"{url}/tandem/ps?loaded=true", timeout=10).json()["models"]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{SECOND} was not unloaded")
        time.sleep(0.1)
    arrivals: list[float] = []
    reached = threading.Event()
    result: dict = {}
    stream = threading.Thread(target=_stream, args=(url, first, tokens, arrivals, before,
                                                    reached, result))
    stream.start()
    reached.wait(600)
    loaded_at: list[float] = []
    watcher = threading.Thread(target=_watch_load, args=(url, loaded_at))
    t0 = time.perf_counter()
    watcher.start()
    r = httpx.post(f"{url}/v1/chat/completions", json={**warm, "max_tokens": 1}, timeout=600)
    t1 = time.perf_counter()
    watcher.join(60)
    stream.join(600)
    t_loaded = loaded_at[0] if loaded_at else t1
    gaps = [(b, b - a) for a, b in zip(arrivals, arrivals[1:], strict=False)]
    pre = [g for t, g in gaps if t < t0]
    during = [g for t, g in gaps if t0 <= t <= t_loaded]
    reply = [g for t, g in gaps if t_loaded < t <= t1]
    p_pre, p_during, p_reply = percentiles(pre), percentiles(during), percentiles(reply)
    return {
        "before": {"n": len(pre), **p_pre}, "during": {"n": len(during), **p_during},
        "second_reply": {"n": len(reply), **p_reply},
        "p99_ratio": ratio(p_during["p99"] or 0.0, p_pre["p99"] or 0.0),
        "load_s": round(t_loaded - t0, 3), "second_reply_s": round(t1 - t0, 3),
        "stream_tokens": len(arrivals),
        "stream_ok": result.get("status") == 200 and result.get("finish_reason") == "length",
        "second_ok": r.status_code == 200,
        "tokens_after_load": sum(1 for t in arrivals if t > t1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help="the streaming model")
    p.add_argument("--second", default=None, help="the model loaded on demand, a .gguf path "
                   "(default: the first model's file under another name)")
    p.add_argument("--tokens", type=int, default=600, help="tokens the stream generates")
    p.add_argument("--before", type=int, default=100,
                   help="stream tokens before the second model is requested")
    p.add_argument("--ctx-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    first = Path(resolve_model(args.model, pull_missing=False)).resolve()
    second = Path(args.second).resolve() if args.second else first
    with tempfile.TemporaryDirectory() as home:
        _store(first, second, Path(home))
        port = free_port()
        cmd = [sys.executable, "-m", "app.cli", "serve", "--model", str(Path(home) / "models"
                                                                        / first.name),
               "--port", str(port), "--ctx-size", str(args.ctx_size),
               "--max-loaded-models", "2"]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        env = {**os.environ, "TANDEM_HOME": home, "PYTHONUNBUFFERED": "1"}
        env.pop("TANDEM_API_KEY", None)
        with running(cmd, port, timeout=300, env=env) as url:
            name = httpx.get(f"{url}/health", timeout=10).json()["model"]
            out = measure(url, name, args.tokens, args.before)
    out.update({"model": str(first), "second": str(second), "tokens": args.tokens,
                "before_tokens": args.before, "ctx_size": args.ctx_size,
                "note": "ratios from one run; noisy on a shared machine"})
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
