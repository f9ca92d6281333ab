"""The adaptive draft controller on exact curves and acceptance estimates."""

import random

import pytest

from app.engine.spec_decode.controller import (
    AcceptanceEstimate,
    StepTimeCurve,
    allocate_drafts,
    drafts_can_pay,
    drafts_may_pay,
    step_seconds,
)
from app.engine.types import SamplingParams
from tests.unit.helpers import MEASURED_CPU

# t(n)/t(1) measured on this project's 2-core CPU (raw llama.cpp, embedded model)
CPU = StepTimeCurve({1: 1.0, 2: 1.48, 3: 2.12, 4: 2.14, 5: 2.59, 8: 3.89, 9: 4.4, 16: 8.1,
                     17: 8.6, 24: 12.0, 32: 16.0})
FLAT = StepTimeCurve({1: 1.0, 64: 1.05})  # a GPU / Apple-Silicon-like curve


def test_curve_interpolates_is_monotone_and_extrapolates():
    c = StepTimeCurve({1: 1.0, 3: 2.0, 4: 1.5, 8: 4.0})
    assert c(2) == 1.5
    assert c(4) == 2.0  # a dip below t(3) is noise: the curve never falls
    assert c(10) == pytest.approx(4.0 + 2 * (4.0 - 2.0) / 4)
    assert c.ratios() == {1: 1.0, 3: 2.0, 4: 2.0, 8: 4.0}


def test_past_its_last_point_a_curve_never_rises_slower_than_its_mean_cost_per_token():
    # Qwen2.5-1.5B Q4_K_M's profile here: t(10) 256.6 ms, t(12) 281.9 (12.6 ms a token) and
    # no point past 12, while a step of 16 sequences costs 17.5 ms a row: extrapolated with
    # the last segment, 8 drafts at 94% looked like they paid at 16 users, and lost 7-24%
    c = StepTimeCurve({1: 0.0283, 8: 0.2192, 10: 0.2566, 12: 0.2819})
    slope = (0.2819 - c(6)) / 6  # over the upper half, t(6) to t(12): 19.5 ms a token
    assert c(16) == pytest.approx(0.2819 + 4 * slope) and slope > 0.0195
    assert allocate_drafts(c, [1] * 16, 16, [[0.94] * 8] * 16, [8] * 16) == [0] * 16
    steep_end = StepTimeCurve({1: 1.0, 2: 1.1, 3: 3.0})  # the last segment is the steeper
    assert steep_end(5) == pytest.approx(3.0 + 2 * 1.9)
    assert FLAT(128) == pytest.approx(1.05 + 64 * (1.05 - FLAT(32)) / 32)  # flat stays flat


def test_flat_curve_gets_long_drafts():
    assert allocate_drafts(FLAT, [1], 1, [[0.9] * 8], [8]) == [8]


def test_steep_curve_at_batch_16_gets_none():
    assert allocate_drafts(CPU, [1] * 16, 16, [[0.9] * 8] * 16, [8] * 16) == [0] * 16


def test_a_prompt_chunk_in_the_step_does_not_make_drafts_look_cheap():
    # 15 decodes and another user's 17-token prompt chunk: t(32) = 16. Against that step's
    # rate (15 / 16) one sequence's 8 drafts at 0.94 (6.1 tokens for t(40) - t(32) = 4) looked
    # like a gain; against decoding alone (15 / t(15) = 1.98) they cost more than they give
    counts = [1] * 15 + [17]
    rates, owners = [[0.94] * 8], [0]
    assert allocate_drafts(CPU, counts, 15, rates, [8], owners) == [0]
    assert not drafts_can_pay(CPU, 32, 15, 8, best_rate=0.94)
    assert allocate_drafts(FLAT, counts, 15, rates, [8], owners) == [8]  # where they are cheap
    assert drafts_can_pay(FLAT, 32, 15, 8)


def test_one_user_on_the_cpu_curve_takes_the_best_total_not_the_first_stop():
    # gains .8, .64, .512 ...: (1 + G(D)) / t(1 + D) peaks at D = 3 (t(4) ~ t(3)), although
    # D = 2 alone is worse than D = 1
    assert allocate_drafts(CPU, [1], 1, [[0.8] * 8], [8]) == [3]


def test_tokens_go_to_the_sequence_with_the_most_to_gain():
    # flat: long drafts pay for the likely sequence; the unlikely one's gains (0.1 ** j)
    # fall below even a flat curve's cost after two tokens
    assert allocate_drafts(FLAT, [1, 1], 2, [[0.95] * 8, [0.1] * 8], [8, 8]) == [8, 2]
    ks = allocate_drafts(CPU, [1, 1], 2, [[0.95] * 8, [0.1] * 8], [8, 8])
    assert ks[1] == 0 and ks[0] > 0


