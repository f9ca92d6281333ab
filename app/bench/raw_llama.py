"""llama.cpp alone, through llama-cpp-python's low-level API: the ceiling a benchmark
measures tandem's runner against in the same run (`app.bench.kv_quant`)."""

from __future__ import annotations

import time

import numpy as np

CHUNK = 512  # tokens per prefill step (the runner's max_batch_tokens in the benches)


class RawDecoder:
    """llama.cpp alone, the ceiling of the runner's decode: one context per KV type on one
    `llama_model` (loaded with `repack` as the runner loads it), each one sequence of `n_ctx`
    tokens, flash attention on, `type_k` = `type_v`, `threads` threads, driven through
    llama-cpp-python's low-level API with `llama_batch_get_one` and nothing else between the
    steps. `close()` frees the contexts and the model. Raises ValueError if llama.cpp cannot
    load the model or create a context."""

    def __init__(self, path: str, kv_types: list[str], n_ctx: int, threads: int,
                 repack: bool):
        import llama_cpp as L

        from backends.llamacpp import runtime
        from backends.llamacpp.runner import GGML_KV_TYPE

        self._L = L
        self._model, _ = runtime.load_model(path, repack)
        self._contexts: dict[str, object] = {}
        try:
            for t in kv_types:
                cp = L.llama_context_default_params()
                cp.n_ctx = n_ctx
                cp.n_batch = cp.n_ubatch = CHUNK
                cp.n_seq_max = 1
                cp.n_threads = cp.n_threads_batch = threads
                cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
                cp.type_k = cp.type_v = GGML_KV_TYPE[t]
                self._contexts[t] = L.llama_init_from_model(self._model, cp)
                if not self._contexts[t]:
                    raise ValueError(f"llama.cpp could not create a {t} KV context")
        except BaseException:
            self.close()
            raise

    def _decode(self, ctx, tokens: list[int]) -> None:
        L = self._L
        ids = (L.llama_token * len(tokens))(*tokens)
        if L.llama_decode(ctx, L.llama_batch_get_one(ids, len(tokens))) != 0:
            raise ValueError("llama_decode failed")

    def prefill(self, kv_type: str, tokens: list[int]) -> np.ndarray:
        """Empty the `kv_type` context, compute `tokens` in `CHUNK`-token steps; the last
        token's logits, float32 `[n_vocab]` (a copy)."""
        L, ctx = self._L, self._contexts[kv_type]
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        for start in range(0, len(tokens), CHUNK):
            self._decode(ctx, tokens[start:start + CHUNK])
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self._model))
        return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), (n_vocab,)).copy()

    def decode_tok_s(self, kv_type: str, tokens: list[int], decode_tokens: int) -> float:
        """`decode_times`' tokens per second."""
        return decode_tokens / sum(self.decode_times(kv_type, tokens, decode_tokens))

    def decode_times(self, kv_type: str, tokens: list[int], decode_tokens: int) -> list[float]:
        """Prefill `tokens`, then `decode_tokens` one-token steps (the text's tokens again:
        the time does not depend on which); each step's seconds."""
        self.prefill(kv_type, tokens)
        ctx = self._contexts[kv_type]
        times = []
        for i in range(decode_tokens):
            t0 = time.perf_counter()
            self._decode(ctx, [tokens[i % len(tokens)]])
            times.append(time.perf_counter() - t0)
        return times

    def close(self) -> None:
        for ctx in self._contexts.values():
            if ctx:
                self._L.llama_free(ctx)
        self._contexts = {}
        if self._model is not None:
            self._L.llama_model_free(self._model)
            self._model = None
