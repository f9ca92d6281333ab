"""Prefill chunks on the model's plain weights while decode runs on the repacked ones.

Repacked weights make llama.cpp's CPU decode (GEMV) faster and its prefill (GEMM) slower: on
Qwen2.5-Coder-1.5B Q4_K_M 1.13-1.43x faster steps of 1-16 rows but 0.67x the prefill
tokens/s from 128-token chunks on (README, "Repacked weights"). So a runner whose weights
were repacked also loads the same GGUF plainly (mapped: the file's pages are shared, the
extra memory is one sequence's KV) with a one-sequence context, computes each large prefill
chunk there, and copies the sequence's KV into its slot of the main context
(`llama_state_seq_get/set_data`, the blob retargeted from one stream to the slot's, its
rows copied as is: both contexts must store KV alike, same V layout and KV cache type).

The plain context keeps the last sequence it computed: the next chunk of the same prompt
continues there without copying the slot back in. Any other change to that slot (release,
truncate, a shared prefix, an import) must `forget` it first.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp as L
import numpy as np

from backends.base import BatchItem
from backends.llamacpp import kv_transfer as kvt
from backends.llamacpp import runtime
from backends.llamacpp.batch import TokenBatch
from backends.llamacpp.memory import ContextMemory

# Chunks of at least this many tokens go to the plain weights: plain prefill runs at 0.86x
# the repacked one's speed at 16 tokens, 1.09x at 32, 1.34x at 64 (app.bench.repack,
# Qwen2.5-Coder-1.5B Q4_K_M, README). Not 32: the kernels a prompt token gets then depend on
# how the prompt was chunked, and at 32, 16 concurrent ~40-token prompts no longer gave
# each one's tokens alone (SmolLM2 Q4_0; README, "Repacked weights").
PLAIN_PREFILL_MIN_TOKENS = 64


class PlainPrefill:
    """A second llama.cpp context, on the plain weights, for one sequence at a time.

    Args: the GGUF path; the main context's KV streams (its `n_seq_max`: split layout, a
    stream per slot), tokens per sequence (`n_ctx` here), threads, flash attention type,
    batch size (`n_batch`) and KV cache type (ggml_type, K and V), so that both contexts
    store KV alike (same V layout, same row type). Raises ValueError if llama.cpp cannot
    load the model or create the context.
    """

    def __init__(self, path: str | Path, main_streams: int, seq_tokens: int, n_threads: int,
                 flash_attn_type: int, max_batch_tokens: int,
                 kv_type: int = L.GGML_TYPE_F16):
        self.main_streams = main_streams
        self._model, self.weight_buffers = runtime.load_model(path, repack=False)
        cp = L.llama_context_default_params()
        cp.n_ctx = seq_tokens
        cp.n_seq_max = 1
        cp.n_batch = cp.n_outputs_max = max_batch_tokens
        cp.n_ubatch = min(512, max_batch_tokens)
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.flash_attn_type = flash_attn_type
        cp.type_k = cp.type_v = kv_type
        self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            L.llama_model_free(self._model)
            self._model = None
            raise ValueError(f"llama.cpp could not create a {seq_tokens}-token prefill context")
        self._memory = ContextMemory(self._ctx)
        self._batch = TokenBatch(max_batch_tokens)
        self._held: tuple[int, int] | None = None  # (main slot, positions 0..n-1 held here)
        self.chunks = 0  # chunks computed here (for tests and stats)

    @property
    def model(self) -> L.llama_model_p:
        """The plain weights' `llama_model` (the embedder runs on them too)."""
        return self._model

    def forget(self, slot: int | None = None) -> None:
        """The main context's `slot` (None: any) changed: what is held here is stale."""
        if self._held is not None and (slot is None or self._held[0] == slot):
            self._held = None

    def set_threads(self, n: int) -> None:
        """Compute with `n` threads from the next call on (`LlamaCppRunner.yield_core`)."""
        L.llama_set_n_threads(self._ctx, n, n)

    def compute(self, item: BatchItem, main: ContextMemory) -> np.ndarray:
        """Compute `item` (a prefill chunk of the main context's sequence `item.slot`) here
        and leave the slot of `main` holding positions `0 .. start_pos+len(tokens)-1`, as
        `llama_decode` on the main context would. Returns float32 `[len(item.logits_indices),
        n_vocab]` (a copy). Raises RuntimeError if llama.cpp fails or refuses a state."""
        if self._held != (item.slot, item.start_pos):
            self._memory.seq_rm(0, -1, -1)
            if item.start_pos:
                self._load(self._memory, 0, main.state_get(item.slot), n_stream=1, stream=0)
        self._held = None
        self._batch.fill([BatchItem(0, item.tokens, item.start_pos, item.block_table,
                                    item.logits_indices)])
        rc = L.llama_decode(self._ctx, self._batch.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} (plain prefill)")
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self._model))
        rows = np.array(self._batch.logits(self._ctx, n_vocab), copy=True)
        self._load(main, item.slot, self._memory.state_get(0), n_stream=self.main_streams,
                   stream=item.slot)
        self._held = (item.slot, item.start_pos + len(item.tokens))
        self.chunks += 1
        return rows

    @staticmethod
    def _load(memory: ContextMemory, seq: int, blob: np.ndarray, n_stream: int,
              stream: int) -> None:
        memory.state_set(seq, kvt.retarget_state(blob, seq, n_stream, stream))

    def close(self) -> None:
        runtime.free_native(self)
