"""Forced tokens as drafts: where a request's grammar allows exactly one continuation (a
schema's keys and punctuation), llguidance's fast-forward tokens are drafts that cost no
model call and are almost always accepted.

They are verified in the batched step like any draft: the target samples its own token
at each position under the grammar's mask and keeps the draft only if it equals it. So the
output (greedy or seeded) is exactly what decoding without them gives; unlike jump-forward
decoding, which appends forced text unverified and changes the distribution (SGLang
removed it). A forced draft can still be rejected: llguidance tokenizes forced text
canonically, and the mask may allow another tokenization of the same bytes.
"""

from __future__ import annotations

from app.engine.request import Request

FORCED = "forced"  # the kind of draft, in acceptance statistics and `spec_state["source"]`


class ForcedProposer:
    """Drafts the tokens a constrained request's grammar forces next (none for a request
    without a grammar)."""

    name = FORCED

    def propose(self, request: Request, k: int) -> list[int]:
        """Up to `k` forced tokens after `request`'s output; [] when none are forced."""
        matcher = request.matcher
        if matcher is None or k <= 0:
            return []
        return matcher.forced_tokens()[:k]

    def kind(self, request: Request) -> str:
        return FORCED
