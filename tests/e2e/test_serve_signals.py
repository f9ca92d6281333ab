"""`tandem serve` as a process: a busy port is one line before anything loads, the banner
means it listens, and Ctrl+C / SIGTERM stop it gracefully (exit 0, no traceback; open
streams end with an error event and `[DONE]` once the grace period is over)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from app.bench.server_process import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.model


@contextmanager
def serving(model: Path, *flags: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """A `tandem serve` process, yielded once it printed its banner; killed if still alive."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--model", str(model), "--port", str(port),
         "--spec", "off", "--threads", "1", "--max-concurrency", "2", *flags],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("tandem: serving "):
                break
        else:
            pytest.fail(f"no banner; stderr: {proc.stderr.read()}")
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def events(body: str) -> list[str]:
    return [e.removeprefix("data: ") for e in body.split("\n\n") if e]


def test_busy_port_is_one_line_and_no_banner(embedded_model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--model",
                            str(embedded_model), "--port", str(port)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"tandem serve: port {port} is in use\n")


def signal_mid_stream(url: str, body: dict, proc, sig) -> str:
    """Stream a chat completion, send `sig` to the server after its first chunk, and return
    everything received."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        chunks = r.iter_text()
        received = next(chunks)
        proc.send_signal(sig)
        return received + "".join(chunks)


def test_idle_server_stops_at_once_on_sigterm(embedded_model: Path) -> None:
    with serving(embedded_model) as (proc, url):
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # banner = listening
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr.read() == ""


def test_stop_ends_open_stream_with_error_and_done(embedded_model: Path) -> None:
    body = {"messages": [{"role": "user", "content": "Tell a long story."}], "stream": True,
            "max_tokens": 4000, "ignore_eos": True}
    with serving(embedded_model, "--shutdown-timeout", "1") as (proc, url):
        received = signal_mid_stream(url, body, proc, signal.SIGINT)  # Ctrl+C mid-stream
        assert proc.wait(timeout=20) == 0
        assert proc.stderr.read() == ""
    got = events(received)
    assert got[-1] == "[DONE]"
    assert json.loads(got[-2]) == {"error": {
        "message": "The server is shutting down; the reply was cut short.",
        "type": "server_error", "param": None, "code": "server_shutting_down"}}
    assert len(got) > 3


def test_grace_period_lets_a_short_reply_finish(embedded_model: Path) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True,
            "max_tokens": 24, "ignore_eos": True}
    with serving(embedded_model, "--shutdown-timeout", "60") as (proc, url):
        received = signal_mid_stream(url, body, proc, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr.read() == ""
    got = events(received)
    assert got[-1] == "[DONE]"
    assert json.loads(got[-2])["choices"][0]["finish_reason"] == "length"
