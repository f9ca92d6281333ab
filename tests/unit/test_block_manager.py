"""Block manager invariants with exact block ids (after vLLM's test_prefix_caching)."""

from app.engine.block_manager import BlockManager, hash_block
from app.engine.request import Request
from app.engine.types import SamplingParams


def req(rid, tokens):
    return Request(rid, list(tokens), SamplingParams())


def test_allocate_takes_lowest_free_ids_in_order():
    bm = BlockManager(num_blocks=8, block_size=4)
    r = req("a", range(10))
    assert bm.allocate(r, 10)
    assert r.block_table == [0, 1, 2]
    assert [bm.blocks[i].ref_count for i in range(4)] == [1, 1, 1, 0]
    assert bm.num_free_blocks == 5


def test_allocate_fails_without_change_when_full():
    bm = BlockManager(num_blocks=2, block_size=4)
    r = req("a", range(12))
    assert not bm.allocate(r, 12)
    assert r.block_table == []
    assert bm.num_free_blocks == 2


def test_prefix_hit_shares_blocks_and_never_covers_last_token():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = req("a", range(12))
    bm.allocate(a, 12)
    bm.cache_full_blocks(a, 12)
    assert a.num_hashed_blocks == 3
    # identical 12-token prompt: at most 11 tokens may hit -> 2 full blocks
    b = req("b", range(12))
    hits = bm.find_cached_prefix(b.token_ids)
    assert hits == [0, 1]
    assert bm.allocate(b, 12, hits)
    assert b.block_table == [0, 1, 3]
    assert [bm.blocks[i].ref_count for i in range(4)] == [2, 2, 1, 1]
    assert bm.hit_tokens_total == 8


def test_hit_stops_at_first_differing_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = req("a", range(12))
    bm.allocate(a, 12)
    bm.cache_full_blocks(a, 12)
    other = [0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11, 12]
    assert bm.find_cached_prefix(other) == [0]  # block 2 matches tokens but not the chain


def test_freed_blocks_stay_cached_and_are_evicted_lru_tail_first():
    evicted = []
    bm = BlockManager(num_blocks=6, block_size=4, on_evict=evicted.extend)
    a = req("a", range(13))  # blocks 0,1,2 full + 3 partial
    bm.allocate(a, 13)
    bm.cache_full_blocks(a, 13)
    bm.free(a)
    assert bm.num_free_blocks == 6
    # the unhashed partial block 3 is reused first, then never-used 4, 5, then the
    # cached ones from the tail of a's table: 2, then 1, then 0
    assert list(bm.free_queue) == [3, 4, 5, 2, 1, 0]
    b = req("b", [100 + i for i in range(20)])
    assert bm.allocate(b, 20)
    assert b.block_table == [3, 4, 5, 2, 1]
    assert evicted == [2, 1]
    # block 0 is still a hit for a's prefix; blocks 1 and 2 are gone
    assert bm.find_cached_prefix(list(range(13))) == [0]


def test_hit_on_free_cached_block_takes_it_out_of_free_queue():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = req("a", range(9))
    bm.allocate(a, 9)
    bm.cache_full_blocks(a, 9)
    bm.free(a)
    b = req("b", range(9))
    hits = bm.find_cached_prefix(b.token_ids)
    assert hits == [0, 1]
    assert bm.allocate(b, 9, hits)
    assert b.block_table == [0, 1, 2]
    assert 0 not in bm.free_queue and 1 not in bm.free_queue
    assert bm.blocks[0].ref_count == 1


def test_duplicate_block_is_not_cached_twice():
    evicted = []
    bm = BlockManager(num_blocks=8, block_size=4, on_evict=evicted.extend)
    a, b = req("a", range(5)), req("b", range(5))
    bm.allocate(a, 5)
    bm.allocate(b, 5)  # computed concurrently: neither hit
    bm.cache_full_blocks(a, 5)
    bm.cache_full_blocks(b, 5)
    assert bm.cached == {hash_block(None, [0, 1, 2, 3]): 0}
    bm.free(b)  # b's copy has no cache value: reused first
    assert list(bm.free_queue)[:2] == [2, 3]
    assert evicted == [2]  # the runner drops the copy's KV


def test_uncache_forgets_lost_blocks():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = req("a", range(9))
    bm.allocate(a, 9)
    bm.cache_full_blocks(a, 9)
    bm.free(a)
    bm.uncache([0])
    assert bm.find_cached_prefix(list(range(9))) == []


def test_cache_only_verified_tokens():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = req("a", range(8))
    bm.allocate(a, 8)
    bm.cache_full_blocks(a, 7)
    assert a.num_hashed_blocks == 1
    bm.cache_full_blocks(a, 8)
    assert a.num_hashed_blocks == 2


def test_known_prompt_hashes_are_used_not_recomputed():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = req("a", range(12))
    a.prompt_block_hashes = bm.block_hashes(a.token_ids, 3)
    bm.allocate(a, 12)
    bm.cache_full_blocks(a, 12)
    assert [bm.blocks[i].block_hash for i in range(3)] == a.prompt_block_hashes
    # the hashes given stand for the leading blocks: another prompt's hashes find a's
    # blocks, and hashing resumes from them past the hashes given
    other = [9] * 8 + [8, 9, 10, 11, 0]
    assert bm.find_cached_prefix(other) == []
    assert bm.find_cached_prefix(other, a.prompt_block_hashes[:2]) == [0, 1, 2]
    assert bm.find_cached_prefix(other, a.prompt_block_hashes[:1]) == [0]
