"""Run a server as a child process for benchmarks and tests: a free port, start it, wait until
`GET /health` answers, stop it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 120.0,
                 stderr_tail=lambda: "") -> dict:
    """Poll `url/health` until it answers 200; returns its JSON body.

    Raises RuntimeError if `proc` exits first (with `stderr_tail()` in the message),
    TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {stderr_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200:
                return r.json()
        time.sleep(0.2)
    raise TimeoutError(f"{url} not healthy after {timeout:.0f} s")


@contextlib.contextmanager
def running(cmd: list[str], port: int, timeout: float = 120.0, **popen_kw) -> Iterator[str]:
    """Start `cmd` (a server listening on 127.0.0.1:`port`), yield its base URL once healthy,
    terminate it on exit. stderr goes to a temporary file, quoted if the server dies."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, **popen_kw)

        def tail() -> str:
            err.seek(0)
            return err.read().decode(errors="replace")[-3000:]

        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, timeout, tail)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
