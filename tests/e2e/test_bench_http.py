"""The peer benchmark against our own server: its numbers and the prefix-cache report."""

from __future__ import annotations

import json

from app.bench.http import main, run_http_bench
from tests.e2e.conftest import Server


def test_run_http_bench(server: Server) -> None:
    r = run_http_bench(
        f"{server.url}/v1",
        server.model,
        concurrency=2,
        requests=2,
        prompt_tokens=16,
        max_tokens=6,
        api_key=server.api_key,
        warmup=False,
    )
    assert r["concurrency"] == 2
    assert r["completion_tokens"] == 12  # ignore_eos forces the length
    assert r["throughput_tok_s"] > 0
    assert 0 < r["ttft_ms"]["p50"] <= r["ttft_ms"]["p99"]
    assert 0 < r["tpot_ms"]["p50"] <= r["tpot_ms"]["p99"]


def test_shared_system_prompt_is_cached(server: Server, capsys) -> None:  # noqa: ANN001
    argv = ["--url", server.url, "--concurrency", "1", "--requests", "2", "--prompt-tokens", "8"]
    argv += ["--max-tokens", "2", "--system-prompt-tokens", "80", "--api-key", server.api_key or ""]
    assert main(argv) == 0

    (line,) = capsys.readouterr().out.strip().splitlines()
    r = json.loads(line)
    assert r["prefix_cached_tokens"] >= 64  # the second request reuses the system prompt
    assert r["prompt_tokens_mean"] > 80
