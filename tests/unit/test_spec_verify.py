"""Rejection sampling gives exactly the target's distribution (chi-square, fixed seed)."""

import numpy as np
import pytest

from app.engine.sampler import distribution, draw, make_rng, sample
from app.engine.spec_decode.verify import rejection_sample
from app.engine.types import SamplingParams

N = 40_000
# chi-square critical value at p = 0.001 for df = 5 (a 6-token vocabulary)
CHI2_CRIT = {5: 20.515, 4: 18.467, 3: 16.266, 2: 13.816}


def chi_square(counts, p):
    keep = p > 0
    expected = p[keep] * counts.sum()
    assert counts[~keep].sum() == 0  # nothing outside p's support
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def speculative_draws(p, q, rng):
    counts = np.zeros(len(p), dtype=np.int64)
    accepted = 0
    for _ in range(N):
        x = draw(q, rng.random())
        token, ok = rejection_sample(p, q, x, rng.random(), rng.random())
        counts[token] += 1
        accepted += ok
    return counts, accepted / N


def test_output_follows_p_not_q():
    rng = make_rng(2024)
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = np.array([0.1, 0.3, 0.1, 0.2, 0.2, 0.1])
    counts, acceptance = speculative_draws(p, q, rng)
    stat, df = chi_square(counts, p)
    assert stat < CHI2_CRIT[df]
    # acceptance is sum(min(p, q)) (Leviathan et al., theorem 3.5)
    assert acceptance == pytest.approx(np.minimum(p, q).sum(), abs=0.01)
    # the test can tell: the same counts are nowhere near q
    assert chi_square(counts, np.where(p > 0, q, 0) / q[p > 0].sum())[0] > 100 * CHI2_CRIT[df]


def test_with_top_p_and_penalties_the_target_is_the_full_sampler():
    logits = np.array([2.0, 1.5, 1.0, 0.5, 0.2, -1.0], dtype=np.float32)
    params = SamplingParams(temperature=0.8, top_p=0.8, repetition_penalty=1.3,
                            presence_penalty=0.2)
    prompt, output = [1, 4], [1, 2]
    p = distribution(logits, params, prompt, output)
    assert p[5] == 0.0 and p.sum() == pytest.approx(1.0)  # top-p cut the tail
    # the plain sampler draws from exactly this p
    rng = make_rng(7)
    plain = np.bincount([int(sample(logits[None], [params], [prompt], [output],
                                    [rng]).token_ids[0]) for _ in range(8000)], minlength=6)
    stat, df = chi_square(plain, p)
    assert stat < CHI2_CRIT[df]
    # a draft from another distribution, verified by rejection sampling, gives p too
    q = np.full(6, 1 / 6)
    counts, _ = speculative_draws(p, q, make_rng(99))
    stat, df = chi_square(counts, p)
    assert stat < CHI2_CRIT[df]


def test_zero_probability_draft_is_refused():
    with pytest.raises(ValueError, match="zero probability"):
        rejection_sample(np.array([1.0, 0.0]), np.array([1.0, 0.0]), 1, 0.5, 0.5)
