"""`Matcher`: one constrained sequence's position in its grammar.

Wraps `llguidance.LLMatcher`, which never raises on grammar errors but enters an error
state; used by the engine's step thread only (an LLMatcher is one-thread-at-a-time).
"""

from __future__ import annotations

import llguidance


class Matcher:
    """The grammar state after the tokens consumed so far.

    `consume` advances by accepted tokens; `rollback` undoes the last n (a rejected draft);
    `valid_prefix` checks drafts without advancing; `forced_tokens` are the tokens the
    grammar allows and nothing else (llguidance's fast-forward tokens, canonically
    tokenized): free drafts for speculative decoding.
    """

    __slots__ = ("_m", "consumed")

    def __init__(self, matcher: llguidance.LLMatcher):
        self._m = matcher
        self.consumed = 0  # tokens consumed and not rolled back

    @property
    def raw(self) -> llguidance.LLMatcher:
        """The llguidance matcher (for batched mask fills)."""
        return self._m

    def consume(self, token: int) -> bool:
        """Advance by one token. False (and the matcher is in error from then on) if the
        grammar forbids it."""
        ok = self._m.consume_token(token)
        if ok:
            self.consumed += 1
        return ok

    def rollback(self, n: int) -> None:
        """Undo the last `n` consumed tokens. Raises ValueError if fewer were consumed."""
        if n > self.consumed:
            raise ValueError(f"cannot roll back {n} tokens: {self.consumed} consumed")
        if n and not self._m.rollback(n):
            raise ValueError(f"rollback of {n} tokens failed: {self._m.get_error()}")
        self.consumed -= n

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading `tokens` the grammar allows from here (the state is unchanged)."""
        return self._m.validate_tokens(tokens) if tokens else 0

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (possibly none); the state is unchanged."""
        return self._m.compute_ff_tokens()

    @property
    def stopped(self) -> bool:
        """The grammar is complete and allows nothing more but end of sequence (or the
        matcher is in error)."""
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is a complete match (it may still go on)."""
        return self._m.is_accepting()

    @property
    def error(self) -> str:
        """Why the matcher is in error, or "" when it is not."""
        return self._m.get_error()
