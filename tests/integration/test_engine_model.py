"""The engine on the embedded model: parity with llama-cpp-python, batching, prefix cache."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import EngineArgs
from app.engine import SamplingParams
from app.loader import load_engine
from app.prompts import chat_prompt_ids, raw_prompt_ids
from backends.base import RunnerConfig
from backends.llamacpp.runner import BLOCK_SIZE

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "1, 2, 3, 4, 5,",
    "Water boils at a temperature of",
    "The largest planet in our solar system is",
]


@pytest.fixture(scope="module")
def engine(embedded_model_path):
    eng = load_engine(EngineArgs(str(embedded_model_path), runner=RunnerConfig(
        max_seqs=16, seq_tokens=4096, n_threads=2)))
    yield eng
    eng.shutdown()


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


async def collect(engine, prompt_ids, params):
    tokens, text, last = [], "", None
    async for out in engine.generate(prompt_ids, params):
        tokens += out.token_ids
        text += out.text
        last = out
    return tokens, text, last


def reference_greedy(llm, prompt_ids, n):
    out = []
    for tok in llm.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                            repeat_penalty=1.0, reset=True):
        out.append(tok)
        if len(out) == n:
            return out
    return out


async def test_greedy_matches_llama_cpp_python_for_64_tokens(engine, reference_llama):
    prompt = raw_prompt_ids(engine.tokenizer, PROMPTS[0])
    assert prompt == reference_llama.tokenize(PROMPTS[0].encode(), add_bos=True, special=True)
    ours, _, _ = await collect(engine, prompt, greedy(64))
    assert ours == reference_greedy(reference_llama, prompt, 64)


def test_tandem_run_cli_matches_llama_cpp_python(embedded_model_path, reference_llama):
    tandem = Path(sys.executable).with_name("tandem")
    proc = subprocess.run(
        [str(tandem), "run", "--raw", PROMPTS[0], "--model", embedded_model_path,
         "--temperature", "0", "--repetition-penalty", "1", "--max-tokens", "64",
         "--threads", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    prompt = reference_llama.tokenize(PROMPTS[0].encode(), add_bos=True, special=True)
    ref_tokens = reference_greedy(reference_llama, prompt, 64)
    expected = reference_llama.detokenize(ref_tokens).decode("utf-8", errors="replace")
    assert proc.stdout == expected + "\n"
    assert "TTFT" in proc.stderr and "64 generated tokens (max tokens)" in proc.stderr


async def test_batched_equals_alone(engine):
    prompts = [raw_prompt_ids(engine.tokenizer, p) for p in PROMPTS]
    alone = [(await collect(engine, p, greedy(24)))[0] for p in prompts]
    together = await asyncio.gather(*(collect(engine, p, greedy(24)) for p in prompts))
    assert [t[0] for t in together] == alone


async def test_repeated_system_prompt_served_from_prefix_cache(engine):
    system = " ".join(f"Rule {i}: answer briefly and politely." for i in range(70))
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "What is two plus two?"}]
    prompt = chat_prompt_ids(engine.tokenizer, messages)
    assert len(prompt) > 500
    first_tokens, first_text, first = await collect(engine, prompt, greedy(16))
    second_tokens, second_text, second = await collect(engine, prompt, greedy(16))
    assert first.metrics.cached_tokens == 0
    # one-token blocks: every prompt token but the last, whose logits must be computed
    assert engine.runner.block_size == BLOCK_SIZE == 1
    assert second.metrics.cached_tokens == len(prompt) - 1
    assert second_tokens == first_tokens and second_text == first_text


async def test_cancel_returns_blocks(engine):
    before = engine.stats().kv_blocks_used
    stream = engine.submit(raw_prompt_ids(engine.tokenizer, PROMPTS[2]), greedy(2000))
    got, cancelled = 0, False
    async for out in stream:
        got += len(out.token_ids)
        # an output may carry several tokens (accepted drafts: this prompt's continuation
        # is in the suffix index after the earlier tests)
        if got >= 3 and not out.finished and not cancelled:
            assert engine.stats().kv_blocks_used > before
            stream.cancel()
            cancelled = True
    assert out.finished and out.finish_reason == "abort"
    await asyncio.sleep(0.05)
    assert engine.stats().kv_blocks_used == before
    assert engine.engine.block_manager.num_used_blocks == before


async def test_seeded_sampling_is_reproducible(engine):
    prompt = raw_prompt_ids(engine.tokenizer, PROMPTS[3])
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=16, seed=7, ignore_eos=True)
    first = (await collect(engine, prompt, params))[0]
    others = await asyncio.gather(*(collect(engine, prompt, params) for _ in range(3)))
    assert all(o[0] == first for o in others)


def test_in_process_bench_runs_the_http_bench_load(engine):
    from app.bench.http import make_conversations, run_in_process_bench

    r = run_in_process_bench(engine, concurrency=2, requests=3, prompt_tokens=8, max_tokens=5,
                             system_prompt_tokens=40)
    assert (r["url"], r["concurrency"], r["requests"]) == ("in-process", 2, 3)
    assert r["completion_tokens"] == 15  # ignore_eos forces the length
    lengths = [len(chat_prompt_ids(engine.tokenizer, m)) for m in make_conversations(3, 8, 40, 0)]
    assert r["prompt_tokens_mean"] == round(sum(lengths) / 3, 1)
    assert r["prefix_cached_tokens"] >= 2 * 32  # later requests hit the system prompt
    assert 0 < r["ttft_ms"]["p50"] <= r["ttft_ms"]["p99"]
