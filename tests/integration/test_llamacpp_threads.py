"""`LlamaCppRunner.yield_core` on the embedded model: the next step computes with one thread
fewer, and with all of them again once the load beside it is over (`app.server.model_pool.
cores_yielded`); the logits are the same either way."""

from __future__ import annotations

import llama_cpp as L
import numpy as np

from backends.base import BatchItem
from backends.llamacpp.runner import LlamaCppRunner


def test_a_yielded_core_is_given_back_and_changes_no_logit(embedded_model_path):
    runner = LlamaCppRunner(embedded_model_path, max_seqs=1, seq_tokens=256, n_threads=2,
                            kv_layout="split")
    try:
        prompt = runner.tokenizer.encode("The capital of France is", add_special=True)
        table = list(range(32))

        def step(pos: int) -> np.ndarray:
            return runner.execute([BatchItem(0, prompt[pos:pos + 1], pos, table, [0])]).copy()

        runner.execute([BatchItem(0, prompt[:-2], 0, table, [len(prompt) - 3])])
        runner.yield_core(True)
        assert L.llama_n_threads(runner._ctx) == 2  # applied by the next step, not before
        yielded = step(len(prompt) - 2)
        assert L.llama_n_threads(runner._ctx) == 1
        runner.yield_core(False)
        step(len(prompt) - 1)
        assert L.llama_n_threads(runner._ctx) == 2
        runner.truncate(0, len(prompt) - 2)
        np.testing.assert_array_equal(step(len(prompt) - 2), yielded)
    finally:
        runner.close()
