"""The step's commit: several tokens accepted for one request in one step, the rest rolled
back (block manager `shrink` + runner `truncate`), stops taken one token at a time."""

import pytest

from app.engine.types import SamplingParams
from tests.unit.helpers import greedy, make, planned


def decoding(drafts, params=None, prompt=(1, 2, 3, 4, 5)):
    """An engine whose request 'a' has its prompt computed and one token sampled, with
    `drafts` proposed for the next step. Block size 4."""
    runner, eng = make(budget=16)
    req = eng.add_request("a", list(prompt), params or greedy(20))
    (first,) = eng.step()
    req.spec_token_ids = list(drafts)
    return runner, eng, req, first


@pytest.mark.parametrize("drafts, emitted, computed, blocks, truncated", [
    # the fake model continues 6 with 7, 8, 9, 10; a wrong draft ends the accepted prefix
    ([50, 51, 52], [7], 6, [0, 1], [("truncate", 0, 6)]),
    ([7, 50, 51], [7, 8], 7, [0, 1], [("truncate", 0, 7)]),
    ([7, 8, 9], [7, 8, 9, 10], 9, [0, 1, 2], []),
])
def test_accepts_prefix_and_rolls_back_the_rest(drafts, emitted, computed, blocks, truncated):
    runner, eng, req, first = decoding(drafts)
    assert first.token_ids == [6] and req.block_table == [0, 1]
    (out,) = eng.step()
    # the last real token plus every draft were computed, with logits at each of them
    assert planned(runner) == [(0, 5, 4, [0, 1, 2, 3])]
    assert runner.steps[-1][0].tokens == [6] + drafts
    assert out.token_ids == emitted
    assert req.token_ids == [1, 2, 3, 4, 5, 6] + emitted
    assert req.num_computed_tokens == computed == req.num_tokens - 1
    assert req.block_table == blocks
    assert [c for c in runner.calls if c[0] == "truncate"] == truncated
    assert req.spec_token_ids == []
    m = req.metrics
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (1, 3, len(emitted) - 1)
    # the prompt's full block is in the prefix cache at once, decoded ones in batches
    assert req.num_hashed_blocks == 1
    cached = dict(eng.block_manager.cached)
    # rejected blocks went back to the head of the free queue: reused first
    freed = sorted(set([0, 1, 2]) - set(blocks))
    assert list(eng.block_manager.free_queue)[:len(freed)] == freed
    # leaving its slot, the request registers exactly its blocks full of verified tokens
    eng.abort("a")
    bm = eng.block_manager
    assert len(bm.cached) == computed // 4
    assert bm.cached == {**cached, **{bm.blocks[b].block_hash: b for b in blocks[:computed // 4]}}
    assert list(bm.cached.values()) == blocks[:computed // 4]


def test_next_step_after_rollback_recomputes_from_the_first_rejected_position():
    runner, eng, req, _ = decoding([7, 50, 51])
    eng.step()
    (out,) = eng.step()
    assert planned(runner) == [(0, 7, 1, [0])]
    assert out.token_ids == [9]


def test_max_tokens_reached_inside_an_accepted_block():
    runner, eng, req, _ = decoding([7, 8, 9], greedy(3))
    (out,) = eng.step()
    assert out.token_ids == [7, 8]
    assert out.finished and out.finish_reason == "length"
    assert req.output_ids == [6, 7, 8] and req.metrics.completion_tokens == 3
    assert not eng.has_work()
    assert eng.block_manager.num_used_blocks == 0


def test_eos_inside_an_accepted_block_ends_the_request_there():
    # 98 -> 99 -> 0 (EOS, id 0 in the fake tokenizer) -> 1
    params = SamplingParams(temperature=0, max_tokens=20)
    runner, eng, req, first = decoding([99, 0, 1], params, prompt=(96, 97))
    assert first.token_ids == [98]
    (out,) = eng.step()
    assert out.token_ids == [99, 0]
    assert out.finished and out.finish_reason == "stop"
    assert eng.generation_tokens_total == 3


def test_stop_string_inside_an_accepted_block_leaks_nothing_after_it():
    # fake token ids are bytes: 98 'b', 99 'c'; the fake model then says 0, 1
    params = SamplingParams(temperature=0, max_tokens=20, stop=["c"])
    runner, eng, req, first = decoding([99, 0, 1], params, prompt=(96, 97))
    assert first.token_ids == [98] and first.text == "b"
    (out,) = eng.step()
    assert out.token_ids == [99] and out.text == ""
    assert out.finish_reason == "stop"
    assert req.output_ids == [98, 99]


def test_budget_cuts_drafts_and_computes_only_the_leading_ones():
    runner, eng, req, _ = decoding([7, 8, 9, 10, 11])
    eng.scheduler.config.max_num_batched_tokens = 3
    (out,) = eng.step()
    assert planned(runner) == [(0, 5, 3, [0, 1, 2])]
    assert out.token_ids == [7, 8, 9]
    assert req.num_computed_tokens == 8 and req.metrics.num_draft_tokens == 2


def test_requests_with_different_draft_lengths_verify_in_one_step():
    runner, eng = make(budget=32)
    a = eng.add_request("a", [1, 2, 3], greedy(20))
    b = eng.add_request("b", [40, 41], greedy(20))
    eng.step()
    a.spec_token_ids = [5, 6]
    b.spec_token_ids = []
    outs = {o.request_id: o.token_ids for o in eng.step()}
    assert planned(runner) == [(0, 3, 3, [0, 1, 2]), (1, 2, 1, [0])]
    assert outs == {"a": [5, 6, 7], "b": [43]}


def test_shrink_refuses_to_drop_cached_blocks():
    runner, eng, req, _ = decoding([7, 8, 9])
    eng.step()
    eng.block_manager.cache_full_blocks(req, req.num_computed_tokens)
    assert req.num_hashed_blocks == 2
    with pytest.raises(ValueError, match="verified"):
        eng.block_manager.shrink(req, 4)


def test_step_result_reports_the_committed_positions():
    runner, eng = make(budget=4)
    eng.add_request("a", [1, 2, 3, 4, 5, 6], greedy(5))
    assert eng.execute_step().computed == {"a": range(0, 4)}  # a prefill chunk
    first = eng.execute_step()
    assert first.computed == {"a": range(4, 6)} and first.outputs[0].token_ids == [7]
    eng.requests["a"].spec_token_ids = [8, 50]
    # 7 and draft 8 verified, 50 rejected: positions 6 and 7 committed, 8 rolled back
    assert eng.execute_step().computed == {"a": range(6, 8)}
