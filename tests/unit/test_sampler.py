"""Sampler: greedy, seeded draws, top-k/top-p/min-p on known distributions, penalties, logprobs."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from app.engine.sampler import (
    apply_penalties,
    draw,
    make_rng,
    penalty_window,
    sample,
    top_k_ids,
)
from app.engine.types import SamplingParams

PROBS = [0.5, 0.3, 0.15, 0.05]


def logits_of(probs) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


class FixedU:
    """Stands in for a generator: `random()` always returns `u`, to probe the CDF's ends."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


def draws(row: np.ndarray, params: SamplingParams, n: int, seed: int = 0) -> list[int]:
    """`n` single-row samples from the same logits with one seeded generator."""
    rng = make_rng(seed)
    logits = row[None, :]
    return [int(sample(logits, [params], [[]], [[]], [rng]).token_ids[0]) for _ in range(n)]


def test_greedy_is_exact_argmax_with_ties_to_lowest_id():
    logits = np.array(
        [[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 1.0, 5.0], [-2.0, -1.0, -3.0, -1.5]], dtype=np.float32
    )
    p = SamplingParams(temperature=0.0)
    out = sample(logits, [p] * 3, [[]] * 3, [[]] * 3, [make_rng(0)] * 3)
    assert out.token_ids.dtype == np.int64
    assert out.token_ids.tolist() == [1, 0, 1]
    assert out.logprobs == [None, None, None]


def test_seeded_sampling_is_reproducible():
    row = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    p = SamplingParams(temperature=1.0)
    a = draws(row, p, 50, seed=1234)
    b = draws(row, p, 50, seed=1234)
    c = draws(row, p, 50, seed=4321)
    assert a == b
    assert a != c
    assert len(set(a)) > 10  # really sampling, not stuck on one token


def test_row_draws_do_not_depend_on_the_rest_of_the_batch():
    gen = np.random.default_rng(2)
    rows = gen.standard_normal((3, 500)).astype(np.float32)
    mine = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=7)

    alone_rng = make_rng(7)
    alone = [
        int(sample(rows[1:2], [mine], [[]], [[]], [alone_rng]).token_ids[0]) for _ in range(50)
    ]

    # Same row, now in the middle of a batch with a greedy row and another sampled row.
    others = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5, min_p=0.05)]
    batch_rngs = [make_rng(None), make_rng(7), make_rng(99)]
    params = [others[0], mine, others[1]]
    in_batch = [
        int(sample(rows, params, [[]] * 3, [[]] * 3, batch_rngs).token_ids[1]) for _ in range(50)
    ]
    assert alone == in_batch


def test_top_k_2_only_gives_the_two_most_likely_ids():
    row = logits_of([0.1, 0.4, 0.2, 0.3])
    got = Counter(draws(row, SamplingParams(temperature=1.0, top_k=2), 2000))
    assert set(got) == {1, 3}
    # Renormalised over the two: 0.4 / 0.7.
    assert got[1] / 2000 == pytest.approx(0.4 / 0.7, abs=0.04)


def test_top_k_on_a_large_vocabulary_stays_inside_the_k_largest():
    row = (np.random.default_rng(3).standard_normal(50_000) * 4).astype(np.float32)
    allowed = set(np.argsort(-row)[:5].tolist())
    got = set(draws(row, SamplingParams(temperature=1.0, top_k=5), 300))
    assert got <= allowed
    assert len(got) >= 2


@pytest.mark.parametrize("scale", [0.1, 4.0, 1000.0])  # pre-filter hits, widens, falls back
def test_top_k_ids_equals_a_full_sort(scale):
    row = (np.random.default_rng(4).standard_normal(20_000) * scale).astype(np.float32)
    for k in (1, 7, 100, 5000):
        assert top_k_ids(row, k).tolist() == sorted(np.argsort(-row)[:k].tolist())
    assert top_k_ids(row, 30_000).tolist() == list(range(20_000))


def test_top_p_keeps_the_smallest_set_reaching_p():
    row = logits_of(PROBS)
    only01 = Counter(draws(row, SamplingParams(temperature=1.0, top_p=0.8), 2000))
    assert set(only01) == {0, 1}
    assert only01[0] / 2000 == pytest.approx(0.5 / 0.8, abs=0.04)
    assert set(draws(row, SamplingParams(temperature=1.0, top_p=0.81), 2000)) == {0, 1, 2}
    assert set(draws(row, SamplingParams(temperature=1.0, top_p=0.01), 200)) == {0}
    # The far end of the CDF is the last kept token, exactly at the boundary.
    for top_p, last in ((0.8, 1), (0.81, 2), (0.5, 0), (1.0, 3)):
        params = SamplingParams(temperature=1.0, top_p=top_p)
        out = sample(row[None, :], [params], [[]], [[]], [FixedU(1 - 1e-12)])
        assert out.token_ids.tolist() == [last]


