"""Fixtures that start a `tandem serve` app on a free port and clients that talk to it.

Every test that uses `server` or `tiny_server` runs against both engines, chosen by the
`engine_kind` parameter (test ids `[fake]` / `[real]`):
- `fake`: the app in-process (uvicorn in a thread) on the real `AsyncEngine` over
  `tests.fakes.runner.ScriptedRunner` (byte tokens, scripted replies; no model);
- `real`: `python -m app.cli serve` in a subprocess with the embedded model; marked `model`,
  so `-m "not model"` leaves it out, and skipped when the model is missing (see
  `tests/conftest.py:embedded_model`).
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

from app.bench.server_process import free_port, running, wait_healthy
from app.engine.async_engine import AsyncEngine
from app.engine.engine import EngineConfig, LLMEngine
from app.engine.scheduler import SchedulerConfig
from models.registry import DEFAULT_MODEL
from tests.fakes.runner import ScriptedRunner

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key-e2e"
CTX_SIZE = 2048
MODEL = os.environ.get("TANDEM_E2E_MODEL", DEFAULT_MODEL)


GREEDY_TEXT = "Hello wörld, the quick brown fox jumps over the lazy dog; naïve café. "
GREEDY_WORDS = GREEDY_TEXT.split(" ")[:-1]
REPLY_CHARS = 40  # the fake model says this many characters, then EOS


def scripted_reply(prompt: list[int]) -> str:
    """The fake model's reply: 40 characters of `GREEDY_TEXT`, from a word the prompt picks
    (a function of the prompt, so the same prompt always gets the same reply)."""
    start = sum(prompt) % len(GREEDY_WORDS)
    words = GREEDY_WORDS[start:] + GREEDY_WORDS[:start]
    return (" ".join(words) + " ")[:REPLY_CHARS]


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


def _one_model_home() -> Path:
    """A TANDEM_HOME inside the session's whose store links only `MODEL` (and its sha256
    sidecar), made once: the e2e servers list exactly the model they serve, whatever else
    the user's store holds. Profiles and probes are cached there for every server."""
    from models.store import link_model, model_path

    home = Path(os.environ["TANDEM_HOME"]) / "e2e-one-model"
    store = home / "models"
    if not store.is_dir():
        store.mkdir(parents=True)
        link_model(model_path(MODEL), store)
    return home


def _start_subprocess(api_key: str | None, *extra: str) -> Iterator[Server]:
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--model", MODEL, "--port", str(port)]
    cmd += ["--ctx-size", str(CTX_SIZE), *extra]
    if api_key:
        cmd += ["--api-key", api_key]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TANDEM_HOME": str(_one_model_home())}
    # llama.cpp's OpenMP workers spin at barriers by default; on a shared, oversubscribed CI
    # box that turns a 1 s request into 10+ s. Sleeping at barriers keeps the suite steady.
    env.setdefault("OMP_WAIT_POLICY", "passive")
    env.pop("TANDEM_API_KEY", None)
    with running(cmd, port, timeout=180, cwd=ROOT, env=env) as url:
        model = httpx.get(f"{url}/health", timeout=10).json()["model"]
        yield Server(url, model, api_key, "real")


def fake_engine(
    context_length: int = CTX_SIZE, max_seqs: int = 32, max_waiting: int = 64,
    step_s: float = 0.003, tokenizer: object = None,
) -> tuple[AsyncEngine, ScriptedRunner]:
    """The real engine over a scripted runner; `step_s` is the simulated time per step.

    The scripted token leads the others by a margin of 2 (logits), so greedy decoding
    follows the script and seeded sampling (temperature 0.8, top-k 5) draws from a real
    distribution: about half its tokens leave the script."""
    runner = ScriptedRunner(default=scripted_reply, step_s=step_s, margin=2.0,
                            max_seqs=max_seqs, num_blocks=1024, block_size=16,
                            n_ctx=context_length, name="fake-model",
                            tokenizer=tokenizer)  # type: ignore[arg-type]
    config = EngineConfig(
        context_length=context_length,
        scheduler=SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=512,
                                  max_waiting=max_waiting),
    )
    engine = AsyncEngine(LLMEngine(runner, config), "fake-model", "fake")
    return engine, runner


def _start_inprocess(
    api_key: str | None, cors: tuple[str, ...] = (), fail_after: int | None = None,
    **engine_kw: object,
) -> Iterator[Server]:
    from app.server.app import create_app
    from app.server.limits import uvicorn_options

    engine, runner = fake_engine(**engine_kw)  # type: ignore[arg-type]
    if fail_after is not None:
        runner.fail_after(fail_after)
    app = create_app(engine, api_key=api_key, aliases=["fake-model.gguf"], cors_origins=cors)
    yield from serve_in_thread(app, engine, api_key, **uvicorn_options())


def serve_in_thread(app: object, engine: object, api_key: str | None,
                    **uvicorn_kw: object) -> Iterator[Server]:
    """Serve `app` with uvicorn on a free loopback port in a thread; on exit stop it and
    shut `engine` down. `uvicorn_kw` go to `uvicorn.Config`."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,  # type: ignore[arg-type]
                                           log_level="warning", lifespan="off", **uvicorn_kw))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        yield Server(url, wait_healthy(url, timeout=30)["model"], api_key, "fake")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.shutdown()  # type: ignore[attr-defined]


@pytest.fixture(scope="session", params=["fake", pytest.param("real", marks=pytest.mark.model)])
def engine_kind(request: pytest.FixtureRequest) -> str:
    """Which engine the session's servers run: every e2e test runs on both."""
    if request.param == "real" and MODEL == DEFAULT_MODEL:
        request.getfixturevalue("embedded_model")  # skips when the model is missing
    return request.param


@pytest.fixture(scope="session")
def server(engine_kind: str) -> Iterator[Server]:
    """The main server (API key required)."""
    if engine_kind == "real":
        yield from _start_subprocess(API_KEY)
    else:
        yield from _start_inprocess(API_KEY)


@pytest.fixture(scope="session")
def tiny_server(engine_kind: str) -> Iterator[Server]:
    """A server that decodes one sequence at a time and queues at most one more."""
    if engine_kind == "real":
        yield from _start_subprocess(None, "--max-concurrency", "1", "--max-queue", "1")
    else:
        yield from _start_inprocess(None, max_seqs=1, max_waiting=1)


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="module")
def qwen() -> Iterator[Server]:
    """`tandem serve --model qwen2.5-coder-1.5b-instruct --ctx-size 2048`, no API key
    (skipped where the model is not in the store)."""
    from app.bench.server_process import free_port, running
    from tests.conftest import store_model

    store_model("qwen2.5-coder-1.5b-instruct")
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--model", "qwen2.5-coder-1.5b-instruct",
           "--port", str(port), "--ctx-size", "2048"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "passive"}
    env.pop("TANDEM_API_KEY", None)
    with running(cmd, port, timeout=300, cwd=ROOT, env=env) as url:
        model = httpx.get(f"{url}/health", timeout=10).json()["model"]
        yield Server(url, model, None, "real")
