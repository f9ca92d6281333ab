"""The speculator: before each step, proposes drafts for decoding sequences and lets the
controller size them; after verification, learns from what was accepted.

Modes (`SpecConfig.mode`): "auto" and "ngram" (prediction drafts where a request brings a
prediction, otherwise the longer match of n-gram prompt lookup and the suffix index of
earlier requests' outputs; the controller sizes every draft), "fixed:K"
(K tokens whenever a proposer has them: the baseline the benchmark sweeps). A suffix draft's
acceptance estimate is capped, per position, by the index's confidence in that token.

A constrained request's drafts start with the tokens its grammar forces (`forced`), in
every mode unless `SpecConfig.forced_drafts` is off; the other proposers' drafts continue
after them (a prediction that agrees with them, else n-gram lookup past them), and the
engine cuts them at the first token the grammar forbids. The controller rates forced
positions by their own estimate (prior `FORCED_PRIOR`), so they are drafted where n-gram
drafts would not pay.

A sequence whose drafts the controller declines still learns what they would have done:
the declined drafts are kept as a shadow and scored against the tokens the sequence then
emits, one observation per shadow, as a verification would have scored them (`_shadow`).
Where the acceptance bound ("no_gain") skips the controller, the proposers still run for
each sequence without an open shadow, to make one. Without shadows, a kind of draft whose
prior is too low to pay on a steep curve is never tried, so never found to pay (a
whole-file prediction accepted at 97% sat at its 90% prior).

Every decode step of a sequence that verifies no draft is counted under one reason
(`NO_DRAFT_REASONS`, `SpecStats.no_draft`, the request's `metrics.no_draft`), and the
server's log says, at info level, each time the reason of a step without drafts changes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from app.engine.config import SpecConfig
from app.engine.request import Request
from app.engine.spec_decode.controller import (
    BEST_ACCEPTANCE,
    AcceptanceEstimate,
    StepTimeCurve,
    allocate_drafts,
    drafts_can_pay,
    drafts_may_pay,
    step_seconds,
)
from app.engine.spec_decode.draft_model import PENDING, DraftModelProposer
from app.engine.spec_decode.forced import FORCED, ForcedProposer
from app.engine.spec_decode.proposer import (
    NgramProposer,
    PredictionProposer,
    Proposer,
    SuffixProposer,
)
from app.engine.spec_decode.step_times import OnlineStepTimes
from app.engine.spec_decode.suffix import SuffixIndex

log = logging.getLogger("tandem.spec")

# First acceptance estimates of a kind of draft: enough for drafts to be tried where the
# step-time curve is flat, not on a steep one until there is evidence; a prediction is tried
# on a steep curve too.
PRIOR = 0.6
PREDICTION_PRIOR = 0.9
# Forced tokens are rejected only where the model picks another tokenization of the same
# bytes, which the mask may allow: rare.
FORCED_PRIOR = 0.98

# Why a decoding sequence verified no draft in a step, and what the log says about it.
NO_DRAFT_REASONS = {
    "step_cost": "a longer step costs more than drafts accepted at 95% would return "
                 "(the step-time curve is steep for this batch)",
    "no_gain": "drafts were there, but at their estimated acceptance they would not pay",
    "no_proposal": "no draft source had tokens (no n-gram match in the request or in "
                   "earlier outputs, no prediction)",
    "prediction_exhausted": "the request's prediction is used up",
    "prediction_lost": "the reply left the request's prediction and no n-gram of it "
                       "finds its place again",
    "at_limit": "the next token is the last the request's max_tokens or the context allows",
    "opted_out": "the request set speculative: false",
    "grammar": "the grammar forbids the first draft token",
}
REASONS = tuple(NO_DRAFT_REASONS)


class SpecStats:
    """Cumulative counters (for /metrics). accepted = length of each accepted prefix."""

    def __init__(self, max_k: int):
        self.drafts = 0  # verifications with at least one draft token
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_by_position = [0] * max_k  # accepted at draft position j+1
        self.forced_draft_tokens = 0  # of draft_tokens, forced by a grammar
        self.forced_accepted_tokens = 0  # of those, accepted
        # chosen_k[k]: times a sequence with a proposal got k drafts. A list of fixed size,
        # so `snapshot` (called from other threads) copies it in one step.
        self.chosen_k = [0] * (max_k + 1)
        # no_draft[i]: decode steps of a sequence that verified no draft, for REASONS[i]
        self.no_draft = [0] * len(REASONS)
        # the suffix index's size: suffix_tokens, suffix_max_tokens, suffix_outputs,
        # suffix_evicted (replaced whole after each change, so a reader sees one state)
        self.suffix_index: dict[str, int] = {}

    def snapshot(self) -> dict[str, object]:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_by_position": list(self.accepted_by_position),
            "forced_draft_tokens": self.forced_draft_tokens,
            "forced_accepted_tokens": self.forced_accepted_tokens,
            "chosen_k": {k: n for k, n in enumerate(list(self.chosen_k)) if n},
            "no_draft": dict(zip(REASONS, list(self.no_draft), strict=True)),
            **self.suffix_index,
        }


class Speculator:
    """Args:
    config: mode and draft cap.
    curve: the target's measured step-time curve (needed unless the mode is fixed, or
        `online` is given).
    context_length: the engine's per-sequence limit; drafts never pass it.
    equal_split: the target runner's `capabilities.equal_split` (how a step's cost grows
        with sequences of different lengths).
    draft, draft_curve: a draft model proposer and its step-time curve (mode "draft" needs
        them; "auto" uses them where prediction and n-gram lookup have nothing).
    online: the curve refined from the engine's steps (`observe_step`), per batch-size
        bucket; used instead of `curve` when given.
    Raises ValueError for mode "off" (build no speculator then), a missing curve, or mode
    "draft" without a draft model.
    """

    def __init__(self, config: SpecConfig, curve: StepTimeCurve | None, context_length: int,
                 equal_split: bool = False, draft: DraftModelProposer | None = None,
                 draft_curve: StepTimeCurve | None = None,
                 online: OnlineStepTimes | None = None):
        if config.mode == "off":
            raise ValueError("speculation is off: build no Speculator")
        if online is not None and curve is None:
            curve = online.curve(1)
        if config.fixed_k is None and curve is None:
            raise ValueError("the adaptive controller needs a step-time curve")
        if config.mode == "draft" and draft is None:
            raise ValueError("--spec draft needs a draft model (--draft-model)")
        if draft is not None and config.fixed_k is None and draft_curve is None:
            raise ValueError("the adaptive controller needs the draft model's step-time curve")
        self.config = config
        self.curve = curve
        self.online = online
        self._online_version = online.version if online is not None else 0
        self.context_length = context_length
        self.equal_split = equal_split
        self.max_k = config.num_draft_tokens
        self.prediction = PredictionProposer()
        self.suffix = (SuffixProposer(SuffixIndex(config.suffix_tokens))
                       if config.suffix_tokens and config.mode != "draft" else None)
        self.proposers: list[Proposer] = (
            [] if config.mode == "draft" else [self.prediction, NgramProposer()])
        if self.suffix is not None:
            self.proposers.append(self.suffix)
        self.forced = ForcedProposer() if config.forced_drafts else None
        self.ngram = next((p for p in self.proposers if isinstance(p, NgramProposer)), None)
        self.draft = draft
        self.draft_curve = draft_curve
        # acceptance over all sequences, per kind of draft: the prior of a new sequence. It
        # starts at PRIOR (a prediction: PREDICTION_PRIOR, since an editor's prediction is
        # mostly the reply) and learns from every verification.
        self.global_estimates: dict[str, AcceptanceEstimate] = {}
        self.stats = SpecStats(self.max_k)
        self._suffix_size()
        # (step tokens, decoding) -> the shape bound; (that, ceilings) -> the acceptance bound
        self._can_pay: dict[tuple, bool] = {}
        # highest acceptance a new kind of draft starts from, without / with a prediction;
        # None: recompute (a global estimate was created or observed)
        self._global_ceilings: tuple[float, float] | None = None
        self._logged_reason: str | None = None  # the last no-draft reason logged

    def _cap(self, r: Request) -> int:
        cap = min(self.max_k, self.context_length - r.num_tokens - 1)
        if r.params.max_tokens is not None:
            cap = min(cap, r.params.max_tokens - r.num_output_tokens - 1)
        return cap

    def propose(self, running: Iterable[Request], waiting: Iterable[Request],
                budget: int) -> None:
        """Set `spec_token_ids` on the running requests that will decode this step; count
        each decoding request that gets none under its reason (`no_draft`)."""
        num_decoding = 0
        counts: list[int] = []  # tokens per sequence in the step, without drafts
        slots: list[int] = []
        decodes: list[bool] = []  # per entry of `counts`: a decode (else a prompt chunk)
        owners: list[int] = []
        candidates: list[tuple[Request, str, list[int]]] = []
        running, waiting = list(running), list(waiting)
        forced: dict[Request, list[int]] = {}
        reasons: dict[Request, str] = {}  # decoding requests without drafts: why
        eligible: list[Request] = []  # decoding requests that may draft
        for r in running:
            r.spec_token_ids = []
            r.spec_state.pop("forced", None)
            if r.num_tokens - r.num_computed_tokens != 1:
                continue  # a prefill
            if not r.params.speculative:
                reasons[r] = "opted_out"
            elif self._cap(r) <= 0:
                reasons[r] = "at_limit"
            else:
                eligible.append(r)
                if self.forced is not None and r.matcher is not None:
                    tokens = self.forced.propose(r, self._cap(r))
                    if tokens:
                        forced[r] = tokens
        for r in eligible:
            self._score_shadow(r)
        curve = self._step_curve(len(running) + len(waiting))
        if self.config.fixed_k is None and eligible:
            why = self._may_pay(curve, running, waiting, budget, forced)
            if why is not None:
                for r in eligible:
                    reasons[r] = why
                    # what the proposers would draft, as a shadow: without it an estimate
                    # below what pays would never be tested (proposing is a few dict lookups)
                    if why == "no_gain" and r not in forced and "shadow" not in r.spec_state:
                        proposal = self._propose(r, self._cap(r))
                        if proposal is not None:
                            self._shadow(r, *proposal)
                self._count(reasons, drafted=False)
                return
        left = budget
        for r in running:
            todo = min(r.num_tokens - r.num_computed_tokens, left)
            left -= todo
            counts.append(todo)
            slots.append(r.slot)
            decodes.append(todo == 1 and r.num_tokens - r.num_computed_tokens == 1)
            if not decodes[-1]:
                continue  # a prefill chunk
            num_decoding += 1
            if r in reasons:
                continue
            cap = self._cap(r)
            if r in forced:
                kind, tail = self._after_forced(r, forced[r], cap)
                candidates.append((r, kind, forced[r] + tail, len(forced[r])))
                owners.append(len(counts) - 1)
                continue
            proposal = self._propose(r, cap)
            if proposal is not None:
                candidates.append((r, *proposal, 0))
                owners.append(len(counts) - 1)
            else:
                if self.draft is not None:  # its tokens are computed once k is known
                    candidates.append((r, "draft", [PENDING] * cap, 0))
                    owners.append(len(counts) - 1)
                else:
                    reasons[r] = _why_no_proposal(r)
        taken = set(slots)
        free = (s for s in range(1 << 16) if s not in taken)
        for r in waiting:  # admissions take the lowest free slots and the budget left
            if left <= 0:
                break
            todo = min(r.num_tokens - r.num_computed_tokens, left)
            left -= todo
            counts.append(todo)
            slots.append(next(free))
            decodes.append(False)
        if not candidates:
            self._count(reasons, drafted=False)
            return
        if self.config.fixed_k is not None:
            ks = [min(self.config.fixed_k, len(d)) for _, _, d, _ in candidates]
        else:
            rates = [self._rates(r, name, n_forced, len(d))
                     for r, name, d, n_forced in candidates]
            ks = allocate_drafts(curve, counts, num_decoding, rates,
                                 [len(d) for _, _, d, _ in candidates], owners,
                                 self.equal_split, self.draft_curve,
                                 [kind == "draft" for _, kind, _, _ in candidates], slots,
                                 decodes=decodes)
        for (r, kind, drafts, n_forced), k in zip(candidates, ks, strict=True):
            self.stats.chosen_k[k] += 1
            if k:
                r.spec_token_ids = drafts[:k]
                r.spec_state["source"] = kind
                r.spec_state.pop("shadow", None)  # the verification will tell
                if n_forced:
                    r.spec_state["forced"] = min(n_forced, k)
            else:
                reasons[r] = "no_gain"
                if not n_forced and kind != "draft":
                    self._shadow(r, kind, drafts)
                # not tried: let what is known fade towards the prior, slowly, so that a
                # kind of draft that did badly once is tried again some time later
                for name in {kind, FORCED} if n_forced else (kind,):
                    self._estimate(r, name).forget(0.95)
                    self._global(name).forget(0.999)
        self._count(reasons, drafted=any(ks))

    def _propose(self, r: Request, cap: int) -> tuple[str, list[int]] | None:
        """(kind, drafts) for `r`: the prediction's where it has some; else the longer match
        of n-gram lookup in the request and the suffix index of earlier outputs (a tie goes
        to the request's own text); None when no proposer has any."""
        best: tuple[int, str, list[int]] | None = None
        for proposer in self.proposers:
            drafts = proposer.propose(r, cap)
            if not drafts:
                continue
            if proposer is self.ngram:
                match = r.spec_state["ngram_match"]
            elif proposer is self.suffix:
                match = r.spec_state["suffix_match"]
            else:
                return proposer.kind(r), drafts
            if best is None or match > best[0]:
                best = (match, proposer.kind(r), drafts)
        return None if best is None else best[1:]

    def _shadow(self, r: Request, kind: str, drafts: list[int]) -> None:
        """Keep `drafts` of `kind`, declined this step, as `r`'s shadow (unless one is still
        open): `_score_shadow` scores them against the tokens `r` emits next."""
        if drafts and "shadow" not in r.spec_state:
            r.spec_state["shadow"] = (kind, r.num_output_tokens, list(drafts))

    def _score_shadow(self, r: Request) -> None:
        """Once `r`'s output settles its shadow (a token differs from the draft at its
        position, or every draft token has been matched), learn from it as from a
        verification of those drafts: `_learn(kind, drafted, accepted)`. Nothing enters
        the statistics of drafted tokens."""
        shadow = r.spec_state.get("shadow")
        if shadow is None:
            return
        kind, start, drafts = shadow
        first = r.num_prompt_tokens + start
        emitted = r.token_ids[first:first + len(drafts)]
        accepted = 0
        while accepted < len(emitted) and emitted[accepted] == drafts[accepted]:
            accepted += 1
        if accepted == len(emitted) < len(drafts):
            return  # matching so far: not settled yet
        del r.spec_state["shadow"]
        self._learn(r, kind, len(drafts), accepted)
        self._refresh_ceiling(r)

    def no_draft(self, r: Request, reason: str) -> None:
        """Count one more step of `r` without drafts under `reason` (one of REASONS): for
        drafts the engine removed after `propose` (e.g. "grammar")."""
        self._count({r: reason}, drafted=False)

    def _count(self, reasons: dict[Request, str], drafted: bool) -> None:
        """Count this step's decoding requests without drafts by reason, and log the
        step's reason (the most common; none when something drafted) when it changed."""
        if not reasons:
            return
        tally: dict[str, int] = {}
        for r, why in reasons.items():
            self.stats.no_draft[REASONS.index(why)] += 1
            r.metrics.no_draft[why] = r.metrics.no_draft.get(why, 0) + 1
            tally[why] = tally.get(why, 0) + 1
        if drafted:
            return
        why = max(REASONS, key=lambda w: tally.get(w, 0))
        if why != self._logged_reason:
            self._logged_reason = why
            log.info("speculation: no drafts (%s): %s", why, NO_DRAFT_REASONS[why])

    def observe_step(self, num_tokens: int, num_seqs: int, seconds: float) -> None:
        """A step the engine ran: `num_tokens` tokens, each with logits, for `num_seqs`
        sequences, in `seconds` (refines the online curve; no-op without one)."""
        if self.online is not None:
            self.online.observe(num_tokens, num_seqs, seconds)

    def _step_curve(self, num_seqs: int) -> StepTimeCurve:
        """The curve for a step of `num_seqs` sequences; forgets the cached bounds when the
        online curve changed."""
        if self.online is None:
            return self.curve
        if self.online.version != self._online_version:
            self._online_version = self.online.version
            self._can_pay.clear()
        return self.online.curve(num_seqs)

    def _after_forced(self, r: Request, forced: list[int], cap: int) -> tuple[str, list[int]]:
        """(kind, drafts) to follow `r`'s forced tokens, up to `cap` in all: a prediction's
        drafts when they start with the forced tokens, else n-gram lookup past them; kind
        is FORCED when nothing follows."""
        room = cap - len(forced)
        if room <= 0:
            return FORCED, []
        for proposer in self.proposers:
            if isinstance(proposer, PredictionProposer):
                drafts = proposer.propose(r, cap)
                if drafts[:len(forced)] == forced and len(drafts) > len(forced):
                    return proposer.kind(r), drafts[len(forced):]
        if self.ngram is not None:
            tail = self.ngram.propose_after(r, forced, room)
            if tail:
                return self.ngram.kind(r), tail
        return FORCED, []

    def finished(self, r: Request) -> None:
        """A request ended: its output goes into the suffix index (if any)."""
        if self.suffix is not None and r.num_output_tokens:
            self.suffix.finished(r)
            self._suffix_size()

    def _suffix_size(self) -> None:
        index = self.suffix.index if self.suffix is not None else None
        self.stats.suffix_index = {} if index is None else {
            "suffix_tokens": index.tokens, "suffix_max_tokens": index.max_tokens,
            "suffix_outputs": index.sequences, "suffix_evicted": index.evicted}

    def _rates(self, r: Request, kind: str, n_forced: int, n: int) -> list[float]:
        """Conditional acceptance by draft position for `n` drafts of which the first
        `n_forced` are forced and the rest of `kind` (a suffix draft's capped by the
        index's confidence in each token)."""
        if not n_forced:
            rates = self._estimate(r, kind).rates()
            if kind.startswith("suffix:"):
                conf = r.spec_state.get("suffix_conf", [])
                rates[:len(conf)] = [min(e, c) for e, c in zip(rates, conf, strict=False)]
            return rates
        rates = self._estimate(r, FORCED).rates()[:n_forced]
        if kind != FORCED:
            rates += self._estimate(r, kind).rates()[:n - n_forced]
        return rates

    def _may_pay(self, curve: StepTimeCurve, running: list[Request],
                 waiting: list[Request], budget: int,
                 forced: dict[Request, list[int]]) -> str | None:
        """Why drafts cannot pay in this step (then the controller does not run, and on
        "step_cost" the proposers do not either), or None when they may.

        Two upper bounds. By the step's shape (cached): even drafts accepted at
        `BEST_ACCEPTANCE` cannot pay on a compute-bound step ("step_cost"). By acceptance:
        each decoding sequence's drafts are accepted at most at its `_ceiling`, and on a
        steep curve a sequence whose drafts are accepted 60% of the time cannot gain
        (`drafts_may_pay`; "no_gain"). Either means `allocate_drafts` would give every
        sequence k = 0."""
        total = 0
        decoding: list[int] = []  # the decodes' slots
        for r in running:
            todo = r.num_tokens - r.num_computed_tokens
            total += todo
            if todo == 1:
                decoding.append(r.slot)
        total += sum(r.num_tokens - r.num_computed_tokens for r in waiting)
        # the decodes alone, as `allocate_drafts` times them (in micro-batches by slot
        # with equal_split): the baseline both bounds share with it
        plain = step_seconds(curve, [1] * len(decoding), self.equal_split, decoding) or None
        # forced drafts may be accepted above BEST_ACCEPTANCE: bound with 1 then
        key = (id(curve), min(total, budget), len(decoding), bool(forced), plain)
        max_drafts = min(len(decoding) * self.max_k, budget - key[1])
        if len(self._can_pay) > 4096:
            self._can_pay.clear()
        verdict = self._can_pay.get(key)
        if verdict is None:
            # the draft model's own cost only lowers the bound: leave it out
            verdict = self._can_pay[key] = drafts_can_pay(
                curve, key[1], len(decoding), max_drafts,
                1.0 if forced else BEST_ACCEPTANCE, plain)
        if not verdict:
            return "step_cost"
        ceilings = tuple(self._ceiling(r, r in forced) for r in running
                         if r.num_tokens - r.num_computed_tokens == 1)
        verdict = self._can_pay.get((key, ceilings))
        if verdict is None:
            verdict = self._can_pay[key, ceilings] = drafts_may_pay(
                curve, key[1], len(decoding), ceilings, self.max_k, max_drafts, plain)
        return None if verdict else "no_gain"

    def _ceiling(self, r: Request, forced: bool = False) -> float:
        """The highest conditional acceptance any draft of `r` can be estimated at before the
        next verification: its own estimates' ceilings, and those a kind of draft it has
        not drafted yet would start from (the global estimates and their priors); with
        `forced` tokens to draft, theirs too."""
        if not r.params.speculative:
            return 0.0
        if forced:
            return max(self._estimate(r, FORCED).ceiling(), self._ceiling(r))
        if self._global_ceilings is None:
            plain = max([PRIOR] + [g.ceiling() for kind, g in self.global_estimates.items()
                                   if kind not in ("prediction", FORCED)])
            pred = self.global_estimates.get("prediction")
            self._global_ceilings = (plain, max(plain, PREDICTION_PRIOR,
                                                pred.ceiling() if pred else 0.0))
        start = self._global_ceilings[r.params.prediction is not None]
        return max(start, r.spec_state.get("ceiling", 0.0))

    def fill(self, scheduled: Iterable[Request]) -> None:
        """After scheduling: the draft model computes the drafts it was given room for."""
        if self.draft is not None:
            self.draft.fill(list(scheduled))

    def _global(self, kind: str) -> AcceptanceEstimate:
        est = self.global_estimates.get(kind)
        if est is None:
            prior = {"prediction": PREDICTION_PRIOR, FORCED: FORCED_PRIOR}.get(kind, PRIOR)
            est = self.global_estimates[kind] = AcceptanceEstimate(self.max_k, prior=prior,
                                                                   decay=0.98)
            self._global_ceilings = None
        return est

    def _estimate(self, r: Request, kind: str) -> AcceptanceEstimate:
        key = "estimate:" + kind
        est = r.spec_state.get(key)
        if est is None:
            est = AcceptanceEstimate(self.max_k, prior=self._global(kind).rates())
            r.spec_state[key] = est
            if kind != FORCED:  # forced tokens are rated on their own (`_ceiling`)
                r.spec_state["ceiling"] = max(r.spec_state.get("ceiling", 0.0), est.ceiling())
        return est

    def observe(self, r: Request, num_drafted: int, num_accepted: int) -> None:
        """Called by the commit after verifying `num_drafted` drafts of `r` (the first
        `spec_state["forced"]` of them forced by its grammar), `num_accepted` accepted."""
        name = r.spec_state.get("source", "ngram:0")
        n_forced = min(r.spec_state.get("forced", 0), num_drafted)
        if n_forced:  # the forced prefix and what followed it learn apart
            accepted = min(num_accepted, n_forced)
            self._learn(r, FORCED, n_forced, accepted)
            self.stats.forced_draft_tokens += n_forced
            self.stats.forced_accepted_tokens += accepted
            r.metrics.num_forced_draft_tokens += n_forced
            r.metrics.num_accepted_forced_tokens += accepted
        if num_drafted > n_forced and num_accepted >= n_forced:
            self._learn(r, name, num_drafted - n_forced, num_accepted - n_forced)
        self._refresh_ceiling(r)
        s = self.stats
        s.drafts += 1
        s.draft_tokens += num_drafted
        s.accepted_tokens += num_accepted
        for j in range(min(num_accepted, self.max_k)):
            s.accepted_by_position[j] += 1
        if name == "prediction" and num_drafted > n_forced:
            accepted = max(num_accepted - n_forced, 0)
            r.metrics.accepted_prediction_tokens += accepted
            r.metrics.rejected_prediction_tokens += num_drafted - n_forced - accepted

    @staticmethod
    def _refresh_ceiling(r: Request) -> None:
        r.spec_state["ceiling"] = max((est.ceiling() for key, est in r.spec_state.items()
                                       if key.startswith("estimate:")
                                       and key != "estimate:" + FORCED), default=0.0)

    def _learn(self, r: Request, kind: str, num_drafted: int, num_accepted: int) -> None:
        self._estimate(r, kind).observe(num_drafted, num_accepted)
        self._global(kind).observe(num_drafted, num_accepted)
        self._global_ceilings = None


def _why_no_proposal(r: Request) -> str:
    """The reason a decoding request had no draft from any proposer."""
    return {"exhausted": "prediction_exhausted", "lost": "prediction_lost"}.get(
        r.spec_state.get("prediction_miss"), "no_proposal")
