"""Two-box mode across backends on the embedded model: a llama.cpp prefill worker feeding an
MLX decode box, and an MLX worker feeding a llama.cpp decode box, through the neutral wire
layout. The fingerprint matches across backends (same GGUF); greedy output through the split
equals the decode box's single-box output (short prompt, a few tokens: MLX on CPU is slow).
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("mlx.core")

from app.bench.worker_process import WorkerProcess  # noqa: E402
from app.config import EngineArgs  # noqa: E402
from app.disagg.peer import PeerConfig  # noqa: E402
from app.disagg.policy import PolicyConfig  # noqa: E402
from app.engine.types import SamplingParams  # noqa: E402
from app.loader import load_engine  # noqa: E402
from backends.base import RunnerConfig  # noqa: E402

PROMPT = "The capital of France is Paris. The capital of Italy is"
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)
RUNNER = RunnerConfig(max_seqs=2, seq_tokens=512, n_threads=1)


async def _generate(engine, ids):
    toks, metrics = [], None
    async for out in engine.generate(ids, GREEDY):
        toks += out.token_ids
        metrics = out.metrics
    return toks, metrics


@pytest.mark.parametrize("worker_backend, decode_backend", [("llamacpp", "mlx"),
                                                           ("mlx", "llamacpp")])
def test_split_across_backends_equals_the_decode_box_alone(gguf_path, tmp_path,
                                                           worker_backend, decode_backend):
    worker = WorkerProcess(tmp_path, "--model", gguf_path, "--backend", worker_backend,
                           "--threads", "1", "--ctx-size", "512")
    try:
        alone = load_engine(EngineArgs(model=gguf_path, backend=decode_backend, runner=RUNNER))
        ids = alone.tokenizer.encode(PROMPT, add_special=True)
        want, _ = asyncio.run(_generate(alone, ids))
        alone.shutdown()
        peer = PeerConfig("127.0.0.1", worker.port, first_frame_timeout_s=120.0,
                          frame_timeout_s=60.0, policy=PolicyConfig(mode="always"))
        split = load_engine(EngineArgs(model=gguf_path, backend=decode_backend, runner=RUNNER,
                                       prefill_peer=peer))
        got, m = asyncio.run(_generate(split, ids))
        split.shutdown()
    finally:
        worker.stop()
    assert m.remote_prefill["ok"], m.remote_prefill
    assert m.remote_prefill["imported_tokens"] == len(ids) - 1
    assert got == want
