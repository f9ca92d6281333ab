"""Claude Code (`claude -p`, installed from npm by the test) against `tandem serve` on
Qwen2.5-Coder-1.5B: one task that needs a tool call, through a proxy that records what
Claude Code sends.

Skipped, with the reason, when npm is missing or cannot install `@anthropic-ai/claude-code`
(no network), or when the model is not in the store (`TANDEM_CLAUDE_CODE_MODEL` may name a
GGUF file or registry model instead). The install is cached in `TANDEM_NPM_CACHE`
(default `~/.cache/tandem-tests/npm`).

Claude Code is run as the README says: `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`, the
served model's name for every model slot, non-essential traffic off, and `--bare --tools
Read` (its minimal system prompt and one tool: ~550 prompt tokens instead of ~11.6K, so the
first turn's prefill takes seconds, not minutes, on a CPU).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.bench.server_process import free_port, running, wait_healthy
from tests.conftest import store_model
from tests.e2e.conftest import ROOT

pytestmark = pytest.mark.model

VERSION = os.environ.get("TANDEM_CLAUDE_CODE_VERSION", "2.1.332")
NPM_CACHE = Path(os.environ.get("TANDEM_NPM_CACHE",
                                Path.home() / ".cache" / "tandem-tests" / "npm"))
KEY = "claude-code-test-key"
CTX = 32768  # Claude Code compacts at once when the window minus its output reserve is small


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    """The `claude` executable, installed with npm once into the cache."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: cannot install @anthropic-ai/claude-code")
    prefix = NPM_CACHE / f"claude-code-{VERSION}"
    exe = prefix / "node_modules" / ".bin" / "claude"
    if not exe.exists():
        try:
            r = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit",
                                "--no-fund", f"@anthropic-ai/claude-code@{VERSION}"],
                               capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            pytest.skip("npm install @anthropic-ai/claude-code took over 10 minutes "
                        "(registry unreachable?)")
        if r.returncode != 0 or not exe.exists():
            pytest.skip(f"npm could not install @anthropic-ai/claude-code@{VERSION} "
                        f"(registry unreachable?): {(r.stderr or r.stdout)[-500:]}")
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"the installed claude does not run here: {r.stderr[-500:]}")
    return exe


@pytest.fixture(scope="module")
def tandem() -> Iterator[tuple[str, str]]:
    """(base URL, model name) of `tandem serve` on Qwen2.5-Coder-1.5B."""
    model = os.environ.get("TANDEM_CLAUDE_CODE_MODEL")
    if model is None:
        store_model("qwen2.5-coder-1.5b-instruct")
        model = "qwen2.5-coder-1.5b-instruct"
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--model", model, "--port", str(port),
           "--ctx-size", str(CTX), "--api-key", KEY]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "passive"}
    env.pop("TANDEM_API_KEY", None)
    with running(cmd, port, timeout=300, cwd=ROOT, env=env) as url:
        yield url, httpx.get(f"{url}/health", timeout=10).json()["model"]


class Recorder:
    """A reverse proxy to `upstream` that keeps the JSON body of every request."""

    def __init__(self, upstream: str):
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        self.bodies: list[dict] = []
        client = httpx.AsyncClient(base_url=upstream, timeout=None)

        async def forward(request: Request) -> StreamingResponse:
            raw = await request.body()
            if raw:
                self.bodies.append(json.loads(raw))
                print(f"[recorder] {request.method} {request.url.path} "
                      f"#{len(self.bodies)} {len(raw)} bytes", file=sys.stderr, flush=True)
            headers = {k: v for k, v in request.headers.items()
                       if k not in ("host", "content-length")}
            sent = client.build_request(request.method, request.url.path,
                                        params=request.query_params, content=raw,
                                        headers=headers)
            r = await client.send(sent, stream=True)
            keep = {k: v for k, v in r.headers.items()
                    if k not in ("content-length", "transfer-encoding", "content-encoding")}
            return StreamingResponse(r.aiter_raw(), status_code=r.status_code, headers=keep,
                                     background=None)

        app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        url = f"http://127.0.0.1:{self.port}"
        wait_healthy(url, timeout=30)
        return url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


ATTEMPTS = 3  # Claude Code sends no temperature: the model samples with its own defaults


def run_claude(claude_bin: Path, url: str, model: str, tmp_path: Path, prompt: str
               ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """One `claude -p` run in a fresh HOME: (the process, the request bodies it sent)."""
    home = tmp_path / "home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_MODEL": model,
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
           "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
           "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(CTX), "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
           "API_TIMEOUT_MS": "3600000"}  # a CPU's first turn may outlast the default 10 min
    recorder = Recorder(url)
    with recorder as proxy:
        env["ANTHROPIC_BASE_URL"] = proxy
        r = subprocess.run([str(claude_bin), "-p", "--bare", "--tools", "Read",
                            "--allowedTools", "Read", "--model", model, "--max-turns", "6",
                            prompt], cwd=tmp_path / "work", env=env, capture_output=True,
                           text=True, timeout=900)
    return r, [b for b in recorder.bodies if "messages" in b]


def tool_results(turns: list[dict]) -> list[dict]:
    """The `tool_result` blocks of every request's messages."""
    return [c for b in turns for m in b["messages"] if isinstance(m["content"], list)
            for c in m["content"] if c.get("type") == "tool_result"]


@pytest.mark.timeout(3600)  # CPU prefill of each turn, up to ATTEMPTS runs
def test_claude_p_finishes_a_turn_with_a_tool_call(claude_bin: Path, tandem: tuple[str, str],
                                                   tmp_path: Path) -> None:
    url, model = tandem
    (tmp_path / "work").mkdir()
    secret = tmp_path / "work" / "secret.txt"
    secret.write_text("The secret word is: pineapple\n")
    prompt = f"Use the Read tool to read {secret}, then reply with the secret word in it."
    for attempt in range(1, ATTEMPTS + 1):
        r, turns = run_claude(claude_bin, url, model, tmp_path, prompt)
        assert r.returncode == 0, f"claude exited {r.returncode}: {r.stdout[-1000:]}{r.stderr[-1000:]}"
        assert turns, "Claude Code sent no messages request"
        assert turns[0]["max_tokens"] == 4096
        assert [t["name"] for t in turns[0]["tools"]] == ["Read"]
        results = tool_results(turns)
        if results:
            break
        print(f"attempt {attempt}: the model answered without calling Read", file=sys.stderr)
    assert results, f"the server never saw a tool_result turn in {ATTEMPTS} runs"
    assert any("pineapple" in json.dumps(c["content"]) for c in results)
