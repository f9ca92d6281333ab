"""`backends.llamacpp.kv_plan`: layout choice and context sizing, no model needed."""

from __future__ import annotations

import pytest

from backends.llamacpp.kv_plan import KvPlan, check_args, context_error, plan_kv

SMOL_KV_BYTES = 2 * 2 * 30 * 3 * 64  # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16 K and V


def plan(**kw) -> KvPlan:
    args = dict(max_seqs=3, seq_tokens=256, kv_tokens=None, kv_layout="auto", block_size=16,
                max_batch_tokens=128, n_ctx_train=8192, kv_bytes_per_token=SMOL_KV_BYTES)
    return plan_kv(**{"split_kv_bytes": 2 << 30, **args, **kw})


def test_split_gives_each_sequence_its_stream():
    assert plan(kv_layout="split") == KvPlan("split", n_ctx=768, n_seq_max=3, num_blocks=48,
                                             max_seq_tokens=256, scratch_seq=None, max_seqs=3)


def test_split_pool_is_bounded_by_kv_tokens():
    assert plan(kv_layout="split", kv_tokens=100).num_blocks == 6


def test_seq_tokens_round_up_to_256_and_stop_at_the_training_context():
    assert plan(kv_layout="split", seq_tokens=300).max_seq_tokens == 512
    assert plan(kv_layout="split", seq_tokens=4096, n_ctx_train=2048).max_seq_tokens == 2048


def test_unified_shares_one_pool_with_slack_and_a_scratch_sequence():
    assert plan(kv_layout="unified", kv_tokens=24 * 16) == KvPlan(
        "unified", n_ctx=24 * 16 + 128, n_seq_max=4, num_blocks=24, max_seq_tokens=384,
        scratch_seq=3, max_seqs=3)
    # default pool: two full-length sequences, at least 16384 tokens
    p = plan(kv_layout="unified", max_seqs=64, seq_tokens=4096, block_size=8,
             max_batch_tokens=512)
    assert (p.num_blocks, p.n_ctx, p.max_seq_tokens, p.scratch_seq) == (2048, 16896, 16384, 64)


def test_auto_is_split_with_as_many_sequences_as_the_budget_holds():
    budget = 3 * 256 * SMOL_KV_BYTES
    assert (plan(split_kv_bytes=budget).layout, plan(split_kv_bytes=budget).max_seqs) == \
        ("split", 3)
    short = plan(split_kv_bytes=budget - 1)
    assert (short.layout, short.max_seqs, short.n_seq_max, short.n_ctx) == ("split", 2, 2, 512)
    # 64 x 4096 tokens of SmolLM2 are 5.6 GiB: 2 GiB holds 22 streams
    p = plan(max_seqs=64, seq_tokens=4096)
    assert (p.layout, p.max_seqs, p.n_ctx) == ("split", 22, 22 * 4096)
    # never fewer than one sequence, even past the budget
    assert plan(split_kv_bytes=1).max_seqs == 1


def test_budget_is_a_share_of_memory_with_a_floor():
    from backends.llamacpp.kv_plan import kv_budget_bytes

    assert kv_budget_bytes(24 << 30) == 3 << 30
    assert kv_budget_bytes(1 << 30) == 512 << 20


def test_context_error_names_the_size_and_the_way_out():
    p = plan(kv_layout="split", max_seqs=64, seq_tokens=8192)
    assert context_error(p, "m.gguf", SMOL_KV_BYTES) == (
        "llama.cpp could not create a context for m.gguf (split KV cache of 524288 tokens, "
        "11.2 GiB): lower the concurrency or --ctx-size, or use --kv-layout unified")
    u = plan(kv_layout="unified", kv_tokens=1024)
    assert context_error(u, "m.gguf", 2**20).endswith("(unified KV cache of 1152 tokens, 1.1 "
                                                      "GiB): lower the concurrency or --ctx-size")


@pytest.mark.parametrize(("max_seqs", "layout", "message"), [
    (0, "auto", "max_seqs must be in 1..255"),
    (256, "auto", "max_seqs must be in 1..255"),
    (4, "paged", "kv_layout must be split, unified or auto, not 'paged'"),
])
def test_bad_arguments_are_refused(max_seqs, layout, message):
    with pytest.raises(ValueError, match=message):
        check_args(max_seqs, layout)
    check_args(255, "unified")  # the largest slot count passes
