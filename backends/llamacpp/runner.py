"""llama.cpp runner through llama-cpp-python's low-level API.

One `llama_context` with `max_seqs` sequence ids: sequences at different positions are decoded
together in one `llama_decode`. The pieces: `runtime` (process init, model load and facts),
`kv_plan` (split or unified KV layout and context size), `batch` (the `llama_batch`) and
`residency` (where cached prefixes live: running slots or host memory).
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp as L
import numpy as np

from backends.base import BatchItem, RunnerCapabilities
from backends.llamacpp import runtime
from backends.llamacpp.batch import TokenBatch
from backends.llamacpp.kv_plan import SPLIT_KV_BYTES, check_args, context_error, plan_kv
from backends.llamacpp.memory import ContextMemory
from backends.llamacpp.residency import PrefixResidency, SplitResidency, UnifiedResidency
from backends.llamacpp.runtime import default_threads
from backends.llamacpp.tokenizer import LlamaCppTokenizer

__all__ = ["BLOCK_SIZE", "SPLIT_KV_BYTES", "LlamaCppRunner", "default_threads"]

_FLASH_ATTN = {
    "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
# Tokens per engine block: the granularity of prefix-cache hits. Here blocks are only
# accounting (llama.cpp keeps KV in its own cells), so finer blocks cost just bookkeeping and
# reuse more of a shared prefix (llama-server reuses to the token): a 26-token common chat
# prefix hits 24 tokens, not 16, saving ~25 ms of TTFT per request on the CI machine.
BLOCK_SIZE = 8


class LlamaCppRunner:
    """Implements `backends.base.Runner` on llama.cpp.

    Args:
        model_path: a GGUF file.
        max_seqs: sequence slots (llama.cpp's `n_seq_max`, at most 255).
        kv_tokens: tokens of KV the engine's block pool accounts for (default: unified
            max(2 * seq_tokens, 16384), all cells shared by all slots; split
            `max_seqs * seq_tokens`, less only to bound the host memory kept for prefixes).
        seq_tokens: most tokens one sequence holds; in the split layout the size of each
            slot's stream (rounded up to 256, capped by the model's training context).
        kv_layout: "split" | "unified" | "auto" (split if `max_seqs * seq_tokens` cells fit
            `split_kv_bytes`, else unified).
        split_kv_bytes: KV memory budget of the split layout for "auto", bytes.
        block_size: tokens per engine block (see BLOCK_SIZE).
        max_batch_tokens: most tokens one `execute` may carry (`n_batch`).
        n_threads: llama.cpp worker threads (default: CPUs available).
        flash_attn: "auto" | "on" | "off".
    Raises:
        FileNotFoundError: no such file. ValueError: llama.cpp cannot load it.
    """

    # truncate removes the positions from the slot's cells (`seq_rm`), so recomputing them
    # gives the logits of the first computation (tests/integration/test_llamacpp_truncate.py)
    capabilities = RunnerCapabilities(exact_truncate=True, kv_transfer=False)

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_seqs: int = 64,
        kv_tokens: int | None = None,
        seq_tokens: int = 4096,
        kv_layout: str = "auto",
        split_kv_bytes: int = SPLIT_KV_BYTES,
        block_size: int = BLOCK_SIZE,
        max_batch_tokens: int = 512,
        n_threads: int | None = None,
        flash_attn: str = "auto",
        verbose: bool = False,
    ):
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        check_args(max_seqs, kv_layout)
        runtime.init_backend(verbose)
        self._model = runtime.load_model(path)
        self.block_size = block_size
        self.max_seqs = max_seqs
        self.max_batch_tokens = max_batch_tokens
        self.n_threads = n_threads or default_threads()
        kv_bytes = runtime.kv_bytes_per_token(self._model)
        plan = plan_kv(max_seqs=max_seqs, seq_tokens=seq_tokens, kv_tokens=kv_tokens,
                       kv_layout=kv_layout, block_size=block_size,
                       max_batch_tokens=max_batch_tokens,
                       n_ctx_train=L.llama_model_n_ctx_train(self._model),
                       kv_bytes_per_token=kv_bytes, split_kv_bytes=split_kv_bytes)
        self.kv_layout = plan.layout
        # split: llama.cpp micro-batches sequences of unequal lengths apart (split_equal)
        self.capabilities = RunnerCapabilities(exact_truncate=True, kv_transfer=False,
                                               equal_split=plan.layout == "split")
        self.num_blocks = plan.num_blocks
        self.max_seq_tokens = plan.max_seq_tokens

        cp = L.llama_context_default_params()
        cp.n_ctx = plan.n_ctx
        cp.n_seq_max = plan.n_seq_max
        cp.kv_unified = plan.layout == "unified"
        cp.n_batch = max_batch_tokens
        cp.n_ubatch = min(512, max_batch_tokens)
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = _FLASH_ATTN[flash_attn]
        cp.n_outputs_max = max_batch_tokens
        self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            L.llama_model_free(self._model)
            self._model = None  # close() must not free it again
            raise ValueError(context_error(plan, str(path), kv_bytes))

        self.tokenizer = LlamaCppTokenizer(self._model)
        self.info = runtime.model_info(self._model, path.stem, self.tokenizer.n_vocab)
        self._batch = TokenBatch(max_batch_tokens)
        memory = ContextMemory(self._ctx)
        self.residency: PrefixResidency = (
            SplitResidency(memory, max_seqs, block_size) if plan.layout == "split"
            else UnifiedResidency(memory, max_seqs, block_size, scratch=plan.scratch_seq))

    def execute(self, items: list[BatchItem]) -> np.ndarray:
        self._batch.fill(items, slot_order=self.kv_layout == "split")
        self.residency.before_compute()
        for item in items:
            self.residency.note_computed(item.slot, item.block_table,
                                         item.start_pos + len(item.tokens))
        rc = L.llama_decode(self._ctx, self._batch.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        return self._batch.logits(self._ctx, self.info.n_vocab)

    def share_blocks(self, slot: int, block_ids: list[int]) -> int:
        return self.residency.share_blocks(slot, block_ids)

    def release(self, slot: int, n_keep_blocks: int) -> None:
        self.residency.release(slot, n_keep_blocks)

    def evict(self, block_ids: list[int]) -> None:
        self.residency.evict(block_ids)

    def truncate(self, slot: int, n_tokens: int) -> None:
        self.residency.truncate(slot, n_tokens)

    @property
    def saved_bytes(self) -> int:
        """Host memory held by saved prefixes (bytes)."""
        return self.residency.saved_bytes

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            L.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