def test_top_p_when_the_tail_is_needed():
    # One dominant token (p ~ 0.98) and 19,999 tied tiny ones (each < 1e-6 of the max): a 0.99
    # nucleus needs thousands of tail tokens, taken lowest id first among ties.
    row = np.zeros(20_000, dtype=np.float32)
    row[0] = 14.0
    p = np.exp(row.astype(np.float64) - 14.0)
    p /= p.sum()
    need_tail = math.ceil((0.99 - p[0]) / p[1])
    assert 1000 < need_tail < 19_000
    params = SamplingParams(temperature=1.0, top_p=0.99)
    # u just below 1 picks the last token of the nucleus: its highest id.
    last = sample(row[None, :], [params], [[]], [[]], [FixedU(1 - 1e-12)]).token_ids[0]
    assert abs(int(last) - need_tail) <= 1
    got = draws(row, params, 300)
    assert max(got) <= need_tail + 1
    assert 0 in got and len(set(got)) > 1


def test_min_p_drops_tokens_below_fraction_of_the_max():
    row = logits_of(PROBS)
    # 0.4 * 0.5 = 0.2: drops 0.15 and 0.05.
    got = Counter(draws(row, SamplingParams(temperature=1.0, min_p=0.4), 2000))
    assert set(got) == {0, 1}
    # 0.25 * 0.5 = 0.125: keeps 0.15, drops 0.05.
    assert set(draws(row, SamplingParams(temperature=1.0, min_p=0.25), 2000)) == {0, 1, 2}
    out = sample(row[None, :], [SamplingParams(min_p=0.4)], [[]], [[]], [FixedU(1 - 1e-12)])
    assert out.token_ids.tolist() == [1]


def test_temperature_scales_the_distribution():
    row = logits_of([0.5, 0.3, 0.2])
    got = Counter(draws(row, SamplingParams(temperature=0.5), 4000))
    expected = np.array([0.25, 0.09, 0.04]) / 0.38  # p ** (1 / 0.5), renormalised
    for tok in range(3):
        assert got[tok] / 4000 == pytest.approx(expected[tok], abs=0.03)
    flat = Counter(draws(row, SamplingParams(temperature=100.0), 3000))
    for tok in range(3):
        assert flat[tok] / 3000 == pytest.approx(1 / 3, abs=0.04)


def test_temperature_limit_towards_zero_is_argmax():
    row = np.array([1.0, 1.1, 0.9, -5.0], dtype=np.float32)
    assert set(draws(row, SamplingParams(temperature=1e-3), 200)) == {1}
    # Below 1e-5 the row is greedy and does not consume its generator.
    rng = make_rng(5)
    out = sample(row[None, :], [SamplingParams(temperature=1e-7)], [[]], [[]], [rng])
    assert out.token_ids.tolist() == [1]
    assert rng.random() == make_rng(5).random()


def test_penalties_give_hand_computed_logits():
    row = np.array([2.0, -1.0, 0.5, 3.0, -2.0], dtype=np.float32)
    row.flags.writeable = False
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    out = apply_penalties(row, p, prompt_ids=[0, 1], output_ids=[1, 3, 3])
    # repetition over {0, 1, 3}: 2/2, -1*2, 3/2; then output counts {1: 1, 3: 2}:
    # id 1: -2 - (0.5*1 + 0.25) = -2.75; id 3: 1.5 - (0.5*2 + 0.25) = 0.25.
    assert out.tolist() == [1.0, -2.75, 0.5, 0.25, -2.0]
    assert row.tolist() == [2.0, -1.0, 0.5, 3.0, -2.0]

    rep_only = apply_penalties(row, SamplingParams(repetition_penalty=1.25), [4], [4, 4])
    assert rep_only.tolist() == [2.0, -1.0, 0.5, 3.0, -2.5]  # once per token, not per repeat
    freq_only = apply_penalties(row, SamplingParams(frequency_penalty=1.0), [0, 1, 2], [2, 2])
    assert freq_only.tolist() == [2.0, -1.0, -1.5, 3.0, -2.0]  # prompt tokens not counted
    assert apply_penalties(row, SamplingParams(), [0], [1]) is row
    with pytest.raises(ValueError):
        apply_penalties(row, SamplingParams(presence_penalty=1.0), [], [5])


