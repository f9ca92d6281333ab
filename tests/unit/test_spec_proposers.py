"""n-gram prompt lookup, Predicted Outputs, and the speculator in the engine's step over
the fake runner (next token = token + 1)."""

import pytest

from app.engine.config import SpecConfig
from app.engine.request import Request
from app.engine.spec_decode.controller import AcceptanceEstimate, StepTimeCurve
from app.engine.spec_decode.ngram import NgramIndex
from app.engine.spec_decode.proposer import NgramProposer, PredictionProposer
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from tests.unit.helpers import MEASURED_CPU, greedy, make, planned, run_all

FLAT = StepTimeCurve({1: 1.0, 64: 1.01})


def test_ngram_index_proposes_what_followed_the_latest_earlier_match():
    idx = NgramIndex(min_n=2, max_n=3)
    tokens = [5, 6, 7, 8, 5, 6, 9, 1, 5, 6]
    idx.update(tokens)
    # (5, 6) last occurred at 4..5, followed by 9, 1, 5
    assert idx.propose(tokens, 3) == [9, 1, 5]
    # an n-gram is registered only once a token follows it, so the suffix never matches itself
    assert idx.propose(tokens + [7], 2) == [8, 5]


def test_ngram_index_prefers_the_longest_match_and_never_matches_itself():
    idx = NgramIndex(min_n=1, max_n=3)
    tokens = [1, 2, 3, 4, 9, 3, 4, 7, 2, 3, 4]
    idx.update(tokens)
    # (2, 3, 4) occurred at 1..3 followed by 9; (3, 4) more recently at 5..6 followed by 7
    assert idx.propose(tokens, 2) == [9, 3]
    assert NgramIndex(1, 2).propose([1, 2, 3], 4) == []  # nothing indexed: no match


def test_ngram_index_bounded_rebuilds_over_recent_tokens():
    idx = NgramIndex(min_n=1, max_n=1, max_entries=4)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    idx.update(tokens)
    assert len(idx._next) <= 4
    assert idx.propose(tokens + [1], 1) == []  # the early occurrence of 1 is forgotten


def request(prompt, output=(), **params):
    r = Request("r", list(prompt), SamplingParams(temperature=0, **params))
    r.token_ids.extend(output)
    return r


def test_prediction_proposer_follows_then_resyncs_after_an_edit():
    pred = [10, 11, 12, 13, 14, 15, 16, 17]
    p = PredictionProposer()
    r = request([1, 2], prediction=pred)
    assert p.propose(r, 3) == [10, 11, 12]
    r.token_ids.extend([10, 11, 12, 13])  # accepted all and the bonus agreed
    assert p.propose(r, 2) == [14, 15]
    r.token_ids.extend([99, 98])  # an edit: the output leaves the prediction
    assert p.propose(r, 2) == []
    r.token_ids.extend([15, 16])  # back on the prediction: (15, 16) re-synchronises
    assert p.propose(r, 3) == [17]


def test_ngram_proposer_keeps_its_index_on_the_request():
    r = request([4, 5, 6, 4, 5])
    assert NgramProposer().propose(r, 2) == [6, 4]
    assert "ngram" in r.spec_state


def spec_engine(mode="auto", curve=FLAT, budget=64):
    runner, eng = make(budget=budget)
    eng.speculator = Speculator(SpecConfig(mode=mode), curve, eng.context_length)
    return runner, eng


def test_speculation_gives_the_same_tokens_and_counts_exact_acceptance():
    # prompt 1..4 then 1, 2: the n-gram (1, 2) predicts 3, 4, 1, 2 ...; the fake model says
    # 3, 4, 5, 6 ..., so the first two drafts are accepted and the third rejected
    prompt = [1, 2, 3, 4, 1, 2]
    _, plain = make(budget=64)
    plain.add_request("a", prompt, greedy(8))
    want = run_all(plain)["a"]
    runner, eng = spec_engine()
    req = eng.add_request("a", prompt, greedy(8))
    assert run_all(eng)["a"] == want == [3, 4, 5, 6, 7, 8, 9, 10]
    # step 1 prefill -> 3; step 2 drafts [4, 1, 2, 3] after (2, 3): 4 accepted
    assert runner.steps[1][0].tokens == [3, 4, 1, 2, 3]
    m = req.metrics
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (1, 4, 1)
    s = eng.speculator.stats.snapshot()
    assert s["drafts"] == 1 and s["draft_tokens"] == 4 and s["accepted_tokens"] == 1
    assert s["accepted_by_position"][:2] == [1, 0]


def test_k_zero_is_exactly_the_plain_step():
    steep = StepTimeCurve({1: 1.0, 2: 3.0, 64: 200.0})
    runner_a, plain = make(budget=64)
    runner_b, eng = spec_engine(curve=steep)
    plain.add_request("a", [1, 2, 3, 1, 2], greedy(6))
    req = eng.add_request("a", [1, 2, 3, 1, 2], greedy(6))
    assert run_all(plain) == run_all(eng)
    assert [planned(runner_a, i) for i in range(len(runner_a.steps))] == \
        [planned(runner_b, i) for i in range(len(runner_b.steps))]
    # drafts cannot pay on this curve even if all were accepted: the proposers never ran
    assert eng.speculator.stats.snapshot()["chosen_k"] == {}
    assert req.spec_state == {}


