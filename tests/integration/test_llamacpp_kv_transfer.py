"""`LlamaCppRunner.export_kv/import_kv` on real models: the blob codec reproduces llama.cpp's
bytes, and KV exported from one slot (or runner) and imported into another gives the next
token bit-identical logits (both sides are f16 copies of the same cells, and the split
layout's attention does not depend on neighbours)."""

from __future__ import annotations

import numpy as np
import pytest

from backends.base import Q8_0_BLOCK, BatchItem
from backends.llamacpp import kv_transfer as kvt
from backends.llamacpp.memory import ContextMemory
from backends.llamacpp.runner import LlamaCppRunner
from tests.conftest import store_model

PROMPT = "The capital of France is Paris, and the capital of Italy is"
T0, T1 = list(range(20)), list(range(20, 40))  # slot 0's and slot 1's blocks (4 tokens each)


def _runner(path, layout: str, flash_attn: str = "auto", max_seqs: int = 2,
            kv_cache_type: str = "f16") -> LlamaCppRunner:
    return LlamaCppRunner(path, max_seqs=max_seqs, seq_tokens=256, kv_tokens=768, block_size=4,
                          kv_layout=layout, flash_attn=flash_attn, n_threads=2,
                          kv_cache_type=kv_cache_type)


@pytest.mark.parametrize("layout, flash_attn", [("split", "auto"), ("split", "off"),
                                                ("unified", "auto")])
def test_blob_to_neutral_and_back_is_byte_identical(embedded_model_path, layout, flash_attn):
    runner = _runner(embedded_model_path, layout, flash_attn)
    toks = runner.tokenizer.encode(PROMPT, add_special=True)
    runner.execute([BatchItem(1, toks, 0, T1, [])])
    blob = bytes(ContextMemory(runner._ctx).state_get(1))
    state = kvt.parse_state(blob, 3, 64)
    assert state.v_trans == (flash_attn == "off")
    assert state.n_stream == (2 if layout == "split" else 1)
    assert list(state.positions) == list(range(len(toks)))
    kv = runner.export_kv(1, T1, 0, len(toks))
    assert len(kv) == 30 and kv[0][0].shape == (len(toks), 3, 64)
    assert kv[0][0].dtype == np.float16
    rebuilt = kvt.from_neutral(kv, 0, seq_id=1, n_stream=state.n_stream, stream=state.stream,
                               v_trans=state.v_trans, interleaved=True)
    assert bytes(kvt.build_state(rebuilt)) == blob
    # magic, seq, n_stream; a cell count per stream; v_trans, n_layer; a 12-byte type and
    # row size per layer's K and V; then per token 12 bytes of cell metadata and
    # 30 layers x (K + V) x 3 heads x 64 x 2 bytes
    assert len(toks) == 13
    header = 12 + 4 * state.n_stream + 8 + 30 * 2 * 12
    assert len(blob) == header + 13 * (12 + 30 * 2 * 3 * 64 * 2)
    runner.close()


@pytest.mark.parametrize("layout, flash_attn, kv_cache_type", [
    ("split", "auto", "f16"), ("split", "off", "f16"), ("unified", "auto", "f16"),
    ("unified", "off", "f16"), ("split", "auto", "q8_0"), ("unified", "auto", "q8_0")])
def test_imported_kv_gives_bit_identical_next_token_logits(embedded_model_path, layout,
                                                           flash_attn, kv_cache_type):
    runner = _runner(embedded_model_path, layout, flash_attn, kv_cache_type=kv_cache_type)
    toks = runner.tokenizer.encode(PROMPT, add_special=True)
    n = len(toks)
    runner.execute([BatchItem(0, toks[:-1], 0, T0, [])])
    kv = runner.export_kv(0, T0, 0, n - 1)
    # f16: 3 heads x 64; q8_0: those 192 values as 6 blocks of 32 (Q8_0_BLOCK)
    assert (kv[0][0].dtype, kv[0][0].shape) == (
        (np.dtype(np.float16), (n - 1, 3, 64)) if kv_cache_type == "f16"
        else (Q8_0_BLOCK, (n - 1, 6)))
    # two chunks, the second appended to the first (llama.cpp's load clears its target)
    runner.import_kv(1, T1, 0, [(k[:5], v[:5]) for k, v in kv])
    runner.import_kv(1, T1, 5, [(k[5:], v[5:]) for k, v in kv])
    assert n == 13
    assert runner.residency.slot_blocks(1) == T1[:3]  # positions 0..11 in 4-token blocks
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(kv, runner.export_kv(1, T1, 0, n - 1), strict=True))
    want = runner.execute([BatchItem(0, toks[-1:], n - 1, T0, [0])]).copy()
    got = runner.execute([BatchItem(1, toks[-1:], n - 1, T1, [0])])
    assert np.array_equal(got, want)
    runner.close()