def test_repetition_penalty_covers_the_last_repeat_last_n_tokens():
    row = np.array([2.0, -1.0, 3.0, 0.5, 1.0, -2.0], dtype=np.float32)
    prompt, output = [0] + [5] * 70, [2]  # token 0 is 71 tokens back
    window = apply_penalties(row, SamplingParams(repetition_penalty=2.0), prompt, output)
    whole = apply_penalties(row, SamplingParams(repetition_penalty=2.0, repeat_last_n=-1),
                            prompt, output)
    # the default window of 64: {5, 2} (2.0 -> 1.5, -2 -> -4); the whole history adds 0
    assert window.tolist() == [2.0, -1.0, 1.5, 0.5, 1.0, -4.0]
    assert whole.tolist() == [1.0, -1.0, 1.5, 0.5, 1.0, -4.0]
    off = SamplingParams(repetition_penalty=2.0, repeat_last_n=0)
    assert apply_penalties(row, off, prompt, output) is row
    assert penalty_window([0, 1, 2, 3], [4], 3).tolist() == [2, 3, 4]
    assert penalty_window([0], [1] * 70 + [3], 2).tolist() == [1, 3]
    assert penalty_window([0, 1], [2], 64).tolist() == [0, 1, 2]
    assert penalty_window([0, 1], [2], -1).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="repeat_last_n must be -1"):
        SamplingParams(repeat_last_n=-2)


def test_sample_uses_penalised_logits():
    logits = np.array([[3.0, 2.0, 0.0]], dtype=np.float32)
    p = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    out = sample(logits, [p], [[]], [[0]], [make_rng(0)])
    assert out.token_ids.tolist() == [1]  # 3 / 2 = 1.5 < 2.0


@pytest.mark.parametrize("penalty", [5e-324, 1e-300, 1e300])
def test_an_extreme_repetition_penalty_keeps_logits_finite(penalty):
    """Found by the API fuzzer: `repetition_penalty: 5e-324` overflowed a seen token's
    logit to inf, the sampler raised and the engine stopped for every request."""
    big = float(np.finfo(np.float32).max)
    logits = np.array([[3.0, -2.0, 1.0, 0.5]], dtype=np.float32)
    p = SamplingParams(temperature=1.0, repetition_penalty=penalty, seed=0)
    row = apply_penalties(logits[0], p, [0, 1], [])
    expected = [big, -0.0, 1.0, 0.5] if penalty < 1 else [0.0, -big, 1.0, 0.5]
    assert row.tolist() == expected
    out = sample(logits, [p], [[0, 1]], [[]], [make_rng(0)])
    assert out.token_ids.tolist() == ([0] if penalty < 1 else [2])  # the mass is on it


def _log_softmax(xs: list[float]) -> list[float]:
    lse = math.log(sum(math.exp(x) for x in xs))
    return [x - lse for x in xs]


def test_logprobs_are_raw_log_softmax_with_sorted_top_list():
    xs = [1.0, 2.0, 0.5, 3.0]
    lp = _log_softmax(xs)
    logits = np.array([xs, xs, xs], dtype=np.float32)
    params = [
        SamplingParams(temperature=0.0, logprobs=2),
        # Temperature and top-k do not change the reported (raw) logprobs.
        SamplingParams(temperature=0.3, top_k=1, logprobs=4),
        SamplingParams(temperature=0.0),
    ]
    out = sample(logits, params, [[]] * 3, [[]] * 3, [make_rng(0) for _ in range(3)])
    assert out.token_ids.tolist() == [3, 3, 3]
    chosen, top = out.logprobs[0]
    assert chosen == pytest.approx(lp[3], abs=1e-6)
    assert [t for t, _ in top] == [3, 1]
    assert [v for _, v in top] == pytest.approx([lp[3], lp[1]], abs=1e-6)
    chosen, top = out.logprobs[1]
    assert chosen == pytest.approx(lp[3], abs=1e-6)
    assert [t for t, _ in top] == [3, 1, 0, 2]
    assert [v for _, v in top] == pytest.approx([lp[3], lp[1], lp[0], lp[2]], abs=1e-6)
    assert out.logprobs[2] is None


def test_logprobs_after_penalties_and_k_zero():
    xs = [3.0, 2.0, 0.0]
    logits = np.array([xs], dtype=np.float32)
    p = SamplingParams(temperature=0.0, presence_penalty=1.5, logprobs=0)
    out = sample(logits, [p], [[]], [[0]], [make_rng(0)])
    lp = _log_softmax([1.5, 2.0, 0.0])
    assert out.token_ids.tolist() == [1]
    chosen, top = out.logprobs[0]
    assert chosen == pytest.approx(lp[1], abs=1e-6)
    assert top == []


