"""The real Codex CLI (`@openai/codex` from npm) against `tandem serve` on
Qwen2.5-Coder-1.5B: `codex exec` with a custom provider (`wire_api = "responses"`) finishes
a turn that needs one tool call (read a file), exit code 0, and the server saw the
`function_call_output` turn.

Skipped, with the reason, where npm or the package cannot be installed, or where the model
is not in the store (`TANDEM_CODEX_MODEL` may name a .gguf path instead; `TANDEM_CODEX_URL`
a running server). Codex's first
request is ~10K tokens (its instructions and 9 tools), prefilled at ~100 tokens/s on a
2-core CPU: minutes. A recording proxy between Codex and the server keeps every request
body and, per response, the time to its first output event and its `usage`; they are
written to `codex-trace.json` in the test's temporary directory and printed (`-s`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.bench.server_process import free_port, running, wait_healthy
from tests.conftest import store_model
from tests.e2e.conftest import ROOT

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(3600)]

CODEX_VERSION = "0.171.0"  # the version issue 28 captured
NPM_PREFIX = Path.home() / ".cache" / "tandem-tests" / "npm" / "codex"
CTX_SIZE = 16384  # Codex's first request is ~10K tokens; room for a few turns
SECRET = "pineapple"
# named tool and command: asked only to "read note.txt", the 1.5B model answers in words
# (it asked for "the command or code snippet to execute this operation")
TASK = "Use the exec_command tool to run `cat note.txt`, then tell me the secret word it prints."


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    """The `codex` executable, installed with npm into a cache directory once."""
    exe = NPM_PREFIX / "node_modules" / ".bin" / "codex"
    if exe.exists():
        return exe
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: cannot install @openai/codex")
    NPM_PREFIX.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([npm, "install", "--prefix", str(NPM_PREFIX), "--no-audit",
                               "--no-fund", f"@openai/codex@{CODEX_VERSION}"],
                              capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install @openai/codex timed out (registry unreachable?)")
    if done.returncode != 0 or not exe.exists():
        pytest.skip(f"npm install @openai/codex failed (registry unreachable?): "
                    f"{(done.stderr or done.stdout)[-500:]}")
    return exe


@pytest.fixture(scope="module")
def coder() -> Iterator[str]:
    """`tandem serve` on Qwen2.5-Coder-1.5B (the store's, or `TANDEM_CODEX_MODEL`), or the
    server already running at `TANDEM_CODEX_URL` (its prefix cache spares the next trial
    the ~10K-token prefill)."""
    if os.environ.get("TANDEM_CODEX_URL"):
        yield os.environ["TANDEM_CODEX_URL"].rstrip("/")
        return
    model = os.environ.get("TANDEM_CODEX_MODEL") or str(
        store_model("qwen2.5-coder-1.5b-instruct"))
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--model", model, "--port", str(port),
           "--ctx-size", str(CTX_SIZE), "--max-concurrency", "1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "passive"}
    env.pop("TANDEM_API_KEY", None)
    with running(cmd, port, timeout=300, cwd=ROOT, env=env) as url:
        yield url


class Recorder:
    """A proxy that forwards every request to `target` and records, per request, its JSON
    body, the seconds to the first output event of its streamed response and the
    `usage` of its last event."""

    def __init__(self, target: str):
        self.target = target
        self.calls: list[dict[str, Any]] = []

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        async def forward(request: Request) -> StreamingResponse:
            body = await request.body()
            call: dict[str, Any] = {"body": json.loads(body or b"null"), "ttft_s": None,
                                    "usage": None, "events": [], "status": None}
            self.calls.append(call)
            start = time.monotonic()
            client = httpx.AsyncClient(timeout=None)
            upstream = await client.send(client.build_request(
                request.method, self.target + request.url.path, content=body,
                headers={"content-type": "application/json"}), stream=True)
            call["status"] = upstream.status_code

            async def relay() -> Any:
                buf = b""
                try:
                    async for chunk in upstream.aiter_raw():
                        buf += chunk
                        while b"\n\n" in buf:
                            frame, buf = buf.split(b"\n\n", 1)
                            self._note(call, frame, start)
                        yield chunk
                finally:
                    await upstream.aclose()
                    await client.aclose()

            return StreamingResponse(relay(), status_code=upstream.status_code,
                                     media_type=upstream.headers.get("content-type"))

        return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])

    @staticmethod
    def _note(call: dict[str, Any], frame: bytes, start: float) -> None:
        data = next((line[6:] for line in frame.split(b"\n") if line.startswith(b"data: ")),
                    None)
        if data is None:
            return
        event = json.loads(data)
        kind = event.get("type", "")
        call["events"].append(kind)
        if call["ttft_s"] is None and kind == "response.output_item.added":
            call["ttft_s"] = round(time.monotonic() - start, 2)
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            call["usage"] = event["response"].get("usage")
            call["output"] = event["response"].get("output")


@pytest.fixture
def recorder(coder: str) -> Iterator[tuple[Recorder, str]]:
    import uvicorn

    rec = Recorder(coder)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(rec.app(), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    wait_healthy(coder)
    try:
        yield rec, url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def codex_config(base_url: str, model: str) -> str:
    """A Codex `config.toml` with tandem as a custom Responses provider."""
    return f"""model = "{model}"
model_provider = "tandem"
model_context_window = {CTX_SIZE}

[model_providers.tandem]
name = "tandem"
base_url = "{base_url}/v1"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 1800000
"""


def test_codex_exec_finishes_a_turn_with_a_tool_call(codex_bin: Path, coder: str,
                                                     recorder: tuple[Recorder, str],
                                                     tmp_path: Path) -> None:
    rec, url = recorder
    model = httpx.get(f"{coder}/health", timeout=10).json()["model"]
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(codex_config(url, model))
    (work / "note.txt").write_text(f"The secret word is {SECRET}.\n")
    env = {**os.environ, "CODEX_HOME": str(home)}
    env.pop("OPENAI_API_KEY", None)
    start = time.monotonic()
    try:
        done = subprocess.run(
            [str(codex_bin), "exec", "--skip-git-repo-check",
             "--dangerously-bypass-approvals-and-sandbox", "-C", str(work), TASK],
            capture_output=True, text=True, timeout=3000, env=env, stdin=subprocess.DEVNULL)
    finally:
        trace = {"wall_s": round(time.monotonic() - start, 1),
                 "turns": [{"status": c["status"], "ttft_s": c["ttft_s"], "usage": c["usage"],
                            "input_items": [i.get("type", "message") for i in
                                            (c["body"] or {}).get("input", [])],
                            "output": c.get("output"), "events": sorted(set(c["events"]))}
                           for c in rec.calls]}
        (tmp_path / "codex-trace.json").write_text(json.dumps(trace, indent=2))
    trace.update(exit_code=done.returncode, stdout=done.stdout[-4000:],
                 stderr=done.stderr[-4000:])
    (tmp_path / "codex-trace.json").write_text(json.dumps(trace, indent=2))
    print(json.dumps(trace, indent=2))
    assert done.returncode == 0, done.stderr[-2000:]
    later = [c for c in rec.calls[1:] if any(i.get("type") == "function_call_output"
                                             for i in c["body"].get("input", []))]
    assert later, "the server never saw a function_call_output turn"
    assert all(c["status"] == 200 for c in rec.calls)
