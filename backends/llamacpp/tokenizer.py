"""The GGUF's own tokenizer, through llama.cpp's vocabulary API."""

from __future__ import annotations

import ctypes

import llama_cpp as L


class LlamaCppTokenizer:
    """Tokenizer of a loaded llama.cpp model (implements `backends.base.Tokenizer`).

    `token_bytes` is cached per id: decode calls it once per generated token.
    """

    def __init__(self, model: L.llama_model_p):
        self._vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        bos = L.llama_vocab_bos(self._vocab)
        self.bos_id: int | None = bos if bos >= 0 else None
        self.add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))
        self.eos_ids: set[int] = {t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self._vocab, t)}
        template = L.llama_model_chat_template(model, None)
        self.chat_template: str | None = template.decode("utf-8") if template else None
        self._bytes_cache: dict[int, bytes] = {}
        # fill-in-the-middle tokens as llama.cpp found them (GGUF metadata or the known
        # spellings in the vocabulary); absent ones are left out
        fim = {"prefix": L.llama_vocab_fim_pre(self._vocab), "suffix": L.llama_vocab_fim_suf(self._vocab),
               "middle": L.llama_vocab_fim_mid(self._vocab)}
        self.fim_ids: dict[str, int] = {k: v for k, v in fim.items() if v >= 0}
        self._piece_buf = ctypes.create_string_buffer(256)

    def token_text(self, token_id: int) -> str:
        """Text of one token including special tokens' markup (e.g. `<|im_end|>`)."""
        return self._piece(token_id, special=True).decode("utf-8", errors="replace")

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (L.llama_token * n_max)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def _piece(self, token_id: int, special: bool) -> bytes:
        n = L.llama_token_to_piece(self._vocab, token_id, self._piece_buf, len(self._piece_buf), 0, special)
        if n < 0:
            big = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self._vocab, token_id, big, len(big), 0, special)
            return big.raw[:n]
        return self._piece_buf.raw[:n]

    def token_bytes(self, token_id: int) -> bytes:
        """Bytes a token contributes to output text; control tokens contribute none."""
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = self._bytes_cache[token_id] = self._piece(token_id, special=False)
        return cached

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")