def test_caps_bound_what_each_sequence_gets():
    assert allocate_drafts(FLAT, [1], 1, [[0.9] * 8], [2]) == [2]
    assert allocate_drafts(FLAT, [1], 1, [[0.9] * 8], [0]) == [0]


def test_falling_acceptance_backs_off():
    est = AcceptanceEstimate(8, prior=0.9)
    assert allocate_drafts(CPU, [1], 1, [est.rates()], [8]) == [3]
    for _ in range(6):
        est.observe(4, 0)  # every first draft rejected
    assert est.rates()[0] < 0.2
    assert allocate_drafts(CPU, [1], 1, [est.rates()], [8]) == [0]


def test_acceptance_counts_only_positions_reached():
    est = AcceptanceEstimate(4, prior=0.5, prior_weight=1.0, decay=1.0)
    est.observe(4, 1)  # position 1 accepted, 2 rejected, 3 and 4 never reached
    assert est.accepted == [1.0, 0.0, 0.0, 0.0]
    assert est.reached == [1.0, 1.0, 0.0, 0.0]
    assert est.rates() == [0.75, 0.25, 0.5, 0.5]


def test_equal_split_costs_one_pass_per_distinct_count():
    c = StepTimeCurve({1: 1.0, 16: 16.0})  # linear: t(n) = n
    assert step_seconds(c, [4, 1, 1, 1], equal_split=False) == 7.0
    # passes: 4 sequences x 1 token, then 1 sequence x 3 tokens
    assert step_seconds(c, [4, 1, 1, 1], equal_split=True) == 4.0 + 3.0
    assert step_seconds(c, [3, 3, 1, 1], equal_split=True) == 4.0 + 4.0
    assert step_seconds(c, [0, 2, 2], equal_split=True) == 4.0
    # slots that are not consecutive are micro-batched apart (split_equal(sequential))
    assert step_seconds(c, [1, 1], equal_split=True, slots=[1, 3]) == 1.0 + 1.0
    assert step_seconds(c, [2, 1, 1], equal_split=True, slots=[0, 1, 3]) == 2.0 + 1.0 + 1.0


def test_equal_split_drafts_for_everyone_or_no_one():
    # a second pass costs as much as a first: one sequence drafting alone doubles the step,
    # all four drafting the same k keep one pass
    c = StepTimeCurve({1: 1.0, 4: 1.0, 8: 1.1, 16: 1.3, 64: 4.0})
    ks = allocate_drafts(c, [1, 1, 1, 1], 4, [[0.5] * 8] * 4, [8] * 4, equal_split=True)
    assert len(set(ks)) == 1 and ks[0] > 0
    alone = allocate_drafts(c, [1, 1, 1, 1], 4, [[0.5] * 8], [8], owners=[0],
                            equal_split=True)
    assert alone == [0]
    # counted as one pass of the total, the same draft pays
    assert allocate_drafts(c, [1, 1, 1, 1], 4, [[0.5] * 8], [8], owners=[0]) != [0]



def test_ceiling_is_the_highest_rate_before_the_next_observation():
    est = AcceptanceEstimate(2, prior=0.5, decay=1.0)
    assert est.ceiling() == 0.5
    est.observe(2, 2)
    assert est.rates() == [0.75, 0.75] and est.ceiling() == 0.75
    est.forget(0.5)  # towards the prior: under the ceiling
    assert est.rates() == pytest.approx([2 / 3, 2 / 3]) and est.ceiling() == 0.75
    est.observe(2, 0)  # position 1 rejected, position 2 not reached
    assert est.rates() == pytest.approx([0.4, 2 / 3]) and est.ceiling() == pytest.approx(2 / 3)


def test_acceptance_bound_on_the_measured_cpu_curve():
    # n-gram drafts start at 0.6: at best 1 + .6 + .36 + ... tokens for t(1 + D) >= 1.9 t(1)
    assert not drafts_may_pay(MEASURED_CPU, 1, 1, [0.6], 8, 8)
    # 0.8 could: 1 + .8 + .64 + .512 = 2.95 tokens in t(4) = 2.887
    assert drafts_may_pay(MEASURED_CPU, 1, 1, [0.8], 8, 8)
    assert not drafts_may_pay(MEASURED_CPU, 1, 1, [0.8], 1, 8)  # one draft at most: 1.8 / 1.918
    assert not drafts_may_pay(MEASURED_CPU, 1, 1, [0.0], 8, 8)  # a sequence that never drafts
    assert drafts_may_pay(FLAT, 16, 16, [0.1] * 16, 8, 128)


