"""llama.cpp runner through llama-cpp-python's low-level API.

One `llama_context` with `max_seqs` sequence ids: sequences at different positions are decoded
together in one `llama_decode`. llama.cpp stores KV per token cell, each cell tagged with the
sequences that see it; the engine's blocks are accounting on top. Two KV layouts:
- "split" (llama.cpp `kv_unified=false`, what llama-server `-np N` uses): one KV stream per
  sequence, `seq_tokens` cells each. Each token attends over its own stream only: 1.05-1.2x
  faster decode at 16 sequences than unified (measured, SmolLM2, 2 threads, 40-600 token
  contexts). Costs `max_seqs * seq_tokens` cells up front; sharing a prefix copies it.
- "unified" (`kv_unified=true`): one pool of cells; a shared prefix is one set of cells
  tagged with several sequences (no copy), but every token attends (masked) over the cells
  of all sequences. Used when the split layout would not fit the KV memory budget.

Where a cached block's KV lives:
- in running slots: sharing it adds the new slot's tag to those cells (unified:
  `llama_memory_seq_cp`, no copy) or copies the source's cells through host memory (split:
  `llama_state_seq_get_data` / `set_data`, then `seq_rm` past the prefix); freeing removes a
  tag (`llama_memory_seq_rm`);
- once no running sequence holds it, in host memory: a finished sequence's cached prefix is
  saved with `llama_state_seq_get_data` and its cells are freed. Idle KV must not stay in
  the buffer: llama.cpp attends over every cell up to the highest one in use, so parked
  prefixes would slow every decode (measured: 2x on SmolLM2 with 4k parked cells). A hit is
  restored with `llama_state_seq_set_data`: split, straight into the slot's stream; unified,
  into a scratch sequence whose cells are then tagged into the slot (set_data first clears
  its destination, so runs from several sources cannot be appended directly).
Facts relied on: shared/notes/llamacpp.md §1-2.
"""

from __future__ import annotations

import ctypes
import os
from itertools import pairwise
from pathlib import Path

import llama_cpp as L
import numpy as np

from backends.base import BatchItem, ModelInfo, shared_pool_tokens
from backends.llamacpp.tokenizer import LlamaCppTokenizer

