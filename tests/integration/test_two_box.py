"""Two-box mode on loopback: a real `tandem prefill-worker` process prefills, this process
decodes (llama.cpp on both, the embedded model). Greedy output through the split equals the
single box token for token: cold, partly cached, with another stream decoding meanwhile, and
after every fault (each ends with the single-box output and a worker that still serves)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.bench.server_process import free_port
from app.bench.worker_process import WorkerProcess
from app.config import EngineArgs
from app.disagg.peer import PeerConfig
from app.disagg.policy import PolicyConfig, PrefillPolicy
from app.engine.types import SamplingParams
from app.loader import load_engine
from backends.base import RunnerConfig
from tests.fakes.peer import FakeWorker

RUNNER = RunnerConfig(max_seqs=4, seq_tokens=2048, n_threads=1)
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def Worker(tmp: Path, *extra: str) -> WorkerProcess:
    return WorkerProcess(tmp, "--threads", "1", "--ctx-size", "2048", *extra)


def engines(model, runner: RunnerConfig, split: bool):
    """A module fixture's engine: one box, or the decode box of a split (its worker's port
    set later by `point_at`), with `runner`'s settings."""
    peer = PeerConfig("127.0.0.1", 1, frame_timeout_s=1.0, first_frame_timeout_s=8.0,
                      policy=PolicyConfig(mode="always")) if split else None
    engine = load_engine(EngineArgs(model=str(model), runner=runner, prefill_peer=peer))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def local(embedded_model):
    yield from engines(embedded_model, RUNNER, split=False)


@pytest.fixture(scope="module")
def split(embedded_model):
    yield from engines(embedded_model, RUNNER, split=True)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = Worker(tmp_path_factory.mktemp("worker"))
    yield w
    w.stop()


def client_of(engine):
    return engine.engine.scheduler.remote


def point_at(engine, port: int):
    """Aim the split engine's client at `port`, with a fresh policy (closed breaker)."""
    client = client_of(engine)
    client.peer.port = port
    client.policy = PrefillPolicy(client.peer.policy, client.policy.bytes_per_token)
    client.counters.clear()
    return client


def prompt_ids(engine, words: int, tag: str) -> list[int]:
    # the tag first: prompts of different tests share no leading token, so no cache hit
    text = f"{tag}: Repeat the list: " + " ".join(f"w{i}" for i in range(words))
    return engine.tokenizer.encode(text, add_special=True)


async def _collect(engine, ids, params=GREEDY, on_output=None):
    toks, last = [], None
    async for out in engine.generate(ids, params):
        toks += out.token_ids
        last = out
        if on_output is not None:
            on_output(out)
    return toks, last.metrics


def generate(engine, ids, params=GREEDY):
    return asyncio.run(_collect(engine, ids, params))


def wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def remote_request(engine):
    """The request the split engine is prefilling remotely, once there is one."""
    def find():
        for r in list(engine.engine.requests.values()):
            if r.metrics.remote_prefill and r.metrics.remote_prefill.get("remote"):
                return r
        return None
    wait_for(lambda: find() is not None)
    return find()


# -- identity --------------------------------------------------------------------------------


def test_split_output_equals_single_box_cold(local, split, worker):
    ids = prompt_ids(local, 250, "cold")
    want, _ = generate(local, ids)
    point_at(split, worker.port)
    got, m = generate(split, ids)
    assert got == want
    info = m.remote_prefill
    assert (info["remote"], info["ok"], info["imported_tokens"]) == (True, True, len(ids) - 1)
    assert info["bytes"] == (len(ids) - 1) * 30 * 2 * 3 * 64 * 2  # 23,040 B per token
    assert info["frames"] == 30 * info["chunks"]
    assert m.cached_tokens == 0
    # the worker logs the transfer: tokens, tokens it computed, KV bytes, seconds, GB/s
    n = len(ids) - 1
    said = f": done: {n} tokens sent ({n} computed), {info['bytes'] / 1e6:.1f} MB of KV in "
    wait_for(lambda: said in worker.log())
    line = next(ln for ln in worker.log().splitlines() if said in ln)
    found = re.fullmatch(r"tandem: prefill for 127\.0\.0\.1:\d+" + re.escape(said)
                         + r"(\d+\.\d\d) s, (\d+\.\d\d\d) GB/s", line)
    assert found, line
    seconds, gbps = float(found[1]), float(found[2])
    assert 0 < seconds < 60
    assert gbps == pytest.approx(info["bytes"] / seconds / 1e9, abs=0.001 + gbps * 0.01)


def test_worker_prints_everything_on_stderr(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "prefill-worker", "--port",
                             str(port), "--threads", "1", "--ctx-size", "2048"],
                            cwd=Path(__file__).resolve().parents[2], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stderr.readline()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert line == (f"tandem: prefill worker for smollm2-135m-instruct listening on "
                    f"127.0.0.1:{port} (loopback, no secret)\n")
    assert out == ""


