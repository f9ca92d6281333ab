"""`LLMEngine._lone_decode`: a lone plain-greedy request decodes without the scheduler's
plan, and every step is exactly the general step's (runner calls, tokens, text, finish,
blocks, prefix cache); any other step goes through the scheduler."""

import numpy as np
import pytest

import app.engine.engine as engine_mod
from app.engine.config import SpecConfig
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from tests.unit.helpers import greedy, make, planned

FLAT = StepTimeCurve({1: 1.0, 64: 1.0})


def trace(runner, eng, arrivals=None):
    """Step `eng` to the end, adding `arrivals[i]` (request id, prompt, params) before step
    i; returns everything a step's caller or the next step can see."""
    arrivals = dict(arrivals or {})
    steps = []
    while eng.has_work() or arrivals:
        for rid, prompt, params in arrivals.pop(len(steps), []):
            eng.add_request(rid, prompt, params)
        res = eng.execute_step()
        steps.append(([(o.request_id, o.text, o.token_ids, o.finish_reason)
                       for o in res.outputs], dict(res.computed)))
    bm = eng.block_manager
    return (steps, [planned(runner, i) for i in range(len(runner.steps))],
            [[item.tokens for item in step] for step in runner.steps], runner.calls,
            dict(bm.cached), list(bm.free_queue), eng.stats())


def both(setup, arrivals=None, **make_kw):
    """`trace` of the same workload with the lone path and with it switched off."""
    runs = []
    for lone in (True, False):
        runner, eng = make(**make_kw)
        if not lone:
            eng._lone_decode = lambda: None
        setup(eng)
        runs.append(trace(runner, eng, arrivals))
    return runs


def test_takes_no_plan_and_no_sampler_for_a_lone_greedy_request(monkeypatch):
    runner, eng = make()
    eng.add_request("a", [60, 61, 62, 63, 64], greedy(6))
    (first,) = eng.step()  # the prefill goes through the scheduler
    assert first.token_ids == [65]

    def no_plan():
        raise AssertionError("the scheduler planned a lone decode")

    monkeypatch.setattr(eng.scheduler, "schedule", no_plan)
    monkeypatch.setattr(engine_mod, "sample", no_plan)
    outs = [eng.execute_step() for _ in range(5)]
    assert [o.outputs[0].token_ids for o in outs] == [[66], [67], [68], [69], [70]]
    assert [o.computed for o in outs] == [{"a": range(p, p + 1)} for p in range(5, 10)]
    assert outs[-1].outputs[0].finish_reason == "length" and not eng.has_work()
    assert planned(runner) == [(0, 9, 1, [0])]
    assert runner.steps[-1][0].tokens == [69]


def test_the_same_steps_as_the_general_path_to_a_stop_string_and_to_eos():
    def setup(eng):
        eng.add_request("a", [60, 61, 62, 63, 64], SamplingParams(
            temperature=0, max_tokens=20, stop=["D"]))
        eng.add_request("b", [95, 96, 97], SamplingParams(temperature=0, max_tokens=20))

    lone, general = both(setup, budget=2)  # b waits for a's prefill: the steps alternate
    assert lone == general
    steps = lone[0]
    assert [s[0] for s in steps[-3:]] == [[("a", "C", [67], None), ("b", "b", [98], None)],
                                          [("a", "", [68], "stop"), ("b", "c", [99], None)],
                                          [("b", "", [0], "stop")]]


def test_a_request_arriving_mid_decode_is_admitted_in_the_next_step():
    def setup(eng):
        eng.add_request("a", [1, 2, 3, 4, 5], greedy(12))

    arrivals = {4: [("b", [40, 41, 42], greedy(3))]}
    lone, general = both(setup, arrivals)
    assert lone == general
    steps, plans = lone[0], lone[1]
    assert plans[3] == [(0, 7, 1, [0])]  # a alone
    assert plans[4] == [(0, 8, 1, [0]), (1, 0, 3, [2])]  # a decodes, b prefills beside it
    assert [out[0] for out in steps[7][0]] == ["a"]  # b finished: a alone again
    # the prefix cache: a's prompt block at once, its decoded blocks when it ended
    # (a: 16 of its 17 tokens computed, b: 5 of 6)
    assert lone[4] == general[4] and len(lone[4]) == 16 // 4 + 5 // 4


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logit_bias={62: -100.0}),
    SamplingParams(temperature=0.9, max_tokens=4, ignore_eos=True, seed=7,
                   logit_bias={62: -100.0}),
])
def test_a_request_that_samples_goes_through_the_sampler(params):
    def setup(eng):
        eng.add_request("a", [58, 59, 60], SamplingParams(temperature=0, max_tokens=1))
        eng.add_request("b", [58, 59], params)  # alone after the first step

    lone, general = both(setup)
    assert lone == general
    # argmax would give b 60 61 62 63; the bias makes the sampler pick another than 62
    b_tokens = [t for step in lone[0] for rid, _, toks, _ in step[0] if rid == "b"
                for t in toks]
    assert len(b_tokens) == 4 and b_tokens[:2] == [60, 61] and 62 not in b_tokens


@pytest.mark.parametrize("lone", [True, False])
def test_decoded_tokens_enter_the_prefix_cache_16_at_a_time(lone):
    runner, eng = make()
    if not lone:
        eng._lone_decode = lambda: None
    req = eng.add_request("a", [1, 2, 3, 4, 5], greedy(40))
    eng.step()  # the prompt's full block at once
    hashed = []
    for _ in range(20):
        eng.step()
        hashed.append(req.num_hashed_blocks)
    # verified tokens 6 .. 25: registered when 16 past the 4 hashed, at 20 (and 36)
    assert hashed == [1] * 14 + [5] * 6
    assert [eng.block_manager.blocks[b].block_hash is not None
            for b in req.block_table] == [True] * 5 + [False] * 2


def test_drafts_go_through_the_plan_and_verify():
    def setup(eng):
        eng.speculator = Speculator(SpecConfig(mode="auto"), FLAT, eng.context_length)
        eng.add_request("a", [1, 2, 3, 4, 1, 2], greedy(8))

    lone, general = both(setup, budget=64)
    assert lone == general
    # the n-gram (1, 2) drafts 4 1 2 3 after 3: a step that computes drafts
    assert [3, 4, 1, 2, 3] in [tokens for step in lone[2] for tokens in step]


def test_ties_go_to_the_lowest_id():
    runner, eng = make()
    eng.add_request("a", [1, 2, 3], greedy(4))
    eng.step()

    def tied(items):
        rows = np.full((1, runner.info.n_vocab), -1.0, dtype=np.float32)
        rows[0, [9, 4]] = 5.0
        runner.steps.append(items)
        return rows

    eng.runner.execute = tied
    assert [eng.step()[0].token_ids for _ in range(3)] == [[4], [4], [4]]


def test_no_free_block_leaves_the_step_to_the_scheduler_unchanged():
    runner, eng = make(budget=16)
    req = eng.add_request("a", [1, 2, 3, 4, 5], greedy(20))
    for _ in range(3):  # positions 0..6
        eng.step()
    assert req.num_computed_tokens == 7 and req.block_table == [0, 1]
    bm = eng.block_manager
    bm._take_free_blocks(bm.num_free_blocks)  # the other sequences took every block
    n_steps = len(runner.steps)
    assert eng.execute_step().outputs[0].token_ids == [9]  # position 7: still block 1
    assert eng._lone_decode() is None  # position 8 needs a block
    assert req.num_computed_tokens == 8 and req.block_table == [0, 1]
    assert req.token_ids[-1] == 9 and len(runner.steps) == n_steps + 1
