"""The two-box wire fuzzed (`app.bench.wire_fuzz`) against a live in-process prefill worker
(`app.disagg.worker.PrefillWorker` on the real engine over a runner that exports KV without a
model): 200 seeded mutations of every frame at every stage; the worker never fails, answers
or closes cleanly each time, and serves an honest decode box, byte for byte, afterwards."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from app.bench.wire_fuzz import (
    MUTATIONS,
    STAGES,
    Target,
    fuzz_worker,
    honest_session,
    mutated_session,
    raw_frame,
)
from app.disagg.wire import FrameType
from app.disagg.worker import PrefillWorker
from app.engine.engine import EngineConfig, LLMEngine
from app.engine.scheduler import SchedulerConfig
from backends.base import RunnerCapabilities
from models.fingerprint import ModelFingerprint
from tests.fakes.runner import FakeRunner

LAYERS, HEADS, DIM = 2, 2, 4
N_CTX, N_VOCAB = 256, 100
FP = ModelFingerprint("llama", LAYERS, HEADS, DIM, 10000.0, "none", "a" * 64, "b" * 64)
SECRET = b"fuzz-secret"


class ExportRunner(FakeRunner):
    """A FakeRunner whose KV can be exported: K of position p in layer l is p + l, V its
    negation (float16 `[n, HEADS, DIM]` per layer)."""

    capabilities = RunnerCapabilities(exact_truncate=True, kv_transfer=True)

    def export_kv(self, slot, block_table, start, n):
        pos = np.arange(start, start + n, dtype=np.float16)[:, None, None]
        k = np.broadcast_to(pos, (n, HEADS, DIM)).astype(np.float16)
        return [(k + layer, -(k + layer)) for layer in range(LAYERS)]


async def _worker() -> tuple[PrefillWorker, asyncio.Server, Target]:
    runner = ExportRunner(num_blocks=256, block_size=4, max_seqs=1, n_vocab=N_VOCAB,
                          n_ctx=N_CTX)
    engine = LLMEngine(runner, EngineConfig(context_length=N_CTX, scheduler=SchedulerConfig(
        max_num_seqs=1, max_num_batched_tokens=64)))
    worker = PrefillWorker(engine, FP, SECRET, handshake_timeout_s=5.0)
    server = await worker.serve("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = Target("127.0.0.1", port, SECRET, FP, prompt=list(range(1, 90)), n_ctx=N_CTX,
                    n_vocab=N_VOCAB, chunk_tokens=16)
    return worker, server, target


def _unexpected(worker: PrefillWorker):
    """A `healthy` check: a message when the last session ended in an exception the worker
    did not expect (its "failed" counter grew)."""
    seen = [0]

    def check() -> str | None:
        n, seen[0] = worker.counters.get("failed", 0) - seen[0], worker.counters.get("failed", 0)
        return "the worker failed with an unexpected exception (see its log)" if n else None

    return check


async def test_200_mutations_leave_the_worker_serving() -> None:
    worker, server, target = await _worker()
    try:
        summary = await fuzz_worker(target, 200, seed=33, honest_every=20, close_timeout=10.0,
                                    healthy=_unexpected(worker))
    finally:
        server.close()
        worker.close()
    assert summary["failures"] == []
    assert summary["sessions"] == 200 and summary["honest"] == 10
    tried = {key.split(" -> ")[0] for key in summary["outcomes"]}
    assert tried == {f"{s}/{m}" for s in STAGES for m in MUTATIONS}
    assert worker.counters["done"] >= summary["honest"]  # the last may not be counted yet
    assert "failed" not in worker.counters


@pytest.mark.parametrize("field, value, error", [
    ("n_layers", float("inf"), "OverflowError('cannot convert float infinity to integer')"),
    ("rope_base", "x", "ValueError(\"could not convert string to float: 'x'\")"),
    ("head_dim", None, "TypeError(\"int() argument must be a string, a bytes-like object or a "
     "real number, not 'NoneType'\")"),
    ("weights_digest", "missing", "KeyError('weights_digest')")])
async def test_a_malformed_fingerprint_is_refused_with_an_error_frame(field, value,
                                                                      error) -> None:
    """A peer that knows the secret but sends a fingerprint with a field of the wrong type
    (or infinite) gets ERROR "protocol" (once an exception the worker did not expect, logged
    with a traceback, and no answer); the next peer is served."""

    def bad_fingerprint(stage, kind, rng, h, key, challenge):
        fp = {**h.fp_c, field: value}
        if value == "missing":
            del fp[field]
        return raw_frame(FrameType.HELLO, {"nonce": h.nonce_c, "fingerprint": fp}), fp

    worker, server, target = await _worker()
    try:
        session = await mutated_session(target, "hello", "semantic", 0, 10.0, bad_fingerprint)
        digest, problem = await honest_session(target)
    finally:
        server.close()
        worker.close()
    assert (session.answer, session.problem) == ("ERROR:protocol", None)
    assert session.errors == [{"code": "protocol",
                               "message": f"malformed model fingerprint: {error}"}]
    assert worker.counters.get("peer_error") == 1 and "failed" not in worker.counters
    assert problem is None and digest
