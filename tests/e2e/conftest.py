"""Fixtures that start a real `tandem serve` on a free port and clients that talk to it.

Engine choice (`TANDEM_E2E_ENGINE`): `real` runs `python -m app.cli serve` in a subprocess
with the embedded model; `fake` runs the app in-process (uvicorn in a thread) on
`tests/e2e/fake_engine.py`; `auto` (default) is `real` when `app.engine.AsyncEngine` imports.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key-e2e"
CTX_SIZE = 2048
MODEL = os.environ.get("TANDEM_E2E_MODEL", "smollm2-135m-instruct")


def engine_mode() -> str:
    mode = os.environ.get("TANDEM_E2E_ENGINE", "auto")
    if mode != "auto":
        return mode
    try:
        from app.engine import AsyncEngine  # noqa: F401
    except ImportError:
        return "fake"
    return "real"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running server: `url` is the base (no `/v1`), `model` the served name."""

    url: str
    model: str
    api_key: str | None
    mode: str

    def client(self, **kw: object) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1",
            api_key=self.api_key or "none",
            max_retries=0,
            timeout=120,
            **kw,
        )

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0, timeout=120
        )

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metric(self, name: str) -> float:
        """One sample of `/metrics` (a metric without labels)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"server exited with {proc.returncode}: {err[-3000:]}")
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200:
                return r.json()["model"]
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not healthy after {timeout}s")


def _start_subprocess(api_key: str | None, *extra: str) -> Iterator[Server]:
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--model", MODEL, "--port", str(port)]
    cmd += ["--ctx-size", str(CTX_SIZE), *extra]
    if api_key:
        cmd += ["--api-key", api_key]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # llama.cpp's OpenMP workers spin at barriers by default; on a shared, oversubscribed CI
    # box that turns a 1 s request into 10+ s. Sleeping at barriers keeps the suite steady.
    env.setdefault("OMP_WAIT_POLICY", "passive")
    env.pop("TANDEM_API_KEY", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        model = _wait_healthy(url, proc)
        yield Server(url, model, api_key, "real")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_inprocess(
    api_key: str | None, cors: tuple[str, ...] = (), **engine_kw: object
) -> Iterator[Server]:
    import uvicorn

    from app.server.app import create_app
    from tests.e2e.fake_engine import FakeEngine

    engine_kw.setdefault("context_length", CTX_SIZE)
    engine = FakeEngine(**engine_kw)  # type: ignore[arg-type]
    app = create_app(engine, api_key=api_key, aliases=["fake-model.gguf"], cors_origins=cors)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        model = _wait_healthy(url, None, timeout=30)
        yield Server(url, model, api_key, "fake")
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The main server (API key required)."""
    if engine_mode() == "real":
        yield from _start_subprocess(API_KEY)
    else:
        yield from _start_inprocess(API_KEY)


@pytest.fixture(scope="session")
def tiny_server() -> Iterator[Server]:
    """A server that decodes one sequence at a time and queues at most one more."""
    if engine_mode() == "real":
        yield from _start_subprocess(None, "--max-concurrency", "1", "--max-queue", "1")
    else:
        yield from _start_inprocess(None, max_seqs=1, max_waiting=1)


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return server.client()
