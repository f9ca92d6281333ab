"""The decode hot path of `LLMEngine._sample`: a batch of one plain-greedy row per request
is one argmax, without the general sampler; anything else goes through `sample`."""

import numpy as np
import pytest

import app.engine.engine as engine_mod
from app.engine.engine import ScheduledRequest, StepPlan
from app.engine.types import SamplingParams
from tests.unit.helpers import greedy, make


class TiedRunner:
    """Wraps a FakeRunner: every logits row ties tokens 9 and 4 at the top (argmax: 4)."""

    def __init__(self, runner):
        self.runner = runner

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def execute(self, items):
        rows = self.runner.execute(items)
        rows = np.full_like(rows, -1.0)
        rows[:, [4, 9]] = 5.0
        return rows


def _no_sample(*args, **kwargs):
    raise AssertionError("the general sampler ran")


def test_plain_greedy_is_set_from_the_params():
    _, eng = make()
    assert eng.add_request("a", [1, 2], greedy(4)).plain_greedy
    for params in (SamplingParams(temperature=0, repetition_penalty=1.1),
                   SamplingParams(temperature=0, logprobs=2),
                   SamplingParams(temperature=0, logit_bias={3: 1.0}),
                   SamplingParams(temperature=0.7)):
        assert not eng.add_request(f"r{len(eng.requests)}", [1, 2], params).plain_greedy


def test_all_greedy_decode_batch_skips_the_sampler(monkeypatch):
    _, eng = make()
    eng.add_request("a", [1, 2, 3], greedy(3))
    eng.add_request("b", [5, 6], greedy(3))
    monkeypatch.setattr(engine_mod, "sample", _no_sample)
    outs = {}
    while eng.has_work():
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.token_ids)
    # the fake model continues each token with the next id
    assert outs == {"a": [4, 5, 6], "b": [7, 8, 9]}


def test_ties_go_to_the_lowest_id_as_in_the_sampler():
    runner, eng = make()
    eng.runner = TiedRunner(runner)
    eng.add_request("a", [1, 2, 3], greedy(2))
    (out,) = eng.step()
    assert out.token_ids == [4]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, repetition_penalty=1.3),
    SamplingParams(temperature=0.9, max_tokens=2, ignore_eos=True, seed=1),
])
def test_a_row_that_is_not_plain_greedy_takes_the_sampler(monkeypatch, params):
    _, eng = make()
    eng.add_request("a", [1, 2, 3], greedy(2))
    eng.add_request("b", [5, 6], params)
    monkeypatch.setattr(engine_mod, "sample", _no_sample)
    with pytest.raises(AssertionError, match="the general sampler ran"):
        eng.step()


def test_a_plan_with_a_draft_row_takes_the_sampler_even_when_rows_equal_requests():
    # as many rows as requests, but not one each: a prefill chunk (no row) beside a decode
    # with one draft (two rows); pairing rows with requests one to one would be wrong
    _, eng = make()
    a = eng.add_request("a", [1, 2, 3], greedy(4))
    b = eng.add_request("b", [5, 6, 7, 8], greedy(4))
    a.spec_token_ids = [4]
    plan = StepPlan(scheduled=[ScheduledRequest(a, 2, 2, 1, 0, 2),
                               ScheduledRequest(b, 0, 2, 0, 2, 0)], num_rows=2)
    logits = np.zeros((2, 16), dtype=np.float32)
    logits[0, 7] = logits[1, 9] = 1.0
    assert eng._sample(plan, logits) == {a: [(7, None), (9, None)]}
