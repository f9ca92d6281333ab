"""Speculative decoding on the embedded model: the same tokens with speculation on or off.

Run in the split KV layout, whose numerics do not depend on batch shape: with flash attention
on, llama.cpp computes a k+1-token verification step bit-identically to k+1 one-token steps,
and the split layout keeps each sequence's attention over its own stream, so greedy output
is the same whatever was drafted, accepted or rolled back.
"""

from __future__ import annotations

import pytest

from app.engine.config import EngineConfig, SchedulerConfig, SpecConfig
from app.engine.engine import LLMEngine
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from app.prompts import chat_prompt_ids
from backends.llamacpp.runner import LlamaCppRunner

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
'''
FLAT = StepTimeCurve({1: 1.0, 64: 1.01})  # makes the controller draft as much as it can


@pytest.fixture(scope="module")
def runner(embedded_model_path):
    r = LlamaCppRunner(embedded_model_path, max_seqs=4, seq_tokens=1024, kv_layout="split",
                       n_threads=2, flash_attn="on")
    yield r
    r.close()


def generate(runner, prompts, params, spec: str | None, max_seqs: int = 4):
    """Token ids per prompt, all submitted together (at most `max_seqs` running at once);
    spec None means no speculator."""
    context = min(1024, runner.max_seq_tokens)
    config = EngineConfig(context_length=context, scheduler=SchedulerConfig(
        max_num_seqs=max_seqs, max_num_batched_tokens=512))
    speculator = None
    if spec is not None:
        speculator = Speculator(SpecConfig(mode=spec), FLAT, context)
    engine = LLMEngine(runner, config, speculator=speculator)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, p)
    out: dict[str, list[int]] = {}
    finish = {}
    while engine.has_work():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.token_ids)
            if o.finished:
                finish[o.request_id] = o.finish_reason
    stats = speculator.stats.snapshot() if speculator else None
    # leave the runner clean for the next engine: every slot released
    return [out[str(i)] for i in range(len(prompts))], finish, stats


def edit_prompt(runner, instruction):
    return chat_prompt_ids(runner.tokenizer, [{"role": "user", "content":
                                               f"{instruction}\n\n```python\n{CODE}```"}])


@pytest.mark.parametrize("spec", ["auto", "fixed:3"])
def test_greedy_same_tokens_with_ngram_drafts(runner, spec):
    prompts = [edit_prompt(runner, "Rename the variable subtotal to net in this code."),
               edit_prompt(runner, "Add a docstring to this function."),
               chat_prompt_ids(runner.tokenizer, [{"role": "user", "content": "Hi there!"}])]
    params = [SamplingParams(temperature=0, max_tokens=60)] * 3
    plain, finish_plain, _ = generate(runner, prompts, params, None)
    spec_out, finish_spec, stats = generate(runner, prompts, params, spec)
    assert spec_out == plain
    assert finish_spec == finish_plain
    assert stats["draft_tokens"] > 0 and stats["accepted_tokens"] > 0
    # different sequences got different k in the same steps
    assert len([k for k, n in stats["chosen_k"].items() if n]) >= 2


def test_prediction_of_the_reply_is_accepted_and_changes_nothing(runner):
    prompt = edit_prompt(runner, "Rename the variable subtotal to net in this code.")
    params = SamplingParams(temperature=0, max_tokens=60)
    (plain,), _, _ = generate(runner, [prompt], [params], None)
    # predict the code as it was before the edit, as an editor would
    prediction = runner.tokenizer.encode(f"```python\n{CODE}```")
    with_prediction = SamplingParams(temperature=0, max_tokens=60, prediction=prediction)
    (out,), _, stats = generate(runner, [prompt], [with_prediction], "auto")
    assert out == plain
    assert stats["accepted_tokens"] >= 20


def test_max_tokens_and_eos_inside_accepted_blocks(runner):
    prompt = edit_prompt(runner, "Repeat this code exactly.")
    for max_tokens in (7, 13, 200):
        params = [SamplingParams(temperature=0, max_tokens=max_tokens)]
        plain, finish_plain, _ = generate(runner, [prompt], params, None)
        spec_out, finish_spec, _ = generate(runner, [prompt], params, "fixed:4")
        assert spec_out == plain and finish_spec == finish_plain
        assert len(spec_out[0]) <= max_tokens


def test_stop_string_inside_an_accepted_block(runner):
    prompt = edit_prompt(runner, "Repeat this code exactly.")
    params = [SamplingParams(temperature=0, max_tokens=80, stop=["tax"])]
    plain, finish_plain, _ = generate(runner, [prompt], params, None)
    spec_out, finish_spec, _ = generate(runner, [prompt], params, "fixed:4")
    assert spec_out == plain and finish_plain == {"0": "stop"} == finish_spec


def test_seeded_sampling_same_text_with_speculation(runner):
    prompt = edit_prompt(runner, "Rename the variable subtotal to net in this code.")
    params = [SamplingParams(temperature=0.7, top_p=0.9, seed=42, max_tokens=60),
              SamplingParams(temperature=0.7, top_p=0.9, seed=43, max_tokens=60)]
    plain, _, _ = generate(runner, [prompt, prompt], params, None)
    spec_out, _, stats = generate(runner, [prompt, prompt], params, "fixed:3")
    assert spec_out == plain
    assert stats["accepted_tokens"] > 0


def test_windowed_repetition_penalty_same_tokens_with_drafts(runner):
    """The penalty window slides over the drafts in verification exactly as over the tokens
    of plain decoding: greedy with a penalty over the last 16 tokens, the same tokens with
    prediction and n-gram drafts as without; and the window changes the reply (else this
    could not tell)."""
    prompt = edit_prompt(runner, "Repeat this code exactly.")
    prediction = runner.tokenizer.encode(f"```python\n{CODE}```")
    window = SamplingParams(temperature=0, max_tokens=60, repetition_penalty=1.3,
                            repeat_last_n=16, prediction=prediction)
    whole = SamplingParams(temperature=0, max_tokens=60, repetition_penalty=1.3,
                           repeat_last_n=-1)
    (plain,), _, _ = generate(runner, [prompt], [window], None)
    (spec_out,), _, stats = generate(runner, [prompt], [window], "fixed:4")
    assert spec_out == plain
    assert stats["accepted_tokens"] > 0
    (plain_whole,), _, _ = generate(runner, [prompt], [whole], None)
    assert plain_whole != plain


def one_after_another(runner, prompts, params, suffix_tokens: int | None):
    """Token ids per prompt, each request run to its end before the next is added, through
    one engine (so later ones can draft from the suffix index of earlier outputs); the
    speculator's stats. suffix_tokens None: no speculator."""
    context = min(1024, runner.max_seq_tokens)
    config = EngineConfig(context_length=context, scheduler=SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=512))
    speculator = None
    if suffix_tokens is not None:
        speculator = Speculator(SpecConfig(mode="auto", suffix_tokens=suffix_tokens), FLAT,
                                context)
    engine = LLMEngine(runner, config, speculator=speculator)
    outs = []
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, p)
        tokens: list[int] = []
        while engine.has_work():
            for o in engine.step():
                tokens.extend(o.token_ids)
        outs.append(tokens)
    return outs, speculator.stats.snapshot() if speculator else None


def test_suffix_drafts_from_an_earlier_reply_change_nothing(runner):
    """A request whose reply an earlier request wrote (an agent re-asking, a user repeating
    a question) drafts it from the suffix index, and its tokens stay those of no drafts."""
    ask = [{"role": "user", "content": "Write a haiku about the sea."}]
    prompts = [chat_prompt_ids(runner.tokenizer, [{"role": "system", "content": s}, *ask])
               for s in ("You are a poet.", "You are a helpful poet.")]
    params = [SamplingParams(temperature=0, max_tokens=40)] * 2
    plain, _ = one_after_another(runner, prompts, params, None)
    with_suffix, stats = one_after_another(runner, prompts, params, 1 << 15)
    without_suffix, stats_off = one_after_another(runner, prompts, params, 0)
    assert with_suffix == without_suffix == plain
    assert plain[0][:10] == plain[1][:10]  # the second reply repeats the first, at least so far
    assert stats["suffix_outputs"] == 2
    assert stats["accepted_tokens"] - stats_off["accepted_tokens"] >= 8