def test_ngram_drafts_that_cannot_pay_are_kept_as_a_shadow():
    # one user, an n-gram match to draft from, but n-gram drafts start at 0.6 acceptance:
    # on this curve no number of them can pay, so the controller does not run; the
    # proposers do, and their drafts become a shadow scored against the output
    runner, eng = spec_engine(curve=MEASURED_CPU)
    eng.add_request("a", [1, 2, 3, 4, 1, 2], greedy(8))
    assert run_all(eng)["a"] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert all(len(item.tokens) == 1 for step in runner.steps[1:] for item in step)
    snapshot = eng.speculator.stats.snapshot()
    assert snapshot["chosen_k"] == {} and snapshot["draft_tokens"] == 0
    # the shadow: the tail [1, 2, 3] matched at the start, drafts [4, 1, 2, 3] (all that
    # followed); the reply went 4, 5: one observation, 1 of 4 accepted, 2 positions reached
    est = eng.speculator.global_estimates["ngram:3"]
    assert (est.accepted[:3], est.reached[:3]) == ([1.0, 0.0, 0.0], [1.0, 1.0, 0.0])


def test_a_prediction_is_still_tried_on_the_measured_cpu_curve():
    # a prediction starts at 0.9: three drafts could pay (3.44 tokens in t(4) = 2.887)
    runner, eng = spec_engine(curve=MEASURED_CPU)
    req = eng.add_request("a", [1, 2], SamplingParams(temperature=0, max_tokens=6,
                                                      ignore_eos=True,
                                                      prediction=[3, 4, 5, 6, 7, 8]))
    assert run_all(eng)["a"] == [3, 4, 5, 6, 7, 8]
    assert runner.steps[1][0].tokens == [3, 4, 5, 6]
    assert req.metrics.accepted_prediction_tokens == 3


def test_a_sequences_own_acceptance_can_lift_its_ceiling_above_the_global_one():
    sp = Speculator(SpecConfig(mode="auto"), MEASURED_CPU, 1024)
    good = Request("good", [1, 2, 3], greedy(50))
    good.spec_state["source"] = "ngram:2"
    for _ in range(5):
        sp.observe(good, 8, 8)  # good's drafts are all accepted
    own = good.spec_state["estimate:ngram:2"].ceiling()
    assert own == pytest.approx((sum(0.9 ** i for i in range(5)) + 0.6) /
                                (sum(0.9 ** i for i in range(5)) + 1))  # 0.92
    # other sequences' drafts of that kind did badly since: the global estimate fell
    sp.global_estimates["ngram:2"] = AcceptanceEstimate(8, prior=0.2)
    sp._global_ceilings = None
    assert sp._ceiling(good) == own
    assert sp._ceiling(Request("new", [1, 2, 3], greedy(50))) == 0.6  # a new sequence: the prior
    assert sp._ceiling(Request("opted-out", [1], SamplingParams(speculative=False))) == 0.0
    assert sp._ceiling(Request("predicted", [1], SamplingParams(prediction=[2, 3]))) == 0.9


def test_drafts_can_pay_bound():
    from app.engine.spec_decode.controller import drafts_can_pay

    cpu = StepTimeCurve({1: 1.0, 2: 1.88, 4: 2.69, 8: 4.38, 16: 8.0, 17: 8.55, 32: 15.7})
    assert drafts_can_pay(cpu, 1, 1, 8)  # one user: a 7-token draft accepted at 0.95 pays
    assert not drafts_can_pay(cpu, 16, 16, 128)  # batch 16: nothing can
    assert drafts_can_pay(cpu, 16, 16, 128, best_rate=1.0)  # (the CPU curve is near-linear)
    assert not drafts_can_pay(cpu, 1, 1, 0)


def test_prediction_drafts_are_accepted_and_counted_as_prediction_tokens():
    runner, eng = spec_engine()
    req = eng.add_request("a", [1, 2], SamplingParams(temperature=0, max_tokens=6,
                                                      ignore_eos=True,
                                                      prediction=[3, 4, 5, 50, 51]))
    out = run_all(eng)["a"]
    assert out == [3, 4, 5, 6, 7, 8]
    m = req.metrics
    # after the first token (3, on the prediction) the prediction drafts 4 5 50 51 (cap 4:
    # max_tokens - outputs - 1); 4 5 accepted, 50 rejected, 51 never reached
    assert runner.steps[1][0].tokens == [3, 4, 5, 50, 51]
    assert (m.accepted_prediction_tokens, m.rejected_prediction_tokens) == (2, 2)


def test_opted_out_request_never_drafts():
    runner, eng = spec_engine()
    eng.add_request("a", [1, 2, 3, 1, 2], SamplingParams(temperature=0, max_tokens=6,
                                                         ignore_eos=True, speculative=False))
    run_all(eng)
    assert all(len(item.tokens) == 1 for step in runner.steps[1:] for item in step)


def test_seeded_sampling_is_the_same_with_and_without_speculation():
    params = dict(temperature=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    prompt = [1, 2, 3, 4, 1, 2]
    _, plain = make(budget=64)
    plain.add_request("a", prompt, SamplingParams(**params))
    runner, eng = spec_engine(mode="fixed:3")
    eng.add_request("a", prompt, SamplingParams(**params))
    assert run_all(eng) == run_all(plain)
    assert eng.speculator.stats.draft_tokens > 0
