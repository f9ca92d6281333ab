"""Speculative decoding through the server: Predicted Outputs, usage, opt-out, /metrics.

Runs on both engines (`engine_kind`):
- `real`: the session's `tandem serve` subprocess on the embedded model; its engine comes
  from `app.loader.load_engine` with the default spec mode "auto" (adaptive controller);
- `fake`: an in-process app over `ScriptedRunner` with a `fixed:4` speculator, built here
  because `conftest.fake_engine` builds its `LLMEngine` without one.

Every test is greedy and reads /metrics before and after its requests, on a server with no
other traffic (it waits until nothing runs), so counter deltas are this test's own.

Identities the asserts rest on, for one greedy request (whatever step-time curve the
controller has: every decode step either drafts or is counted under one no-draft reason):
    completion_tokens = 1 (from the prefill) + decode steps + accepted draft tokens
    decode steps      = drafts + sum over reasons of no_draft[reason]
    drafts            = sum over k >= 1 of chosen_k[k]
    chosen_k[0]       = no_draft["no_gain"] less the steps `_may_pay` declined at once
    draft_tokens      = sum over k of k * chosen_k[k] = accepted + rejected
and, for any traffic, accepted = the sum over positions of accepted_by_position.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from app.engine.async_engine import AsyncEngine
from app.engine.config import SpecConfig
from app.engine.engine import EngineConfig, LLMEngine
from app.engine.spec_decode.speculator import REASONS, Speculator
from tests.e2e.conftest import API_KEY, CTX_SIZE, Server, scripted_reply, serve_in_thread
from tests.fakes.runner import ScriptedRunner

MSGS = [{"role": "user", "content": "Name three colors."}]
MAX_TOKENS = 64  # both models end their reply with EOS well before this
FAKE_K = 4
DRAFT_CAP = 8  # SpecConfig.num_draft_tokens default: K of the labelled families
UNRELATED = "Жжжж ЩЩЩ ЖЖЖ щщщ " * 5  # shares no token pair with either model's reply


def _fake_spec_server() -> Iterator[Server]:
    from app.server.app import create_app

    runner = ScriptedRunner(default=scripted_reply, step_s=0.003, margin=2.0, max_seqs=8,
                            num_blocks=1024, block_size=16, n_ctx=CTX_SIZE, name="fake-model")
    speculator = Speculator(SpecConfig(f"fixed:{FAKE_K}"), None, CTX_SIZE)
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(context_length=CTX_SIZE),
                                   speculator=speculator), "fake-model", "fake")
    app = create_app(engine, api_key=API_KEY)
    yield from serve_in_thread(app, engine, API_KEY)


@pytest.fixture(scope="module")
def spec_server(engine_kind: str, request: pytest.FixtureRequest) -> Iterator[Server]:
    """A server whose engine has a speculator (see the module docstring)."""
    if engine_kind == "real":
        yield request.getfixturevalue("server")
    else:
        yield from _fake_spec_server()


@pytest.fixture
def spec_client(spec_server: Server) -> openai.OpenAI:
    return spec_server.client()


def scrape(server: Server) -> dict[str, float]:
    """Every `tandem_spec_*` and `tandem_requests_*` sample, once the server is quiet."""
    for _ in range(200):
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        samples = {}
        for line in text.splitlines():
            if line.startswith("tandem_"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        if samples["tandem_requests_running"] == samples["tandem_requests_waiting"] == 0:
            return {k: v for k, v in samples.items() if k.startswith("tandem_spec_")}
        time.sleep(0.05)
    raise TimeoutError("the server never became quiet")


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Per-sample increase (every sample, zero ones included)."""
    return {k: int(after[k] - before.get(k, 0.0)) for k in after}


def chosen(d: dict[str, int]) -> dict[int, int]:
    return {k: d[f'tandem_spec_chosen_k_total{{k="{k}"}}'] for k in range(DRAFT_CAP + 1)}


def no_draft(d: dict[str, int]) -> dict[str, int]:
    return {r: d[f'tandem_spec_no_draft_total{{reason="{r}"}}'] for r in REASONS}


def by_position_sum(d: dict[str, int]) -> int:
    """Accepted tokens again: a draft that kept j tokens counts once at positions 1..j."""
    return sum(v for k, v in d.items() if "by_position" in k)


def chat(client: openai.OpenAI, server: Server, **kw: object):
    # plain greedy, not the model's recommended repetition penalty: the reply these tests
    # reason about must end by itself within MAX_TOKENS
    extra = {"repetition_penalty": 1.0, **kw.pop("extra_body", {})}  # type: ignore[dict-item]
    return client.chat.completions.create(model=server.model, messages=MSGS, temperature=0,
                                          max_tokens=MAX_TOKENS, extra_body=extra,
                                          **kw)  # type: ignore[arg-type]