def test_split_with_a_prompt_partly_in_the_prefix_cache(local, split, worker):
    head = prompt_ids(local, 120, "partial")
    full = head + local.tokenizer.encode(" and then " + " ".join(f"v{i}" for i in range(60)))
    want, _ = generate(local, full)
    client = point_at(split, worker.port)
    # prefilled remotely: its prompt, to the token, is now in this box's prefix cache
    head_out, _ = generate(split, head)
    got, m = generate(split, full)
    assert got == want
    tail = full[len(head):]
    assert head_out[0] != tail[0]  # so the hit is exactly the head
    assert m.cached_tokens == len(head)
    assert m.remote_prefill["imported_tokens"] == len(full) - 1 - m.cached_tokens
    assert client.counters == {"ok": 2}


def test_split_while_another_stream_decodes(local, split, worker):
    short = prompt_ids(local, 5, "stream")
    long = prompt_ids(local, 170, "busy")  # two 512-token chunks on the worker
    many = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)
    want_short, _ = generate(local, short, many)
    want_long, _ = generate(local, long)
    point_at(split, worker.port)
    stamps: list[float] = []

    async def both():
        first = asyncio.get_running_loop().create_future()

        def seen(out):
            stamps.append(time.perf_counter())
            if not first.done():
                first.set_result(None)

        a = asyncio.create_task(_collect(split, short, many, seen))
        await first
        submitted = time.perf_counter()
        b = await _collect(split, long)
        return await a, b, submitted

    (got_short, _), (got_long, m), submitted = asyncio.run(both())
    assert got_short == want_short and got_long == want_long
    assert m.remote_prefill["ok"] and m.remote_prefill["chunks"] == 2
    # the short stream kept producing tokens while the long prompt was prefilled remotely
    during = [t for t in stamps if submitted < t < m.first_token_time]
    assert len(during) >= 10


# -- faults of the real worker ---------------------------------------------------------------


def signal_after_first_chunk(engine, ids, proc, sig):
    """Generate `ids` on `engine`, sending `sig` to the worker `proc` once the first chunk
    of its remote prefill has been imported; returns (tokens, metrics)."""
    async def run():
        task = asyncio.create_task(_collect(engine, ids))
        r = await asyncio.to_thread(remote_request, engine)
        await asyncio.to_thread(
            wait_for, lambda: r.num_computed_tokens > r.metrics.cached_tokens)
        proc.send_signal(sig)
        return await task

    return asyncio.run(run())


def test_worker_killed_mid_transfer(local, split, tmp_path):
    w = Worker(tmp_path)
    ids = prompt_ids(local, 170, "killed")
    want, _ = generate(local, ids)
    client = point_at(split, w.port)
    got, m = signal_after_first_chunk(split, ids, w.proc, signal.SIGKILL)
    assert got == want
    info = m.remote_prefill
    assert (info["ok"], info["failure"], info["imported_tokens"]) == (False, "peer_closed", 512)
    assert client.counters == {"peer_closed": 1}
    w2 = Worker(tmp_path)  # a restarted worker serves the next request
    point_at(split, w2.port)
    assert generate(split, prompt_ids(local, 50, "after-kill"))[1].remote_prefill["ok"]
    w2.stop()


def test_worker_stalled_past_the_deadline(local, split, worker):
    ids = prompt_ids(local, 170, "stalled")
    want, _ = generate(local, ids)
    client = point_at(split, worker.port)
    ended = worker.ended()
    try:
        got, m = signal_after_first_chunk(split, ids, worker.proc, signal.SIGSTOP)
    finally:
        worker.proc.send_signal(signal.SIGCONT)
    # resumed, it finds the decode box gone and frees the request
    wait_for(lambda: worker.ended() > ended)
    assert got == want
    assert (m.remote_prefill["failure"], m.remote_prefill["imported_tokens"]) == (
        "frame_timeout", 512)
    assert client.counters == {"frame_timeout": 1}
    point_at(split, worker.port)
    m2 = generate(split, prompt_ids(local, 50, "after-stall"))[1]
    assert m2.remote_prefill["ok"]


def test_client_cancel_mid_prefill_frees_the_request_on_the_worker(local, split, worker):
    ids = prompt_ids(local, 170, "cancel")
    point_at(split, worker.port)
    done_before = worker.log().count(": done")
    cancelled_before = worker.log().count(": cancelled")

    async def run():
        stream = split.submit(ids, GREEDY)
        r = await asyncio.to_thread(remote_request, split)
        await asyncio.to_thread(
            wait_for, lambda: r.num_computed_tokens > r.metrics.cached_tokens)
        stream.cancel()
        return [out async for out in stream]

    outs = asyncio.run(run())
    assert outs[-1].finish_reason == "abort"
    wait_for(lambda: worker.log().count(": cancelled") == cancelled_before + 1)
    # the worker's one slot is free again: the next prompt is prefilled there at once
    assert generate(split, prompt_ids(local, 50, "after-cancel"))[1].remote_prefill["ok"]
    assert worker.log().count(": done") == done_before + 1


