"""`backends.llamacpp.embedder.cut_tokens`: Ollama's `truncate` keeps the special tokens."""

from __future__ import annotations

import pytest

from backends.llamacpp.embedder import cut_tokens

CLS, SEP = 101, 102


@pytest.mark.parametrize(("tokens", "limit", "head", "tail", "expected"), [
    ([CLS, 1, 2, 3, 4, SEP], 4, 1, 1, [CLS, 1, 2, SEP]),  # BERT: CLS text SEP
    ([CLS, 1, 2, 3, 4, SEP], 6, 1, 1, [CLS, 1, 2, 3, 4, SEP]),  # fits: unchanged
    ([7, 1, 2, 3], 2, 1, 0, [7, 1]),  # BOS only
    ([1, 2, 3], 2, 0, 0, [1, 2]),  # no special tokens (SmolLM2)
    ([CLS, 1, SEP], 1, 1, 1, [CLS]),  # a limit below the special tokens: at most `limit`
])
def test_cut_keeps_special_tokens(tokens: list[int], limit: int, head: int, tail: int,
                                  expected: list[int]) -> None:
    assert cut_tokens(tokens, limit, head, tail) == expected
