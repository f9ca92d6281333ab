"""KV layout and context sizing for the llama.cpp runner: pure arithmetic, no llama.cpp.

Two layouts of one `llama_context` holding `max_seqs` sequences:
- "split" (llama.cpp `kv_unified=false`, what llama-server `-np N` uses): one KV stream per
  sequence, `seq_tokens` cells each. Each token attends over its own stream only: 1.05-1.2x
  faster decode at 16 sequences than unified (measured, SmolLM2, 2 threads, 40-600 token
  contexts). Costs `max_seqs * seq_tokens` cells up front; sharing a prefix copies it.
- "unified" (`kv_unified=true`): one pool of cells; a shared prefix is one set of cells
  tagged with several sequences (no copy), but every token attends (masked) over the cells
  of all sequences, in an order that depends on where llama.cpp placed them: output can
  vary with batch composition and cache history. Only on request.

"auto" is split, with as many sequences as the KV memory budget (`kv_budget_bytes`, a
share of the machine's memory) holds: greedy and seeded output then do not depend on what
else the engine is doing.

KV cache types (`kv_cache_type`, llama.cpp's `type_k`/`type_v`): f16 (2 bytes a value), q8_0
(blocks of 32 values in 34 bytes: an f16 scale and 32 int8) and q4_0 (32 values in 18 bytes).
Every size here is in bytes of the chosen type.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.base import quantized_v_needs_flash_attn, shared_pool_tokens

LAYOUTS = ("split", "unified", "auto")
MAX_SEQS = 255  # llama.cpp allows 256 sequence ids; unified keeps one as the restore scratch
# "auto": the split streams may take this share of physical memory, at least the floor
KV_BUDGET_SHARE = 1 / 8
KV_BUDGET_FLOOR = 512 << 20


# KV cache type -> (values per block, bytes per block), ggml's `ggml_row_size` arithmetic
KV_BLOCKS: dict[str, tuple[int, int]] = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}


def kv_row_bytes(values: int, kv_cache_type: str = "f16") -> int:
    """Bytes of one cached K (or V) row of `values` values (a layer's kv_heads x head_dim)
    in `kv_cache_type`. Raises ValueError for an unknown type, or a row that is not whole
    blocks (llama.cpp cannot quantize it)."""
    if kv_cache_type not in KV_BLOCKS:
        raise ValueError(f"kv_cache_type must be f16, q8_0 or q4_0, not {kv_cache_type!r}")
    block_values, block_bytes = KV_BLOCKS[kv_cache_type]
    if values % block_values:
        raise ValueError(f"--kv-cache-type {kv_cache_type} stores blocks of {block_values} "
                         f"values; this model's K/V rows have {values}")
    return values // block_values * block_bytes


def kv_token_bytes(n_layers: int, n_kv_heads: int, head_dim: int,
                   kv_cache_type: str = "f16") -> int:
    """K and V bytes one token takes across all layers in `kv_cache_type` (SmolLM2-135M,
    30 layers x 3 heads x 64: f16 23040, q8_0 12240, q4_0 6480). Raises as `kv_row_bytes`."""
    return 2 * n_layers * kv_row_bytes(n_kv_heads * head_dim, kv_cache_type)


def check_kv_cache_type(kv_cache_type: str, flash_attn: str) -> str:
    """The flash attention setting a context with `kv_cache_type` KV gets: a quantized V
    cache needs flash attention (llama.cpp refuses it otherwise), so "auto" becomes "on".
    Raises ValueError for an unknown type, or a quantized type with flash attention off."""
    kv_row_bytes(0, kv_cache_type)  # the type's name
    if kv_cache_type == "f16":
        return flash_attn
    if flash_attn == "off":
        raise ValueError(quantized_v_needs_flash_attn(kv_cache_type))
    return "on"


def kv_budget_bytes(physical_memory: int) -> int:
    """KV memory the "auto" layout may allocate on a machine with `physical_memory` bytes."""
    return max(int(physical_memory * KV_BUDGET_SHARE), KV_BUDGET_FLOOR)


@dataclass(frozen=True, slots=True)
class KvPlan:
    """How to size the context, and what the engine may account for.

    layout: "split" | "unified". n_ctx: llama.cpp KV cells (tokens). n_seq_max: llama.cpp
    sequence ids. num_blocks: engine blocks the pool accounts for. max_seq_tokens: most
    tokens one sequence holds. scratch_seq: the sequence id restores go through (unified),
    else None. max_seqs: sequence slots the engine may use (fewer than asked when "auto"
    had to fit the budget).
    """

    layout: str
    n_ctx: int
    n_seq_max: int
    num_blocks: int
    max_seq_tokens: int
    scratch_seq: int | None
    max_seqs: int = 0


def check_args(max_seqs: int, kv_layout: str) -> None:
    """Raises ValueError for a slot count or layout name the runner cannot take."""
    if not 1 <= max_seqs <= MAX_SEQS:
        raise ValueError("max_seqs must be in 1..255 (llama.cpp allows 256 sequences)")
    if kv_layout not in LAYOUTS:
        raise ValueError(f"kv_layout must be split, unified or auto, not {kv_layout!r}")


def plan_kv(*, max_seqs: int, seq_tokens: int, kv_tokens: int | None, kv_layout: str,
            block_size: int, max_batch_tokens: int, n_ctx_train: int, kv_bytes_per_token: int,
            split_kv_bytes: int) -> KvPlan:
    """Size the context for `max_seqs` sequences of up to `seq_tokens` tokens each.

    seq_tokens is capped by `n_ctx_train` and rounded up to 256 (llama.cpp pads streams so).
    kv_layout "auto" is split with as many of the `max_seqs` sequences (at least one) as
    fit `split_kv_bytes` of KV at `kv_bytes_per_token` bytes per cell. kv_tokens: tokens the
    engine's block pool accounts for (default: split `max_seqs * seq_tokens`, unified
    `shared_pool_tokens(seq_tokens)`). The arguments are assumed valid (see `check_args`).
    """
    seq_tokens = -(-min(seq_tokens, n_ctx_train) // 256) * 256
    if kv_layout == "auto":
        kv_layout = "split"
        max_seqs = max(1, min(max_seqs, split_kv_bytes // (seq_tokens * kv_bytes_per_token)))
    if kv_layout == "split":
        # one stream per sequence; cached prefixes live in host memory, so no spare
        # sequence ids: the block pool only bounds how much of them is kept
        return KvPlan("split", n_ctx=max_seqs * seq_tokens, n_seq_max=max_seqs,
                      num_blocks=(kv_tokens or max_seqs * seq_tokens) // block_size,
                      max_seq_tokens=seq_tokens, scratch_seq=None, max_seqs=max_seqs)
    num_blocks = max(1, (kv_tokens or shared_pool_tokens(seq_tokens)) // block_size)
    # slack beyond the accounted blocks: llama.cpp places a ubatch in free cells itself
    return KvPlan("unified", n_ctx=num_blocks * block_size + max_batch_tokens,
                  n_seq_max=max_seqs + 1, num_blocks=num_blocks,
                  max_seq_tokens=num_blocks * block_size, scratch_seq=max_seqs,
                  max_seqs=max_seqs)


def context_error(plan: KvPlan, model: str, kv_bytes_per_token: int) -> str:
    """The message for a context llama.cpp could not allocate: its size, and what to lower."""
    gib = plan.n_ctx * kv_bytes_per_token / 2**30
    return (f"llama.cpp could not create a context for {model} ({plan.layout} KV cache of "
            f"{plan.n_ctx} tokens, {gib:.1f} GiB): lower the concurrency or --ctx-size"
            + (", or use --kv-layout unified" if plan.layout == "split" else ""))