@pytest.mark.parametrize("name, code", [
    ("garbage", "protocol"), ("forged_length", "protocol"), ("version", "version"),
    ("wrong_secret", "auth"), ("different_model", "fingerprint"), ("bad_tag", "protocol"),
])
def test_worker_survives_a_bad_peer(local, split, worker, name, code):
    from app.disagg import wire
    from app.disagg.handshake import proof
    from app.disagg.wire import FrameType

    fp = client_of(split).fingerprint.to_dict()
    theirs = dict(fp, weights_digest="0" * 64) if name == "different_model" else fp
    nonce = b"n" * 32
    hello = wire.encode(FrameType.HELLO, {"nonce": nonce, "fingerprint": theirs})
    first = {
        "garbage": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(100),
        # an 8 GiB HELLO
        "forged_length": wire.PREFIX.pack(b"TDKV", wire.PROTOCOL_VERSION, 1, 0, 10, 8 << 30),
        "version": hello[:4] + bytes([9]) + hello[5:],
        "bad_tag": hello[:-1] + bytes([hello[-1] ^ 1]),
    }.get(name, hello)
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as s:
        s.sendall(first)
        reply, _ = wire.decode(s.recv(65536))
        if reply.type == FrameType.CHALLENGE:  # the handshake goes on to a refused AUTH
            secret = b"x" * 16 if name == "wrong_secret" else b""
            s.sendall(wire.encode(FrameType.AUTH, {"proof": proof(
                secret, b"client", nonce, reply.header["nonce"], theirs, reply.header[
                    "fingerprint"])}))
            reply, _ = wire.decode(s.recv(65536))
    assert (reply.type, reply.header["code"]) == (FrameType.ERROR, code)
    if name == "different_model":
        assert reply.header["message"] == "weights_digest"
    point_at(split, worker.port)
    assert generate(split, prompt_ids(local, 40, f"after-{name}"))[1].remote_prefill["ok"]


# -- faults of a fake worker: every one falls back to the single-box output ------------------


@pytest.mark.parametrize("behaviour, reason", [
    ("garbage", "magic"), ("version", "version"), ("fingerprint", "fingerprint"),
    ("secret", "auth"), ("forged_length", "length"), ("checksum", "checksum"),
    ("busy", "busy"), ("stall", "first_frame_timeout"),
])
def test_decode_box_falls_back_from_a_bad_worker(local, split, behaviour, reason):
    client = client_of(split)
    fake = FakeWorker(behaviour, client.fingerprint, client.shape)
    ids = prompt_ids(local, 40, f"fake-{behaviour}")
    want, _ = generate(local, ids)
    point_at(split, fake.port)
    if behaviour == "stall":
        client.peer.first_frame_timeout_s = 0.5
    try:
        t0 = time.perf_counter()
        got, m = generate(split, ids)
        elapsed = time.perf_counter() - t0
    finally:
        client.peer.first_frame_timeout_s = 8.0
        fake.close()
    assert got == want
    assert (m.remote_prefill["ok"], m.remote_prefill["failure"]) == (False, reason)
    assert client.counters == {reason: 1}
    if behaviour == "stall":
        assert elapsed < 0.5 + 5.0  # deadline + local prefill of 40 words, generously
    if behaviour == "fingerprint":
        assert m.remote_prefill["detail"].startswith("models differ in weights_digest: here '")
    if behaviour != "busy":  # the breaker now keeps prompts local for a while
        assert client.decide(100, 0)[:2] == (False, "peer_backoff")


def test_unreachable_worker_falls_back(local, split):
    ids = prompt_ids(local, 40, "refused")
    want, _ = generate(local, ids)
    point_at(split, free_port())
    got, m = generate(split, ids)
    assert got == want and m.remote_prefill["failure"] == "refused"


# -- the real server, the official client ----------------------------------------------------


def test_serve_with_a_prefill_peer_through_the_openai_client(local, worker):
    from tests.e2e.conftest import _start_subprocess

    ids = prompt_ids(local, 200, "serve")
    text = local.tokenizer.decode(ids)
    want, _ = generate(local, local.tokenizer.encode(text, add_special=True))
    gen = _start_subprocess(None, "--prefill-peer", f"127.0.0.1:{worker.port}",
                            "--prefill-policy", "always", "--threads", "1")
    server = next(gen)
    try:
        out = server.client().completions.create(model=server.model, prompt=text,
                                                  max_tokens=12, temperature=0)
        assert out.choices[0].text == local.tokenizer.decode(want)
        assert server.metric('tandem_prefill_route_total{reason="always",route="remote"}') == 1
        n = out.usage.prompt_tokens - 1
        assert server.metric("tandem_remote_prefill_imported_tokens_total") == n
        assert server.metric("tandem_remote_prefill_kv_bytes_total") == n * 23040
    finally:
        gen.close()
