"""Ctrl+C / SIGTERM under mixed streaming traffic (issue 33.4): every stream open at the end
of the grace period ends with its API's error event (and `[DONE]` on the OpenAI APIs), every
collected reply is a 503, the process exits 0 and nothing reaches stderr (uvicorn's "Cancel
N running task(s)" and its CancelledError traceback were the symptom), over rounds that vary
the grace period, the signal and what the engine computes when the grace period ends.

`tandem serve` runs as a process on the fake engine (`tests.fakes.serve`): replies of 5000
tokens, so no long stream ends by itself, and a prompt chunk of 256 tokens or more costs 8 ms
a token, so the long prompt sent just before the signal in some rounds makes a step of 4 s
(a 500-token prefill chunk, as a larger model takes on a small machine) while the grace
period ends: longer than the 2 s the streams had, when they waited for the engine to answer
their abort, before uvicorn cancelled them. Two rounds add a client that stops reading its
stream (with the 16 KiB send buffer every connection gets here, the server's writes to it
wait at once): its connection must be dropped before uvicorn would cancel its task.
7 rounds, about 40 s."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from app.bench.server_process import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = "fake-model"
LONG = 1900  # tokens asked of every long reply (the fake context is 2048)
MSG = [{"role": "user", "content": "Tell a long story."}]
SHUTDOWN = "The server is shutting down; the reply was cut short."
OPENAI_ERROR = {"error": {"message": SHUTDOWN, "type": "server_error", "param": None,
                          "code": "server_shutting_down"}}

# (name, path, body): the streams, one or more per API, then the collected replies
STREAMS = [
    ("chat", "/v1/chat/completions",
     {"messages": MSG, "stream": True, "max_tokens": LONG, "temperature": 0}),
    ("chat n=2", "/v1/chat/completions",
     {"messages": MSG, "stream": True, "max_tokens": LONG, "temperature": 0, "n": 2,
      "stream_options": {"include_usage": True}}),
    ("completions", "/v1/completions",
     {"prompt": "Once", "stream": True, "max_tokens": LONG, "temperature": 0}),
    ("responses", "/v1/responses",
     {"input": "Tell a long story.", "stream": True, "max_output_tokens": LONG,
      "temperature": 0}),
    ("messages", "/v1/messages",
     {"model": MODEL, "messages": MSG, "stream": True, "max_tokens": LONG, "temperature": 0}),
    ("ollama chat", "/api/chat",
     {"model": MODEL, "messages": MSG, "options": {"num_predict": LONG, "temperature": 0}}),
    ("ollama generate", "/api/generate",
     {"model": MODEL, "prompt": "Once", "options": {"num_predict": LONG, "temperature": 0}}),
]
COLLECTED = [
    ("collected chat", "/v1/chat/completions",
     {"messages": MSG, "max_tokens": LONG, "temperature": 0}),
]
# streamed: its first chunk (the role) is sent once it is submitted, before its prefill
LONG_PROMPT = ("chat, long prompt", "/v1/chat/completions",
               {"messages": [{"role": "user", "content": "x" * 1500}], "stream": True,
                "max_tokens": LONG, "temperature": 0})

# (grace seconds, signal, long prompt just before the signal, a client that reads nothing)
ROUNDS = [(0, signal.SIGINT, True, False), (1, signal.SIGTERM, False, True),
          (0.5, signal.SIGINT, True, False), (0, signal.SIGTERM, False, False),
          (1, signal.SIGINT, False, False), (0.5, signal.SIGTERM, True, False),
          (0.5, signal.SIGINT, False, True)]


class Client(threading.Thread):
    """One request, read to its end; `started` is set at its first body bytes."""

    def __init__(self, url: str, name: str, path: str, body: dict, collected: bool = False):
        super().__init__(daemon=True)
        self.url, self.name, self.path, self.body = url, name, path, body
        self.collected = collected
        self.started = threading.Event()
        self.status: int | None = None
        self.text = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + self.path, json=self.body, timeout=60) as r:
                self.status = r.status_code
                raw = b""
                for data in r.iter_raw():
                    raw += data
                    self.started.set()
                self.text = raw.decode()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.started.set()


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name or None, data) of each server-sent event."""
    out = []
    for block in filter(None, text.split("\n\n")):
        name, data = None, ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((name, data))
    return out


