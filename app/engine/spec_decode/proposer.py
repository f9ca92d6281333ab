"""Draft proposers: each offers up to k tokens that the target may accept for one request.

Proposers here are deterministic (a draft is a fixed token, not a sample), so verification
is exact by equality: the target samples its own token at each drafted position and keeps a
draft only if it equals that token (see `app.engine.engine`). None costs a model call.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Protocol

from app.engine.request import Request
from app.engine.spec_decode.ngram import NgramIndex
from app.engine.spec_decode.suffix import SuffixIndex


class Proposer(Protocol):
    """`name` labels its drafts in stats ("ngram", "prediction")."""

    name: str

    def propose(self, request: Request, k: int) -> list[int]:
        """Up to `k` draft tokens to follow `request.token_ids`; [] when it has none."""
        ...

    def kind(self, request: Request) -> str:
        """Which class of draft the last `propose` made, for acceptance statistics (e.g.
        the n-gram length matched): drafts of one kind are expected to fare alike."""
        ...


class NgramProposer:
    """Prompt lookup over the request's own prompt + output (no second model). The index
    lives on the request (`request.spec_state`) and is updated as tokens arrive."""

    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, request: Request, k: int) -> list[int]:
        index = request.spec_state.get("ngram")
        if index is None:
            index = request.spec_state["ngram"] = NgramIndex(self.min_n, self.max_n)
        index.update(request.token_ids)
        drafts, n = index.propose_with_match(request.token_ids, k)
        request.spec_state["ngram_match"] = n
        return drafts

    def kind(self, request: Request) -> str:
        return f"ngram:{request.spec_state.get('ngram_match', 0)}"

    def propose_after(self, request: Request, prefix: list[int], k: int) -> list[int]:
        """Up to `k` tokens to follow `request.token_ids + prefix` (drafts that continue
        after forced tokens); `kind` then names this lookup's match."""
        index = request.spec_state.get("ngram")
        if index is None:
            index = request.spec_state["ngram"] = NgramIndex(self.min_n, self.max_n)
        index.update(request.token_ids)
        drafts, n = index.propose_with_match(request.token_ids + prefix, k)
        request.spec_state["ngram_match"] = n
        return drafts


class PredictionIndex:
    """Positions of every n-gram of a fixed prediction, for re-synchronising with it."""

    def __init__(self, tokens: Sequence[int], min_n: int = 2, max_n: int = 8):
        self.tokens = list(tokens)
        self.min_n, self.max_n = min_n, max_n
        self._after: dict[tuple[int, ...], list[int]] = {}
        for i in range(1, len(self.tokens) + 1):
            for n in range(min_n, min(max_n, i) + 1):
                self._after.setdefault(tuple(self.tokens[i - n:i]), []).append(i)

    def find(self, suffix: Sequence[int], not_before: int) -> int | None:
        """The position after an occurrence of the longest n-gram ending `suffix`: the
        first one at or after `not_before`, else the last one before it; None if none."""
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            hits = self._after.get(tuple(suffix[len(suffix) - n:]))
            if hits:
                j = bisect_left(hits, not_before)
                return hits[j] if j < len(hits) else hits[-1]
        return None


class PredictionProposer:
    """OpenAI Predicted Outputs: drafts come from `request.params.prediction` (token ids of
    the expected output, e.g. the file being edited).

    A cursor follows where in the prediction the output has got to. While the output keeps
    agreeing with the prediction the next drafts are the prediction's next tokens; after an
    edit, the output's last n-gram (longest first, the occurrence nearest after the cursor)
    finds the place to continue from. When it has no drafts, `spec_state["prediction_miss"]`
    says why: "exhausted" (the cursor is at the prediction's end) or "lost" (no n-gram of the
    output is in the prediction).
    """

    name = "prediction"

    def propose(self, request: Request, k: int) -> list[int]:
        prediction = request.params.prediction
        if not prediction or k <= 0:
            return []
        state = request.spec_state
        index: PredictionIndex | None = state.get("prediction")
        if index is None:
            index = state["prediction"] = PredictionIndex(prediction)
            state["cursor"], state["cursor_out"] = 0, 0
        output = request.output_ids
        advanced = len(output) - state["cursor_out"]
        cursor = state["cursor"] + advanced
        within = prediction[state["cursor"]:cursor]
        agreed = output[state["cursor_out"]:state["cursor_out"] + len(within)] == within
        aligned = 0 < cursor <= len(prediction) and agreed
        if not output:
            cursor = 0
        elif not aligned:
            found = index.find(output, state["cursor"])
            if found is None:
                # the output went on past the prediction's end, or left it
                past_end = cursor > len(prediction) and agreed
                state["prediction_miss"] = "exhausted" if past_end else "lost"
                return []
            cursor = found
        state["cursor"], state["cursor_out"] = cursor, len(output)
        drafts = prediction[cursor:cursor + k]
        state["prediction_miss"] = None if drafts else "exhausted"
        return drafts

    def kind(self, request: Request) -> str:
        return "prediction"


class SuffixProposer:
    """Drafts from a `SuffixIndex` of earlier requests' outputs (global, one per engine):
    text the model wrote before for another request. `spec_state["suffix_conf"]` keeps
    the confidence of each draft token (the speculator caps its acceptance estimate with
    it), `spec_state["suffix_match"]` the tail length matched."""

    name = "suffix"

    def __init__(self, index: SuffixIndex):
        self.index = index

    def propose(self, request: Request, k: int) -> list[int]:
        draft = self.index.propose(request.token_ids, k)
        state = request.spec_state
        if draft is None:
            state["suffix_match"], state["suffix_conf"] = 0, []
            return []
        state["suffix_match"], state["suffix_conf"] = draft.match, draft.confidences
        return draft.tokens

    def kind(self, request: Request) -> str:
        return f"suffix:{request.spec_state.get('suffix_match', 0)}"

    def finished(self, request: Request) -> None:
        """Store a finished request's output for later requests."""
        self.index.add(request.output_ids)
