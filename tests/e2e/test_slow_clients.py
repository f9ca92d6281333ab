"""A client that stops reading its stream (issue 33.3): the engine and other streams go on,
and once its bytes have waited `write_timeout_s` it is disconnected, its request aborted and
its KV freed. In-process on the fake engine (a stalled socket needs no model)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from app.bench.server_process import wait_healthy
from tests.e2e.conftest import Server, fake_engine

WRITE_TIMEOUT_S = 1.0
N = 8  # choices of the stalled request: 8 sequences, each event ~1.5 KB with 20 logprobs
ABORTED = 'tandem_requests_finished_total{finish_reason="abort"}'


@pytest.fixture(scope="module")
def slow() -> Iterator[Server]:
    """The fake engine at 10 ms a step (the stalled request's 2000 tokens would take 20 s or
    more) behind uvicorn with a 1 s write timeout, on a listening socket whose connections
    get a 16 KiB send buffer: without it Linux grows a loopback socket's buffer to a few MB,
    which takes the stalled stream seconds to fill before anything waits."""
    import uvicorn

    from app.server.app import create_app
    from app.server.limits import uvicorn_options

    engine, _ = fake_engine(step_s=0.01)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)  # accepted ones inherit it
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(
        create_app(engine), log_level="warning", lifespan="off",
        **uvicorn_options(write_timeout_s=WRITE_TIMEOUT_S)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield Server(url, wait_healthy(url, timeout=30)["model"], None, "fake")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.shutdown()
        sock.close()


def _until(check, limit_s: float = 60.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def _stalled_request(server: Server) -> socket.socket:
    """A raw socket with a 4 KiB receive buffer that asks for a long stream and never reads."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "max_tokens": 2000, "ignore_eos": True, "temperature": 0, "n": N,
                       "logprobs": True, "top_logprobs": 20}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def _read_until_closed(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_stalled_reader_is_dropped_and_others_stream_on(slow: Server) -> None:
    aborted = slow.metric(ABORTED, 0)
    sock = _stalled_request(slow)
    try:
        assert _until(lambda: slow.metric("tandem_requests_running") == N)
        # another client's stream is served in full while the stalled one holds its socket
        body = {"messages": [{"role": "user", "content": "hello"}], "stream": True,
                "temperature": 0}
        with httpx.stream("POST", f"{slow.url}/v1/chat/completions", json=body,
                          timeout=30) as r:
            events = [e for e in r.read().decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "stop"
        # the stalled one is aborted once its bytes waited the write timeout: every
        # sequence ends "abort" (not "length"), nothing runs, no KV block is held
        assert _until(lambda: slow.metric(ABORTED, 0) == aborted + N)
        assert _until(lambda: slow.metric("tandem_requests_running") == 0)
        assert slow.metric("tandem_kv_blocks_used") == 0
        # and its connection is closed: what the kernel held, then the end (no [DONE])
        data = _read_until_closed(sock, 30)
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"data: [DONE]" not in data
    finally:
        sock.close()