def details(usage) -> tuple[int, int]:
    d = usage.completion_tokens_details
    return d.accepted_prediction_tokens, d.rejected_prediction_tokens


def assert_all_drafts_predicted(d: dict[str, int], completion_tokens: int,
                                accepted: int, rejected: int) -> dict[str, int]:
    """The identities of the module docstring, when the prediction is the reply's text.

    Such a prediction drafts every step that pays until it is used up, which is before the
    reply's EOS: the EOS is either the bonus token of the last draft step or comes from one
    plain step with the prediction used up. Which one, and how many steps the controller
    declined ("no_gain", "step_cost"), depends on the k the adaptive controller picks from
    this machine's step-time curve; the counts say which. Returns the no-draft counts.
    """
    ks, why = chosen(d), no_draft(d)
    drafts = sum(n for k, n in ks.items() if k)
    assert completion_tokens == 1 + drafts + sum(why.values()) + accepted
    assert why["prediction_exhausted"] in (0, 1)
    assert {r for r, n in why.items() if n} <= {"prediction_exhausted", "no_gain", "step_cost"}
    assert d["tandem_spec_drafts_total"] == drafts
    assert d["tandem_spec_draft_tokens_total"] == sum(k * n for k, n in ks.items())
    assert d["tandem_spec_draft_tokens_total"] == accepted + rejected
    assert d["tandem_spec_accepted_tokens_total"] == accepted == by_position_sum(d)
    return why


@pytest.fixture(scope="module")
def reply(spec_server: Server) -> tuple[str, int]:
    """(text, completion_tokens) of the plain greedy reply (no prediction)."""
    r = chat(spec_server.client(), spec_server)
    assert r.choices[0].finish_reason == "stop"
    assert details(r.usage) == (0, 0)
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
    return r.choices[0].message.content, r.usage.completion_tokens


def test_exact_prediction_same_text_all_accepted(spec_server: Server, spec_client: openai.OpenAI,
                                                 reply: tuple[str, int]) -> None:
    text, n_tokens = reply
    before = scrape(spec_server)
    r = chat(spec_client, spec_server, prediction={"type": "content", "content": text})
    d = delta(before, scrape(spec_server))
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == n_tokens
    accepted, rejected = details(r.usage)
    # every predicted token is the model's: nothing to reject, and >= 1 step had drafts
    assert rejected == 0
    assert accepted > 0
    why = assert_all_drafts_predicted(d, n_tokens, accepted, rejected)
    # each draft's first token was accepted (rejected == 0)
    assert d['tandem_spec_accepted_tokens_by_position_total{position="1"}'] == (
        d["tandem_spec_drafts_total"])
    if spec_server.mode == "fake":  # fixed:4 over 42 reply tokens + EOS: 8 steps of 4, one of 1
        assert (accepted, d["tandem_spec_drafts_total"]) == (33, 9)
        assert chosen(d) == {0: 0, 1: 1, 2: 0, 3: 0, 4: 8, 5: 0, 6: 0, 7: 0, 8: 0}
        assert set(why.values()) == {0}


def test_prediction_as_text_parts_streamed(spec_server: Server, spec_client: openai.OpenAI,
                                           reply: tuple[str, int]) -> None:
    """Parts concatenate; the streamed usage chunk carries the same details."""
    text, n_tokens = reply
    half = len(text) // 2
    parts = [{"type": "text", "text": text[:half]}, {"type": "text", "text": text[half:]}]
    before = scrape(spec_server)
    chunks = list(chat(spec_client, spec_server, stream=True,
                       stream_options={"include_usage": True},
                       prediction={"type": "content", "content": parts}))
    d = delta(before, scrape(spec_server))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == n_tokens
    accepted, rejected = details(usage)
    assert rejected == 0 and accepted > 0
    assert_all_drafts_predicted(d, n_tokens, accepted, rejected)


def test_unrelated_prediction_same_text_nothing_drafted_from_it(
        spec_server: Server, spec_client: openai.OpenAI, reply: tuple[str, int]) -> None:
    text, n_tokens = reply
    r = chat(spec_client, spec_server, prediction={"type": "content", "content": UNRELATED})
    assert r.choices[0].message.content == text
    assert r.usage.completion_tokens == n_tokens
    # no token pair of the reply occurs in the prediction, and its first token differs:
    # the prediction proposer never finds a place to draft from
    assert details(r.usage) == (0, 0)


