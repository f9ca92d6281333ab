"""The draft-model proposer over fake runners: the target says token + 1; the draft says
the same except after multiples of 5, where it says token + 2 (a wrong draft)."""

import numpy as np
import pytest

from app.engine.config import SpecConfig
from app.engine.engine import LLMEngine
from app.engine.residency import MirroredResidency
from app.engine.spec_decode.draft_model import DraftModelProposer, check_same_vocabulary
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from tests.fakes.runner import FakeRunner
from tests.unit.helpers import greedy, make, run_all


class SometimesWrongDraft(FakeRunner):
    def execute(self, items):
        logits = super().execute(items)
        row = 0
        for item in items:
            for j in item.logits_indices:
                t = item.tokens[j]
                if t % 5 == 0:
                    logits[row] = -10.0
                    logits[row, (t + 2) % self.info.n_vocab] = 10.0
                row += 1
        return logits


def draft_engine(mode="fixed:3"):
    target, eng = make(budget=64)
    draft = SometimesWrongDraft(num_blocks=target.num_blocks, block_size=target.block_size,
                                max_seqs=target.max_seqs)
    residency = MirroredResidency(target, draft, target.block_size)
    engine = LLMEngine(target, eng.config, residency=residency,
                       speculator=Speculator(SpecConfig(mode=mode), None, 1024,
                                             draft=DraftModelProposer(draft, residency)))
    return target, draft, residency, engine


def test_draft_model_gives_the_target_tokens_and_drafts_only_what_it_lacks():
    _, plain = make(budget=64)
    plain.add_request("a", [1, 2, 3], greedy(12))
    want = run_all(plain)["a"]
    target, draft, residency, eng = draft_engine()
    req = eng.add_request("a", [1, 2, 3], greedy(12))
    assert run_all(eng)["a"] == want == list(range(4, 16))
    # after the prefill sampled 4: the draft catches up on the prompt (all but the last
    # real token), then feeds 4 -> 5, 5 -> 7 (its mistake), 7 -> 8
    steps = [[(i.start_pos, i.tokens) for i in step] for step in draft.steps]
    assert steps[:4] == [[(0, [1, 2, 3])], [(3, [4])], [(4, [5])], [(5, [7])]]
    # the target verifies 4 + drafts 5 7 8: 5 accepted, 7 rejected; it emits 5 and its 6
    assert target.steps[1][0].tokens == [4, 5, 7, 8]
    # rolled back to 5 positions (1 2 3 4 5); the draft is told the same
    assert ("truncate", 0, 5) in target.calls and ("truncate", 0, 5) in draft.calls
    # next draft: it lacks only position 5 (token 6, the target's own): no re-decoding
    assert steps[4] == [(5, [6])]
    # 4 verifications of 3 drafts; the draft errs after 5, 10 and 15 only
    m = req.metrics
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (4, 12, 7)
    assert residency.draft_tokens == {}  # released with the request


def test_rollback_reaches_the_draft_and_release_keeps_only_what_it_computed():
    target, draft, residency, eng = draft_engine()
    eng.add_request("a", [1, 2, 3], greedy(12))
    run_all(eng)
    t_trunc = [c for c in target.calls if c[0] == "truncate"]
    d_trunc = [c for c in draft.calls if c[0] == "truncate"]
    assert t_trunc and d_trunc
    assert all(d[2] <= t[2] for t, d in zip(t_trunc, d_trunc, strict=False))
    (t_rel,) = [c for c in target.calls if c[0] == "release"]
    (d_rel,) = [c for c in draft.calls if c[0] == "release"]
    assert d_rel[2] <= t_rel[2]


def test_vocabulary_mismatch_is_refused_naming_the_difference():
    a, b = FakeRunner(n_vocab=100), FakeRunner(n_vocab=101)
    with pytest.raises(ValueError, match="vocabulary size 101 != target's 100"):
        check_same_vocabulary(a, b)
    c = FakeRunner(n_vocab=100)
    c.tokenizer = type(c.tokenizer)("bytes", bos_id=None, eos_id=1)
    with pytest.raises(ValueError, match=r"EOS/EOT ids \[1\] != target's \[0\]"):
        check_same_vocabulary(a, c)
    check_same_vocabulary(a, FakeRunner(n_vocab=100))


def test_adaptive_controller_charges_the_draft_models_cost():
    from app.engine.spec_decode.controller import StepTimeCurve, allocate_drafts

    flat = StepTimeCurve({1: 1.0, 64: 1.0})
    free = allocate_drafts(flat, [1], 1, [[0.9] * 8], [8])
    costly = allocate_drafts(flat, [1], 1, [[0.9] * 8], [8],
                             draft_curve=StepTimeCurve({1: 0.6, 64: 0.6}), is_draft=[True])
    assert free == [8] and costly[0] < 8
    # a draft costing as much as the target never pays at this acceptance
    assert allocate_drafts(flat, [1], 1, [[0.9] * 8], [8], draft_curve=flat,
                           is_draft=[True]) == [0]
    assert np.isfinite(costly[0])


def test_unseeded_sampling_gets_sampled_drafts_verified_by_rejection_sampling():
    # the fake models put e^20 more weight on their token than on any other, so at T = 1
    # the target's p is one token; where the draft errs, q puts its weight elsewhere: the
    # draft is rejected and the resample from max(0, p - q) is the target's token
    target, draft, residency, eng = draft_engine()
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    req = eng.add_request("a", [1, 2, 3], params)
    verified = []
    original = eng._verify_sampled_drafts

    def spy(plan, logits, sampled):
        verified.extend(len(s.request.spec_state.get("q", [])) for s in plan.scheduled)
        original(plan, logits, sampled)

    eng._verify_sampled_drafts = spy
    assert run_all(eng)["a"] == list(range(4, 16))
    assert sum(verified) > 0  # drafts came with their q
    m = req.metrics
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (4, 12, 7)


def test_seeded_requests_get_greedy_drafts():
    target, draft, residency, eng = draft_engine()
    req = eng.add_request("a", [1, 2, 3], SamplingParams(temperature=1.0, seed=5,
                                                         max_tokens=12, ignore_eos=True))
    eng.step()
    eng.step()
    assert "q" not in req.spec_state and req.metrics.num_draft_tokens == 3
