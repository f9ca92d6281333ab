"""A draft model on the embedded model: a Q8_0 copy (made with llama.cpp's quantize API) as
target, the Q4_1 original as draft. Greedy and seeded output equal plain decoding, in the
split KV layout (see test_spec_model.py for why that layout)."""

from __future__ import annotations

import llama_cpp as L
import pytest

from app.config import EngineArgs
from app.engine.config import EngineConfig, SchedulerConfig, SpecConfig
from app.engine.engine import LLMEngine
from app.engine.residency import MirroredResidency
from app.engine.spec_decode.draft_model import DraftModelProposer
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from app.loader import load_draft
from app.prompts import chat_prompt_ids
from backends.base import RunnerConfig
from backends.llamacpp.runner import LlamaCppRunner
from backends.loader import load_runner

RUNNER = RunnerConfig(max_seqs=4, seq_tokens=1024, kv_layout="split", n_threads=2,
                      flash_attn="on")


@pytest.fixture(scope="module")
def q8_target(embedded_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("q8") / "smollm2-135m-q8_0.gguf"
    params = L.llama_model_quantize_default_params()
    params.ftype = L.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    rc = L.llama_model_quantize(str(embedded_model_path).encode(), str(out).encode(),
                                params)
    assert rc == 0
    return str(out)


def engine_for(target: str, draft: str | None, mode: str):
    """(engine, runners to close): plain when `draft` is None, else with the draft model
    in `mode` (the loader's `load_draft` shapes and checks it)."""
    runner, _ = load_runner(target, config=RUNNER)
    config = EngineConfig(context_length=1024, scheduler=SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=512))
    if draft is None:
        return LLMEngine(runner, config), [runner]
    args = EngineArgs(target, runner=RUNNER, spec=SpecConfig(mode=mode), draft_model=draft)
    draft_runner, _ = load_draft(args, runner, "llamacpp")
    residency = MirroredResidency(runner, draft_runner, runner.block_size)
    speculator = Speculator(SpecConfig(mode=mode), None, 1024, True,
                            DraftModelProposer(draft_runner, residency))
    return LLMEngine(runner, config, residency=residency, speculator=speculator), \
        [runner, draft_runner]


def generate(engine, prompts, params):
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, p)
    out: dict[str, list[int]] = {}
    while engine.has_work():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.token_ids)
    return [out[str(i)] for i in range(len(prompts))]


def run(target, draft, mode, prompts, params):
    engine, runners = engine_for(target, draft, mode)
    try:
        tokens = generate(engine, prompts, params)
        stats = engine.speculator.stats.snapshot() if engine.speculator else None
        return tokens, stats
    finally:
        for r in runners:
            r.close()


def prompts_of(tokenizer):
    texts = ["Write a Python function that reverses a string.",
             "What is the capital of France?",
             "List three colors."]
    return [chat_prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in texts]


@pytest.fixture(scope="module")
def prompts(embedded_model_path):
    r = LlamaCppRunner(embedded_model_path, max_seqs=1, seq_tokens=256)
    try:
        return prompts_of(r.tokenizer)
    finally:
        r.close()


def test_greedy_with_a_draft_model_equals_plain_decoding(q8_target, embedded_model_path,
                                                         prompts):
    params = [SamplingParams(temperature=0, max_tokens=48)] * 3
    plain, _ = run(q8_target, None, "off", prompts, params)
    drafted, stats = run(q8_target, str(embedded_model_path), "fixed:4", prompts, params)
    assert drafted == plain
    # the Q4_1 draft agrees with its Q8_0 copy most of the time (measured: 107 of 124); a
    # draft that lost track of its KV would be far below
    assert stats["accepted_tokens"] >= 0.6 * stats["draft_tokens"] > 0


def test_seeded_sampling_with_a_draft_model_equals_plain(q8_target, embedded_model_path,
                                                         prompts):
    params = [SamplingParams(temperature=0.8, top_k=40, seed=7 + i, max_tokens=40)
              for i in range(3)]
    plain, _ = run(q8_target, None, "off", prompts, params)
    drafted, stats = run(q8_target, str(embedded_model_path), "fixed:3", prompts, params)
    assert drafted == plain
    assert stats["accepted_tokens"] > 0


def test_a_draft_with_another_vocabulary_is_refused(q8_target, tmp_path):
    from tests.conftest import store_model

    try:
        other = store_model("qwen2.5-coder-0.5b-instruct")
    except pytest.skip.Exception:
        pytest.skip("needs qwen2.5-coder-0.5b-instruct in the model store")
    args = EngineArgs(q8_target, runner=RUNNER, draft_model=str(other))
    runner = LlamaCppRunner(q8_target, max_seqs=4, seq_tokens=1024, kv_layout="split")
    try:
        with pytest.raises(ValueError, match="cannot draft for .*: vocabulary size 151936 != "
                                             "target's 49152"):
            load_draft(args, runner, "llamacpp")
    finally:
        runner.close()
