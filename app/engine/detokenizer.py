"""Incremental byte-level detokenizer with stop strings.

Tokens map to raw bytes (byte-level BPE pieces may split a UTF-8 character), so text is
produced by an incremental UTF-8 decoder: a character split over several tokens is emitted
once, whole, when its last byte arrives; bytes that can never form a valid character become
U+FFFD at once (Python's `codecs` incremental decoder with ``errors="replace"``). At the end of
a request, the bytes of a character the generation stopped inside (e.g. cut by max_tokens
halfway through an emoji) are dropped, never shown as U+FFFD; their tokens still count.

Stop strings are matched on the decoded text. Any suffix of the not-yet-emitted text that is
a prefix of a stop string is held back until it either completes a stop string (the text
before it is emitted, the stop string never is) or stops matching (released at once).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class IncrementalDetokenizer:
    """Turns one request's token ids into safe-to-stream text.

    `token_bytes(id)` returns a token's raw bytes. `stop` lists stop strings (empty strings
    are ignored). `push()` each generated token in order, `flush()` once at the end.

    Attributes: `stopped` is True once a stop string has matched; `stop_matched` is that
    string (None before); `text` is everything emitted so far.
    """

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()):
        self._token_bytes = token_bytes
        self._stops = tuple(s for s in stop if s)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded, not yet emitted: could still start a stop string
        self._chunks: list[str] = []
        self._text: str | None = ""
        self.stopped = False
        self.stop_matched: str | None = None

    @property
    def text(self) -> str:
        """All text emitted so far (concatenation of every push/flush return value)."""
        if self._text is None:
            self._text = "".join(self._chunks)
            self._chunks = [self._text]
        return self._text

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is safe to emit now ("" if held back).

        Returns "" for every token after a stop string matched.
        """
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(self._token_bytes(token_id), final=False)
        return self._release(final=False)

    def flush(self) -> str:
        """End of request: return the held-back text. The incomplete UTF-8 tail of a
        character cut off by the end of generation is dropped (not shown as U+FFFD)."""
        if self.stopped:
            return ""
        self._decoder.reset()  # forget the buffered bytes of an unfinished character
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        pending = self._pending
        cut = self._find_stop(pending)
        if cut is not None:
            self.stopped = True
            self._pending = ""
            return self._emit(pending[:cut])
        hold = 0 if final else self._held_suffix(pending)
        self._pending = pending[len(pending) - hold :] if hold else ""
        return self._emit(pending[: len(pending) - hold])

    def _find_stop(self, pending: str) -> int | None:
        """Start of the earliest stop string in `pending` (sets `stop_matched`), or None."""
        best = None
        for s in self._stops:
            i = pending.find(s)
            if i >= 0 and (best is None or i < best):
                best, self.stop_matched = i, s
        return best

    def _held_suffix(self, pending: str) -> int:
        """Length of the longest suffix of `pending` that is a proper prefix of a stop."""
        hold = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(pending)), hold, -1):
                if pending.endswith(s[:k]):
                    hold = k
                    break
        return hold

    def _emit(self, piece: str) -> str:
        if piece:
            self._chunks.append(piece)
            self._text = None
        return piece
