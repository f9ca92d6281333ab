"""Constrained decoding inside the engine's step, on a scripted model (byte tokens): masks
applied to every sampled row (draft positions too), greedy/seeded/logprobs under the mask,
the grammar ending the request, one matcher per sequence, speculation on = off."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from app.engine.config import EngineConfig, SchedulerConfig, SpecConfig
from app.engine.constrain import GrammarCompiler, ResponseFormat
from app.engine.engine import LLMEngine
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from tests.fakes.runner import ScriptedRunner
from tests.unit.helpers import MEASURED_CPU

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1,
                 "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
VALID = '{"name": "Ann", "age": 41, "tags": ["a"]}'


def engine(replies, spec: str | None = None, curve=None,
           forced_drafts: bool = True) -> tuple[ScriptedRunner, LLMEngine]:
    runner = ScriptedRunner(replies, default="", margin=2.0)
    eng = LLMEngine(runner, EngineConfig(context_length=1024, scheduler=SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=256)))
    if spec is not None:
        eng.speculator = Speculator(SpecConfig(mode=spec, forced_drafts=forced_drafts),
                                    curve, eng.context_length)
    return runner, eng


def grammar(eng: LLMEngine, schema=PERSON):
    return eng.grammars.compile(ResponseFormat("json_schema", schema, "person"))


def run(eng: LLMEngine) -> dict[str, dict]:
    """Step to the end; per request id its text, tokens, finish reason and logprobs."""
    got: dict[str, dict] = {}
    while eng.has_work():
        for out in eng.step():
            g = got.setdefault(out.request_id, {"text": "", "tokens": [], "lp": []})
            g["text"] += out.text
            g["tokens"] += out.token_ids
            g["lp"] += out.logprobs or []
            if out.finished:
                g["finish"] = out.finish_reason
    return got


def params(eng, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", 120)
    return SamplingParams(grammar=grammar(eng), **kw)


def test_a_valid_script_is_followed_and_the_grammar_ends_it_without_eos():
    # the model would go on after the object; the grammar is complete at its "}"
    _, eng = engine([VALID + " and more text"])
    eng.add_request("a", [1, 2, 3], params(eng, temperature=0.0))
    got = run(eng)["a"]
    assert got["text"] == VALID
    assert got["finish"] == "stop"
    assert len(got["tokens"]) == len(VALID)  # no EOS token: the grammar ended it


def test_unconstrained_the_same_model_says_something_else():
    _, eng = engine([VALID + " and more text"])
    eng.add_request("a", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=120))
    assert run(eng)["a"]["text"] == VALID + " and more text"


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.0),
    dict(temperature=0.9, seed=7),
    dict(temperature=0.9, seed=8, top_k=5, top_p=0.9),
    dict(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5),
    dict(temperature=0.0, logprobs=3),
])
def test_an_invalid_script_becomes_output_valid_for_the_schema(sampling):
    # the script breaks the schema at once (a string age, an unknown key, a third tag)
    _, eng = engine(['{"name": "Ann", "age": "old", "x": 1, "tags": ["a", "b", "c"]}'])
    eng.add_request("a", [1, 2, 3], params(eng, **sampling))
    got = run(eng)["a"]
    assert got["finish"] == "stop"
    jsonschema.validate(json.loads(got["text"]), PERSON)
    if sampling["temperature"] == 0.0:  # greedy follows the script while it is valid
        assert got["text"].startswith('{"name": "Ann", "age": ')
    for lp in got["lp"]:  # logprobs see the constrained distribution: finite, <= 0
        assert np.isfinite(lp.logprob) and lp.logprob <= 0
        assert all(np.isfinite(v) for _, _, v in lp.top)


def test_greedy_logprobs_are_of_the_masked_distribution():
    # where the grammar forces one token its probability is 1 (logprob 0) and it is the
    # only alternative listed
    _, eng = engine([VALID])
    eng.add_request("a", [1, 2, 3], params(eng, temperature=0.0, logprobs=3))
    lp = run(eng)["a"]["lp"]
    assert lp[0].token == "{" and lp[0].logprob == 0.0
    assert [t for _, t, _ in lp[0].top] == ["{"]


def test_each_sequence_has_its_own_matcher_and_schema():
    other = {"type": "object", "properties": {"ok": {"type": "boolean"}},
             "required": ["ok"], "additionalProperties": False}
    _, eng = engine([VALID, VALID, VALID])
    g_other = grammar(eng, other)
    for i in range(2):
        eng.add_request(f"p{i}", [1, 2, 3 + i], params(eng, temperature=0.9, seed=i))
    eng.add_request("o", [1, 2, 9], SamplingParams(temperature=0.0, max_tokens=60,
                                                   grammar=g_other))
    got = run(eng)
    for i in range(2):
        jsonschema.validate(json.loads(got[f"p{i}"]["text"]), PERSON)
    assert json.loads(got["o"]["text"]) in ({"ok": True}, {"ok": False})
    assert got["o"]["finish"] == "stop"


def test_max_tokens_still_ends_a_constrained_request():
    _, eng = engine([VALID])
    eng.add_request("a", [1, 2, 3], params(eng, temperature=0.0, max_tokens=5))
    got = run(eng)["a"]
    assert (got["text"], got["finish"]) == (VALID[:5], "length")


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, seed=3)])
def test_speculation_on_and_off_give_the_same_output(sampling):
    # the prediction drafts the valid object, then text the grammar forbids: drafts are
    # cut there, and the output equals decoding without speculation
    script = '{"name": "Bob", "age": "x", "tags": ["b", "a", "a"]}'
    prediction = list(b'{"name": "Bob", "age": 7, "tags": ["b", "a"]} trailing')
    outs, drafted = [], []
    for spec in (None, "fixed:4"):
        _, eng = engine([script], spec)
        req = eng.add_request("a", [1, 2, 3], params(eng, prediction=prediction, **sampling))
        outs.append(run(eng)["a"])
        drafted.append(req.metrics.num_draft_tokens)
    assert drafted[0] == 0 and drafted[1] >= 8
    assert outs[0]["text"] == outs[1]["text"]
    assert outs[0]["tokens"] == outs[1]["tokens"]
    jsonschema.validate(json.loads(outs[0]["text"]), PERSON)


def test_drafts_are_cut_at_the_first_token_the_grammar_forbids():
    runner, eng = engine([VALID], "fixed:8")
    req = eng.add_request("a", [1, 2, 3], params(
        eng, temperature=0.0, prediction=list(b'{"name": "Ann", "agX": 41}')))
    run(eng)
    # every step's drafts stop before the forbidden 'X' ('{"name": "Ann", "ag' is valid)
    drafted = [item.tokens[1:] for step in runner.steps for item in step if len(item.tokens) > 1
               and item.start_pos >= 3]
    assert drafted and all(ord("X") not in d for d in drafted)
    m = req.metrics
    assert m.num_draft_tokens == m.num_accepted_tokens  # nothing drafted was rejected


def test_the_grammar_compiler_is_built_per_engine_from_the_runner():
    runner, eng = engine([VALID])
    assert isinstance(eng.grammars, GrammarCompiler)
    assert eng.grammars.n_logits == runner.info.n_vocab == 258
    assert eng.grammars.lltokenizer.vocab_size == 258


def drafted_steps(runner: ScriptedRunner) -> list[bytes]:
    """The drafts of every verify step (tokens after the first), as bytes."""
    return [bytes(item.tokens[1:]) for step in runner.steps for item in step
            if len(item.tokens) > 1 and item.start_pos >= 3]


def test_forced_tokens_are_drafted_and_accepted_where_ngram_drafts_would_not_pay():
    # the measured CPU curve: a 60%-accepted n-gram draft never pays on it, a forced one
    # does. Every draft is grammar-forced, all are accepted, and the output is the same
    # as without speculation.
    runner, eng = engine([VALID + " and more text"], "auto", MEASURED_CPU)
    req = eng.add_request("a", [1, 2, 3], params(eng, temperature=0.0))
    got = run(eng)["a"]
    assert got["text"] == VALID and got["finish"] == "stop"
    m = req.metrics
    # '{' comes from the prompt's step; then the forced runs, 8 at most (the draft cap),
    # the target's own token after each: '"name": ' + '"', ', "age":' + ' ', (after "41"
    # a third digit would pass the maximum 150) ', "tags"' + ':', ' ["'. A lone forced
    # token ('"' after "a", the closing '}') is not drafted: one draft token does not pay
    # on this curve.
    assert drafted_steps(runner) == [b'"name": ', b', "age":', b', "tags"', b' ["']
    assert (m.num_forced_draft_tokens, m.num_accepted_forced_tokens) == (27, 27)
    assert (m.num_draft_tokens, m.num_accepted_tokens) == (27, 27)
    stats = eng.speculator.stats.snapshot()
    assert (stats["forced_draft_tokens"], stats["forced_accepted_tokens"]) == (27, 27)
    assert len(runner.steps) == len(VALID) - 27  # one step per token not drafted


def test_without_forced_drafts_the_same_curve_drafts_nothing():
    runner, eng = engine([VALID + " and more text"], "auto", MEASURED_CPU, forced_drafts=False)
    req = eng.add_request("a", [1, 2, 3], params(eng, temperature=0.0))
    assert run(eng)["a"]["text"] == VALID
    assert req.metrics.num_draft_tokens == req.metrics.num_forced_draft_tokens == 0
    assert drafted_steps(runner) == []


def test_a_prediction_continues_after_forced_tokens_and_its_rejection_changes_nothing():
    # the prediction has a second tag the model does not write: its drafts continue after
    # the forced ones where they agree, are rejected at ', "b"', and the output (and the
    # grammar, which follows only verified tokens) equals decoding without speculation
    prediction = list(b'{"name": "Ann", "age": 41, "tags": ["a", "b"]}')
    outs = []
    for spec in (None, "fixed:8"):
        runner, eng = engine([VALID], spec)
        req = eng.add_request("a", [1, 2, 3], params(eng, temperature=0.0,
                                                     prediction=prediction))
        outs.append((run(eng)["a"], req.metrics, runner))
    (plain, _, _), (spec_out, m, runner) = outs
    assert spec_out["tokens"] == plain["tokens"] and plain["text"] == VALID
    # forced: '"name": ' (the cap), then 'e": ' followed by the prediction's '41, ',
    # 'tags": [' (the cap), '}'; the prediction alone: 'Ann", "a' and 'a", "b"]' (2 taken)
    assert drafted_steps(runner) == [b'"name": ', b'Ann", "a', b'e": 41, ', b'tags": [',
                                     b'a", "b"]', b'}']
    assert (m.num_forced_draft_tokens, m.num_accepted_forced_tokens) == (21, 21)
    assert (m.num_draft_tokens, m.num_accepted_tokens) == (41, 35)
    assert (m.accepted_prediction_tokens, m.rejected_prediction_tokens) == (14, 6)


def test_drafts_the_grammar_cuts_to_nothing_count_as_grammar():
    # the prediction's 'X' is forbidden where the reply writes "age": a step whose drafts
    # start there verifies none. Every decode step drafts or counts under one reason; the
    # grammar's steps were counted as drafts by the controller (chosen_k) too
    runner, eng = engine([VALID], "fixed:8", forced_drafts=False)
    req = eng.add_request("a", [1, 2, 3], params(
        eng, temperature=0.0, prediction=list(b'{"name": "Ann", "agX": 41}')))
    assert run(eng)["a"]["text"] == VALID
    m = req.metrics
    assert m.no_draft == {"grammar": 3, "prediction_lost": 10}
    chosen = eng.speculator.stats.snapshot()["chosen_k"]
    decode_steps = sum(n for k, n in chosen.items() if k) + sum(m.no_draft.values()) - 3
    assert decode_steps == m.num_drafts + 13 == len(runner.steps) - 1
    assert 1 + decode_steps + m.num_accepted_tokens == len(VALID)