def test_acceptance_bound_never_skips_what_allocate_drafts_would_give():
    rng = random.Random(0)
    skipped = drafted = 0
    for _ in range(400):
        n = rng.randint(1, 4)
        points, t = {1: 1.0}, 1.0
        for k in (2, 3, 4, 6, 8, 12, 16, 32):
            t += rng.uniform(0.0, 1.2) * (k - max(points))
            points[k] = t
        curve = StepTimeCurve(points)
        ceilings = [rng.random() for _ in range(n)]
        rates = [[rng.uniform(0.0, c) for _ in range(8)] for c in ceilings]
        ks = allocate_drafts(curve, [1] * n, n, rates, [8] * n, margin=0.0)
        may = drafts_may_pay(curve, n, n, ceilings, 8, 8 * n)
        assert may or not any(ks), (points, ceilings, ks)
        skipped += not may
        drafted += any(ks)
    assert skipped > 50 and drafted > 50  # both kinds of case were met


def test_decodes_in_slots_apart_are_timed_apart_by_the_bounds_too():
    # four decodes in slots 0, 2, 4, 6 run as four one-token micro-batches (t = 4, not
    # t(4) = 2.14): against that, 3 drafts each at 0.7 pay, and the bound must say they may
    slots = [0, 2, 4, 6]
    plain = step_seconds(CPU, [1] * 4, True, slots)
    assert plain == 4.0
    assert allocate_drafts(CPU, [1] * 4, 4, [[0.7] * 8] * 4, [8] * 4, equal_split=True,
                           slots=slots) == [3, 3, 3, 3]
    assert drafts_may_pay(CPU, 4, 4, [0.7] * 4, 8, 32, plain)
    assert not drafts_may_pay(CPU, 4, 4, [0.7] * 4, 8, 32)  # timed as one step of 4


class Decoding:
    """A running request with one token to compute (a decode) in `slot`, whose drafts'
    acceptance is estimated at most 0.7 (`Speculator._ceiling`)."""

    def __init__(self, slot: int):
        self.num_tokens, self.num_computed_tokens, self.slot = 10, 9, slot
        self.params = SamplingParams(temperature=0)
        self.spec_state = {"ceiling": 0.7}


def test_the_speculator_times_the_decodes_by_slot_for_its_bounds():
    from app.engine.config import SpecConfig
    from app.engine.spec_decode.speculator import Speculator

    def why(slots: list[int], equal_split: bool) -> str | None:
        spec = Speculator(SpecConfig(mode="auto"), CPU, 1024, equal_split=equal_split)
        return spec._may_pay(CPU, [Decoding(s) for s in slots], [], 64, {})

    assert why([0, 2, 4, 6], True) is None  # four micro-batches: drafts may pay (above)
    assert why([0, 1, 2, 3], True) == "no_gain"  # one micro-batch of 4: they cannot
    assert why([0, 2, 4, 6], False) == "no_gain"


def test_the_bounds_hold_beside_prompt_chunks_and_with_slots_split_apart():
    """`_may_pay`'s bounds, with the baseline the speculator gives them (the decodes alone,
    timed by slot), never skip what `allocate_drafts` would give: with prompts in the step
    (1-token ones too: a prefix-cache hit) and decodes in slots that are not adjacent.
    The curves are concave, as measured ones are (flat on a GPU, near-linear on a CPU): a
    token added to a step never costs more than the one before it, so a draft that makes a
    micro-batch of its own costs at least what it would add to one step of the total."""
    rng = random.Random(1)
    skipped = drafted = 0
    for _ in range(600):
        n, prompts = rng.randint(1, 4), rng.randint(0, 2)
        points, t, slope = {1: 1.0}, 1.0, 1.0
        for k in (2, 3, 4, 6, 8, 12, 16, 32, 64):
            slope *= rng.uniform(0.5, 1.0)
            t += slope * (k - max(points))
            points[k] = t
        curve = StepTimeCurve(points)
        counts = [1] * n + [rng.choice([1, 5, 40]) for _ in range(prompts)]
        slots = rng.sample(range(12), n + prompts)
        split = rng.random() < 0.5
        ceilings = [rng.random() for _ in range(n)]
        rates = [[rng.uniform(0.0, c) for _ in range(8)] for c in ceilings]
        ks = allocate_drafts(curve, counts, n, rates, [8] * n, list(range(n)), split,
                             slots=slots, margin=0.0,
                             decodes=[True] * n + [False] * prompts)
        plain = step_seconds(curve, [1] * n, split, slots[:n])
        may = drafts_may_pay(curve, sum(counts), n, ceilings, 8, 8 * n, plain)
        assert may or not any(ks), (points, counts, slots, split, ceilings, ks)
        assert drafts_can_pay(curve, sum(counts), n, 8 * n, 1.0, plain) or not any(ks)
        skipped += not may
        drafted += any(ks)
    assert skipped > 50 and drafted > 50
