"""How many draft tokens each sequence gets this step, from what the machine measures.

The step-time curve t(n) (seconds for a target step computing n tokens, measured at
start-up) says what an extra verified position costs; a running acceptance estimate per
sequence and draft position says what it is expected to return. The controller picks the
total number of draft tokens D that maximises expected tokens per second,

    (decoding sequences + sum of the D largest marginal gains)
        / (t(decodes) + t(n_base + D) - t(n_base)),

where t(decodes) is the step of the decoding sequences alone and n_base the step's tokens
without drafts (prompt chunks included): the drafts are charged what they add to the step,
and measured against plain decoding. A prompt chunk in the step must be computed anyway;
counted in the base rate, it made drafts look cheap beside it (t(n_base) is large), while
on a compute-bound machine each draft row costs what a decode row does anywhere (README,
"Many users: drafts charged what they add"). The marginal gain of a sequence's j-th draft
token is the probability that drafts 1..j are all accepted (the product of its
per-position acceptance estimates), so each sequence's gains fall with j and taking the D
largest hands out tokens one at a time to the sequence with the most to gain. Evaluating
every D (not stopping at the first D that does not pay) keeps a curve with flat stretches
from hiding a longer draft that pays. D = 0 wins whenever the step is compute-bound: then
every sequence gets k = 0 and the step is the plain decode step.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Mapping, Sequence


class StepTimeCurve:
    """t(n) in seconds, linear between measured points, made non-decreasing, extrapolated
    past the last point with the steeper of the last segment's slope and the mean slope
    over the upper half of the measured range (t(last/2) to t(last)): one noisy last
    segment (a profile's t(10) to t(12)) must not make the long steps of many sequences
    look cheap, which would hand them drafts that cannot pay; a flat curve stays flat.

    Args:
        points: {tokens in the step: seconds}; at least one point with n >= 1.
    Raises ValueError for an empty or non-positive curve.
    """

    def __init__(self, points: Mapping[int, float]):
        items = sorted((int(n), float(t)) for n, t in points.items() if n >= 1)
        if not items or any(t <= 0 for _, t in items):
            raise ValueError("a step-time curve needs positive times")
        self.ns = [n for n, _ in items]
        self.ts = []
        for _, t in items:
            self.ts.append(max(t, self.ts[-1]) if self.ts else t)

    def __call__(self, n: int) -> float:
        ns, ts = self.ns, self.ts
        if n <= ns[0]:
            return ts[0] * n / ns[0] if n < ns[0] else ts[0]
        i = bisect_left(ns, n)
        if i == len(ns):
            if len(ns) == 1:
                return ts[0] * n / ns[0]
            half = max(ns[0], ns[-1] // 2)
            slope = (ts[-1] - self(half)) / (ns[-1] - half) if half < ns[-1] else 0.0
            slope = max(slope, (ts[-1] - ts[-2]) / (ns[-1] - ns[-2]))
            return ts[-1] + slope * (n - ns[-1])
        if ns[i] == n:
            return ts[i]
        f = (n - ns[i - 1]) / (ns[i] - ns[i - 1])
        return ts[i - 1] + f * (ts[i] - ts[i - 1])

    def ratios(self) -> dict[int, float]:
        """t(n) / t(1) at the measured points."""
        t1 = self(1)
        return {n: round(t / t1, 3) for n, t in zip(self.ns, self.ts, strict=True)}


class AcceptanceEstimate:
    """Running estimate of P(draft position j accepted | positions before it accepted).

    Counts decay by `decay` per observation of a position, so the estimate follows a
    sequence whose text turns from copying to free writing; positions not yet observed
    fall back to `prior` (the proposer's estimate over all sequences) with weight
    `prior_weight`.
    """

    def __init__(self, max_k: int, prior: Sequence[float] | float = 0.4,
                 prior_weight: float = 1.0, decay: float = 0.9):
        self.max_k = max_k
        self.decay, self.prior_weight = decay, prior_weight
        self.prior = ([float(prior)] * max_k if isinstance(prior, float | int)
                      else list(prior)[:max_k])
        self.accepted = [0.0] * max_k
        self.reached = [0.0] * max_k
        self._ceiling: float | None = None

    def rates(self) -> list[float]:
        w = self.prior_weight
        return [(a + p * w) / (r + w)
                for a, r, p in zip(self.accepted, self.reached, self.prior, strict=True)]

    def ceiling(self) -> float:
        """The highest rate, at any position, this estimate can give before its next
        `observe`: `forget` moves each rate towards its prior and never past it, so that is
        max(rate, prior) over positions."""
        if self._ceiling is None:
            self._ceiling = max(max(self.rates(), default=0.0), max(self.prior, default=0.0))
        return self._ceiling

    def forget(self, factor: float) -> None:
        """Scale the counts by `factor`: the estimate drifts back towards the prior."""
        self.accepted = [a * factor for a in self.accepted]
        self.reached = [r * factor for r in self.reached]

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """One verification: positions 1..num_accepted accepted, position num_accepted+1
        (if drafted) rejected, later ones never reached."""
        for j in range(min(num_drafted, num_accepted + 1, self.max_k)):
            self.accepted[j] = self.accepted[j] * self.decay + (j < num_accepted)
            self.reached[j] = self.reached[j] * self.decay + 1.0
        self._ceiling = None


def step_seconds(curve: StepTimeCurve, counts: Sequence[int], equal_split: bool,
                 slots: Sequence[int] | None = None) -> float:
    """Predicted time of a step computing `counts[i]` tokens for the sequence in slot
    `slots[i]` (default: slots 0, 1, 2, ...).

    Without `equal_split`: t(total). With it, llama.cpp's `split_equal(sequential)` is
    emulated: each micro-batch starts at the lowest slot with tokens left, takes the run of
    consecutive slots after it that still have tokens, and computes the same number of
    tokens (the run's smallest remainder) for each; the step costs t() of every micro-batch.
    """
    if not equal_split:
        return curve(max(sum(counts), 0)) if any(c > 0 for c in counts) else 0.0
    slots = range(len(counts)) if slots is None else slots
    left = {s: c for s, c in zip(slots, counts, strict=True) if c > 0}
    total = 0.0
    while left:
        order = sorted(left)
        run = [order[0]]
        for slot in order[1:]:
            if slot != run[-1] + 1:
                break
            run.append(slot)
        n = min(left[slot] for slot in run)
        total += curve(len(run) * n)
        for slot in run:
            left[slot] -= n
            if not left[slot]:
                del left[slot]
    return total


# Drafts are given only when they are predicted to raise tokens per second by more than this
# fraction: the estimates behind the prediction are noisier than a few percent.
DRAFT_MARGIN = 0.05

# The acceptance `drafts_can_pay` assumes for every draft token: above what any real
# proposer sustains over a step's worth of drafts, so the bound skips only what cannot pay.
BEST_ACCEPTANCE = 0.95


def drafts_can_pay(curve: StepTimeCurve, total: int, num_decoding: int, max_drafts: int,
                   best_rate: float = BEST_ACCEPTANCE, plain: float | None = None) -> bool:
    """Whether any number of draft tokens D <= `max_drafts` could raise tokens per second
    for a step of `total` tokens, `num_decoding` of them decodes, were each draft gaining
    `best_rate` tokens, with drafts charged t(total + D) - t(total) against the decodes
    alone (`plain` seconds: `allocate_drafts`'s baseline, by default t(num_decoding)): an
    upper bound, so False means k = 0 for everyone without looking at the drafts."""
    plain, t_base = _plain_and_base(curve, total, num_decoding, plain)
    base = num_decoding / plain
    return any((num_decoding + d * best_rate) / (plain + curve(total + d) - t_base) > base
               for d in range(1, max_drafts + 1))


def _plain_and_base(curve: StepTimeCurve, total: int, num_decoding: int,
                    plain: float | None) -> tuple[float, float]:
    """(t(decodes), t(n_base)) of a step of `total` tokens, `num_decoding` of them decodes;
    `plain`, when given, is t(decodes)."""
    t_base = curve(max(total, 1))
    if plain is None:
        plain = curve(num_decoding) if num_decoding else t_base
    return plain, t_base


def drafts_may_pay(curve: StepTimeCurve, total: int, num_decoding: int,
                   ceilings: Sequence[float], max_k: int, max_drafts: int,
                   plain: float | None = None) -> bool:
    """Whether drafts could raise tokens per second for a step of `total` tokens with
    `num_decoding` decoding sequences (`plain`: as `drafts_can_pay`), where the candidates'
    conditional acceptance rates are at most `ceilings` (one per candidate,
    `AcceptanceEstimate.ceiling`). Candidate i's j-th draft token (j <= `max_k`) gains at
    most ceiling_i ** j, the product of j rates each at most ceiling_i, so
    `allocate_drafts`'s D largest gains are at most the D largest of those (D <=
    `max_drafts`): False means it would give every candidate k = 0."""
    gains = sorted((c ** j for c in ceilings if c > 0 for j in range(1, max_k + 1)),
                   reverse=True)[:max(max_drafts, 0)]
    plain, t_base = _plain_and_base(curve, total, num_decoding, plain)
    base = num_decoding / plain
    expected = float(num_decoding)
    for d, gain in enumerate(gains, 1):
        expected += gain
        if expected / (plain + curve(total + d) - t_base) > base:
            return True
    return False


def allocate_drafts(curve: StepTimeCurve, base_counts: Sequence[int], num_decoding: int,
                    rates: Sequence[Sequence[float]], caps: Sequence[int],
                    owners: Sequence[int] | None = None, equal_split: bool = False,
                    draft_curve: StepTimeCurve | None = None,
                    is_draft: Sequence[bool] | None = None,
                    slots: Sequence[int] | None = None,
                    margin: float = DRAFT_MARGIN,
                    decodes: Sequence[bool] | None = None) -> list[int]:
    """Draft tokens per candidate sequence.

    Args:
        curve: the target's step-time curve.
        base_counts: tokens each sequence in the step computes without drafts (1 for a
            decode, the chunk for a prefill).
        num_decoding: sequences that emit a token this step (expected tokens without drafts).
        rates: per candidate, conditional acceptance estimates by draft position.
        caps: per candidate, the most draft tokens it may get (what its proposer offered).
        owners: per candidate, its index in `base_counts` (default: candidate i is
            sequence i).
        equal_split: the runner's `capabilities.equal_split` (see `step_seconds`).
        slots: the slot of each sequence in `base_counts` (for `equal_split`).
        margin: drafts must beat no drafts by this fraction of tokens per second.
        decodes: which `base_counts` entries are decodes, the baseline's step (default:
            the 1-token entries).
        draft_curve, is_draft: a draft model's step-time curve, and which candidates it
            drafts for: their j-th tokens cost one draft step over every sequence drafting
            at least j tokens, sum_j t_draft(m_j), on top of the target's step.
    Returns k per candidate (same order), maximising expected tokens per second.
    """
    counts = list(base_counts)
    owners = list(range(len(caps))) if owners is None else list(owners)
    heap: list[tuple[float, int, int]] = []  # (-gain, candidate, j)
    for i, (r, cap) in enumerate(zip(rates, caps, strict=True)):
        if cap > 0 and r:
            heapq.heappush(heap, (-r[0], i, 0))
    ks = [0] * len(caps)
    base_s = step_seconds(curve, counts, equal_split, slots)
    # the decodes alone: the rate drafts must beat (a step without any: the whole step)
    if decodes is None:
        decodes = [c == 1 for c in counts]
    plain_s = step_seconds(curve, [c if d else 0 for c, d in zip(counts, decodes, strict=True)],
                           equal_split, slots) or base_s
    base_rate = num_decoding / max(plain_s, 1e-12)
    best_rate = base_rate * (1 + margin)
    best_d, taken = 0, []
    gain_sum, d = 0.0, 0
    depth: list[int] = []  # sequences the draft model drafts for at each depth
    draft_s = 0.0
    while heap:
        neg, i, j = heapq.heappop(heap)
        gain = -neg
        taken.append(i)
        d += 1
        gain_sum += gain
        counts[owners[i]] += 1
        if draft_curve is not None and is_draft is not None and is_draft[i]:
            if j == len(depth):
                depth.append(0)
            m = depth[j]
            draft_s += draft_curve(m + 1) - (draft_curve(m) if m else 0.0)
            depth[j] = m + 1
        rate = (num_decoding + gain_sum) / (
            plain_s + step_seconds(curve, counts, equal_split, slots) - base_s + draft_s)
        if rate > best_rate:
            best_rate, best_d = rate, d
        if j + 1 < min(caps[i], len(rates[i])):
            heapq.heappush(heap, (-(gain * rates[i][j + 1]), i, j + 1))
    for i in taken[:best_d]:
        ks[i] += 1
    return ks
