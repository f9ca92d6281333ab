"""The grammar engine's view of a model's vocabulary (`llguidance.LLTokenizer`).

Built once per loaded model from the runner's own tokenizer (`backends.base.Tokenizer`), so
it is the vocabulary the logits index: llama.cpp's GGUF vocabulary, or the MLX tokenizer.
Each id's bytes are what it adds to output text; control tokens (no output bytes, markup in
`token_text`, e.g. `<|im_end|>`) are special tokens, written as llguidance expects them:
0xFF then their markup, so no JSON string can contain them. The list is padded with empty
entries (never allowed) up to the logits width: a model's logits can be wider than its
tokenizer (Qwen2.5: 151,936 logits), and every mask must cover every logit.

Slices (`STRING_SLICES`): llguidance skips walking the vocabulary trie for a slice of tokens
whose every member the grammar allows (docs/optimizations.md, "Slicer optimization",
in llguidance's repository); what no allowed slice covers is walked token by token. Its
default slices are whitespace and JSON string content of 1-10, 1-30 and any number of
characters, so inside a string with fewer than 10 characters left (a `maxLength` string near
its end, or one of 8) no slice applies and all 151k tokens of Qwen2.5 are walked. Shorter
slices cover those positions; the masks are the same, only the time changes
(`python -m app.bench.mask_time`).
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance

from backends.base import Tokenizer

SPECIAL_PREFIX = b"\xff"  # llguidance's marker of a special token's bytes

_STRING_CHAR = r'[^"\\\x00-\x1F\x7F]'  # a character a JSON string holds unescaped
# llguidance's default slices (`LLTokenizer.general_slices()`: whitespace, then string
# content of 1-10, 1-30 and any number of characters) with more lengths below 30 (2, 4, ...,
# 10, 15, 20 measured best; every length 1..10 was slower: each slice is a trie of its own,
# walked separately)
STRING_SLICES: tuple[str, ...] = (
    r"[\x20\x0A\x0D\x09]+",
    *(f"{_STRING_CHAR}{{1,{n}}}" for n in (2, 4, 6, 8, 10, 15, 20, 30)),
    f"{_STRING_CHAR}+",
)


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
                      eos_ids: Sequence[int] | None = None,
                      slices: Sequence[str] | None = STRING_SLICES) -> llguidance.LLTokenizer:
    """The `LLTokenizer` for `tokenizer` with `n_logits` entries (the logits width).

    `eos_ids` (default: the tokenizer's EOS/EOT ids) end a sequence when the grammar
    accepts. `slices`: the slicer's regexes (None: llguidance's defaults). Raises
    ValueError if the tokenizer has no end-of-sequence token (a grammar could then never
    end) or `n_logits` is smaller than 1."""
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
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(source), eos_token=eos,
                                  slices=None if slices is None else list(slices))