def test_kv_moves_between_two_runners_like_two_boxes(embedded_model_path):
    """Worker prefills prompt[:-1]; the decoder imports it and computes the last token: its
    greedy continuation equals the worker's own, token for token, logits bit for bit."""
    worker, decoder = _runner(embedded_model_path, "split"), _runner(embedded_model_path, "split")
    toks = worker.tokenizer.encode(PROMPT, add_special=True)
    n = len(toks)
    worker.execute([BatchItem(0, toks[:-1], 0, T0, [])])
    decoder.import_kv(1, T1, 0, worker.export_kv(0, T0, 0, n - 1))
    seq_w, seq_d = list(toks), list(toks)
    for _ in range(4):
        a = worker.execute([BatchItem(0, seq_w[-1:], len(seq_w) - 1, T0, [0])]).copy()
        b = decoder.execute([BatchItem(1, seq_d[-1:], len(seq_d) - 1, T1, [0])]).copy()
        assert np.array_equal(a, b)
        seq_w.append(int(np.argmax(a)))
        seq_d.append(int(np.argmax(b)))
    assert seq_w == seq_d
    worker.close()
    decoder.close()


def test_export_and_import_refuse_what_they_cannot_do(embedded_model_path):
    runner = _runner(embedded_model_path, "split")
    toks = runner.tokenizer.encode(PROMPT, add_special=True)
    runner.execute([BatchItem(0, toks, 0, T0, [])])
    with pytest.raises(ValueError, match="does not cover"):
        runner.export_kv(0, T0[:2], 0, len(toks))  # 2 blocks = 8 positions
    with pytest.raises(ValueError, match="does not hold positions"):
        runner.export_kv(0, T0, 0, len(toks) + 1)
    kv = runner.export_kv(0, T0, 0, 4)
    with pytest.raises(ValueError, match="expected 30 layers"):
        runner.import_kv(1, T1, 0, kv[:29])
    with pytest.raises(ValueError, match="must hold exactly positions 0..3"):
        runner.import_kv(1, T1, 4, kv)  # slot 1 is empty: nothing to append to
    with pytest.raises(ValueError, match=r"\(4, 3, 64\)"):
        runner.import_kv(1, T1, 0, [(k[:, :2], v[:, :2]) for k, v in kv])
    runner.close()


def test_qwen2_kv_is_not_permuted_and_round_trips():
    """A NEOX-rope model (qwen2): K is stored as HF computes it, and a transfer between slots
    still gives bit-identical logits."""
    runner = LlamaCppRunner(store_model("qwen2.5-coder-0.5b-instruct"), max_seqs=2,
                            seq_tokens=256, block_size=16, n_threads=2)
    assert runner.info.architecture == "qwen2"
    assert runner._kv_facts() == (False, 64)
    toks = runner.tokenizer.encode("def add(a, b):\n    return a +", add_special=True)
    n = len(toks)
    runner.execute([BatchItem(0, toks[:-1], 0, [0, 1], [])])
    blob = bytes(ContextMemory(runner._ctx).state_get(0))
    kv = runner.export_kv(0, [0, 1], 0, n - 1)
    state = kvt.parse_state(blob, 2, 64)
    assert np.array_equal(kv[3][0], state.keys[3])  # no permutation: the cells as stored
    runner.import_kv(1, [2, 3], 0, kv)
    want = runner.execute([BatchItem(0, toks[-1:], n - 1, [0, 1], [0])]).copy()
    got = runner.execute([BatchItem(1, toks[-1:], n - 1, [2, 3], [0])])
    assert np.array_equal(got, want)
    runner.close()
