"""Two-box mode with a q8_0 KV cache on both boxes: the wire carries llama.cpp's q8_0 blocks
(34 bytes per 32 values, 0.53x f16's bytes), and greedy output through the split equals the
single box with the same cache type. A worker and a decode box whose KV types differ refuse
each other in the handshake, and the prompt is prefilled locally."""

from __future__ import annotations

import pytest

from app.config import EngineArgs
from app.disagg.peer import PeerConfig
from app.disagg.policy import PolicyConfig
from app.loader import load_engine
from backends.base import RunnerConfig
from tests.integration.test_two_box import Worker, engines, generate, point_at, prompt_ids

RUNNER = RunnerConfig(max_seqs=4, seq_tokens=2048, n_threads=1, kv_cache_type="q8_0")
PEER = dict(frame_timeout_s=1.0, first_frame_timeout_s=8.0, policy=PolicyConfig(mode="always"))


@pytest.fixture(scope="module")
def local(embedded_model):
    yield from engines(embedded_model, RUNNER, split=False)


@pytest.fixture(scope="module")
def split(embedded_model):
    yield from engines(embedded_model, RUNNER, split=True)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = Worker(tmp_path_factory.mktemp("worker"), "--kv-cache-type", "q8_0")
    yield w
    w.stop()


def test_q8_0_on_the_wire_equals_the_single_box(local, split, worker):
    ids = prompt_ids(local, 250, "q8")
    want, _ = generate(local, ids)
    point_at(split, worker.port)
    got, m = generate(split, ids)
    assert got == want
    info = m.remote_prefill
    assert (info["remote"], info["ok"], info["imported_tokens"]) == (True, True, len(ids) - 1)
    # 30 layers x (K, V) x 6 blocks of 34 bytes: 12,240 B per token against f16's 23,040
    assert info["bytes"] == (len(ids) - 1) * 30 * 2 * 6 * 34
    assert point_at(split, worker.port).policy.bytes_per_token == 12240


def test_a_worker_of_another_kv_type_is_refused_in_the_handshake(embedded_model, worker):
    f16 = load_engine(EngineArgs(
        model=str(embedded_model), runner=RunnerConfig(max_seqs=4, seq_tokens=2048, n_threads=1),
        prefill_peer=PeerConfig("127.0.0.1", worker.port, **PEER)))
    try:
        got, m = generate(f16, prompt_ids(f16, 40, "mixed"))
    finally:
        f16.shutdown()
    assert len(got) == 12
    info = m.remote_prefill
    assert (info["ok"], info["failure"], info["detail"]) == (
        False, "fingerprint", "KV cache types differ: here f16, peer q8_0 (run both with the "
        "same --kv-cache-type)")
