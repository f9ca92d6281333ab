"""Fixtures that start a real `tandem serve` on a free port and clients that talk to it.

Engine choice (`TANDEM_E2E_ENGINE`): `real` runs `python -m app.cli serve` in a subprocess
with the embedded model; `fake` runs the app in-process (uvicorn in a thread) on
`tests/e2e/fake_engine.py`; `auto` (default) is `real` when `app.engine.AsyncEngine` imports.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from app.server_process import free_port, running, wait_healthy

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

    def metric(self, name: str, default: float | None = None) -> float:
        """One sample of `/metrics`: `name` with its labels as exposed, e.g.
        `tandem_requests_finished_total{finish_reason="stop"}`; `default` if absent."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        if default is not None:
            return default
        raise KeyError(name)


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
    with running(cmd, port, timeout=180, cwd=ROOT, env=env) as url:
        model = httpx.get(f"{url}/health", timeout=10).json()["model"]
        yield Server(url, model, api_key, "real")


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
        model = wait_healthy(url, timeout=30)["model"]
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
