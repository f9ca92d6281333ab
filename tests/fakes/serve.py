"""`tandem serve` on the fake engine, as a process (no model): `python -m tests.fakes.serve
[serve flags]` runs `app.commands.serve` unchanged (flags, banner, signals, graceful stop)
with `load_engine` replaced by `tests.e2e.conftest.fake_engine`.

Environment: `TANDEM_FAKE_STEP_S`, the simulated seconds per step (default 0.003);
`TANDEM_FAKE_PREFILL_S`, further simulated seconds per token of a prompt chunk of 256 tokens
or more computed in a step (default 0), so a long prompt's prefill takes long steps, as on a
larger model;
`TANDEM_FAKE_REPLY_CHARS`, the length of every reply in characters (= tokens; default: the
fixtures' 40-character `scripted_reply`), `GREEDY_TEXT` repeated."""

from __future__ import annotations

import os
import sys
import time

from app import cli
from app.commands import serve
from tests.e2e.conftest import GREEDY_TEXT, fake_engine


def _engine(args: object, **kw: object) -> object:
    engine, runner = fake_engine(step_s=float(os.environ.get("TANDEM_FAKE_STEP_S", "0.003")))
    chars = os.environ.get("TANDEM_FAKE_REPLY_CHARS")
    if chars:
        n = int(chars)
        runner.default = (GREEDY_TEXT * (n // len(GREEDY_TEXT) + 1))[:n]
    token_s = float(os.environ.get("TANDEM_FAKE_PREFILL_S", "0"))
    if token_s:
        execute = runner.execute

        def slow_execute(items: list) -> object:
            time.sleep(token_s * sum(len(i.tokens) for i in items if len(i.tokens) >= 256))
            return execute(items)

        runner.execute = slow_execute  # type: ignore[method-assign]
    return engine


def main() -> int:
    serve.load_engine = _engine  # type: ignore[assignment]
    return cli.main(["serve", "--model", "fake-model", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
