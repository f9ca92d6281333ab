"""Scheduler and engine step loop against the fake runner: budget, chunking, preemption."""

import pytest

from app.engine.types import PromptTooLongError, SamplingParams
from tests.unit.helpers import greedy, make, planned, run_all


def test_token_budget_and_chunked_prefill():
    runner, eng = make(budget=8)
    eng.add_request("a", [1, 2, 3, 4, 5], greedy(2))
    eng.add_request("b", [10, 11, 12, 13, 14, 15], greedy(2))
    eng.step()
    # a fully (5 tokens, logits on its last), b chunked to the 3 remaining budget, no logits
    assert planned(runner) == [(0, 0, 5, [4]), (1, 0, 3, [])]
    eng.step()
    # a decodes 1 token; b finishes its prompt (3 tokens) and gets logits
    assert planned(runner) == [(0, 5, 1, [0]), (1, 3, 3, [2])]


def test_long_prompt_chunks_while_others_decode():
    runner, eng = make(budget=6)
    eng.add_request("a", [1, 2], greedy(5))
    eng.step()
    eng.add_request("b", list(range(1, 15)), greedy(1))
    eng.step()
    eng.step()
    # every step: a's decode first, then a chunk of b's 14-token prompt within the budget
    assert planned(runner, 1) == [(0, 2, 1, [0]), (1, 0, 5, [])]
    assert planned(runner, 2) == [(0, 3, 1, [0]), (1, 5, 5, [])]


def test_outputs_follow_fake_model():
    runner, eng = make()
    eng.add_request("a", [5, 6, 7], greedy(4))
    assert run_all(eng) == {"a": [8, 9, 10, 11]}


def test_preemption_recomputes_and_keeps_output():
    # 6 blocks of 4 tokens: two 8-token prompts fit (4 blocks), growth runs out
    runner, eng = make(num_blocks=6, block_size=4, budget=32)
    eng.add_request("a", list(range(1, 9)), greedy(10))
    eng.add_request("b", list(range(21, 29)), greedy(10))
    outs = run_all(eng)
    assert outs["a"] == list(range(9, 19))
    assert outs["b"] == list(range(29, 39))
    # b (newest) was preempted at least once: its slot was released
    assert any(c[0] == "release" and c[1] == 1 for c in runner.calls[:-2])
    assert eng.block_manager.num_used_blocks == 0


def test_no_starvation_fifo_admission():
    runner, eng = make(budget=64, max_seqs=2)
    for i in range(5):
        eng.add_request(f"r{i}", [i + 1] * 3, greedy(2))
    finished = []
    while eng.has_work():
        finished += [o.request_id for o in eng.step() if o.finished]
    assert finished == ["r0", "r1", "r2", "r3", "r4"]


def test_prefix_hit_shares_cached_blocks_with_exact_ids():
    runner, eng = make(block_size=4)
    prompt = list(range(1, 11))  # 10 tokens: 2 full blocks
    eng.add_request("a", prompt, greedy(1))
    run_all(eng)
    assert runner.calls == [("release", 0, 2)]  # a's two full blocks stay cached
    eng.add_request("b", prompt, greedy(1))
    (b_out,) = eng.step()
    assert runner.calls[1] == ("share", 0, [0, 1])  # slot 0 is free again
    assert planned(runner) == [(0, 8, 2, [1])]  # only the tail is computed
    assert b_out.finished and b_out.finish_reason == "length" and b_out.token_ids == [11]
    assert not eng.has_work()


def test_partial_share_recomputes_the_rest_into_the_same_blocks():
    runner, eng = make(block_size=4, budget=16)
    prompt = list(range(1, 11))
    eng.add_request("a", prompt, greedy(1))
    alone = run_all(eng)["a"]
    runner.share_limit = 1  # the runner finds only block 0 in one place (split layout)
    eng.add_request("b", prompt, greedy(1))
    out = run_all(eng)
    assert runner.calls[1] == ("share", 0, [0, 1])
    assert planned(runner) == [(0, 4, 6, [5])]  # block 1 recomputed, then the tail
    assert runner.steps[-1][0].block_table[:2] == [0, 1]
    assert out["b"] == alone
    assert eng.block_manager.hit_tokens_total == 4  # one block served from the cache
    assert eng.requests == {} and eng.block_manager.num_used_blocks == 0


