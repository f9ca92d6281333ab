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


# -- KV cache types (--kv-cache-type): bytes of each, and what fits a budget -----------------


def test_kv_bytes_per_type():
    from backends.llamacpp.kv_plan import kv_row_bytes, kv_token_bytes

    # one K row of SmolLM2 (3 heads x 64 = 192 values): 2 bytes each; 6 blocks of 34 or 18
    assert [kv_row_bytes(192, t) for t in ("f16", "q8_0", "q4_0")] == [384, 204, 108]
    assert [kv_token_bytes(30, 3, 64, t) for t in ("f16", "q8_0", "q4_0")] == \
        [SMOL_KV_BYTES, 12240, 6480] == [23040, 12240, 6480]
    # Llama-3-8B (32 layers x 8 heads x 128): 128 KiB, 68 KiB, 36 KiB a token
    assert [kv_token_bytes(32, 8, 128, t) for t in ("f16", "q8_0", "q4_0")] == \
        [128 << 10, 68 << 10, 36 << 10]


def test_quantized_rows_must_be_whole_blocks_and_types_known():
    from backends.llamacpp.kv_plan import kv_row_bytes

    with pytest.raises(ValueError) as err:
        kv_row_bytes(3 * 40, "q8_0")
    assert str(err.value) == ("--kv-cache-type q8_0 stores blocks of 32 values; this model's "
                              "K/V rows have 120")
    assert kv_row_bytes(3 * 40, "f16") == 240
    with pytest.raises(ValueError, match="^kv_cache_type must be f16, q8_0 or q4_0, not 'q5_1'$"):
        kv_row_bytes(192, "q5_1")


def test_auto_fits_more_sequences_of_a_quantized_cache_in_the_same_budget():
    from backends.llamacpp.kv_plan import kv_token_bytes

    # the default serve's f16 KV (16 x 8192 tokens of SmolLM2, 2.8 GiB) as the budget
    budget = 16 * 8192 * SMOL_KV_BYTES
    fits = {t: plan(max_seqs=255, seq_tokens=8192, split_kv_bytes=budget,
                    kv_bytes_per_token=kv_token_bytes(30, 3, 64, t))
            for t in ("f16", "q8_0", "q4_0")}
    assert {t: (p.max_seqs, p.n_ctx) for t, p in fits.items()} == {
        "f16": (16, 16 * 8192), "q8_0": (30, 30 * 8192), "q4_0": (56, 56 * 8192)}
    # 30 sequences of q8_0: 2.8 GiB of KV, within the budget
    assert 30 * 8192 * 12240 == 3_008_102_400 <= budget == 3_019_898_880
    p = fits["q8_0"]
    assert context_error(p, "m.gguf", 12240) == (
        "llama.cpp could not create a context for m.gguf (split KV cache of 245760 tokens, "
        "2.8 GiB): lower the concurrency or --ctx-size, or use --kv-layout unified")


def test_flash_attention_for_a_kv_cache_type():
    from backends.llamacpp.kv_plan import check_kv_cache_type

    assert [check_kv_cache_type("f16", fa) for fa in ("auto", "on", "off")] == \
        ["auto", "on", "off"]
    assert [check_kv_cache_type(t, fa) for t in ("q8_0", "q4_0") for fa in ("auto", "on")] == \
        ["on"] * 4
    with pytest.raises(ValueError) as err:
        check_kv_cache_type("q4_0", "off")
    assert str(err.value) == ("--kv-cache-type q4_0 needs flash attention (llama.cpp "
                              "quantizes the V cache only with it), which is off")
