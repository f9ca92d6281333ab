"""Constrained decoding on the embedded model: outputs valid for their schema, the same
tokens with speculation on or off (greedy and seeded), the vocabulary view of llama.cpp's
GGUF vocabulary, and `tandem run --json-schema`.

The split KV layout with flash attention is used for the speculation tests, as in
`test_spec_model.py`: there, greedy output does not depend on what was drafted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from app.engine.config import EngineConfig, SchedulerConfig, SpecConfig
from app.engine.constrain import GrammarCompiler, ResponseFormat
from app.engine.engine import LLMEngine
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from app.prompts import chat_prompt_ids
from backends.llamacpp.runner import LlamaCppRunner

ROOT = Path(__file__).resolve().parents[2]
FLAT = StepTimeCurve({1: 1.0, 64: 1.01})  # makes the controller draft as much as it can
# this machine's measured curve (tests/unit/helpers.py): n-gram drafts never pay on it
STEEP = StepTimeCurve({1: 1.0, 2: 1.918, 3: 2.354, 4: 2.887, 5: 3.762, 6: 4.309,
                       8: 5.292, 16: 9.371})
ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 99999},
        "customer": {"type": "string", "maxLength": 20},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object",
            "properties": {"sku": {"type": "string", "maxLength": 8},
                           "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "qty"], "additionalProperties": False}},
        "status": {"enum": ["open", "paid", "shipped"]},
    },
    "required": ["id", "customer", "items", "status"],
    "additionalProperties": False,
}
EXAMPLE = ('{"id": 42, "customer": "Ada", "items": [{"sku": "A1", "qty": 2}], '
           '"status": "paid"}')


@pytest.fixture(scope="module")
def runner(embedded_model_path):
    r = LlamaCppRunner(embedded_model_path, max_seqs=4, seq_tokens=1024, kv_layout="split",
                       n_threads=2, flash_attn="on")
    yield r
    r.close()


@pytest.fixture(scope="module")
def grammar(runner):
    return GrammarCompiler(runner.tokenizer, runner.info.n_vocab).compile(
        ResponseFormat("json_schema", ORDER, "order"))


def generate(runner, prompts, params, spec: str | None, curve=FLAT, forced: bool = True):
    """(texts, tokens, finish reasons, draft tokens) per prompt, submitted together."""
    config = EngineConfig(context_length=1024, scheduler=SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=512))
    speculator = (Speculator(SpecConfig(mode=spec, forced_drafts=forced), curve, 1024)
                  if spec else None)
    engine = LLMEngine(runner, config, speculator=speculator)
    reqs = [engine.add_request(str(i), prompt, p)
            for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))]
    texts = {str(i): "" for i in range(len(prompts))}
    tokens = {str(i): [] for i in range(len(prompts))}
    finish = {}
    while engine.has_work():
        for o in engine.step():
            texts[o.request_id] += o.text
            tokens[o.request_id] += o.token_ids
            if o.finished:
                finish[o.request_id] = o.finish_reason
    return ([texts[str(i)] for i in range(len(prompts))],
            [tokens[str(i)] for i in range(len(prompts))],
            [finish[str(i)] for i in range(len(prompts))],
            [r.metrics.num_draft_tokens for r in reqs])


def prompt(runner, text):
    return chat_prompt_ids(runner.tokenizer, [{"role": "user", "content": text}])


def test_the_vocabulary_view_covers_the_ggufs_logits(runner, grammar):
    compiler = GrammarCompiler(runner.tokenizer, runner.info.n_vocab)
    lltok = compiler.lltokenizer
    assert lltok.vocab_size == runner.info.n_vocab == 49152
    assert sorted(lltok.eos_tokens) == sorted(runner.tokenizer.eos_ids)
    im_end = runner.tokenizer.encode("<|im_end|>", parse_special=True)
    assert len(im_end) == 1 and lltok.is_special_token(im_end[0])
    text = '{"a": [1, 2]}'
    assert lltok.decode_str(runner.tokenizer.encode(text)) == text


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.0),
    dict(temperature=0.8, top_p=0.95, seed=11),
])
def test_same_tokens_with_speculation_on_and_off(runner, grammar, sampling):
    # the prompt holds an order to copy: n-gram drafts from it; the prediction drafts an
    # order with fields the schema forbids, cut at the first one
    prompts = [prompt(runner, f"Copy this order exactly: {EXAMPLE}"),
               prompt(runner, "Make up an order for two books.")]
    prediction = runner.tokenizer.encode(EXAMPLE.replace('"status"', '"note": 1, "status"'))
    params = [SamplingParams(max_tokens=120, grammar=grammar, prediction=prediction,
                             **sampling),
              SamplingParams(max_tokens=120, grammar=grammar, **sampling)]
    plain, plain_tokens, finish_plain, drafted_plain = generate(runner, prompts, params, None)
    spec, spec_tokens, finish_spec, drafted = generate(runner, prompts, params, "fixed:4")
    assert spec_tokens == plain_tokens and spec == plain
    assert finish_spec == finish_plain == ["stop", "stop"]
    assert drafted_plain == [0, 0] and drafted[0] >= 8
    for text in plain:
        jsonschema.validate(json.loads(text), ORDER)


def steep_run(runner, prompts, params, forced: bool):
    """(tokens per prompt, per request (forced drafts, of those accepted, all drafts),
    speculator stats) on the STEEP curve in auto mode."""
    config = EngineConfig(context_length=1024, scheduler=SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=512))
    speculator = Speculator(SpecConfig(mode="auto", forced_drafts=forced), STEEP, 1024)
    engine = LLMEngine(runner, config, speculator=speculator)
    reqs = [engine.add_request(str(i), p, sp)
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
    tokens = {str(i): [] for i in range(len(prompts))}
    while engine.has_work():
        for o in engine.step():
            tokens[o.request_id] += o.token_ids
    counts = [(r.metrics.num_forced_draft_tokens, r.metrics.num_accepted_forced_tokens,
               r.metrics.num_draft_tokens) for r in reqs]
    return [tokens[str(i)] for i in range(len(prompts))], counts, speculator.stats.snapshot()


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.0),
    dict(temperature=0.8, top_p=0.95, seed=11),
])
def test_forced_drafts_pay_on_the_steep_curve_and_change_no_token(runner, grammar, sampling):
    # on this CPU's curve the controller drafts mostly what the grammar forces (the keys
    # and punctuation of ORDER); the target accepts them and the output is unchanged
    prompts = [prompt(runner, "Make up an order for two books."),
               prompt(runner, "Make up an order for a lamp.")]
    params = [SamplingParams(max_tokens=120, grammar=grammar, **sampling)] * 2
    plain, plain_tokens, _, _ = generate(runner, prompts, params, None)
    tokens, got, stats = steep_run(runner, prompts, params, forced=True)
    assert tokens == plain_tokens
    assert got == EXPECTED_FORCED[sampling["temperature"]]
    assert stats["forced_draft_tokens"] == sum(g[0] for g in got)
    assert stats["forced_accepted_tokens"] == sum(g[1] for g in got)
    # without forced drafts: the same tokens, no forced draft (two sequences flatten the
    # curve enough for a few n-gram drafts)
    tokens, got, stats = steep_run(runner, prompts, params, forced=False)
    assert tokens == plain_tokens
    assert [g[:2] for g in got] == [(0, 0), (0, 0)] and stats["forced_draft_tokens"] == 0
    for text in plain:
        jsonschema.validate(json.loads(text), ORDER)


EXPECTED_FORCED = {0.0: [(44, 44, 45), (45, 45, 61)], 0.8: [(47, 47, 54), (35, 35, 40)]}


def test_sequences_in_one_batch_each_have_their_own_matcher(runner, grammar):
    other = GrammarCompiler(runner.tokenizer, runner.info.n_vocab).compile(
        ResponseFormat("json_schema", {"type": "array", "items": {"type": "boolean"},
                                       "minItems": 2, "maxItems": 2}, "flags"))
    p = prompt(runner, "Make up an order.")
    params = [SamplingParams(temperature=0.9, seed=s, max_tokens=120, grammar=grammar)
              for s in (1, 2, 3)]
    params.append(SamplingParams(temperature=0.0, max_tokens=20, grammar=other))
    texts, _, finish, _ = generate(runner, [p] * 4, params, None)
    assert finish == ["stop"] * 4
    for text in texts[:3]:
        jsonschema.validate(json.loads(text), ORDER)
    value = json.loads(texts[3])
    assert len(value) == 2 and all(isinstance(v, bool) for v in value)


def tandem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=300)


def test_tandem_run_json_schema(embedded_model_path, tmp_path):
    schema = tmp_path / "order.json"
    schema.write_text(json.dumps(ORDER))
    r = tandem("run", "--model", embedded_model_path, "--temperature", "0", "--threads", "1",
               "--json-schema", str(schema), "Make up an order.")
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), ORDER)
    assert "generated tokens (stop)" in r.stderr
    assert "forced tokens accepted" in r.stderr  # speculation is on by default
    r = tandem("run", "--model", embedded_model_path, "--temperature", "0", "--threads", "1",
               "--max-tokens", "40", "--json", "A cat as JSON.")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("{")


def test_tandem_run_refuses_a_bad_schema(embedded_model_path, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "objekt"}')
    r = tandem("run", "--model", embedded_model_path, "--json-schema", str(bad), "x")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"tandem: error: --json-schema {bad}: the schema is not a valid JSON "
                        "Schema at schema['type']: 'objekt' is not valid under any of the "
                        "given schemas\n")
    broken = tmp_path / "broken.json"
    broken.write_text("{nope")
    r = tandem("run", "--model", embedded_model_path, "--json-schema", str(broken), "x")
    assert r.returncode == 1
    assert r.stderr == (f"tandem: error: --json-schema {broken}: not valid JSON: Expecting "
                        "property name enclosed in double quotes: line 1 column 2 (char 1)\n")


def test_tandems_slices_give_llguidances_masks_at_every_position(runner):
    from app.bench.mask_time import measure

    tok = runner.tokenizer
    out = measure(tok, runner.info.n_vocab, sorted(tok.eos_ids), rounds=1, cold_bytes=0)
    # the four schemas' instances, token by token, each mask filled twice: through
    # `vocab.STRING_SLICES` and through llguidance's default slices
    assert out["masks_equal"] is True
    assert (out["width"], out["positions"], out["forced_positions"], out["forced_rows"]) == (
        49152, 224, 118, 477)
