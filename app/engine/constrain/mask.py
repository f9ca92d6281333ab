"""Token bitmasks for a batch of logits rows and their vectorised application.

A bitmask row is ``ceil(width / 32)`` int32 words; bit i of word w (little-endian) allows
token ``32*w + i``. llguidance fills the rows (GIL released; one `LLExecutor` fills many
matchers, and every draft position, in parallel); numpy applies them: no Python loop over
the vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import llguidance
import numpy as np
from llguidance.numpy import (
    fill_next_token_bitmask,
    fill_next_token_bitmask_par,
    fill_next_token_bitmask_par_with_draft_tokens,
)

from app.engine.constrain.matcher import Matcher

_executor: llguidance.LLExecutor | None = None


def _shared_executor() -> llguidance.LLExecutor:
    global _executor
    if _executor is None:
        _executor = llguidance.LLExecutor()
    return _executor


def words(width: int) -> int:
    """int32 words of one bitmask row covering `width` logits."""
    return (width + 31) // 32


@dataclass(slots=True)
class MaskRequest:
    """One sequence's rows: `first_row` gets the mask of the matcher's current state, row
    ``first_row + j + 1`` the mask after `drafts[:j + 1]` (drafts after one the grammar
    forbids get no mask: verification never reaches their rows)."""

    matcher: Matcher
    first_row: int
    drafts: list[int]


def fill_masks(requests: list[MaskRequest], num_rows: int, width: int) -> np.ndarray:
    """Bitmask ``[num_rows, words(width)]`` int32 for `requests`; rows no request covers
    allow every token. Matchers end in the state they started in."""
    bitmask = np.full((num_rows, words(width)), -1, dtype=np.int32)
    if len(requests) == 1 and not requests[0].drafts:
        fill_next_token_bitmask(requests[0].matcher.raw, bitmask, requests[0].first_row)
        return bitmask
    plain = [(r.matcher.raw, r.first_row) for r in requests if not r.drafts]
    drafted = [(r.matcher.raw, r.first_row, list(r.drafts)) for r in requests if r.drafts]
    if plain:
        fill_next_token_bitmask_par(_shared_executor(), plain, bitmask)
    if drafted:  # llguidance refuses an empty draft list here
        fill_next_token_bitmask_par_with_draft_tokens(_shared_executor(), drafted, bitmask)
    return bitmask


def allowed(bitmask: np.ndarray, width: int) -> np.ndarray:
    """Bool ``[rows, width]``: which logits each bitmask row allows."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1,
                         bitorder="little")
    if bits.shape[1] < width:  # logits wider than the mask: the extra ids are never allowed
        bits = np.pad(bits, ((0, 0), (0, width - bits.shape[1])))
    return bits[:, :width].view(np.bool_)


def apply_masks(logits: np.ndarray, bitmask: np.ndarray, rows: Iterable[int],
                fallback_ids: Iterable[int]) -> np.ndarray:
    """Set every logit `bitmask` forbids in `rows` of `logits` ``[B, V]`` to -inf, in
    place, and return `logits`; other rows are not touched or copied. A read-only array (a
    backend's buffer) is copied first and the copy returned. A row whose mask allows
    nothing (a matcher in error) allows `fallback_ids` (the end-of-sequence ids) instead,
    so the sequence ends rather than the sampler failing."""
    rows = np.fromiter(rows, dtype=np.int64)
    if not logits.flags.writeable:
        logits = np.array(logits, dtype=np.float32, copy=True)
    if not rows.size:
        return logits
    forbidden = ~allowed(bitmask[rows], logits.shape[1])
    empty = forbidden.all(axis=1)
    if empty.any():
        ids = np.fromiter(fallback_ids, dtype=np.int64)
        forbidden[np.ix_(np.flatnonzero(empty), ids)] = False
    for j, row in enumerate(rows.tolist()):  # a view per row: nothing else is copied
        np.copyto(logits[row], -np.inf, where=forbidden[j])
    return logits
