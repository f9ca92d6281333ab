"""`LlamaCppRunner.truncate` on the embedded model: after rolling a slot back, recomputing the
dropped tokens gives bit-identical logits, in both KV layouts (what speculative decoding's
rollback relies on: `RunnerCapabilities.exact_truncate`)."""

from __future__ import annotations

import numpy as np
import pytest

from backends.base import BatchItem
from backends.llamacpp.runner import LlamaCppRunner

TABLE = list(range(10))  # slot 0's blocks (4 tokens each)
OTHER_TABLE = list(range(100, 110))  # slot 1's


@pytest.mark.parametrize("kv_layout", ["split", "unified"])
def test_truncate_then_recompute_gives_identical_logits(embedded_model_path, kv_layout):
    runner = LlamaCppRunner(embedded_model_path, max_seqs=2, seq_tokens=256, kv_tokens=512,
                            block_size=4, kv_layout=kv_layout, n_threads=2)
    assert runner.capabilities.exact_truncate
    tok = runner.tokenizer
    # another sequence in the pool: in the unified layout its cells sit between slot 0's
    other = tok.encode("Once upon a time, in a small village,", add_special=True)
    runner.execute([BatchItem(1, other, 0, OTHER_TABLE, [len(other) - 1])])
    prompt = tok.encode("The capital of France is", add_special=True)
    n = len(prompt)
    assert n == 5
    seq = list(prompt)
    # rows[k]: next-token logits after seq[:n + k]
    rows = [runner.execute([BatchItem(0, prompt, 0, TABLE, [n - 1])])[0].copy()]
    for _ in range(4):
        seq.append(int(np.argmax(rows[-1])))
        step = BatchItem(0, [seq[-1]], len(seq) - 1, TABLE, [0])
        rows.append(runner.execute([step])[0].copy())
    assert runner.residency.slot_blocks(0) == [0, 1, 2]  # positions 0..8

    runner.truncate(0, n + 1)  # keep the prompt and the first generated token
    assert runner.residency.slot_blocks(0) == [0, 1]
    for j in range(2):  # slot 1 moves on first, into any cells the truncation freed
        runner.execute([BatchItem(1, [1000 + j], len(other) + j, OTHER_TABLE, [0])])
    for pos in range(n + 1, n + 4):
        got = runner.execute([BatchItem(0, [seq[pos]], pos, TABLE, [0])])[0]
        assert np.array_equal(got, rows[pos - n + 1]), f"position {pos}"

    runner.truncate(0, n - 3)  # back into the prompt
    assert runner.residency.slot_blocks(0) == [0]
    got = runner.execute([BatchItem(0, prompt[n - 3:], n - 3, TABLE, [2])])[0]
    assert np.array_equal(got, rows[0])
    got = runner.execute([BatchItem(0, [seq[n]], n, TABLE, [0])])[0]
    assert np.array_equal(got, rows[1])
    runner.close()


def test_model_info_reads_the_rope_base_from_the_gguf(embedded_model_path):
    runner = LlamaCppRunner(embedded_model_path, max_seqs=1, seq_tokens=256, n_threads=2)
    assert runner.info.architecture == "llama"
    assert runner.info.rope_theta == 100000.0  # SmolLM2: llama.rope.freq_base
    runner.close()