def ending(path: str, text: str) -> object:
    """What a stream cut by the shutdown ends with, reduced to what must be exact."""
    if path.startswith("/api/"):
        return json.loads(text.rstrip("\n").rsplit("\n", 1)[-1])
    events = sse_events(text)
    if path == "/v1/responses":
        (e1, d1), (e2, d2) = events[-2:]
        error, failed = json.loads(d1), json.loads(d2)
        return (e1, error["type"], error["code"], error["message"], e2,
                failed["response"]["status"], failed["response"]["error"])
    if path == "/v1/messages":
        return events[-1][0], json.loads(events[-1][1])
    return json.loads(events[-2][1]), events[-1][1]


EXPECTED = {
    "/v1/chat/completions": (OPENAI_ERROR, "[DONE]"),
    "/v1/completions": (OPENAI_ERROR, "[DONE]"),
    "/v1/responses": ("error", "error", "server_shutting_down", SHUTDOWN, "response.failed",
                      "failed", {"code": "server_error", "message": SHUTDOWN}),
    "/v1/messages": ("error", {"type": "error", "error": {"type": "overloaded_error",
                                                         "message": SHUTDOWN}}),
    "/api/chat": {"error": SHUTDOWN},
    "/api/generate": {"error": SHUTDOWN},
}


def stalled_client(port: int) -> socket.socket:
    """A socket with a 4 KiB receive buffer whose long stream (4 choices, 20 logprobs a token:
    about 6 KB a step) has begun and which reads nothing more: once the buffers between are
    full, the server's writes to it wait (until the connection is dropped)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({"messages": MSG, "stream": True, "max_tokens": LONG, "n": 4,
                       "temperature": 0, "logprobs": True, "top_logprobs": 20}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    sock.settimeout(30)
    sock.recv(1, socket.MSG_PEEK)  # the response began: the request is in the engine
    return sock


def one_round(grace: float, sig: int, long_prompt: bool, stalled: bool) -> list[str]:
    """Serve, start the traffic, signal, and list what went wrong (empty: nothing)."""
    port = free_port()
    env = {**os.environ, "TANDEM_FAKE_REPLY_CHARS": "5000", "TANDEM_FAKE_PREFILL_S": "0.008",
           "TANDEM_FAKE_SNDBUF": "16384"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.serve", "--port", str(port),
         "--shutdown-timeout", str(grace)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    problems: list[str] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            if line.startswith("tandem: serving "):
                break
        url = f"http://127.0.0.1:{port}"
        streams = [Client(url, *request) for request in STREAMS]
        collected = [Client(url, *request, collected=True) for request in COLLECTED]
        for c in streams + collected:
            c.start()
        for c in streams:
            assert c.started.wait(30)
        stalled_sock = stalled_client(port) if stalled else None
        if long_prompt:  # its prefill steps run when the grace period ends
            streams.append(Client(url, *LONG_PROMPT))
            streams[-1].start()
            assert streams[-1].started.wait(30)
        proc.send_signal(sig)
        for c in streams + collected:
            c.join(60)
        rc = proc.wait(timeout=60)
        stderr = proc.stderr.read()
        if stalled_sock is not None:
            stalled_sock.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0 or stderr:
        problems.append(f"exit {rc}, stderr: {stderr[-2000:]}")
    for c in streams + collected:
        if c.error is not None:
            problems.append(f"{c.name}: {c.error!r}")
            continue
        want = (503, OPENAI_ERROR) if c.collected else (200, EXPECTED[c.path])
        try:
            got = (c.status, json.loads(c.text) if c.collected else ending(c.path, c.text))
        except (ValueError, IndexError, KeyError) as exc:
            got = (c.status, f"unreadable ending ({exc!r}): {c.text[-300:]!r}")
        if got != want:
            problems.append(f"{c.name}: {got!r}")
    return problems


@pytest.mark.timeout(180)
def test_every_stream_ends_with_its_error_event_over_repeated_shutdowns() -> None:
    failures = {}
    for k, (grace, sig, long_prompt, stalled) in enumerate(ROUNDS):
        problems = one_round(grace, sig, long_prompt, stalled)
        if problems:
            failures[f"round {k} (grace {grace} s, {signal.Signals(sig).name}, long prompt "
                     f"{long_prompt}, stalled client {stalled})"] = problems
    assert failures == {}
