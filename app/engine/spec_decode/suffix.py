"""A global suffix index over earlier requests' outputs, for drafting text the model wrote
before (agent loops that re-emit a tool call, a chat that repeats an answer, users asking
alike).

After SuffixDecoding (Oliaro et al., arXiv 2411.04975), which walks a suffix tree of earlier
outputs from the node of the request's longest matching tail, always to the most frequent
child, and scores a draft by the product of the children's shares. Here the same answer
comes from a position index instead of a tree: for each match length m in `match_lengths`,
every m-gram of the stored outputs maps to the positions right after its occurrences. The
longest tail of the request that occurs is looked up; the occurrences (the most recent
`max_candidates`) vote for the next token, the winner's share of the votes is its
confidence, the occurrences that agree go on voting for the one after. A draft stops at the
end of the stored output it follows, or where the product of confidences falls below
`min_confidence`. A suffix tree holds a node per stored token and depth; this holds
len(match_lengths) entries per stored token, and no depth limit on drafts.

Memory: capped at `max_tokens` stored tokens; past it the oldest outputs are taken out
(their entries removed), so the index holds the most recent outputs that fit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

_END = -1  # between stored outputs: a continuation never runs into the next one


@dataclass(frozen=True)
class SuffixDraft:
    """tokens: the draft. confidences: per token, the share of the occurrences still
    followed that went on with it (conditional, in (0, 1]). match: how many of the
    request's last tokens were found. occurrences: how many occurrences voted first."""

    tokens: list[int]
    confidences: list[float]
    match: int
    occurrences: int


class SuffixIndex:
    """Args:
        max_tokens: memory cap, in stored tokens (the oldest outputs leave first).
        match_lengths: tail lengths looked up, longest first (at least 1 each).
        max_candidates: most recent occurrences that vote.
        min_confidence: a draft stops where the product of its confidences falls below.
    Raises ValueError for a cap below 1, no or non-positive match lengths, or a confidence
    outside (0, 1].
    """

    def __init__(self, max_tokens: int = 1 << 15, match_lengths: Sequence[int] = (2, 4, 8, 16),
                 max_candidates: int = 32, min_confidence: float = 0.1):
        if (max_tokens < 1 or not match_lengths or min(match_lengths) < 1
                or not 0.0 < min_confidence <= 1.0):
            raise ValueError("need max_tokens >= 1, match lengths >= 1, "
                             "0 < min_confidence <= 1")
        self.max_tokens = max_tokens
        self.match_lengths = tuple(sorted(set(match_lengths), reverse=True))
        self.max_candidates, self.min_confidence = max_candidates, min_confidence
        self._tokens: list[int] = []  # the stored outputs, each followed by _END
        self._base = 0  # absolute position of _tokens[0]
        # hash of an m-gram -> absolute positions right after its occurrences, oldest first
        self._after: dict[int, list[int]] = {}
        self._stored: deque[int] = deque()  # lengths of the stored outputs, oldest first
        self.evicted = 0  # outputs taken out to stay under max_tokens

    @property
    def sequences(self) -> int:
        """Outputs stored now."""
        return len(self._stored)

    @property
    def tokens(self) -> int:
        """Tokens stored now (separators not counted)."""
        return len(self._tokens) - len(self._stored)

    @property
    def entries(self) -> int:
        """m-grams indexed now (distinct hashes)."""
        return len(self._after)

    def add(self, tokens: Sequence[int]) -> None:
        """Store one output (its last `max_tokens` tokens), then take out the oldest
        outputs while more than `max_tokens` tokens are stored."""
        seq = list(tokens[-self.max_tokens:])
        if len(seq) < 2:
            return
        start = self._base + len(self._tokens)
        self._tokens.extend(seq)
        self._tokens.append(_END)
        self._stored.append(len(seq))
        for i, key in self._grams(seq):
            self._after.setdefault(key, []).append(start + i)
        while self.tokens > self.max_tokens:
            self._evict()

    def _grams(self, seq: Sequence[int]):
        """(i, hash of seq[i-m:i]) for every m-gram of `seq` with a token after it."""
        for m in self.match_lengths:
            for i in range(m, len(seq)):
                yield i, hash(tuple(seq[i - m:i]))

    def _evict(self) -> None:
        n = self._stored.popleft()
        seq = self._tokens[:n]
        for _, key in self._grams(seq):
            positions = self._after[key]
            del positions[0]  # this output's occurrences are the oldest of every list
            if not positions:
                del self._after[key]
        del self._tokens[:n + 1]
        self._base += n + 1
        self.evicted += 1

    def propose(self, context: Sequence[int], k: int) -> SuffixDraft | None:
        """Up to `k` tokens that most often followed the longest tail of `context` (of a
        length in `match_lengths`) in the stored outputs, or None."""
        if k <= 0:
            return None
        for m in self.match_lengths:
            if m > len(context):
                continue
            tail = list(context[len(context) - m:])
            positions = self._after.get(hash(tuple(tail)))
            if not positions:
                continue
            base, stored = self._base, self._tokens
            # a hash collision is not a match: compare the tokens
            alive = [p - base for p in positions[-self.max_candidates:]
                     if stored[p - base - m:p - base] == tail]
            if alive:
                return self._vote(alive, m, k)
        return None

    def _vote(self, alive: list[int], match: int, k: int) -> SuffixDraft | None:
        stored = self._tokens
        tokens: list[int] = []
        confidences: list[float] = []
        first, score = len(alive), 1.0
        for _ in range(k):
            votes: dict[int, int] = {}
            for p in reversed(alive):  # a tie goes to the most recent occurrence
                t = stored[p]
                if t != _END:
                    votes[t] = votes.get(t, 0) + 1
            if not votes:
                break
            token, n = max(votes.items(), key=lambda kv: kv[1])
            p_token = n / len(alive)
            score *= p_token
            if score < self.min_confidence:
                break
            tokens.append(token)
            confidences.append(p_token)
            alive = [p + 1 for p in alive if stored[p] == token]
        return SuffixDraft(tokens, confidences, match, first) if tokens else None
