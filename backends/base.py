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
from typing import Protocol

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


class Runner(Protocol):
    """A model runner: executes batched steps and manages per-slot KV."""

    info: ModelInfo
    tokenizer: Tokenizer
    max_seqs: int  # slots available
    num_blocks: int  # KV capacity in blocks
    block_size: int  # tokens per block
    max_seq_tokens: int  # most KV tokens one slot can hold

    def execute(self, items: list[BatchItem]) -> np.ndarray:
        """Compute one step; returns float32 logits `[sum(len(i.logits_indices)), n_vocab]`,
        rows in item order, then index order. The array may be a view valid until the next call.
        Raises RuntimeError if the backend fails."""
        ...

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
        """Keep only the first `n_tokens` positions of `slot` (rolls back rejected drafts)."""
        ...

    def close(self) -> None:
        ...
