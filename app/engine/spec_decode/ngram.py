"""A bounded n-gram index over one token sequence, for prompt-lookup drafting.

After vLLM's n-gram proposer (`vllm/v1/spec_decode/ngram_proposer.py`) and llama.cpp's
prompt lookup: find the most recent earlier occurrence of the sequence's last n tokens
(longest n first) and propose the tokens that followed it. Here the lookup is a dict from
n-gram to the position after its latest occurrence, updated incrementally as tokens are
appended, so a proposal costs O(max_n) dict lookups instead of a scan.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Index of `tokens`' n-grams, `min_n <= n <= max_n`.

    Args:
        min_n, max_n: n-gram lengths matched (longest first).
        max_entries: bound on stored n-grams; past it the index is rebuilt over the most
            recent half of the tokens (older matches are forgotten).
    """

    def __init__(self, min_n: int = 2, max_n: int = 4, max_entries: int = 1 << 16):
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self.min_n, self.max_n, self.max_entries = min_n, max_n, max_entries
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> position right after it
        self._indexed = 0  # tokens[:_indexed] have had their n-grams registered
        self._start = 0  # first position indexed (after a rebuild)

    def update(self, tokens: Sequence[int]) -> None:
        """Register the n-grams that end before each token appended since the last call:
        the n-gram `tokens[i-n:i]` maps to `i`. The sequence's current suffix is therefore
        never matched with itself."""
        if len(tokens) < self._indexed:  # rolled back or replaced: start again
            self._next.clear()
            self._indexed = self._start = 0
        for i in range(max(self._indexed, self._start + 1), len(tokens)):
            for n in range(self.min_n, self.max_n + 1):
                if i - n < self._start:
                    break
                self._next[tuple(tokens[i - n:i])] = i
        self._indexed = len(tokens)
        if len(self._next) > self.max_entries:
            self._start = len(tokens) // 2
            self._next.clear()
            self._indexed = self._start
            self.update(tokens)

    def lookup(self, suffix: Sequence[int]) -> tuple[int, int] | None:
        """(position following the latest earlier occurrence of the longest n-gram ending
        `suffix`, that n), or None."""
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            pos = self._next.get(tuple(suffix[len(suffix) - n:]))
            if pos is not None:
                return pos, n
        return None

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of `tokens`' suffix
        in `tokens` itself (the index must be `update`d with `tokens`)."""
        return self.propose_with_match(tokens, k)[0]

    def propose_with_match(self, tokens: Sequence[int], k: int) -> tuple[list[int], int]:
        """(`propose`'s tokens, length of the n-gram matched; 0 when none)."""
        hit = self.lookup(tokens) if k > 0 else None
        if hit is None:
            return [], 0
        pos, n = hit
        return list(tokens[pos:pos + k]), n