_FLASH_ATTN = {
    "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
_log_silencer = L.llama_log_callback(lambda level, text, user: None)
_backend_ready = False


def _init_backend(verbose: bool) -> None:
    global _backend_ready
    if not _backend_ready:
        if not verbose:
            L.llama_log_set(_log_silencer, ctypes.c_void_p())
        L.llama_backend_init()
        _backend_ready = True


def default_threads() -> int:
    """Worker threads for llama.cpp: the CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 4


SPLIT_KV_BYTES = 2 << 30  # "auto" layout budget: 2 GiB of KV (f16) for the split streams
# Tokens per engine block: the granularity of prefix-cache hits. Here blocks are only
# accounting (llama.cpp keeps KV in its own cells), so finer blocks cost just bookkeeping and
# reuse more of a shared prefix (llama-server reuses to the token): a 26-token common chat
# prefix hits 24 tokens, not 16, saving ~25 ms of TTFT per request on the CI machine.
BLOCK_SIZE = 8


def _kv_bytes_per_token(model: L.llama_model_p) -> int:
    """f16 K and V bytes one token takes across all layers."""
    n_head = max(1, L.llama_model_n_head(model))
    head_dim = L.llama_model_n_embd(model) // n_head
    return 2 * 2 * L.llama_model_n_layer(model) * L.llama_model_n_head_kv(model) * head_dim


def _meta(model: L.llama_model_p, key: str) -> str | None:
    buf = ctypes.create_string_buffer(512)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", errors="replace") if n >= 0 else None


def _common_prefix(blocks: list[int | None], block_ids: list[int]) -> int:
    n = 0
    while n < len(blocks) and n < len(block_ids) and blocks[n] == block_ids[n]:
        n += 1
    return n


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
        if not 1 <= max_seqs <= 255:
            raise ValueError("max_seqs must be in 1..255 (llama.cpp allows 256 sequences)")
        if kv_layout not in ("split", "unified", "auto"):
            raise ValueError(f"kv_layout must be split, unified or auto, not {kv_layout!r}")
        _init_backend(verbose)
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = False  # AMX repacking crashes on CPUs whose kernel refuses AMX tiles
        self._model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {path} (not a GGUF model it supports?)")
        self.block_size = block_size
        self.max_seqs = max_seqs
        self.max_batch_tokens = max_batch_tokens
        self.n_threads = n_threads or default_threads()
        n_ctx_train = L.llama_model_n_ctx_train(self._model)
        seq_tokens = -(-min(seq_tokens, n_ctx_train) // 256) * 256  # llama.cpp pads to 256
        kv_bytes = _kv_bytes_per_token(self._model)
        if kv_layout == "auto":
            fits = max_seqs * seq_tokens * kv_bytes <= split_kv_bytes
            kv_layout = "split" if fits else "unified"
        self.kv_layout = kv_layout

        cp = L.llama_context_default_params()
        if kv_layout == "split":
            # one stream per sequence; cached prefixes live in host memory, so no spare
            # sequence ids: the block pool only bounds how much of them is kept
            self.max_seq_tokens = seq_tokens
            self.num_blocks = (kv_tokens or max_seqs * seq_tokens) // block_size
            cp.n_ctx = max_seqs * seq_tokens
            cp.n_seq_max = max_seqs
            cp.kv_unified = False
        else:
            self.num_blocks = max(1, (kv_tokens or shared_pool_tokens(seq_tokens)) // block_size)
            self.max_seq_tokens = self.num_blocks * block_size
            # slack beyond the accounted blocks: llama.cpp places a ubatch in free cells itself
            cp.n_ctx = self.num_blocks * block_size + max_batch_tokens
            cp.n_seq_max = max_seqs + 1  # the last sequence id is the restore scratch
            cp.kv_unified = True
        cp.n_batch = max_batch_tokens
        cp.n_ubatch = min(512, max_batch_tokens)
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = _FLASH_ATTN[flash_attn]
        cp.n_outputs_max = max_batch_tokens
        self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            L.llama_model_free(self._model)
            self._model = None  # close() must not free it again
            gib = cp.n_ctx * kv_bytes / 2**30
            raise ValueError(
                f"llama.cpp could not create a context for {path} ({kv_layout} KV cache of "
                f"{cp.n_ctx} tokens, {gib:.1f} GiB): lower the concurrency or --ctx-size"
                + (", or use --kv-layout unified" if kv_layout == "split" else ""))
        self._mem = L.llama_get_memory(self._ctx)

        self.tokenizer = LlamaCppTokenizer(self._model)
        n_layers = L.llama_model_n_layer(self._model)
        n_head = L.llama_model_n_head(self._model)
        self.info = ModelInfo(
            name=_meta(self._model, "general.name") or path.stem,
            architecture=_meta(self._model, "general.architecture") or "unknown",
            n_layers=n_layers,
            n_kv_heads=L.llama_model_n_head_kv(self._model),
            head_dim=L.llama_model_n_embd(self._model) // max(1, n_head),
            n_vocab=self.tokenizer.n_vocab,
            n_ctx_train=n_ctx_train,
        )
        self._init_batch(max_batch_tokens)
        self._scratch = max_seqs if kv_layout == "unified" else None
        # residency: which engine blocks each slot's cells hold (index i = positions i*bs..)
        self._slot_blocks: list[list[int | None]] = [[] for _ in range(max_seqs)]
        self._holders: dict[int, set[int]] = {}
        # saved prefixes in host memory: id -> (state blob, block ids by index)
        self._saved: dict[int, tuple[ctypes.Array, list[int | None]]] = {}
        self._saved_holders: dict[int, set[int]] = {}
        self._next_saved = 0
        # split layout: running slots' KV exported this step, to copy into newly admitted ones
        self._exports: dict[int, ctypes.Array] = {}

    def _init_batch(self, cap: int) -> None:
        # our own arrays behind a llama_batch: filled with numpy, no per-token ctypes calls
        self._tok = np.zeros(cap, dtype=np.int32)
        self._pos = np.zeros(cap, dtype=np.int32)
        self._nseq = np.ones(cap, dtype=np.int32)
        self._seq = np.zeros(cap, dtype=np.int32)
        self._want = np.zeros(cap, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        base = self._seq.ctypes.data
        self._seq_ptrs = (i32p * (cap + 1))(*[ctypes.cast(base + 4 * i, i32p) for i in range(cap)])
        self._batch = L.llama_batch(
            n_tokens=0,
            token=self._tok.ctypes.data_as(i32p),
            embd=None,
            pos=self._pos.ctypes.data_as(i32p),
            n_seq_id=self._nseq.ctypes.data_as(i32p),
            seq_id=self._seq_ptrs,
            logits=self._want.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    # -- compute ---------------------------------------------------------------------------

    def execute(self, items: list[BatchItem]) -> np.ndarray:
        self._exports.clear()  # the slots' KV changes now
        order = None
        if self.kv_layout == "split" and any(a.slot > b.slot for a, b in pairwise(items)):
            # llama.cpp builds a split-layout micro-batch from consecutive, increasing
            # sequence ids (`split_equal(sequential)`); out of order it splits into more
            order = sorted(range(len(items)), key=lambda i: items[i].slot)
            items = [items[i] for i in order]
        n = 0
        n_out = 0
        for item in items:
            k = len(item.tokens)
            if n + k > self.max_batch_tokens:
                raise ValueError(f"step of {n + k} tokens exceeds max_batch_tokens")
            self._tok[n:n + k] = item.tokens
            self._pos[n:n + k] = np.arange(item.start_pos, item.start_pos + k, dtype=np.int32)
            self._seq[n:n + k] = item.slot
            self._want[n:n + k] = 0
            for j in item.logits_indices:
                self._want[n + j] = 1
            n_out += len(item.logits_indices)
            n += k
            self._note_computed(item)
        self._batch.n_tokens = n
        rc = L.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        if n_out == 0:
            return np.empty((0, self.info.n_vocab), dtype=np.float32)
        ptr = L.llama_get_logits(self._ctx)
        logits = np.ctypeslib.as_array(ptr, shape=(n_out, self.info.n_vocab))
        if order is None:
            return logits
        # rows back in the caller's item order (a copy)
        starts = np.cumsum([0] + [len(it.logits_indices) for it in items])
        rows: list[range] = [range(0)] * len(items)
        for k, orig in enumerate(order):
            rows[orig] = range(starts[k], starts[k + 1])
        return logits[[r for rs in rows for r in rs]]

    def _note_computed(self, item: BatchItem) -> None:
        end = item.start_pos + len(item.tokens)
        n_blocks = -(-end // self.block_size)
        held = self._slot_blocks[item.slot]
        for i in range(len(held), n_blocks):
            block_id = item.block_table[i]
            held.append(block_id)
            self._holders.setdefault(block_id, set()).add(item.slot)

    # -- KV residency ----------------------------------------------------------------------

    def share_blocks(self, slot: int, block_ids: list[int]) -> int:
        held = self._slot_blocks[slot]
        if held:
            raise RuntimeError(f"slot {slot} is not empty")
        if self.kv_layout == "split":
            return self._copy_prefix(slot, block_ids)
        bs = self.block_size
        restored = None  # saved prefix currently loaded in the scratch sequence
        i = 0
        while i < len(block_ids):
            block_id = block_ids[i]
            if self._holders.get(block_id):
                src = next(iter(self._holders[block_id]))
                blocks = self._slot_blocks[src]
            else:
                saved_id = next(iter(self._saved_holders[block_id]))
                if restored != saved_id:
                    self._restore(saved_id)
                    restored = saved_id
                src, blocks = self._scratch, self._saved[saved_id][1]
            if not (i < len(blocks) and blocks[i] == block_id):
                raise RuntimeError(f"block {block_id} is not at index {i} of its source")
            j = i + 1  # extend the run while the same source holds the next block there
            while j < len(block_ids) and j < len(blocks) and blocks[j] == block_ids[j]:
                j += 1
            L.llama_memory_seq_cp(self._mem, src, slot, i * bs, j * bs)
            i = j
        if restored is not None:
            L.llama_memory_seq_rm(self._mem, self._scratch, -1, -1)
        self._hold(slot, block_ids)
        return len(block_ids)

    def _copy_prefix(self, slot: int, block_ids: list[int]) -> int:
        """Split layout: copy the longest run of `block_ids` one source holds from block 0
        (a running stream or a saved prefix) into `slot`'s stream. Returns blocks copied."""
        best, source = 0, None
        first = block_ids[0] if block_ids else None
        for src in self._holders.get(first, ()):
            n = _common_prefix(self._slot_blocks[src], block_ids)
            if n > best:
                best, source = n, src
        for saved_id in self._saved_holders.get(first, ()):
            n = _common_prefix(self._saved[saved_id][1], block_ids)
            if n > best:
                best, source = n, -1 - saved_id
        if source is None:
            return 0
        if source >= 0:
            # through host memory: llama.cpp's cross-stream seq_cp copies the whole stream
            # buffer (seq_tokens cells), this only the cells in use; one export serves every
            # slot admitted from the same source before it computes again
            blob = self._exports.get(source)
            if blob is None:
                blob = self._exports[source] = self._export(source)
        else:
            blob = self._saved[-1 - source][0]
        if L.llama_state_seq_set_data(self._ctx, blob, len(blob), slot) == 0:
            raise RuntimeError("llama.cpp refused to restore a saved prefix")
        L.llama_memory_seq_rm(self._mem, slot, best * self.block_size, -1)
        self._hold(slot, block_ids[:best])
        return best

    def _hold(self, slot: int, block_ids: list[int]) -> None:
        for block_id in block_ids:
            self._slot_blocks[slot].append(block_id)
            self._holders.setdefault(block_id, set()).add(slot)

    def _restore(self, saved_id: int) -> None:
        blob = self._saved[saved_id][0]
        if L.llama_state_seq_set_data(self._ctx, blob, len(blob), self._scratch) == 0:
            raise RuntimeError("llama.cpp refused to restore a saved prefix")

    def release(self, slot: int, n_keep_blocks: int) -> None:
        held = self._slot_blocks[slot]
        L.llama_memory_seq_rm(self._mem, slot, n_keep_blocks * self.block_size, -1)
        for block_id in held[n_keep_blocks:]:
            self._drop_holder(block_id, slot)
        del held[n_keep_blocks:]
        # save the prefix if this slot is the last place some cached block lives
        self._exports.pop(slot, None)
        if any(b is not None and self._holders[b] == {slot} and not self._saved_holders.get(b)
               for b in held):
            blob = self._export(slot)
            saved_id = self._next_saved
            self._next_saved += 1
            self._saved[saved_id] = (blob, list(held))
            for block_id in held:
                if block_id is not None:
                    self._saved_holders.setdefault(block_id, set()).add(saved_id)
        L.llama_memory_seq_rm(self._mem, slot, -1, -1)
        for block_id in held:
            self._drop_holder(block_id, slot)
        held.clear()

    def _export(self, slot: int) -> ctypes.Array:
        size = L.llama_state_seq_get_size(self._ctx, slot)
        blob = (ctypes.c_uint8 * size)()
        if L.llama_state_seq_get_data(self._ctx, blob, size, slot) != size:
            raise RuntimeError("llama.cpp could not save a sequence's KV")
        return blob

    def evict(self, block_ids: list[int]) -> None:
        bs = self.block_size
        for block_id in block_ids:
            for slot in self._holders.pop(block_id, ()):
                held = self._slot_blocks[slot]
                i = held.index(block_id)
                L.llama_memory_seq_rm(self._mem, slot, i * bs, (i + 1) * bs)
                held[i] = None
            for saved_id in self._saved_holders.pop(block_id, ()):
                blocks = self._saved[saved_id][1]
                blocks[blocks.index(block_id)] = None
                if not any(b is not None and saved_id in self._saved_holders.get(b, ())
                           for b in blocks):
                    del self._saved[saved_id]  # nothing hittable left in it

    @property
    def saved_bytes(self) -> int:
        """Host memory held by saved prefixes (bytes)."""
        return sum(len(blob) for blob, _ in self._saved.values())

    def truncate(self, slot: int, n_tokens: int) -> None:
        self._exports.pop(slot, None)
        held = self._slot_blocks[slot]
        L.llama_memory_seq_rm(self._mem, slot, n_tokens, -1)
        keep = -(-n_tokens // self.block_size)
        for block_id in held[keep:]:
            self._drop_holder(block_id, slot)
        del held[keep:]

    def _drop_holder(self, block_id: int | None, slot: int) -> bool:
        """Remove `slot` from the block's holders; True if no slot holds it any more."""
        if block_id is None:
            return False
        holders = self._holders.get(block_id)
        if holders is None:
            return False
        holders.discard(slot)
        if not holders:
            del self._holders[block_id]
            return True
        return False

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