def test_edited_prediction_rejects_at_the_edit(spec_server: Server, spec_client: openai.OpenAI,
                                               reply: tuple[str, int]) -> None:
    text, n_tokens = reply
    # the second word: the first draft runs into it whatever k the step-time curve gives
    # (k >= 2 at the prediction's prior; an edit further on can be skipped by a step whose
    # bonus token already diverges from the prediction, so nothing is drafted at the edit)
    words = text.split(" ")
    words[1] = "banana"
    before = scrape(spec_server)
    r = chat(spec_client, spec_server,
             prediction={"type": "content", "content": " ".join(words)})
    d = delta(before, scrape(spec_server))
    assert r.choices[0].message.content == text
    assert r.usage.completion_tokens == n_tokens
    accepted, rejected = details(r.usage)
    assert accepted >= 1  # the text before the edit
    assert rejected >= 1  # the draft running into "banana"
    # prediction drafts are a subset of all drafts (n-gram lookup may draft after the edit)
    assert d["tandem_spec_draft_tokens_total"] >= accepted + rejected
    assert d["tandem_spec_accepted_tokens_total"] >= accepted
    # a draft token was rejected, so fewer were accepted than drafted
    assert d["tandem_spec_accepted_tokens_total"] < d["tandem_spec_draft_tokens_total"]
    assert d["tandem_spec_accepted_tokens_total"] == by_position_sum(d)


def test_speculative_false_drafts_nothing(spec_server: Server, spec_client: openai.OpenAI,
                                          reply: tuple[str, int]) -> None:
    text, n_tokens = reply
    before = scrape(spec_server)
    r = chat(spec_client, spec_server, prediction={"type": "content", "content": text},
             extra_body={"speculative": False})
    d = delta(before, scrape(spec_server))
    assert r.choices[0].message.content == text
    assert r.usage.completion_tokens == n_tokens
    assert details(r.usage) == (0, 0)
    # every decode step counted as opted out, nothing else moved but the suffix index,
    # which now holds the reply (for later requests)
    assert {k: v for k, v in d.items() if v} == {
        'tandem_spec_no_draft_total{reason="opted_out"}': n_tokens - 1,
        "tandem_spec_suffix_index_tokens": n_tokens}
    # every family still exposed (3 totals, 2 forced-draft totals, by position, chosen k,
    # no-draft reasons, the suffix index's 3)
    assert len(d) == 3 + 2 + DRAFT_CAP + (DRAFT_CAP + 1) + len(REASONS) + 3


def test_n2_and_legacy_completions_sum_over_choices(spec_server: Server,
                                                    spec_client: openai.OpenAI,
                                                    reply: tuple[str, int]) -> None:
    text, n_tokens = reply
    before = scrape(spec_server)
    r = chat(spec_client, spec_server, n=2, prediction={"type": "content", "content": text})
    d = delta(before, scrape(spec_server))
    assert [c.message.content for c in r.choices] == [text, text]
    accepted, rejected = details(r.usage)
    assert rejected == 0 and accepted > 0
    # prediction drafts are among all drafts: where the prediction is used up, the suffix
    # index (which holds this reply from earlier tests) may draft the rest
    assert d["tandem_spec_accepted_tokens_total"] >= accepted
    assert d["tandem_spec_draft_tokens_total"] >= accepted + rejected
    # legacy completions: the predicted continuation of a raw prompt
    kw = dict(model=spec_server.model, prompt="Name three colors:", temperature=0,
              max_tokens=24)
    plain = spec_client.completions.create(**kw)  # type: ignore[call-overload]
    predicted = spec_client.completions.create(  # type: ignore[call-overload]
        **kw, extra_body={"prediction": {"type": "content", "content": plain.choices[0].text}})
    assert predicted.choices[0].text == plain.choices[0].text
    assert predicted.usage.completion_tokens == plain.usage.completion_tokens
    p_acc, p_rej = details(predicted.usage)
    assert p_acc > 0 and p_rej == 0


def test_metrics_families_and_labels(spec_server: Server) -> None:
    samples = scrape(spec_server)
    assert {k for k in samples if "{" not in k} == {
        "tandem_spec_drafts_total", "tandem_spec_draft_tokens_total",
        "tandem_spec_accepted_tokens_total", "tandem_spec_forced_draft_tokens_total",
        "tandem_spec_forced_accepted_tokens_total", "tandem_spec_suffix_index_tokens",
        "tandem_spec_suffix_index_max_tokens", "tandem_spec_suffix_index_evicted_outputs_total"}
    assert {k for k in samples if "by_position" in k} == {
        f'tandem_spec_accepted_tokens_by_position_total{{position="{j}"}}'
        for j in range(1, DRAFT_CAP + 1)}
    assert {k for k in samples if "chosen_k" in k} == {
        f'tandem_spec_chosen_k_total{{k="{k}"}}' for k in range(DRAFT_CAP + 1)}
    assert {k for k in samples if "no_draft" in k} == {
        f'tandem_spec_no_draft_total{{reason="{r}"}}' for r in REASONS}


def test_no_speculator_exports_no_spec_metrics(server: Server) -> None:
    """The conftest's fake server builds its engine without a speculator."""
    if server.mode != "fake":
        pytest.skip("the real server has a speculator (spec mode auto)")
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert "tandem_spec_" not in text
