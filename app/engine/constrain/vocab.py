"""The grammar engine's view of a model's vocabulary (`llguidance.LLTokenizer`).

Built once per loaded model from the runner's own tokenizer (`backends.base.Tokenizer`), so
it is the vocabulary the logits index: llama.cpp's GGUF vocabulary, or the MLX tokenizer.
Each id's bytes are what it adds to output text; control tokens (no output bytes, markup in
`token_text`, e.g. `<|im_end|>`) are special tokens, written as llguidance expects them:
0xFF then their markup, so no JSON string can contain them. The list is padded with empty
entries (never allowed) up to the logits width: a model's logits can be wider than its
tokenizer (Qwen2.5: 151,936 logits), and every mask must cover every logit.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance

from backends.base import Tokenizer

SPECIAL_PREFIX = b"\xff"  # llguidance's marker of a special token's bytes


class _TokenizerSource:
    """What `llguidance.TokenizerWrapper` reads: token bytes, BOS/EOS, special ids, and
    `__call__(text) -> ids` (the model's own tokenization, used for forced tokens)."""

    def __init__(self, tokens: list[bytes], eos: int, bos: int | None,
                 special: list[int], tokenizer: Tokenizer):
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = bos
        self.special_token_ids = special
        self._tokenizer = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, add_special=False, parse_special=False)


def vocabulary_bytes(tokenizer: Tokenizer, n_logits: int) -> tuple[list[bytes], list[int]]:
    """(`n_logits` token byte strings, ids of special tokens): output bytes per id, special
    tokens as 0xFF + markup, empty entries for ids the tokenizer does not have.

    One Python pass over the vocabulary, once per model (about 0.1 s per 50k tokens)."""
    n_tokens = min(int(getattr(tokenizer, "n_vocab", n_logits)), n_logits)
    tokens: list[bytes] = []
    special: list[int] = []
    for i in range(n_tokens):
        data = tokenizer.token_bytes(i)
        if not data:
            markup = tokenizer.token_text(i).encode("utf-8")
            if markup:  # a control token: text only in templates, never in output
                data = SPECIAL_PREFIX + markup
                special.append(i)
        tokens.append(data)
    tokens += [b""] * (n_logits - n_tokens)
    return tokens, special


def grammar_tokenizer(tokenizer: Tokenizer, n_logits: int,
                      eos_ids: Sequence[int] | None = None) -> llguidance.LLTokenizer:
    """The `LLTokenizer` for `tokenizer` with `n_logits` entries (the logits width).

    `eos_ids` (default: the tokenizer's EOS/EOT ids) end a sequence when the grammar
    accepts. Raises ValueError if the tokenizer has no end-of-sequence token (a grammar
    could then never end) or `n_logits` is smaller than 1."""
    if n_logits < 1:
        raise ValueError("the logits width must be at least 1")
    eos = sorted(eos_ids if eos_ids is not None else tokenizer.eos_ids)
    if not eos:
        raise ValueError("constrained decoding needs a model with an end-of-sequence token")
    tokens, special = vocabulary_bytes(tokenizer, n_logits)
    for e in eos:  # an EOS without markup still must be a special token, not text
        if e < n_logits and not tokens[e]:
            tokens[e] = SPECIAL_PREFIX + f"<[{e}]>".encode()
            special.append(e)
    source = _TokenizerSource(tokens, eos[0], tokenizer.bos_id, special, tokenizer)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(source), eos_token=eos)
