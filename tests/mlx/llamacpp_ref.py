"""Reference results from llama.cpp (llama-cpp-python's low-level API) for MLX parity tests.

Loads the same GGUF on the CPU as the runner does
(`backends.llamacpp.repack.load_model_like_runner`: the quiet backend, repacked weights where
the probe passed) and returns tokens and next-token logits.
"""

from __future__ import annotations

import ctypes

import numpy as np


class LlamaCppRef:
    """One llama.cpp model + single-sequence context (seq 0).

    flash_attn: None leaves llama.cpp's default (auto: on for the CPU), as the engine's
    llama.cpp backend runs; True/False forces it (used to measure llama.cpp against itself).
    """

    def __init__(self, path: str, n_ctx: int = 256, flash_attn: bool | None = None):
        import llama_cpp as lc

        from backends.llamacpp.repack import load_model_like_runner

        self.lc = lc
        self.model = load_model_like_runner(path)
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_threads = cp.n_threads_batch = 2
        if flash_attn is not None:
            cp.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                  else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        self.ctx = lc.llama_init_from_model(self.model, cp)

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False):
        raw = text.encode("utf-8")
        buf = (self.lc.llama_token * (len(raw) + 8))()
        n = self.lc.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), add_special,
                                   parse_special)
        if n < 0:
            raise RuntimeError("llama_tokenize buffer too small")
        return list(buf[:n])

    def is_eog(self, token_id: int) -> bool:
        return bool(self.lc.llama_vocab_is_eog(self.vocab, token_id))

    def _decode(self, tokens: list[int], start: int) -> np.ndarray:
        """Decode `tokens` at positions `start..`; logits `[n_vocab]` of the last one."""
        lc = self.lc
        batch = lc.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, t in enumerate(tokens):
                batch.token[i] = t
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == len(tokens) - 1
            batch.n_tokens = len(tokens)
            rc = lc.llama_decode(self.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            ptr = lc.llama_get_logits_ith(self.ctx, len(tokens) - 1)
            arr = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                        shape=(self.n_vocab,))
            return arr.copy()
        finally:
            lc.llama_batch_free(batch)

    def logits(self, tokens: list[int]) -> np.ndarray:
        """Next-token logits `[n_vocab]` float32 after a fresh prefill of `tokens`."""
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        return self._decode(tokens, 0)

    def greedy(self, tokens: list[int], n: int) -> list[int]:
        """`n` greedy tokens after `tokens`: one prefill, then one decode per token (as an
        engine runs)."""
        out = [int(np.argmax(self.logits(tokens)))]
        while len(out) < n:
            row = self._decode([out[-1]], len(tokens) + len(out) - 1)
            out.append(int(np.argmax(row)))
        return out

    def close(self) -> None:
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)
