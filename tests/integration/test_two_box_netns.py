"""Two-box mode over an emulated link: the prefill worker runs in a network namespace of
its own, reached over a veth pair shaped to 1 Gbit/s with 0.5 ms delay (`tc netem`; where the
kernel lacks netem, a `tbf` rate limit alone, which is what this suite's CI machine has).
The split completes with the single-box output, the link probe measures the shaped rate,
and the faults that depend on the network (worker killed, worker stalled, wrong secret)
still end in the single-box output. Needs root and iproute2; skips otherwise."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from app.bench.netns import Link, emulated_link
from app.bench.worker_process import WorkerProcess
from app.config import EngineArgs
from app.disagg.peer import PeerConfig
from app.disagg.policy import PolicyConfig, PrefillPolicy
from app.loader import load_engine
from backends.base import RunnerConfig
from tests.integration.test_two_box import (
    generate,
    prompt_ids,
    signal_after_first_chunk,
    wait_for,
)

RUNNER = RunnerConfig(max_seqs=2, seq_tokens=2048, n_threads=1)


@pytest.fixture(scope="module")
def link():
    """An emulated 1 Gbit/s, 0.5 ms link."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("needs root and iproute2 (ip, tc)")
    try:
        with emulated_link("1gbit", "0.5ms") as shaped:
            yield shaped
    except OSError as e:
        pytest.skip(f"cannot emulate a link here: {e}")


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("peer") / "peer.secret"
    path.write_text("s" * 64 + "\n")
    path.chmod(0o600)  # a secret open to other users is refused
    return path


def worker_in(link: Link, tmp, secret_file) -> WorkerProcess:
    return WorkerProcess(tmp, "--host", link.peer_ip, "--secret-file", str(secret_file),
                         "--threads", "1", "--ctx-size", "2048",
                         prefix=("ip", "netns", "exec", link.namespace))


@pytest.fixture(scope="module")
def engines(embedded_model, link, secret_file):
    local = load_engine(EngineArgs(model=str(embedded_model), runner=RUNNER))
    peer = PeerConfig(link.peer_ip, 1, secret=secret_file.read_bytes().strip(),
                      frame_timeout_s=1.0, policy=PolicyConfig(mode="always"))
    split = load_engine(EngineArgs(model=str(embedded_model), runner=RUNNER,
                                   prefill_peer=peer))
    yield local, split
    split.shutdown()
    local.shutdown()


def aim(split, port: int, secret: bytes | None = None):
    client = split.engine.scheduler.remote
    client.peer.port = port
    if secret is not None:
        client.peer.secret = secret
    client.policy = PrefillPolicy(client.peer.policy, client.policy.bytes_per_token)
    client.counters.clear()
    return client


def test_split_over_the_shaped_link(link, engines, secret_file, tmp_path):
    local, split = engines
    w = worker_in(link, tmp_path, secret_file)
    try:
        ids = prompt_ids(local, 170, "netns")  # two chunks
        want, _ = generate(local, ids)
        aim(split, w.port)
        got, m = generate(split, ids)
        assert got == want
        info = m.remote_prefill
        assert info["ok"] and info["chunks"] == 2
        # the probe sees the shaped link: at most 1 Gbit/s = 0.125 GB/s, plus slack for the
        # token bucket's burst
        assert 0.01 < info["link_gbps"] < 0.2, (link.shaping, info["link_gbps"])
    finally:
        w.stop()


@pytest.mark.parametrize("fault", ["killed", "stalled", "wrong_secret"])
def test_faults_over_the_shaped_link(link, engines, secret_file, tmp_path, fault):
    local, split = engines
    w = worker_in(link, tmp_path, secret_file)
    try:
        ids = prompt_ids(local, 170, f"netns-{fault}")
        want, _ = generate(local, ids)
        client = aim(split, w.port, b"w" * 32 if fault == "wrong_secret" else None)

        try:
            if fault == "wrong_secret":
                got, m = generate(split, ids)
            else:
                got, m = signal_after_first_chunk(
                    split, ids, w.proc, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        finally:
            if fault == "stalled":
                w.proc.send_signal(signal.SIGCONT)
            client.peer.secret = secret_file.read_bytes().strip()
        assert got == want
        reason = {"killed": "peer_closed", "stalled": "frame_timeout",
                  "wrong_secret": "auth"}[fault]
        assert m.remote_prefill["failure"] == reason
        if fault != "killed":  # the worker still serves the next request
            if fault == "stalled":
                wait_for(lambda: w.ended() >= 1)
            aim(split, w.port)
            assert generate(split, prompt_ids(local, 30, f"after-{fault}"))[1] \
                .remote_prefill["ok"]
    finally:
        w.stop()


def test_a_namespace_left_behind_does_not_take_the_next_links_traffic(link):
    """A killed run leaves its namespace and veth routing its subnet; a second link made
    beside it (here: beside the module's) takes another subnet, and a listener in it is
    reached, not refused by the first namespace."""
    with emulated_link("1gbit", "0.5ms") as second:
        assert second.peer_ip.rsplit(".", 1)[0] != link.peer_ip.rsplit(".", 1)[0]
        listener = subprocess.Popen(
            ["ip", "netns", "exec", second.namespace, sys.executable, "-c",
             f"import socket; s = socket.create_server(({second.peer_ip!r}, 0)); "
             "print(s.getsockname()[1], flush=True); s.accept()[0].sendall(b'hi')"],
            stdout=subprocess.PIPE, text=True)
        try:
            port = int(listener.stdout.readline())
            with socket.create_connection((second.peer_ip, port), timeout=5) as conn:
                assert conn.recv(2) == b"hi"
        finally:
            listener.kill()
            listener.wait()
