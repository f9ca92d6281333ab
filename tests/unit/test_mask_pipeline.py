"""`constrain.pipeline`: masks filled on a worker thread or inline give the same bitmask,
the per-sequence mask time statistics, and where a mask thread may run."""

from __future__ import annotations

import os
import threading

import numpy as np

from app.engine.constrain import GrammarCompiler, ResponseFormat
from app.engine.constrain import pipeline as pipeline_module
from app.engine.constrain.mask import MaskRequest, fill_masks
from app.engine.constrain.pipeline import MASK_BUCKETS, MaskPipeline, MaskStats, spare_core
from tests.fakes.tokenizer import FakeTokenizer

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}


def test_a_fill_beside_the_runner_equals_one_inline_and_runs_on_the_worker(monkeypatch):
    compiler = GrammarCompiler(FakeTokenizer(), 300)
    m = compiler.compile(ResponseFormat("json_schema", SCHEMA, "a")).matcher()
    threads: list[str] = []
    real = pipeline_module.fill_masks

    def spy(*args):
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(pipeline_module, "fill_masks", spy)
    requests = [MaskRequest(m, 1, list(b'{"a": '))]
    beside, inline = MaskPipeline(overlap=True), MaskPipeline(overlap=False)
    got = beside.start(requests, [1, 2], 8, 300).result()
    want = inline.start(requests, [1, 2], 8, 300).result()
    beside.close()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, fill_masks(requests, 8, 300))
    assert threads[0].startswith("tandem-mask") and threads[1] == "MainThread"


def test_mask_stats_share_a_step_among_its_sequences():
    stats = MaskStats()
    stats.observe(4, fill_s=0.0004, apply_s=0.0002, wait_s=0.0001)  # 150 us per sequence
    stats.observe(1, fill_s=0.02, apply_s=0.0, wait_s=0.0)  # 20 ms: the last bucket
    snap = stats.snapshot()
    assert snap["count"] == 5
    assert snap["buckets"][MASK_BUCKETS.index(2.5e-4)] == 4
    assert snap["buckets"][MASK_BUCKETS.index(0.1)] == 1
    assert round(snap["sum_s"], 6) == 0.0206
    assert (round(snap["fill_s"], 6), round(snap["wait_s"], 6)) == (0.0204, 0.0001)
    assert [round(x, 6) for x in stats.recent_fill_s] == [0.0001] * 4 + [0.02]


class _Runner:
    def __init__(self, n_threads):
        self.n_threads = n_threads


def test_a_mask_thread_runs_only_beside_a_runner_that_leaves_a_core():
    cores = len(os.sched_getaffinity(0))
    assert spare_core(_Runner(cores)) is False
    assert spare_core(_Runner(cores - 1)) is (cores > 1)
    assert spare_core(object()) is True  # no CPU threads (MLX on the GPU)
