"""`tandem serve` on a fake engine, as a process (no model): `python -m tests.fakes.serve
[serve flags]` runs `app.commands.serve` unchanged (flags, banner, signals, graceful stop)
with `load_engine` replaced by the real `AsyncEngine` over a `ScriptedRunner` (the engine of
`tests.e2e.conftest.fake_engine`; that module is not imported: openai and pytest would
double the process's start-up).

Environment: `TANDEM_FAKE_REPLY_CHARS`, the length of every reply in characters (= tokens;
default 40); `TANDEM_FAKE_STEP_S`, the simulated seconds per step (default 0.003);
`TANDEM_FAKE_PREFILL_S`, further seconds per token of a prompt chunk of 256 tokens or more
in a step (default 0), so a long prompt's prefill takes long steps, as on a larger model;
`TANDEM_FAKE_SNDBUF`, the send buffer in bytes of every connection (default: the kernel's,
which Linux grows to 4 MB on loopback; a small one makes a client that stops reading block
the server's writes at once, as a slow link would)."""

from __future__ import annotations

import os
import socket
import sys
import time

from app import cli
from app.commands import serve
from app.commands.graceful import bind_socket
from app.engine.async_engine import AsyncEngine
from app.engine.engine import EngineConfig, LLMEngine
from app.engine.scheduler import SchedulerConfig
from tests.fakes.runner import ScriptedRunner

TEXT = "Once upon a time, in a land of naïve cafés, a quick brown fox told a story. "
CONTEXT = 2048


def _engine(args: object, **kw: object) -> AsyncEngine:
    chars = int(os.environ.get("TANDEM_FAKE_REPLY_CHARS", "40"))
    runner = ScriptedRunner(default=(TEXT * (chars // len(TEXT) + 1))[:chars],
                            step_s=float(os.environ.get("TANDEM_FAKE_STEP_S", "0.003")),
                            max_seqs=32, num_blocks=1024, block_size=16, n_ctx=CONTEXT,
                            name="fake-model")
    token_s = float(os.environ.get("TANDEM_FAKE_PREFILL_S", "0"))
    if token_s:
        execute = runner.execute

        def slow_execute(items: list) -> object:
            time.sleep(token_s * sum(len(i.tokens) for i in items if len(i.tokens) >= 256))
            return execute(items)

        runner.execute = slow_execute  # type: ignore[method-assign]
    config = EngineConfig(context_length=CONTEXT, scheduler=SchedulerConfig(
        max_num_seqs=32, max_num_batched_tokens=512, max_waiting=64))
    return AsyncEngine(LLMEngine(runner, config), "fake-model", "fake")


def _bind_socket(host: str, port: int) -> socket.socket:
    sock = bind_socket(host, port)
    sndbuf = os.environ.get("TANDEM_FAKE_SNDBUF")
    if sndbuf:  # accepted connections inherit it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(sndbuf))
    return sock


def main() -> int:
    serve.load_engine = _engine  # type: ignore[assignment]
    serve.bind_socket = _bind_socket  # type: ignore[assignment]
    return cli.main(["serve", "--model", "fake-model", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
