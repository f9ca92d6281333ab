"""Paged KV accounting: fixed-size blocks, reference counts, chained-hash prefix cache.

Invariants (tested in tests/unit/test_block_manager.py):
- a block is in the free queue iff its ref count is 0;
- a full block that holds verified tokens is identified by a chained hash (digest of the
  previous block's hash and this block's token ids), so equal hashes mean equal prefixes;
- freed blocks keep their hash and stay hittable until evicted, least recently used first;
  blocks with no hash are reused before any cached block;
- a prefix hit never covers the last token of a request (its logits must be computed);
- only verified tokens are hashed: `cache_full_blocks` is given at most the request's
  committed, verified token count, and `shrink` (rollback of rejected drafts) never drops a
  hashed block.

Design after vLLM v1's `KVCacheManager`/`BlockPool` and nano-vllm's `BlockManager`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

from app.engine.request import Request

BlockHash = bytes


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """Chained block hash: blake2b-128 of the parent's hash and the block's token ids."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class KVBlock:
    __slots__ = ("block_id", "ref_count", "block_hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: BlockHash | None = None


class BlockManager:
    """Allocates KV blocks to requests and serves prompt prefixes from freed blocks.

    Args:
        num_blocks: KV capacity in blocks.
        block_size: tokens per block (16 by default, as vLLM).
        enable_prefix_caching: register full blocks by hash and reuse them.
        on_evict: called with block ids whose cached content is about to be overwritten, so
            the runner can drop the KV it keeps for them.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        on_evict: Callable[[list[int]], None] | None = None,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.on_evict = on_evict
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # LRU order: the first entry is reused first. OrderedDict gives O(1) removal of a hit.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[BlockHash, int] = {}
        self.hit_tokens_total = 0

    # -- queries ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_hashes(self, token_ids: Sequence[int], num_blocks: int) -> list[BlockHash]:
        """Chained hashes of the first `num_blocks` full blocks of `token_ids`."""
        hashes: list[BlockHash] = []
        parent = None
        bs = self.block_size
        for i in range(num_blocks):
            parent = hash_block(parent, token_ids[i * bs:(i + 1) * bs])
            hashes.append(parent)
        return hashes

    def find_cached_prefix(self, token_ids: Sequence[int],
                           hashes: Sequence[BlockHash] = ()) -> list[int]:
        """Block ids of the longest cached prefix of `token_ids`, in order.

        Covers at most `len(token_ids) - 1` tokens so the last token is always computed.
        `hashes`: chained hashes of the leading full blocks of `token_ids`, if known (a
        request's prompt hashes), so they are not computed again.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (len(token_ids) - 1) // self.block_size
        hits: list[int] = []
        parent = None
        bs = self.block_size
        for i in range(max_blocks):
            parent = (hashes[i] if i < len(hashes)
                      else hash_block(parent, token_ids[i * bs:(i + 1) * bs]))
            block_id = self.cached.get(parent)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    # -- allocation ------------------------------------------------------------------------

    def can_allocate(self, request: Request, num_tokens: int, cached: Sequence[int] = ()) -> bool:
        """Whether `request` can grow to cover `num_tokens` positions (after taking `cached`)."""
        have = len(request.block_table) + len(cached)
        need = self.blocks_needed(num_tokens) - have
        # cached blocks that sit in the free queue stop being free once taken
        reclaimed = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        return need <= self.num_free_blocks - reclaimed

    def allocate(self, request: Request, num_tokens: int, cached: Sequence[int] = ()) -> bool:
        """Extend `request.block_table` to cover positions `0 .. num_tokens-1`.

        `cached` (only when the table is empty) are prefix-cache hits from
        `find_cached_prefix`; they are shared (ref count + 1), not copied. Returns False and
        changes nothing when there are not enough free blocks.
        """
        if cached and request.block_table:
            raise ValueError("cached blocks can only start an empty block table")
        if not self.can_allocate(request, num_tokens, cached):
            return False
        for block_id in cached:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
        if cached:
            request.block_table.extend(cached)
            request.num_hashed_blocks = len(cached)
            self.hit_tokens_total += len(cached) * self.block_size
        need = self.blocks_needed(num_tokens) - len(request.block_table)
        if need > 0:
            request.block_table.extend(self._take_free_blocks(need))
        return True

    def note_partial_hit(self, num_hit_blocks: int, num_served_blocks: int) -> None:
        """The runner served only `num_served_blocks` of the `num_hit_blocks` an `allocate`
        counted as prefix hits (the rest are recomputed into the same blocks): count only
        those served in `hit_tokens_total`."""
        if not 0 <= num_served_blocks <= num_hit_blocks:
            raise ValueError("served blocks must be within the hit")
        self.hit_tokens_total -= (num_hit_blocks - num_served_blocks) * self.block_size

    def shrink(self, request: Request, num_tokens: int) -> list[int]:
        """Roll back: keep only the blocks covering positions `0 .. num_tokens-1` and free the
        tail, last block first. Returns the freed block ids (in the order freed).

        Raises ValueError if that would drop a block registered in the prefix cache (only
        unverified positions, rejected drafts, may be rolled back).
        """
        keep = self.blocks_needed(num_tokens)
        if keep < request.num_hashed_blocks:
            raise ValueError("cannot roll back verified, cached blocks")
        freed = []
        while len(request.block_table) > keep:
            block_id = request.block_table.pop()
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                # unhashed: reused before any cached block
                block.block_hash = None
                self.free_queue[block_id] = None
                self.free_queue.move_to_end(block_id, last=False)
            freed.append(block_id)
        return freed

    def _take_free_blocks(self, n: int) -> list[int]:
        taken = [self.free_queue.popitem(last=False)[0] for _ in range(n)]
        evicted = []
        for block_id in taken:
            block = self.blocks[block_id]
            block.ref_count = 1
            if block.block_hash is not None:
                # lazy eviction: a cached block loses its identity only when reused
                if self.cached.get(block.block_hash) == block_id:
                    del self.cached[block.block_hash]
                block.block_hash = None
                evicted.append(block_id)
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)
        return taken

    def cache_full_blocks(self, request: Request, num_verified_tokens: int) -> None:
        """Register the request's blocks that are full of verified tokens in the prefix cache.

        Only tokens whose KV is computed and final (never unverified drafts) may be passed.
        """
        if not self.enable_prefix_caching:
            return
        num_full = min(num_verified_tokens // self.block_size, len(request.block_table))
        start = request.num_hashed_blocks
        if num_full <= start:
            return
        bs = self.block_size
        known = request.prompt_block_hashes or ()
        parent = self.blocks[request.block_table[start - 1]].block_hash if start else None
        for i in range(start, num_full):
            block = self.blocks[request.block_table[i]]
            parent = (known[i] if i < len(known)
                      else hash_block(parent, request.token_ids[i * bs:(i + 1) * bs]))
            if block.block_hash is None:
                block.block_hash = parent
                # the first block computed for a prefix stays its canonical copy
                self.cached.setdefault(parent, block.block_id)
        request.num_hashed_blocks = num_full

    def free(self, request: Request) -> None:
        """Drop the request's references, tail first, so its tail blocks are evicted first."""
        duplicates = []
        for block_id in reversed(request.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.block_hash is None or self.cached.get(block.block_hash) != block_id:
                    if block.block_hash is not None:
                        duplicates.append(block_id)  # a second copy of a cached block
                    # nothing to hit here: reuse before any cached block
                    block.block_hash = None
                    self.free_queue.move_to_end(block_id, last=False)
        request.block_table = []
        request.num_hashed_blocks = 0
        if duplicates and self.on_evict is not None:
            self.on_evict(duplicates)

    def uncache(self, block_ids: Sequence[int]) -> None:
        """Forget cached blocks whose KV the runner no longer holds."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.block_hash is not None and self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
            block.block_hash = None
            if block.ref_count == 0:
                self.free_queue.move_to_end(block_id, last=False)

    def reset_prefix_cache(self) -> None:
        for block_id in list(self.cached.values()):
            self.uncache([block_id])
