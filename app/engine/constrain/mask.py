"""Token bitmasks for a batch of logits rows and their vectorised application.

A bitmask row is ``ceil(width / 32)`` int32 words; bit i of word w (little-endian) allows
token ``32*w + i``. llguidance fills the rows (GIL released; one `LLExecutor` fills many
matchers, and every draft position, in parallel); numpy applies them: no Python loop over
the vocabulary.
"""

from __future__ import annotations

import threading
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


def apply_unpacked(logits: np.ndarray, bitmask: np.ndarray, rows: Iterable[int],
                   fallback_ids: Iterable[int]) -> np.ndarray:
    """`apply_masks` by its plain definition: every row unpacked whole, one masked copy per
    row. The reference the tests hold `apply_masks` to and the baseline of
    `app.bench.mask_time`."""
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
    for j, row in enumerate(rows.tolist()):
        np.copyto(logits[row], -np.inf, where=forbidden[j])
    return logits


# A row with at most this share of non-zero words (few tokens allowed: JSON structure) is
# applied through the ids it allows; any other row (string content) through `_BYTE_BIAS`.
SPARSE_WORDS = 1 / 8
_BIT = np.arange(32, dtype=np.int64)
# the additive bias of one mask byte: 0.0 where its bit allows the token, -inf where not
_BYTE_BIAS = np.where(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
    .astype(bool), 0.0, -np.inf).astype(np.float32)
_scratch = threading.local()  # per step thread: a model pool runs several


def _bias_buffer(n_words: int) -> np.ndarray:
    """A float32 ``[n_words * 4, 8]`` buffer kept per thread (a fresh 600 KB array per row
    would be mapped and faulted in every time)."""
    buf = getattr(_scratch, "bias", None)
    if buf is None or buf.shape[0] != n_words * 4:
        buf = _scratch.bias = np.empty((n_words * 4, 8), dtype=np.float32)
    return buf


def _mask_row(x: np.ndarray, row: np.ndarray, fallback: np.ndarray) -> None:
    """Set the logits of `x` ``[V]`` that mask `row` (int32 words) forbids to -inf, in
    place (allowed ones get + 0.0); ids past the mask are forbidden; a mask allowing
    nothing allows `fallback`."""
    width, covered = x.shape[0], row.shape[0] * 32
    if np.count_nonzero(row) <= row.shape[0] * SPARSE_WORDS:
        # few tokens allowed: keep their values, forbid the rest
        allow = np.flatnonzero(row)
        bits = np.unpackbits(row[allow].view(np.uint8).reshape(-1, 4), axis=1,
                             bitorder="little").view(np.bool_)
        ids = (allow[:, None] * 32 + _BIT)[bits]
        ids = ids[ids < width]
        if not ids.size:
            ids = fallback
        kept = x[ids]
        x.fill(-np.inf)
        x[ids] = kept
        return
    bias = _bias_buffer(row.shape[0])
    np.take(_BYTE_BIAS, row.view(np.uint8), axis=0, out=bias)
    n = min(width, covered)
    x[:n] += bias.reshape(-1)[:n]
    if width > covered:
        x[covered:] = -np.inf


def apply_masks(logits: np.ndarray, bitmask: np.ndarray, rows: Iterable[int],
                fallback_ids: Iterable[int]) -> np.ndarray:
    """Set every logit `bitmask` forbids in `rows` of `logits` ``[B, V]`` to -inf, in
    place, and return `logits`; other rows are not touched or copied. A read-only array (a
    backend's buffer) is copied first and the copy returned. A row whose mask allows
    nothing (a matcher in error) allows `fallback_ids` (the end-of-sequence ids) instead,
    so the sequence ends rather than the sampler failing.

    Cost per row: a count of its ``V / 32`` non-zero words; then, for a row allowing few
    words' tokens, one fill and the allowed ids' values put back, else one table lookup
    per mask byte and one add (no per-row allocation). Both equal `apply_unpacked`
    (tests/unit/test_constrain.py)."""
    rows = list(rows)
    if not logits.flags.writeable:
        logits = np.array(logits, dtype=np.float32, copy=True)
    fallback = np.fromiter(fallback_ids, dtype=np.int64)
    for row in rows:
        _mask_row(logits[row], bitmask[row], fallback)
    return logits
