"""One prefill worker, several decode boxes and hostile peers (issue 33): a peer that stops
reading is dropped and frees everything it held, the handshake is bounded, and two decode
boxes sharing the worker both get remote prefill with the single box's greedy tokens.

The worker runs in this process (its own event loop thread, the embedded model) so that its
engine and counters can be inspected; the decode boxes are real engines with a prefill peer.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from app.config import EngineArgs
from app.disagg import wire
from app.disagg.fingerprints import model_fingerprint
from app.disagg.handshake import client_handshake
from app.disagg.peer import PeerConfig
from app.disagg.policy import PolicyConfig
from app.disagg.wire import FrameType
from app.disagg.worker import PrefillWorker
from app.engine.types import SamplingParams
from app.loader import load_engine, load_prefill_engine
from backends.base import RunnerConfig

RUNNER = RunnerConfig(max_seqs=2, seq_tokens=2048, n_threads=1)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, repetition_penalty=1.0)


class LiveWorker:
    """A `PrefillWorker` serving on a free loopback port from its own event loop thread."""

    def __init__(self, model, **kw):
        engine, path = load_prefill_engine(EngineArgs(model=str(model), runner=RUNNER))
        self.fingerprint = model_fingerprint(path)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.worker = PrefillWorker(engine, self.fingerprint, b"", **kw)
        self.server = self.call(self.worker.serve("127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]

    def call(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def engine_stats(self):
        """The engine's stats, read on its executor thread (between steps)."""
        return self.call(self.worker._run(self.worker.engine.stats))

    def stop(self):
        async def shutdown():
            self.server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in handlers:
                t.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            self.worker.close()

        self.call(shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def live(embedded_model):
    w = LiveWorker(embedded_model, max_queue=1, max_handshakes=2, write_timeout_s=2.0,
                   handshake_timeout_s=20.0)
    yield w
    w.stop()


def wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


async def _prefill(port, fingerprint, ids, rcvbuf: int | None = None, stall: bool = False):
    """Handshake and PREFILL `ids` as a decode box; then read frames until DONE or ERROR
    (returns their types in order and the last frame), or with `stall` stop reading without
    closing and return (reader, writer)."""
    sock = socket.socket()
    if rcvbuf is not None:  # before connect: the window the worker sees
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    session = await client_handshake(reader, writer, b"", fingerprint)
    await wire.write_frame(writer, wire.encode_parts(FrameType.PREFILL, {
        "request": 1, "start": 0, "tokens": ids, "chunk_tokens": 64}, key=session.key))
    if stall:
        writer.transport.pause_reading()
        return reader, writer
    types = []
    try:
        while True:
            frame = await asyncio.wait_for(wire.read_frame(reader, session.key), 60)
            types.append(frame.type)
            if frame.type in (FrameType.DONE, FrameType.ERROR):
                return types, frame
    finally:
        writer.close()


def prompt(engine_or_tokenizer, words: int, tag: str) -> list[int]:
    tok = getattr(engine_or_tokenizer, "tokenizer", engine_or_tokenizer)
    text = f"{tag}: Repeat the list: " + " ".join(f"w{i}" for i in range(words))
    return tok.encode(text, add_special=True)


def test_a_peer_that_stops_reading_is_dropped_and_frees_everything(live):
    w = live.worker
    tok = w.engine.runner.tokenizer
    blocks_before = live.engine_stats().kv_blocks_used
    stalled_before = w.counters.get("stalled", 0)
    # 265 tokens: 6.1 MB of KV, twice what loopback's socket buffers take from a peer with
    # a 4 KB receive window (3.0 MB measured, tcp_wmem's 4 MB limit)
    ids = prompt(tok, 120, "stall")
    assert len(ids) * 23040 > 6e6

    async def stalled_then_next():
        reader, writer = await _prefill(live.port, live.fingerprint, ids, rcvbuf=4096,
                                        stall=True)
        try:
            # dropped within 30 s (write deadline 2 s + computing the prompt on a loaded
            # machine): counted, its connection closed, its admission released
            t0 = time.monotonic()
            while w.counters.get("stalled", 0) == stalled_before:
                assert time.monotonic() - t0 < 30, w.counters
                await asyncio.sleep(0.05)
            # ... while this side still holds its socket open
            assert not writer.transport.is_closing()
            # the next peer is served at once, not refused as busy
            return await _prefill(live.port, live.fingerprint, prompt(tok, 20, "next"))
        finally:
            writer.transport.abort()

    types, last = asyncio.run(stalled_then_next())
    assert types[0] == FrameType.QUEUE and last.type == FrameType.DONE
    wait_for(lambda: w.connections == 0 and w.admitted == 0)
    stats = live.engine_stats()
    assert (stats.running, stats.waiting) == (0, 0)
    assert stats.kv_blocks_used == blocks_before
    assert w.counters["stalled"] == stalled_before + 1


def test_connections_in_the_handshake_are_bounded(live):
    w = live.worker
    refused_before = w.counters.get("handshake_limit", 0)
    half_open = [socket.create_connection(("127.0.0.1", live.port)) for _ in range(2)]
    try:
        wait_for(lambda: w._handshaking == 2)
        with socket.create_connection(("127.0.0.1", live.port), timeout=10) as extra:
            reply, _ = wire.decode(extra.recv(65536))
            assert extra.recv(1) == b""  # closed at once
        assert (reply.type, reply.header["code"]) == (FrameType.ERROR, "busy")
        assert reply.header["message"] == "2 connections already in the handshake; try again"
        assert w.counters["handshake_limit"] == refused_before + 1
    finally:
        for s in half_open:
            s.close()
    wait_for(lambda: w._handshaking == 0)
    types, last = asyncio.run(_prefill(live.port, live.fingerprint,
                                       prompt(w.engine.runner.tokenizer, 20, "after-half")))
    assert last.type == FrameType.DONE


def test_admissions_beyond_slots_and_queue_get_busy(live):
    w = live.worker
    tok = w.engine.runner.tokenizer
    gate = threading.Event()
    w._executor.submit(gate.wait)  # hold the engine: admitted prompts pile up
    add = w.engine.add_request

    def slow_add(*args):
        # the driver wakes after the first add and steps while the others are still being
        # added: every prompt in the engine must still be exported after that step (one
        # left out decoded past its prompt and finished, its KV gone)
        time.sleep(0.3)
        return add(*args)

    w.engine.add_request = slow_add

    async def four():
        tasks = []
        for i in range(3):  # one at a time: the handshake bound is 2
            tasks.append(asyncio.create_task(_prefill(live.port, live.fingerprint,
                                                      prompt(tok, 20, f"q{i}"))))
            await asyncio.to_thread(wait_for, lambda: w.admitted == len(tasks))
        # 2 slots + 1 queued: the fourth is refused without waiting
        refused = await _prefill(live.port, live.fingerprint, prompt(tok, 20, "q3"))
        assert w.admitted == 3
        gate.set()
        return [await t for t in tasks] + [refused]

    try:
        results = asyncio.run(four())
    finally:
        gate.set()
        w.engine.add_request = add
    errors = [last for _, last in results if last.type == FrameType.ERROR]
    assert [(e.header["code"], e.header["message"]) for e in errors] == [
        ("busy", "3 prompts admitted already (the most: 3)")]
    assert sorted(types[0] for types, last in results if last.type == FrameType.DONE) == [
        FrameType.QUEUE] * 3


# -- two decode boxes ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local(embedded_model):
    engine = load_engine(EngineArgs(model=str(embedded_model), runner=RUNNER))
    yield engine
    engine.shutdown()


def split_engine(model, port):
    # deadlines for a loaded 2-core machine: the second prompt waits for the first
    peer = PeerConfig("127.0.0.1", port, connect_timeout_s=10.0, first_frame_timeout_s=30.0,
                      frame_timeout_s=30.0, policy=PolicyConfig(mode="always"))
    return load_engine(EngineArgs(model=str(model), runner=RUNNER, prefill_peer=peer))


async def _collect(engine, ids):
    toks, last = [], None
    async for out in engine.generate(ids, GREEDY):
        toks += out.token_ids
        last = out
    return toks, last.metrics


def test_two_decode_boxes_share_one_worker(live, local, embedded_model):
    w = live.worker
    a, b = split_engine(embedded_model, live.port), split_engine(embedded_model, live.port)
    try:
        ids_a, ids_b = prompt(local, 40, "box-a"), prompt(local, 50, "box-b")
        want = [asyncio.run(_collect(local, ids))[0] for ids in (ids_a, ids_b)]
        done_before, busy_before = w.counters.get("done", 0), w.counters.get("busy", 0)
        gate = threading.Event()
        w._executor.submit(gate.wait)  # both prompts are admitted before either computes

        async def both():
            tasks = [asyncio.create_task(_collect(e, ids)) for e, ids in ((a, ids_a),
                                                                           (b, ids_b))]
            await asyncio.to_thread(wait_for, lambda: w.admitted == 2)
            gate.set()
            return [await t for t in tasks]

        try:
            (got_a, m_a), (got_b, m_b) = asyncio.run(both())
        finally:
            gate.set()
        assert [got_a, got_b] == want
        for m, ids in ((m_a, ids_a), (m_b, ids_b)):
            info = m.remote_prefill
            assert (info["remote"], info["ok"], info["imported_tokens"]) == (
                True, True, len(ids) - 1)
        # one waited behind the other, told so by the worker
        assert sorted(m.remote_prefill["queue_peers"] for m in (m_a, m_b)) == [0, 1]
        queued = max((m_a, m_b), key=lambda m: m.remote_prefill["queue_peers"])
        first = ids_a if queued is m_b else ids_b
        assert queued.remote_prefill["queue_tokens"] == len(first) - 1
        assert w.counters.get("busy", 0) == busy_before
        assert w.counters["done"] == done_before + 2
        assert w.peak_admitted >= 2
    finally:
        a.shutdown()
        b.shutdown()


def test_a_long_queue_sends_the_prompt_back_to_the_decode_box(live, local, embedded_model):
    from app.disagg.policy import PrefillPolicy

    w = live.worker
    box = split_engine(embedded_model, live.port)
    try:
        client = box.engine.scheduler.remote
        client.policy = PrefillPolicy(PolicyConfig(mode="auto", min_tokens=1),
                                      client.policy.bytes_per_token)
        # this box 50 tok/s, the worker 200 tok/s: a 100-token prompt goes remote (0.5 s
        # against 2 s here), unless the worker has more than ~200 tokens to compute first
        client.policy.local_rate, client.policy.remote_rate = 50.0, 200.0
        ids = prompt(local, 40, "queued-back")[:101]
        want = asyncio.run(_collect(local, ids))[0]
        ahead = prompt(local, 130, "ahead")
        gate = threading.Event()
        w._executor.submit(gate.wait)  # the prompt ahead is admitted, not computed

        async def run():
            sock_task = asyncio.create_task(_prefill(live.port, live.fingerprint, ahead,
                                                     stall=True))
            await asyncio.to_thread(wait_for, lambda: w.admitted == 1)
            result = await _collect(box, ids)
            _, writer = await sock_task
            writer.transport.abort()  # the prompt ahead is never computed
            return result

        try:
            got, m = asyncio.run(run())
        finally:
            gate.set()
        assert got == want
        info = m.remote_prefill
        assert (info["remote"], info["reason"], info["ok"], info["failure"]) == (
            True, "faster", False, "worker_queue")
        assert (info["queue_peers"], info["queue_tokens"]) == (1, len(ahead))
        assert info["wait_s"] == pytest.approx(len(ahead) / 200.0)
        assert client.counters == {"worker_queue": 1}
        # a queue is not a failure: the breaker stays closed
        assert client.decide(100, 0)[:2] == (True, "faster")
        wait_for(lambda: w.admitted == 0 and w.connections == 0)
        assert (live.engine_stats().running, live.engine_stats().waiting) == (0, 0)
    finally:
        box.shutdown()
