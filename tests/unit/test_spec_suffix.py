"""The suffix index of earlier outputs: exact drafts, votes and confidences, the memory cap,
and suffix drafts in the engine's step over the fake runner (next token = token + 1)."""

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from app.engine.config import SpecConfig
from app.engine.request import Request
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.speculator import Speculator
from app.engine.spec_decode.suffix import SuffixDraft, SuffixIndex
from app.engine.types import SamplingParams
from app.server.spec_metrics import SpecCollector
from tests.unit.helpers import make, run_all

FLAT = StepTimeCurve({1: 1.0, 64: 1.01})


def request(tokens):
    return Request("r", list(tokens), SamplingParams(temperature=0))


def test_an_earlier_output_is_drafted_exactly_from_the_longest_matching_tail():
    ix = SuffixIndex(match_lengths=(2, 4))
    ix.add([1, 2, 3, 4, 5, 6, 7, 8])
    ix.add([9, 3, 4, 70, 71])  # (3, 4) again, followed by 70
    # a 2-token tail: (3, 4) occurred twice, followed by 5 and by 70; the tie goes to the
    # more recent, with half the votes, and 71 followed it every time...
    assert ix.propose([50, 3, 4], 3) == SuffixDraft([70, 71], [0.5, 1.0], 2, 2)
    # ...while a 4-token tail finds the first output, and the draft stops at its end
    assert ix.propose([1, 2, 3, 4], 8) == SuffixDraft([5, 6, 7, 8], [1.0] * 4, 4, 1)
    assert ix.propose([1, 2, 3, 4], 2).tokens == [5, 6]
    assert ix.propose([40, 41], 4) is None  # not stored
    assert ix.propose([1, 2, 3, 4], 0) is None


def test_occurrences_vote_and_the_winners_share_is_the_confidence():
    ix = SuffixIndex(match_lengths=(4,))
    ix.add([1, 2, 3, 4, 10, 11])
    ix.add([1, 2, 3, 4, 10, 12])
    ix.add([1, 2, 3, 4, 20, 21])
    # 10 has 2 of 3 votes; then 11 and 12 tie and the most recent (12) wins with 1 of 2
    assert ix.propose([1, 2, 3, 4], 4) == SuffixDraft([10, 12], [2 / 3, 1 / 2], 4, 3)
    # the draft stops where the product of confidences falls below min_confidence
    strict = SuffixIndex(match_lengths=(4,), min_confidence=0.5)
    for seq in ([1, 2, 3, 4, 10, 11], [1, 2, 3, 4, 10, 12], [1, 2, 3, 4, 20, 21]):
        strict.add(seq)
    assert strict.propose([1, 2, 3, 4], 4) == SuffixDraft([10], [2 / 3], 4, 3)


def test_the_cap_takes_out_the_oldest_outputs_and_their_entries():
    ix = SuffixIndex(max_tokens=10, match_lengths=(2,))
    ix.add([1, 2, 3, 4])
    ix.add([5, 6, 7, 8])
    assert (ix.sequences, ix.tokens, ix.entries, ix.evicted) == (2, 8, 4, 0)
    ix.add([1, 2, 9, 9])  # 12 tokens: the first output leaves
    assert (ix.sequences, ix.tokens, ix.evicted) == (2, 8, 1)
    # its (1, 2) -> 3 is gone; the newer (1, 2) -> 9 stays
    assert ix.propose([1, 2], 3) == SuffixDraft([9, 9], [1.0, 1.0], 2, 1)
    fresh = SuffixIndex(max_tokens=10, match_lengths=(2,))
    fresh.add([5, 6, 7, 8])
    fresh.add([1, 2, 9, 9])
    # the same entries as an index that never held it, positions shifted by its 5 slots
    assert ix._base == 5
    assert {k: [p - 5 for p in v] for k, v in ix._after.items()} == fresh._after
    assert ix.entries == fresh.entries == 4
    ix.add(list(range(100, 130)))  # longer than the cap: its last 10 tokens, alone
    assert (ix.sequences, ix.tokens) == (1, 10)
    assert ix.propose([120, 121], 2).tokens == [122, 123]


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(match_lengths=()),
                                 dict(match_lengths=(0, 2)), dict(min_confidence=0.0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SuffixIndex(**bad)


def run(eng, spec, rid, prompt, n):
    p = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    eng.add_request(rid, prompt, p)
    return run_all(eng)[rid]


def test_a_later_request_drafts_what_an_earlier_one_wrote():
    _, eng = make(budget=64)
    eng.speculator = spec = Speculator(SpecConfig(mode="auto"), FLAT, eng.context_length)
    # no n-gram repeats inside either request; the fake model counts up from the prompt
    assert run(eng, spec, "a", [10, 20, 30, 40], 8) == list(range(41, 49))
    assert spec.stats.drafts == 0
    assert spec.stats.snapshot()["suffix_tokens"] == 8
    out = run(eng, spec, "b", [5, 41, 42], 5)  # 43.. is what "a" wrote after (41, 42)
    assert out == [43, 44, 45, 46, 47]
    s = spec.stats
    assert (s.drafts, s.draft_tokens, s.accepted_tokens) == (1, 3, 3)
    snap = s.snapshot()
    assert (snap["suffix_tokens"], snap["suffix_outputs"], snap["suffix_max_tokens"]) == \
        (13, 2, 1 << 15)
    registry = CollectorRegistry()
    registry.register(SpecCollector(type("A", (), {"engine": eng})()))
    lines = [line for line in generate_latest(registry).decode().splitlines()
             if line.startswith("tandem_spec_suffix")]
    assert lines == ["tandem_spec_suffix_index_tokens 13.0",
                     "tandem_spec_suffix_index_max_tokens 32768.0",
                     "tandem_spec_suffix_index_evicted_outputs_total 0.0"]


def test_no_suffix_index_when_its_cap_is_zero():
    _, eng = make(budget=64)
    eng.speculator = spec = Speculator(SpecConfig(mode="auto", suffix_tokens=0), FLAT,
                                       eng.context_length)
    run(eng, spec, "a", [10, 20, 30, 40], 8)
    assert run(eng, spec, "b", [5, 41, 42], 5) == [43, 44, 45, 46, 47]
    assert spec.stats.drafts == 0
    assert "suffix_tokens" not in spec.stats.snapshot()


def test_the_confidence_caps_the_acceptance_the_controller_plans_with():
    spec = Speculator(SpecConfig(mode="auto"), FLAT, 4096)
    r = type("R", (), {"spec_state": {"suffix_conf": [0.5, 1.0]}})()
    assert spec._rates(r, "suffix:4", 0, 3)[:3] == [0.5, 0.6, 0.6]  # prior 0.6 elsewhere


def test_the_longer_match_of_own_text_and_earlier_outputs_drafts():
    spec = Speculator(SpecConfig(mode="auto"), FLAT, 4096)
    spec.suffix.index.add([7, 1, 2, 3, 4, 50, 51])
    # own text: (3, 4) was followed by 9; earlier outputs: (1, 2, 3, 4) by 50
    r = request([3, 4, 9, 8, 1, 2, 3, 4])
    assert spec._propose(r, 2) == ("suffix:4", [50, 51])
    # a tie (2 tokens each) goes to the request's own text
    r = request([3, 4, 9, 8, 3, 4])
    assert spec._propose(r, 2) == ("ngram:2", [9, 8])
    assert spec._propose(request([60, 61]), 2) is None
