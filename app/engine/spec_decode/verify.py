"""Verification of a sampled draft token: speculative rejection sampling.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding") and
Chen et al. 2023: a draft token x drawn from the draft's distribution q is accepted with
probability min(1, p(x) / q(x)); otherwise the token is drawn from the normalised positive
part of p - q. The token that results is distributed exactly as p, the target's
distribution (the request's full sampler: penalties, temperature, top-k/p, min-p).
Deterministic drafts (n-gram, prediction, greedy draft model) need none of this: their
verification samples p and compares (`app.engine.engine`).
"""

from __future__ import annotations

import numpy as np

from app.engine.sampler import draw


def rejection_sample(p: np.ndarray, q: np.ndarray, draft: int, u_accept: float,
                     u_resample: float) -> tuple[int, bool]:
    """(token, accepted) for a draft token `draft` drawn from `q`.

    Args:
        p, q: target and draft distributions ``[V]`` (sum to 1; q[draft] > 0).
        u_accept, u_resample: uniform draws in [0, 1), one for the acceptance test and one
            for the resample (used only on rejection).
    Raises ValueError if q gives the draft token no probability.
    """
    qx = float(q[draft])
    if qx <= 0.0:
        raise ValueError("the draft token has zero probability under q")
    if u_accept * qx < float(p[draft]):  # u < p/q without dividing
        return draft, True
    residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0.0:  # p == q up to rounding: any rejection is rounding; keep p
        residual = p
    return draw(residual, u_resample), False
