"""The seam between the engine and the hardware: what a model runner must provide.

The engine (`app/engine`) talks only to these protocols, so its scheduler, block manager and
sampler run in tests against a fake runner.

Sequences live in *slots* (`0 <= slot < Runner.max_seqs`). The engine owns the paged KV
accounting (block ids, `block_size` tokens each); a runner either stores KV in a pool indexed
by those block ids (MLX) or maps them onto its own storage (llama.cpp: cells tagged per slot,
idle cached prefixes saved to host memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(slots=True)
class ModelInfo:
    """Model facts: name, shape, vocabulary and context length (tokens)."""

    name: str
    architecture: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    rope_theta: float | None = None


@dataclass(slots=True)
class BatchItem:
    """One sequence's share of a step.

    `tokens` are computed at positions `start_pos .. start_pos+len(tokens)-1` of the sequence
    in `slot`; `block_table` lists the engine's KV blocks covering positions `0 ..
    start_pos+len(tokens)-1` (block i holds positions `i*block_size ..`). `logits_indices`
    are indices into `tokens` whose next-token logits are wanted.
    """

    slot: int
    tokens: list[int]
    start_pos: int
    block_table: list[int]
    logits_indices: list[int] = field(default_factory=list)


class Tokenizer(Protocol):
    """Tokenizer of a model. Token ids are ints in `[0, n_vocab)`."""

    bos_id: int | None
    eos_ids: set[int]  # end-of-generation tokens (EOS and EOT)
    chat_template: str | None

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Tokenize `text`; `parse_special=False` makes `<|im_end|>` in text plain characters."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token as it appears in output text (may be part of a character)."""
        ...

    def token_text(self, token_id: int) -> str:
        """Text of one token including control tokens' markup (for chat templates)."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        """Text of a token sequence (invalid UTF-8 replaced)."""
        ...


def shared_pool_tokens(seq_tokens: int) -> int:
    """Default KV tokens of a pool shared by all sequences (llama.cpp unified, MLX): room for
    two full-length sequences, at least 16384."""
    return max(2 * seq_tokens, 16384)


KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
AUTO_ON_OFF = ("auto", "on", "off")  # --flash-attn, --repack


def quantized_v_needs_flash_attn(kv_cache_type: str) -> str:
    """The refusal of a quantized KV cache with flash attention off (one line)."""
    return (f"--kv-cache-type {kv_cache_type} needs flash attention (llama.cpp quantizes the "
            "V cache only with it), which is off")


@dataclass(frozen=True, slots=True)
class RunnerCapabilities:
    """What a runner can do exactly; the engine never relies on a missing capability.

    exact_truncate: after `truncate(slot, n)` the slot's KV equals that of a sequence that
        never computed positions >= n, so recomputing them gives bit-identical logits. The
        engine speculates (computes drafts it may roll back) only on such runners.
    kv_transfer: `export_kv`/`import_kv` (`SupportsKVTransfer`) are implemented.
    equal_split: a step whose sequences compute different token counts runs as several
        micro-batches, each taking an equal count from every sequence still left
        (llama.cpp's split KV layout, `split_equal`), so it costs one pass per distinct
        count; otherwise a step costs about what its total token count costs.
    """

    exact_truncate: bool = False
    kv_transfer: bool = False
    equal_split: bool = False


class KVResidency(Protocol):
    """Where cached prefixes live, as the scheduler and block manager tell it.

    One interface so that a second runner (a draft model) can receive the same calls as the
    target (`app.engine.residency.CompositeResidency`). Invariants:
    - every call comes from the engine's step thread;
    - `share_blocks` may answer fewer blocks than asked only where blocks are accounting
      (llama.cpp); the engine then recomputes the rest into the same, already allocated,
      blocks;
    - `truncate(slot, n)` drops positions >= n of that slot and nothing else.
    """

    def share_blocks(self, slot: int, block_ids: list[int]) -> int:
        """Make cached blocks (already computed, possibly by other slots) the first blocks
        of `slot`, whose KV must be empty. No compute. Returns how many leading blocks of
        `block_ids` are now the slot's (fewer when no single source holds them all; the
        engine computes the rest)."""
        ...

    def release(self, slot: int, n_keep_blocks: int) -> None:
        """The slot's sequence is done and the slot is free again. Its first `n_keep_blocks`
        blocks are in the prefix cache: keep their KV restorable until `evict`."""
        ...

    def evict(self, block_ids: list[int]) -> None:
        """These cached blocks will be reused for other data: drop their KV."""
        ...

    def truncate(self, slot: int, n_tokens: int) -> None:
        """Keep only the first `n_tokens` positions of `slot` (rolls back rejected drafts).
        Exact only where `capabilities.exact_truncate` says so."""
        ...


class ModelRunner(Protocol):
    """Executes batched steps of one model: facts, tokenizer, sizes, `execute`."""

    info: ModelInfo
    tokenizer: Tokenizer
    capabilities: RunnerCapabilities
    max_seqs: int  # slots available
    num_blocks: int  # KV capacity in blocks
    block_size: int  # tokens per block
    max_seq_tokens: int  # most KV tokens one slot can hold

    def execute(self, items: list[BatchItem]) -> np.ndarray:
        """Compute one step; returns float32 logits `[sum(len(i.logits_indices)), n_vocab]`,
        rows in item order, then index order. The array may be a view valid until the next call.
        Raises RuntimeError if the backend fails."""
        ...

    def close(self) -> None:
        ...


class Runner(ModelRunner, KVResidency, Protocol):
    """What the engine drives: a model runner that also keeps its slots' KV residency."""


# Per layer (K, V), each `[tokens, kv_heads, head_dim]` float16, rotary embedding applied in
# the rotate-half (Hugging Face) convention: DESIGN.md's backend-neutral KV layout. A q8_0 KV
# cache moves as its blocks instead (`Q8_0_BLOCK`, below).
LayerKV = tuple[np.ndarray, np.ndarray]

# llama.cpp's block_q8_0 (ggml-common.h): 32 values as one f16 scale `d` and 32 int8 quants,
# value = d * q; 34 bytes. q8_0 KV moves as `[tokens, kv_heads * head_dim / 32]` blocks with K
# in llama.cpp's cache order (NORM-rope pairs interleaved per head: reordering a head's values
# would cross blocks), so only llama.cpp runners exchange it, and only bytes are copied.
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
KV_TRANSFER_DTYPES = {"f16": np.dtype("<f2"), "q8_0": Q8_0_BLOCK}  # KV cache type -> layout


def kv_row_bytes(dtype: str, width: int) -> int:
    """Bytes of one token's K (or V) of `width` = kv_heads * head_dim values in KV `dtype`
    ("f16": 2 per value; "q8_0": 34 per 32). Raises ValueError for another dtype, or for q8_0
    when `width` is not a multiple of 32."""
    if dtype == "f16":
        return 2 * width
    if dtype == "q8_0":
        if width % 32:
            raise ValueError(f"q8_0 KV needs kv_heads * head_dim divisible by 32, not {width}")
        return width // 32 * Q8_0_BLOCK.itemsize
    raise ValueError(f"KV dtype {dtype!r} cannot be transferred (f16 or q8_0)")


def kv_dtype_of(a: np.ndarray) -> str:
    """The KV dtype name ("f16" or "q8_0") of a `LayerKV` array. Raises ValueError."""
    for name, dt in KV_TRANSFER_DTYPES.items():
        if a.dtype == dt:
            return name
    raise ValueError(f"KV arrays must be float16 or q8_0 blocks, not {a.dtype}")


def kv_shape(dtype: str, n: int, n_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    """Shape of one layer's K (or V) of `n` tokens in KV `dtype` (see `LayerKV`,
    `Q8_0_BLOCK`). Raises ValueError as `kv_row_bytes`."""
    kv_row_bytes(dtype, n_kv_heads * head_dim)
    return (n, n_kv_heads, head_dim) if dtype == "f16" else (n, n_kv_heads * head_dim // 32)


@runtime_checkable
class SupportsKVTransfer(Protocol):
    """KV export/import in the neutral layout (`LayerKV`; a q8_0 cache's blocks as they are,
    `Q8_0_BLOCK`), for the two-box mode. A runner implementing it sets
    `capabilities.kv_transfer`."""

    def export_kv(self, slot: int, block_table: list[int], start: int, n: int) -> list[LayerKV]:
        """K/V of positions `start .. start+n-1` of `slot`, one `LayerKV` per layer.
        Raises ValueError if `block_table` does not cover them."""
        ...

    def import_kv(self, slot: int, block_table: list[int], start: int,
                  kv: list[LayerKV]) -> None:
        """Write per-layer K/V into positions `start ..` of `slot` (blocks of `block_table`).
        Raises ValueError on a layer count or shape mismatch."""
        ...


class Embedder(Protocol):
    """Sentence embeddings from a model (`/v1/embeddings`, `/api/embed`). A runner that can
    embed has `embedder(max_tokens) -> Embedder` (made on first call; ValueError if its
    model cannot embed); one that has no such method cannot.

    `n_embd`: floats per vector. `pooling`: how token states become one vector ("mean",
    "cls", "last"); `pooling_source`: "model" (the model declares it) or "default" (a causal
    LM declares none: the backend's choice). `max_tokens`: most tokens one input may have.
    `n_vocab`: token ids are in `[0, n_vocab)`.
    """

    n_embd: int
    pooling: str
    pooling_source: str
    max_tokens: int
    n_vocab: int

    def tokenize(self, text: str, limit: int | None = None) -> list[int]:
        """The input's tokens with the model's special tokens (BOS, CLS/SEP); with `limit`,
        cut to at most `limit` tokens, keeping those special tokens."""
        ...

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One L2-normalised vector per input (1 to `max_tokens` valid token ids each).
        Blocking and thread-safe; inputs do not affect each other's vectors. Raises
        RuntimeError if the backend fails."""
        ...


@dataclass(slots=True)
class RunnerConfig:
    """How to build a runner; one default for every entry point.

    Args:
        max_seqs: sequence slots (requests decoded together).
        seq_tokens: most tokens one sequence holds (context window per sequence).
        kv_tokens: KV tokens the engine's block pool accounts for (None: the runner's
            default, see `shared_pool_tokens`; llama.cpp split `max_seqs * seq_tokens`).
        kv_layout: llama.cpp: "split" | "unified" | "auto".
        block_size: tokens per engine block (None: the runner's own default).
        max_batch_tokens: most tokens one `execute` carries.
        n_threads: CPU threads (None: all available).
        flash_attn: llama.cpp: "auto" | "on" | "off".
        repack: llama.cpp: repacked weights "auto" (where a cached probe says this machine
            runs them) | "on" | "off" (backends/llamacpp/repack.py).
        kv_cache_type: KV cache values "f16" | "q8_0" | "q4_0" (llama.cpp `type_k` and
            `type_v`; a quantized V needs flash attention, so "auto" then means "on").
        exact: llama.cpp: logits independent of how steps are grouped
            (`backends.llamacpp.exact`: flash attention and repacking off, split layout).
    Raises ValueError (in `__post_init__`) for values out of range.
    """

    max_seqs: int = 32
    seq_tokens: int = 8192
    kv_tokens: int | None = None
    kv_layout: str = "auto"
    block_size: int | None = None
    max_batch_tokens: int = 512
    n_threads: int | None = None
    flash_attn: str = "auto"
    repack: str = "auto"
    kv_cache_type: str = "f16"
    exact: bool = False

    def __post_init__(self) -> None:
        for name in ("max_seqs", "seq_tokens", "max_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("kv_tokens", "block_size", "n_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.kv_layout not in ("auto", "split", "unified"):
            raise ValueError(f"kv_layout must be auto, split or unified, not {self.kv_layout!r}")
        if self.flash_attn not in AUTO_ON_OFF:
            raise ValueError(f"flash_attn must be auto, on or off, not {self.flash_attn!r}")
        if self.repack not in AUTO_ON_OFF:
            raise ValueError(f"repack must be auto, on or off, not {self.repack!r}")
        if self.kv_cache_type not in KV_CACHE_TYPES:
            raise ValueError(f"kv_cache_type must be f16, q8_0 or q4_0, not "
                             f"{self.kv_cache_type!r}")
        if self.kv_cache_type != "f16" and self.flash_attn == "off":
            raise ValueError(quantized_v_needs_flash_attn(self.kv_cache_type))
        if self.exact:
            from backends.llamacpp.exact import resolve

            resolve(flash_attn=self.flash_attn, repack=self.repack,
                    kv_cache_type=self.kv_cache_type, kv_layout=self.kv_layout)