def test_read_only_input_is_never_modified():
    logits = np.random.default_rng(6).standard_normal((4, 3000)).astype(np.float32)
    before = logits.copy()
    logits.flags.writeable = False
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(
            temperature=0.7,
            top_k=20,
            top_p=0.9,
            min_p=0.05,
            logprobs=3,
            repetition_penalty=1.3,
            presence_penalty=0.5,
            frequency_penalty=0.5,
        ),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0, repetition_penalty=1.1, logprobs=1),
    ]
    prompts = [[1, 2, 3]] * 4
    outputs = [[4, 4, 5]] * 4
    for _ in range(5):
        sample(logits, params, prompts, outputs, [make_rng(i) for i in range(4)])
    assert np.array_equal(logits, before)


def test_mixed_batch_greedy_rows_are_exact():
    logits = np.random.default_rng(7).standard_normal((5, 2000)).astype(np.float32)
    params = [SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0) for i in range(5)]
    out = sample(logits, params, [[]] * 5, [[]] * 5, [make_rng(i) for i in range(5)])
    assert out.token_ids[[0, 2, 4]].tolist() == np.argmax(logits[[0, 2, 4]], axis=1).tolist()


def test_draw_never_picks_zero_weight_and_chunked_search_matches_cumsum():
    w = np.array([0.0, 1.0, 0.0, 3.0, 0.0])
    assert draw(w, 0.0) == 1
    assert draw(w, 0.25) == 3
    assert draw(w, 1.0 - 1e-16) == 3
    big = np.random.default_rng(8).random(50_000).astype(np.float32)
    big[::7] = 0.0
    cum = np.cumsum(big, dtype=np.float64)
    for u in np.random.default_rng(9).random(200):
        j = draw(big, float(u))
        assert big[j] > 0
        assert abs(j - int(np.searchsorted(cum, u * cum[-1], side="right"))) <= 1


def test_shape_errors():
    logits = np.zeros((2, 4), dtype=np.float32)
    p = SamplingParams()
    with pytest.raises(ValueError):
        sample(logits, [p], [[]], [[]], [make_rng(0)])
    with pytest.raises(ValueError):
        sample(logits[0], [p], [[]], [[]], [make_rng(0)])
    bad = np.full((1, 4), -np.inf, dtype=np.float32)
    with pytest.raises(ValueError):
        sample(bad, [p], [[]], [[]], [make_rng(0)])


def test_logit_bias_in_an_all_greedy_batch_stays_in_its_own_row():
    # Two greedy rows with the same logits: only row 0 has a bias. The all-greedy fast
    # path must not skip the bias, nor apply it to row 1.
    logits = np.array([[3.0, 1.0, 0.0, 2.0]] * 3, dtype=np.float32)
    biased = SamplingParams(temperature=0.0, logit_bias={2: 100.0})
    banned = SamplingParams(temperature=0.0, logit_bias={0: -100.0})
    plain = SamplingParams(temperature=0.0)
    out = sample(logits, [biased, plain, banned], [[]] * 3, [[]] * 3, [make_rng(0)] * 3)
    assert out.token_ids.tolist() == [2, 0, 3]
    assert logits[0].tolist() == [3.0, 1.0, 0.0, 2.0]  # the input is untouched


def test_logit_bias_is_added_before_penalties_and_in_sampled_rows():
    row = np.array([2.0, 1.0, -1.0, 0.5], dtype=np.float32)
    p = SamplingParams(temperature=1.0, logit_bias={1: 2.0, 2: -0.5}, repetition_penalty=2.0)
    # bias: [2, 3, -1.5, 0.5]; repetition over the prompt's token 1 and 2: 3/2, -1.5*2
    assert apply_penalties(row, p, [1, 2], []).tolist() == [2.0, 1.5, -3.0, 0.5]
    forced = SamplingParams(temperature=1.0, logit_bias={3: 100.0})
    assert set(draws(row, forced, 50)) == {3}


def test_logit_bias_checks_ids_and_range():
    with pytest.raises(ValueError, match="out of range for a vocabulary of 4"):
        sample(np.zeros((1, 4), dtype=np.float32),
               [SamplingParams(temperature=0.0, logit_bias={4: 1.0})], [[]], [[]], [make_rng(0)])
    with pytest.raises(ValueError, match=r"logit_bias for token 3 must be in \[-100, 100\]"):
        SamplingParams(logit_bias={3: 100.5})
    with pytest.raises(ValueError, match="logit_bias token id -1 must be >= 0"):
        SamplingParams(logit_bias={-1: 1.0})
