"""Two-box mode as a user reads it: the route reasons in words with their numbers, `serve`'s
start-up line from the measured estimates, the worker's per-transfer log line, and the
warning when a worker on this machine and the decode box over-subscribe its cores (the
threads come from the handshake, over loopback TCP here)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from app.disagg import handshake as hs
from app.disagg import wire
from app.disagg.client import PrefillClient
from app.disagg.peer import PeerConfig, is_this_host, thread_warning
from app.disagg.policy import PolicyConfig, PrefillPolicy
from app.disagg.report import route_summary, startup_line
from app.disagg.wire import FrameType
from app.disagg.worker import transfer_line
from app.engine.remote_prefill import RemoteJob
from models.fingerprint import ModelFingerprint

FP = ModelFingerprint("llama", 30, 3, 64, 100000.0, "none", "a" * 64, "b" * 64)


def policy(local=None, remote=None, link_gbps=None, bytes_per_token=0, setup_s=None,
           **config):
    p = PrefillPolicy(PolicyConfig(**config), bytes_per_token, clock=lambda: 100.0)
    p.local_rate, p.remote_rate, p.setup_s = local, remote, setup_s
    p.link_bps = link_gbps * 1e9 if link_gbps else None
    return p


def words(p: PrefillPolicy, n_total: int, n_cached: int = 0, **transfer) -> str:
    go, reason, numbers = p.decide_detail(n_total, n_cached)
    return route_summary({"remote": go, "reason": reason, **numbers, **transfer})


# -- route reasons --------------------------------------------------------------------------

def test_route_reasons_in_words_with_their_numbers():
    sent = {"ok": True, "imported_tokens": 2047, "bytes": 47_162_880}
    assert words(policy(), 2047, **sent) == (
        "prefilled remotely (first prompt: measuring the link: 2047 tokens, 47.2 MB of KV)")
    assert words(policy(remote=2000.0), 1000) == "prefilled here (measuring this box)"
    assert words(policy(local=1000.0, remote=500.0), 1000) == (
        "prefilled here (measured: this box prefills faster, 1.00 s here vs 2.00 s remote)")
    assert words(policy(local=500.0, remote=2000.0), 2047, **sent) == (
        "prefilled remotely (measured: the worker prefills faster, 1.02 s vs 4.09 s here: "
        "2047 tokens, 47.2 MB of KV)")
    assert words(policy(), 300, 180) == (
        "prefilled here (short prompt: 120 new tokens, under 256)")
    assert words(policy(mode="always"), 300, 0, **sent) == (
        "prefilled remotely (--prefill-policy always: 2047 tokens, 47.2 MB of KV)")
    p = policy()
    p.observe_failure("frame_timeout")  # the breaker opens for 5 s
    p.clock = lambda: 101.5
    assert words(p, 1000) == "prefilled here (the worker failed just now, retrying in 4 s)"
    assert route_summary({"remote": False, "reason": "kv_full"}) == (
        "prefilled here (no room here for its KV yet)")
    assert route_summary({"remote": True, "reason": "always", "ok": False,
                          "failure": "refused", "imported_tokens": 0}) == (
        "remote prefill failed (worker not reachable) after 0 tokens")


def test_the_scheduler_keeps_the_numbers_in_the_route_record():
    from app.engine.remote_prefill import RemoteOutcome  # noqa: F401 - the protocol's module
    from tests.unit.test_remote_prefill_engine import PROMPT, greedy, setup

    runner, eng, peer = setup(go=False)
    peer.decide = lambda n, cached: (False, "local_faster", {"uncached": n - cached,
                                                             "local_s": 0.5, "remote_s": 0.9})
    req = eng.add_request("a", PROMPT, greedy(1))
    eng.step()
    assert req.metrics.remote_prefill == {"remote": False, "reason": "local_faster",
                                          "uncached": 12, "local_s": 0.5, "remote_s": 0.9}
    assert route_summary(req.metrics.remote_prefill) == (
        "prefilled here (measured: this box prefills faster, 0.50 s here vs 0.90 s remote)")


# -- serve's start-up line ------------------------------------------------------------------

W = "the prefill worker at 10.0.0.2:7070"
TAIL = "; any failure prefills here"


@pytest.mark.parametrize("estimates, line", [
    ({}, f"two-box: {W}; the first prompt of 256+ new tokens goes there to measure the link, "
         f"the next stays here to measure this box, then each goes where it is predicted "
         f"faster{TAIL}"),
    ({"remote": 2400.0}, f"two-box: {W} (measured 2,400 tok/s); the next prompt of 256+ new "
                         f"tokens stays here to measure this box, then each goes where it is "
                         f"predicted faster{TAIL}"),
    ({"local": 3000.0, "remote": 1000.0},
     f"two-box: prompts stay here: this box prefills faster than {W} up to 8,192 tokens "
     f"(measured: this box 3,000 tok/s, the worker 1,000 tok/s){TAIL}"),
    ({"local": 850.0, "remote": 2400.0, "link_gbps": 0.12},
     f"two-box: prompts of 256+ new tokens go to {W}, shorter ones stay here (measured: this "
     f"box 850 tok/s, the worker 2,400 tok/s, link 0.12 GB/s){TAIL}"),
    # 3 s to connect: remote pays only once a prompt is long enough to amortise it
    ({"local": 100.0, "remote": 2400.0, "link_gbps": 0.01, "bytes_per_token": 23_040,
      "setup_s": 3.0},
     f"two-box: prompts of 471+ new tokens go to {W}, shorter ones are faster here "
     f"(measured: this box 100 tok/s, the worker 2,400 tok/s, link 0.01 GB/s){TAIL}"),
])
def test_startup_line_says_what_auto_will_do(estimates, line):
    p = policy(**estimates)
    assert startup_line("10.0.0.2", 7070, p, 8192) == line


def test_startup_line_with_policy_always():
    assert startup_line("::1", 7070, policy(mode="always"), 8192) == (
        f"two-box: every prompt goes to the prefill worker at [::1]:7070 (--prefill-policy "
        f"always){TAIL}")


def test_remote_from_is_the_first_length_auto_sends():
    p = policy(local=100.0, remote=2400.0, link_gbps=0.01, bytes_per_token=23_040,
               setup_s=3.0)
    first = p.remote_from(8192)
    assert first == 471
    assert p.decide(first, 0) == (True, "faster")
    assert p.decide(first - 1, 0) == (False, "local_faster")
    assert p.decide(8192, 0) == (True, "faster")
    assert policy(local=3000.0, remote=1000.0).remote_from(8192) is None


# -- the worker's log line ------------------------------------------------------------------

def test_worker_transfer_line():
    assert transfer_line("done", {"tokens": 2047, "computed": 1535, "bytes": 47_162_880,
                                  "seconds": 2.0}) == (
        "done: 2047 tokens sent (1535 computed), 47.2 MB of KV in 2.00 s, 0.024 GB/s")
    # the decode box gave up before the first chunk was computed
    assert transfer_line("cancelled", {"tokens": 0, "computed": 0, "bytes": 0,
                                       "seconds": 10.0}) == (
        "cancelled: 0 tokens sent (0 computed), 0.0 MB of KV in 10.00 s, 0.000 GB/s")
    assert transfer_line("bad_request", {}) == "bad_request"


# -- threads on one machine -----------------------------------------------------------------

def test_thread_warning_text():
    assert thread_warning("127.0.0.1", 7070, 2, 2, 2) == (
        "the prefill worker at 127.0.0.1:7070 runs on this machine: its 2 threads and these "
        "2 exceed the 2 cores, and the two processes will slow each other down; restart "
        "with --threads 1 here and `tandem prefill-worker --threads 1`")
    assert thread_warning("::1", 7070, 8, 4, 10) == (
        "the prefill worker at [::1]:7070 runs on this machine: its 4 threads and these 8 "
        "exceed the 10 cores, and the two processes will slow each other down; restart "
        "with --threads 5 here and `tandem prefill-worker --threads 5`")
    assert thread_warning("127.0.0.1", 7070, 1, 1, 2) is None


def test_this_host():
    assert is_this_host("127.0.0.1") and is_this_host("localhost") and is_this_host("::1")
    assert not is_this_host("192.0.2.1")  # TEST-NET-1: never assigned to a machine
    assert not is_this_host("no-such-host.invalid")


async def _handshake(client_threads, server_threads):
    done: asyncio.Future = asyncio.get_running_loop().create_future()

    async def serve(reader, writer):
        done.set_result(await hs.server_handshake(reader, writer, b"s" * 32, FP,
                                                  server_threads))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.sockets[0].getsockname()[1])
    client = await hs.client_handshake(reader, writer, b"s" * 32, FP, client_threads)
    writer.close()
    result = (client, await asyncio.wait_for(done, 5))
    server.close()
    await server.wait_closed()
    return result


async def test_handshake_tells_each_side_the_others_threads():
    client, server = await _handshake(4, 2)
    assert (client.peer_threads, server.peer_threads) == (2, 4)
    assert client.peer == server.peer == FP and client.key == server.key
    # a peer that sends none (an older tandem) leaves it unknown; the key still agrees
    client, server = await _handshake(None, 2)
    assert (client.peer_threads, server.peer_threads) == (2, None)
    assert client.key == server.key


class _Sink:
    def __init__(self):
        self.ended = threading.Event()
        self.outcome = None

    def remote_kv(self, request_id, start, kv):
        pass

    def remote_end(self, request_id, outcome):
        self.outcome = outcome
        self.ended.set()


class _BusyWorker:
    """A worker on loopback that says its threads in the handshake, then is busy."""

    def __init__(self, threads):
        self.threads = threads
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self.handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    async def handle(self, reader, writer):
        session = await hs.server_handshake(reader, writer, b"", FP, self.threads)
        await wire.read_frame(reader, session.key)  # PREFILL
        await wire.write_frame(writer, wire.encode_parts(
            FrameType.ERROR, {"code": "busy", "message": "busy"}, key=session.key))
        writer.close()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.mark.parametrize("here, peer, warned", [(2, 2, True), (1, 1, False)])
def test_decode_box_warns_once_when_both_exceed_the_cores(monkeypatch, caplog, here, peer,
                                                          warned):
    monkeypatch.setattr("app.disagg.client.os.cpu_count", lambda: 2)
    worker = _BusyWorker(peer)
    sink = _Sink()
    cfg = PeerConfig("127.0.0.1", worker.port, threads=here, policy=PolicyConfig(mode="always"))
    client = PrefillClient(cfg, FP, 30, 3, 64, sink)
    try:
        with caplog.at_level(logging.WARNING, logger="tandem.two_box"):
            for i in range(2):
                sink.ended.clear()
                client.begin(RemoteJob(f"r{i}", list(range(1, 300)), 0))
                assert sink.ended.wait(10) and sink.outcome.reason == "busy"
    finally:
        client.close()
        worker.stop()
    lines = [r.getMessage() for r in caplog.records if "threads" in r.getMessage()]
    assert lines == ([
        f"the prefill worker at 127.0.0.1:{worker.port} runs on this machine: its 2 threads "
        f"and these 2 exceed the 2 cores, and the two processes will slow each other down; "
        f"restart with --threads 1 here and `tandem prefill-worker --threads 1`"]
        if warned else [])
