"""llama.cpp runner through llama-cpp-python's low-level API.

One `llama_context` with `max_seqs` sequence ids: sequences at different positions are decoded
together in one `llama_decode`. The pieces: `runtime` (process init, model load and facts),
`kv_plan` (split or unified KV layout and context size), `batch` (the `llama_batch`) and
`residency` (where cached prefixes live: running slots or host memory).
"""

from __future__ import annotations

import threading
from pathlib import Path

import llama_cpp as L
import numpy as np

from backends.base import KV_TRANSFER_DTYPES, BatchItem, LayerKV, RunnerCapabilities, kv_shape
from backends.llamacpp import kv_transfer as kvt
from backends.llamacpp import runtime
from backends.llamacpp.batch import TokenBatch
from backends.llamacpp.embedder import LlamaEmbedder
from backends.llamacpp.exact import library_is_exact
from backends.llamacpp.exact import resolve as resolve_exact
from backends.llamacpp.kv_plan import (
    check_args,
    check_kv_cache_type,
    context_error,
    kv_budget_bytes,
    plan_kv,
)
from backends.llamacpp.memory import ContextMemory, blob_pointer
from backends.llamacpp.plain_prefill import PLAIN_PREFILL_MIN_TOKENS, PlainPrefill
from backends.llamacpp.repack import PLAIN_BUFFERS, RepackVerdict, repack_verdict
from backends.llamacpp.residency import PrefixResidency, SplitResidency, UnifiedResidency
from backends.llamacpp.runtime import default_threads
from backends.llamacpp.tokenizer import LlamaCppTokenizer

__all__ = ["BLOCK_SIZE", "LlamaCppRunner", "default_threads"]