def test_abort_frees_blocks():
    runner, eng = make(budget=16)
    eng.add_request("a", list(range(1, 10)), greedy(100))
    eng.step()
    assert eng.block_manager.num_used_blocks == 3
    out = eng.abort("a")
    assert out.finished and out.finish_reason == "abort"
    assert eng.block_manager.num_used_blocks == 0
    assert not eng.has_work()


def test_prompt_too_long():
    runner, eng = make(num_blocks=512)
    with pytest.raises(PromptTooLongError) as err:
        eng.add_request("a", [1] * 1024, greedy(1))
    assert str(err.value) == ("prompt is 1024 tokens but the context window is 1024 tokens "
                              "(at most 1023 prompt tokens leave room for a reply)")


def test_stop_at_eos_and_context_limit():
    runner, eng = make()
    eng.add_request("a", [97], SamplingParams(temperature=0, max_tokens=10))
    outs = []
    while eng.has_work():
        outs += eng.step()
    # 97 -> 98 -> 99 -> 0 (EOS)
    assert [o.token_ids[0] for o in outs] == [98, 99, 0]
    assert outs[-1].finish_reason == "stop"


def two_sharing_a_system_prompt(budget, max_tokens):
    """Requests a and b whose prompts share 4 blocks of 4 tokens, then 2 tokens of their own."""
    runner, eng = make(block_size=4, budget=budget)
    system = list(range(1, 17))
    eng.add_request("a", system + [50, 51], greedy(max_tokens))
    eng.add_request("b", system + [60, 61], greedy(max_tokens))
    return runner, eng


def test_waits_for_inflight_shared_prefix_instead_of_recomputing_it():
    runner, eng = two_sharing_a_system_prompt(budget=12, max_tokens=1)
    eng.step()
    # a takes the whole budget for 12 of its 18 tokens; b waits
    assert planned(runner) == [(0, 0, 12, [])]
    eng.step()
    # a's 4th block is still being computed in this step: b is not admitted yet
    assert planned(runner) == [(0, 12, 6, [5])]
    eng.step()
    # a finished and freed slot 0; b hits all 4 system blocks, computes only its 2 tokens
    assert planned(runner) == [(0, 16, 2, [1])]
    assert ("share", 0, [0, 1, 2, 3]) in runner.calls


def test_a_few_shared_leading_tokens_are_not_worth_a_step_of_waiting():
    runner, eng = make(num_blocks=256, block_size=1, budget=64)
    eng.add_request("a", [1, 2, 3] + list(range(10, 20)), greedy(1))
    eng.add_request("b", [1, 2, 3] + list(range(30, 40)), greedy(1))  # shares 3 tokens
    eng.add_request("c", [1, 2, 3, 4, 5, 6, 7, 8, 9] + [50], greedy(1))
    eng.step()
    # b shares 3 in-flight tokens with a (< 8): admitted with it, and it computes them too.
    # c shares only those 3 with a, and nothing with b: admitted as well.
    assert planned(runner) == [(0, 0, 13, [12]), (1, 0, 13, [12]), (2, 0, 10, [9])]

    system = list(range(60, 68))  # 8 shared tokens are worth the wait
    eng.add_request("f", system + [1], greedy(1))
    eng.add_request("g", system + [2], greedy(1))
    eng.step()
    assert planned(runner) == [(0, 0, 9, [8])]
    eng.step()
    assert planned(runner) == [(0, 8, 1, [0])]  # g hits f's 8 tokens


def test_admitted_in_the_same_step_waits_for_the_shared_prefix_too():
    runner, eng = two_sharing_a_system_prompt(budget=64, max_tokens=2)
    eng.step()
    # budget for both, but b would compute a's 4 blocks again: only a is admitted
    assert planned(runner) == [(0, 0, 18, [17])]
    eng.step()
    # b shares a's blocks (a is still running in slot 0) and computes its 2 tokens
    assert ("share", 1, [0, 1, 2, 3]) in runner.calls
    assert planned(runner) == [(0, 18, 1, [0]), (1, 16, 2, [1])]
