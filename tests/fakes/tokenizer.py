"""`FakeTokenizer`: a `backends.base.Tokenizer` without a model, over bytes or characters.

- `unit="bytes"` (default): ids 0-255 are bytes, so a multi-byte character spans tokens (as
  with a byte-level BPE); BOS is 256 and EOS 257 unless told otherwise; `n_vocab` 258.
- `unit="chars"`: one token per character, id = code point (Basic Multilingual Plane);
  EOS is 0 (NUL) and there is no BOS unless told otherwise; `n_vocab` 65536.

Either way the tokenization of a text is the concatenation of its parts', so a templated
history always starts with the exact tokens of the earlier prompt + reply. Special tokens
have no bytes (they never show in output text) and are written `<s>` / `</s>` by
`token_text`; `encode(..., parse_special=True)` reads that markup back.
"""

from __future__ import annotations

import re

_UNSET = object()


class FakeTokenizer:
    bos_id: int | None
    eos_ids: set[int]
    chat_template: str | None

    def __init__(self, unit: str = "bytes", *, bos_id: int | None | object = _UNSET,
                 eos_id: int | None | object = _UNSET, chat_template: str | None = None):
        if unit not in ("bytes", "chars"):
            raise ValueError(f"unit must be 'bytes' or 'chars', not {unit!r}")
        self.unit = unit
        if unit == "bytes":
            self.bos_id = 256 if bos_id is _UNSET else bos_id  # type: ignore[assignment]
            eos = 257 if eos_id is _UNSET else eos_id
        else:
            self.bos_id = None if bos_id is _UNSET else bos_id  # type: ignore[assignment]
            eos = 0 if eos_id is _UNSET else eos_id
        self.eos_ids = set() if eos is None else {eos}  # type: ignore[arg-type]
        self.chat_template = chat_template
        self._markup = {}
        if self.bos_id is not None:
            self._markup[self.bos_id] = "<s>"
        for e in self.eos_ids:
            self._markup[e] = "</s>"
        self._special_re = re.compile("(" + "|".join(map(re.escape, self._markup.values())) + ")")
        base = 256 if unit == "bytes" else 0x10000
        self.n_vocab = max([base - 1, *self._markup]) + 1

    def _plain(self, text: str) -> list[int]:
        if self.unit == "bytes":
            return list(text.encode("utf-8"))
        ids = [ord(c) for c in text]
        if any(i >= self.n_vocab for i in ids):
            raise ValueError("FakeTokenizer(unit='chars') covers the Basic Multilingual Plane only")
        return ids

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        ids = [self.bos_id] if add_special and self.bos_id is not None else []
        if not parse_special or not self._markup:
            return ids + self._plain(text)
        by_markup = {v: k for k, v in self._markup.items()}
        for i, part in enumerate(self._special_re.split(text)):
            ids += [by_markup[part]] if i % 2 else self._plain(part)
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self._markup:
            return b""
        if self.unit == "bytes":
            return bytes([token_id]) if 0 <= token_id < 256 else b""
        return chr(token_id).encode("utf-8", "surrogatepass")

    def token_text(self, token_id: int) -> str:
        if token_id in self._markup:
            return self._markup[token_id]
        return self.token_bytes(token_id).decode("utf-8", "replace")

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", "replace")