# --flash-attn -> llama.cpp's `flash_attn_type`
FLASH_ATTN_TYPE = {
    "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
# --kv-cache-type -> llama.cpp's `type_k`/`type_v` (ggml_type)
GGML_KV_TYPE = {"f16": L.GGML_TYPE_F16, "q8_0": L.GGML_TYPE_Q8_0, "q4_0": L.GGML_TYPE_Q4_0}
# Tokens per engine block: the granularity of prefix-cache hits. Here blocks are only
# accounting (llama.cpp keeps KV in its own cells), so one token per block costs just
# bookkeeping and reuses a cached prefix to the token, as llama-server does: a repeated chat
# then computes only its last prompt token, not up to a block's worth (README, "tandem serve
# vs llama-server", for what that does to TTFT at 16 users).
BLOCK_SIZE = 1


def _plain_prefill_chunk(item: BatchItem) -> bool:
    """A prompt chunk for the plain weights: long enough to be faster there, and wanting at
    most its last token's logits (a chunk with other rows' logits stays in one step)."""
    n = len(item.tokens)
    return n >= PLAIN_PREFILL_MIN_TOKENS and item.logits_indices in ([], [n - 1])


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
        kv_layout: "split" | "unified" | "auto" (split, with as many of `max_seqs` slots as
            fit `split_kv_bytes`: `max_seqs` may come out smaller).
        split_kv_bytes: KV memory budget of "auto", bytes (default: `kv_budget_bytes` of
            this machine's memory).
        block_size: tokens per engine block (see BLOCK_SIZE).
        max_batch_tokens: most tokens one `execute` may carry (`n_batch`).
        n_threads: llama.cpp worker threads (default: CPUs available).
        flash_attn: "auto" | "on" | "off".
        repack: repacked weights (llama.cpp's extra CPU buffer types): "auto" (where this
            machine's cached probe says they run, `backends.llamacpp.repack`), "on", "off".
        kv_cache_type: "f16" | "q8_0" | "q4_0", K and V alike, in every context this runner
            creates (the plain-prefill one too: KV is copied between them as is). Quantized:
            flash attention "auto" becomes "on" (llama.cpp quantizes V only with it), "off"
            is refused; no KV transfer (two-box mode sends f16).
        exact: logits independent of how a step is grouped (`backends.llamacpp.exact`):
            flash attention and repacked weights off, split layout, f16 KV, and the llama.cpp
            library built without tinyBLAS (chosen before `llama_cpp` was imported).
    Attributes (besides the protocol's): `repack` (the verdict: whether, and why),
    `weight_buffers` ({llama.cpp buffer type: MiB}, e.g. CPU_REPACK, CPU_Mapped),
    `kv_cache_type`, `flash_attn` (as created) and `flash_attn_forced` (auto turned on for
    a quantized cache).
    Raises:
        FileNotFoundError: no such file. ValueError: llama.cpp cannot load it, or
        `kv_cache_type` with flash attention off (or rows not whole blocks of it), or
        `exact` with a setting it cannot keep or without the exact library loaded.
    """

    # truncate removes the positions from the slot's cells (`seq_rm`), so recomputing them
    # gives the logits of the first computation (tests/integration/test_llamacpp_truncate.py)
    capabilities = RunnerCapabilities(exact_truncate=True, kv_transfer=True)
    # whether llama.cpp saves V transposed in this context (learnt on first import)
    _kv_v_trans: bool | None = None
    _embedder: LlamaEmbedder | None = None  # made by `embedder` on first use

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_seqs: int = 64,
        kv_tokens: int | None = None,
        seq_tokens: int = 4096,
        kv_layout: str = "auto",
        split_kv_bytes: int | None = None,
        block_size: int = BLOCK_SIZE,
        max_batch_tokens: int = 512,
        n_threads: int | None = None,
        flash_attn: str = "auto",
        repack: str = "auto",
        kv_cache_type: str = "f16",
        exact: bool = False,
        verbose: bool = False,
    ):
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        check_args(max_seqs, kv_layout)
        self.exact = exact
        if exact:
            flash_attn, repack = resolve_exact(flash_attn=flash_attn, repack=repack,
                                               kv_cache_type=kv_cache_type,
                                               kv_layout=kv_layout)
            if not library_is_exact(L.llama_print_system_info().decode()):
                raise ValueError("--exact needs the llama.cpp library built without "
                                 "tinyBLAS, and this process loaded the default one (the "
                                 "CLI picks it with --exact; in Python call backends."
                                 "llamacpp.exact.select_library() before importing llama_cpp)")
        resolved = check_kv_cache_type(kv_cache_type, flash_attn)
        self.kv_cache_type = kv_cache_type
        self.flash_attn, self.flash_attn_forced = resolved, resolved != flash_attn
        runtime.init_backend(verbose)
        self._embedder_lock = threading.Lock()
        self._flash_attn_type = FLASH_ATTN_TYPE[self.flash_attn]
        self.repack = repack_verdict(path, repack)
        if exact:  # say why: the user may not have asked for "off"
            self.repack = RepackVerdict(False, "--exact")
        self._model, self.weight_buffers = runtime.load_model(path, self.repack.repack)
        self.block_size = block_size
        self.max_seqs = max_seqs
        self.max_batch_tokens = max_batch_tokens
        self.n_threads = n_threads or default_threads()
        self._threads_wanted = self._threads_now = self.n_threads  # `yield_core`
        try:
            kv_bytes = runtime.kv_bytes_per_token(self._model, kv_cache_type)
        except ValueError:
            self.close()
            raise
        if split_kv_bytes is None:
            split_kv_bytes = kv_budget_bytes(runtime.physical_memory_bytes())
        self.kv_budget_bytes = split_kv_bytes
        plan = plan_kv(max_seqs=max_seqs, seq_tokens=seq_tokens, kv_tokens=kv_tokens,
                       kv_layout=kv_layout, block_size=block_size,
                       max_batch_tokens=max_batch_tokens,
                       n_ctx_train=L.llama_model_n_ctx_train(self._model),
                       kv_bytes_per_token=kv_bytes, split_kv_bytes=split_kv_bytes)
        self.kv_layout = plan.layout
        self.max_seqs = plan.max_seqs
        self.kv_bytes = plan.n_ctx * kv_bytes  # KV allocated, bytes
        # split: llama.cpp micro-batches sequences of unequal lengths apart (split_equal)
        # kv_transfer: export_kv/import_kv below (tests/integration/test_llamacpp_kv_transfer.py),
        # f16 (the neutral layout) and q8_0 (its blocks as they are); not q4_0
        self.capabilities = RunnerCapabilities(exact_truncate=True,
                                               kv_transfer=kv_cache_type in KV_TRANSFER_DTYPES,
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
        cp.flash_attn_type = FLASH_ATTN_TYPE[self.flash_attn]
        cp.type_k = cp.type_v = GGML_KV_TYPE[kv_cache_type]
        cp.n_outputs_max = max_batch_tokens
        self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            L.llama_model_free(self._model)
            self._model = None  # close() must not free it again
            raise ValueError(context_error(plan, str(path), kv_bytes))

        self.tokenizer = LlamaCppTokenizer(self._model)
        self.info = runtime.model_info(self._model, path.stem, self.tokenizer.n_vocab)
        self._batch = TokenBatch(max_batch_tokens)
        self._memory = memory = ContextMemory(self._ctx)
        # parked prefixes may take as much host memory as the KV buffer itself, no more
        self.residency: PrefixResidency = (
            SplitResidency(memory, max_seqs, block_size, max_saved_bytes=self.kv_bytes)
            if plan.layout == "split"
            else UnifiedResidency(memory, max_seqs, block_size, scratch=plan.scratch_seq,
                                  max_saved_bytes=self.kv_bytes))
        # repacked weights prefill slower than plain ones: large chunks go to a plain copy
        # (backends/llamacpp/plain_prefill.py); split layout only, where a slot is a stream
        self.plain_prefill: PlainPrefill | None = None
        if plan.layout == "split" and set(self.weight_buffers) - set(PLAIN_BUFFERS):
            try:
                self.plain_prefill = PlainPrefill(
                    path, plan.n_seq_max, plan.max_seq_tokens, self.n_threads,
                    FLASH_ATTN_TYPE[self.flash_attn], max_batch_tokens,
                    GGML_KV_TYPE[kv_cache_type])
            except ValueError:
                self.close()
                raise

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value of the model as text (None if it has no such key)."""
        return runtime.meta(self._model, key)

    @property
    def n_params(self) -> int:
        """The model's parameter count (llama.cpp's `llama_model_n_params`)."""
        return int(L.llama_model_n_params(self._model))

    def yield_core(self, on: bool) -> None:
        """While `on`, steps compute with one thread fewer (at least one), so a model load
        running beside them gets a core of its own instead of stalling their barriers (a
        spinning llama.cpp worker descheduled holds up the whole step). Applied on the step
        thread at the next `execute`; `on=False` restores `n_threads`. Thread-safe."""
        self._threads_wanted = max(1, self.n_threads - 1) if on else self.n_threads

    def _apply_threads(self) -> None:
        n = self._threads_wanted
        if n != self._threads_now:
            L.llama_set_n_threads(self._ctx, n, n)
            if self.plain_prefill is not None:
                self.plain_prefill.set_threads(n)
            self._threads_now = n

    def execute(self, items: list[BatchItem]) -> np.ndarray:
        self._apply_threads()
        self.residency.before_compute()
        plain = self.plain_prefill
        if plain is not None and any(_plain_prefill_chunk(i) for i in items):
            return self._execute_with_plain_prefill(items, plain)
        self._batch.fill(items, slot_order=self.kv_layout == "split")
        for item in items:
            if plain is not None:
                plain.forget(item.slot)
            self.residency.note_computed(item.slot, item.block_table,
                                         item.start_pos + len(item.tokens))
        rc = L.llama_decode(self._ctx, self._batch.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        return self._batch.logits(self._ctx, self.info.n_vocab)

    def _execute_with_plain_prefill(self, items: list[BatchItem], plain: PlainPrefill
                                    ) -> np.ndarray:
        """`execute` with prefill chunks of `PLAIN_PREFILL_MIN_TOKENS` or more computed on
        the plain weights, and the rest (decodes, drafts, short chunks) in one step here.
        A prompt's last chunk leaves its last token to this step, as a one-token item: the
        first output token's logits then come from the same kernels whether the prompt was
        computed or restored from the prefix cache. Returns a new `[rows, n_vocab]` array
        in item order."""
        parts: list[np.ndarray | None] = [None] * len(items)
        here: list[tuple[int, BatchItem]] = []
        for k, item in enumerate(items):
            if _plain_prefill_chunk(item):
                head = item
                if item.logits_indices:
                    head = BatchItem(item.slot, item.tokens[:-1], item.start_pos,
                                     item.block_table)
                    here.append((k, BatchItem(item.slot, item.tokens[-1:],
                                              item.start_pos + len(head.tokens),
                                              item.block_table, [0])))
                parts[k] = plain.compute(head, self._memory)
            else:
                here.append((k, item))
            self.residency.note_computed(item.slot, item.block_table,
                                         item.start_pos + len(item.tokens))
        if here:
            for _, item in here:
                plain.forget(item.slot)
            self._batch.fill([item for _, item in here], slot_order=True)
            rc = L.llama_decode(self._ctx, self._batch.batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc}")
            logits = self._batch.logits(self._ctx, self.info.n_vocab)
            row = 0
            for k, item in here:
                n = len(item.logits_indices)
                parts[k] = logits[row:row + n]
                row += n
        return np.concatenate(parts, axis=0)

    def _forget(self, slot: int) -> None:
        if self.plain_prefill is not None:
            self.plain_prefill.forget(slot)

    def share_blocks(self, slot: int, block_ids: list[int]) -> int:
        self._forget(slot)
        return self.residency.share_blocks(slot, block_ids)

    def release(self, slot: int, n_keep_blocks: int) -> None:
        self._forget(slot)
        self.residency.release(slot, n_keep_blocks)

    def evict(self, block_ids: list[int]) -> None:
        self.residency.evict(block_ids)

    def truncate(self, slot: int, n_tokens: int) -> None:
        self._forget(slot)
        self.residency.truncate(slot, n_tokens)

    # -- KV transfer (two-box mode): llama.cpp state blobs <-> neutral layout (kv_transfer) --

    def _kv_facts(self) -> tuple[bool, int]:
        """(K stored interleaved per head, rotary dims per head). Raises ValueError for rope
        types without a neutral layout."""
        interleaved = kvt.rope_interleaved(L.llama_model_rope_type(self._model))
        n_rot = runtime.meta(self._model, f"{self.info.architecture}.rope.dimension_count")
        return interleaved, int(n_rot) if n_rot else self.info.head_dim

    def _check_kv_transfer_type(self) -> None:
        if self.kv_cache_type not in KV_TRANSFER_DTYPES:
            raise ValueError(f"KV transfer takes an f16 or q8_0 KV cache; this runner's is "
                             f"{self.kv_cache_type}")

    def _check_cover(self, block_table: list[int], start: int, n: int) -> None:
        if start < 0 or n < 0 or len(block_table) * self.block_size < start + n:
            raise ValueError(f"block table of {len(block_table)} blocks does not cover "
                             f"positions {start}..{start + n - 1}")

    def export_kv(self, slot: int, block_table: list[int], start: int, n: int
                  ) -> list[LayerKV]:
        """K/V of positions `start .. start+n-1` of `slot`: per layer (K, V), each
        `[n, kv_heads, head_dim]` float16, K post-RoPE in the rotate-half convention; with a
        q8_0 cache its blocks `[n, kv_heads * head_dim / 32]` (`backends.base.Q8_0_BLOCK`),
        K in the cache's order.

        Copies the slot's whole state out of llama.cpp (`llama_state_seq_get_data`), then
        the range. Raises ValueError if `block_table` or the slot's KV does not cover the
        range, or the KV is neither f16 nor q8_0; RuntimeError if llama.cpp cannot save it."""
        self._check_kv_transfer_type()
        self._check_cover(block_table, start, n)
        interleaved, n_rot = self._kv_facts()
        blob = ContextMemory(self._ctx).state_get(slot)
        state = kvt.parse_state(blob, self.info.n_kv_heads, self.info.head_dim)
        return kvt.to_neutral(state, start, n, interleaved, n_rot)

    def import_kv(self, slot: int, block_table: list[int], start: int,
                  kv: list[LayerKV]) -> None:
        """Write neutral per-layer K/V `[n, kv_heads, head_dim]` float16 (q8_0 blocks, as
        `export_kv` gives them, with a q8_0 cache) into positions `start .. start+n-1` of
        `slot`, which must hold exactly positions `0 .. start-1`.

        Split layout: the slot's state is reloaded whole (its old cells + the new ones),
        because llama.cpp's load clears its destination first. Unified: the new cells are
        loaded into the scratch sequence and tagged into the slot (no copy of the prefix).
        The slot then holds `block_table`'s blocks up to `start+n` (as after `execute`).
        Raises ValueError on a layer count, shape or coverage mismatch; RuntimeError if
        llama.cpp refuses the state."""
        self._check_kv_transfer_type()
        if len(kv) != self.info.n_layers:
            raise ValueError(f"expected {self.info.n_layers} layers, got {len(kv)}")
        n = kv[0][0].shape[0]
        want = kv_shape(self.kv_cache_type, n, self.info.n_kv_heads, self.info.head_dim)
        dtype = KV_TRANSFER_DTYPES[self.kv_cache_type]
        if any(k.shape != want or v.shape != want or k.dtype != dtype or v.dtype != dtype
               for k, v in kv):
            raise ValueError(f"K and V must be {self.kv_cache_type} of shape {want} per layer")
        self._check_cover(block_table, start, n)
        self._forget(slot)
        mem = L.llama_get_memory(self._ctx)
        if L.llama_memory_seq_pos_max(mem, slot) != start - 1 or (
                start and L.llama_memory_seq_pos_min(mem, slot) != 0):
            raise ValueError(f"slot {slot} must hold exactly positions 0..{start - 1}")
        interleaved, n_rot = self._kv_facts()
        memory = ContextMemory(self._ctx)
        if self.kv_layout == "split":
            head = kvt.parse_state(memory.state_get(slot), self.info.n_kv_heads,
                                   self.info.head_dim)
            if head.stream is not None:
                self._kv_v_trans = head.v_trans
            # the slot's own (possibly empty) state says how many streams the context has
            tail = kvt.from_neutral(kv, start, seq_id=slot, n_stream=head.n_stream,
                                    stream=slot, v_trans=bool(self._kv_v_trans),
                                    interleaved=interleaved, n_rot=n_rot)
            self._load_state(slot, kvt.concat_states(head, tail))
        else:
            scratch = self.residency.scratch
            tail = kvt.from_neutral(kv, start, seq_id=scratch, n_stream=1, stream=0,
                                    v_trans=bool(self._kv_v_trans),
                                    interleaved=interleaved, n_rot=n_rot)
            self._load_state(scratch, tail)
            memory.seq_cp(scratch, slot, -1, -1)
            memory.seq_rm(scratch, -1, -1)
        self.residency.before_compute()  # a copy of the slot taken this step is stale
        self.residency.note_computed(slot, block_table, start + n)

    def _load_state(self, seq: int, state: kvt.SeqState) -> None:
        # llama.cpp refuses a blob whose v_trans differs from the context's, and does not
        # say how "auto" flash attention resolved (on: V untransposed): until a load has
        # succeeded, try both (a quantized V is never transposed: it needs flash attention).
        # A refused load only cleared `seq`, which is rewritten whole.
        tries = ([self._kv_v_trans] if self._kv_v_trans is not None
                 else [False] if self.kv_cache_type != "f16" else [False, True])
        for v_trans in tries:
            state.v_trans = v_trans
            blob = kvt.build_state(state)
            if L.llama_state_seq_set_data(self._ctx, blob_pointer(blob), len(blob),
                                          seq) == len(blob):
                self._kv_v_trans = v_trans
                return
        raise RuntimeError("llama.cpp refused the imported KV state")

    def embedder(self, max_tokens: int) -> LlamaEmbedder:
        """The model's embedder (`backends.base.Embedder`): a context of its own on these
        weights (the plain copy's where large prefill chunks go there: embedding is all
        prefill), made on the first call with inputs of up to `max_tokens` tokens (capped,
        see `backends.llamacpp.embedder`). Raises ValueError if the model cannot embed."""
        with self._embedder_lock:
            if self._embedder is None:
                plain = self.plain_prefill
                model = plain.model if plain is not None else self._model
                self._embedder = LlamaEmbedder(model, self.tokenizer, max_tokens,
                                               self.n_threads, self._flash_attn_type)
            return self._embedder

    @property
    def saved_bytes(self) -> int:
        """Host memory held by saved prefixes (bytes)."""
        return self.residency.saved_bytes

    def close(self) -> None:
        if self._embedder is not None:  # before the weights it runs on
            self._embedder.close()
            self._embedder = None
        if getattr(self, "plain_prefill", None) is not None:
            self.plain_prefill.close()
            self.plain_prefill = None
        runtime.free_native(self)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
