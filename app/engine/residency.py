"""KV residency mirrored onto a draft model's runner.

The draft runner keeps the same slots and block ids as the target, so every residency call
the scheduler makes (prefix hits, releases, evictions, rollbacks) reaches both. The draft may
hold fewer positions of a slot than the target (it computes only when it drafts), so this
object tracks how many it holds and never lets it keep or restore more than it computed.
"""

from __future__ import annotations

from backends.base import KVResidency


class MirroredResidency:
    """`KVResidency` for a target and a draft runner with the same block size.

    `draft_tokens[slot]` is how many leading positions of `slot` the draft runner holds; the
    draft proposer advances it as it computes.
    """

    def __init__(self, target: KVResidency, draft: KVResidency, block_size: int):
        self.target = target
        self.draft = draft
        self.block_size = block_size
        self.draft_tokens: dict[int, int] = {}

    def share_blocks(self, slot: int, block_ids: list[int]) -> int:
        n = self.target.share_blocks(slot, block_ids)
        n_draft = self.draft.share_blocks(slot, block_ids[:n]) if n else 0
        self.draft_tokens[slot] = n_draft * self.block_size
        return n

    def release(self, slot: int, n_keep_blocks: int) -> None:
        self.target.release(slot, n_keep_blocks)
        held = self.draft_tokens.pop(slot, 0) // self.block_size
        self.draft.release(slot, min(n_keep_blocks, held))

    def evict(self, block_ids: list[int]) -> None:
        self.target.evict(block_ids)
        self.draft.evict(block_ids)

    def truncate(self, slot: int, n_tokens: int) -> None:
        self.target.truncate(slot, n_tokens)
        if self.draft_tokens.get(slot, 0) > n_tokens:
            self.draft.truncate(slot, n_tokens)
            self.draft_tokens[slot] = n_tokens
