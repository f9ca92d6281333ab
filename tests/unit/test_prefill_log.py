"""`PrefillLog`: which prefills `serve --log-level info` reports, and the exact lines."""

from __future__ import annotations

import logging

import pytest

from app.engine.types import PrefillProgress, RequestMetrics
from app.server.prefill_log import PrefillLog


class Engine:
    def __init__(self) -> None:
        self.now: dict[str, PrefillProgress] = {}
        self.metrics: dict[str, RequestMetrics] = {}

    def prefilling(self) -> dict[str, PrefillProgress]:
        return dict(self.now)

    def request_metrics(self, rid: str) -> RequestMetrics:
        return self.metrics.setdefault(rid, RequestMetrics())


def test_long_prefills_are_logged_while_they_run_and_when_done(
        caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine()
    plog = PrefillLog(engine, interval_s=5.0, min_s=2.0)
    caplog.set_level(logging.INFO, logger="tandem.server")
    engine.now = {"a": PrefillProgress(0, 3000), "short": PrefillProgress(0, 100),
                  "b": PrefillProgress(0, 5000)}
    plog.poll(100.0)
    engine.now = {"a": PrefillProgress(256, 3000), "short": PrefillProgress(64, 100),
                  "b": PrefillProgress(0, 5000)}
    plog.poll(101.0)  # under 2 s: nothing yet
    engine.now = {"a": PrefillProgress(512, 3000, remote=True), "b": PrefillProgress(0, 5000)}
    plog.poll(102.0)  # "short" ended before 2 s: never logged
    engine.now = {"a": PrefillProgress(1024, 3000)}  # b's first token is out
    engine.metrics["b"].first_token_time = 103.9
    plog.poll(104.0)  # logged 2 s ago: not again before 5 s
    engine.now = {"a": PrefillProgress(2560, 3000)}
    plog.poll(107.0)
    engine.now = {}
    engine.metrics["a"].first_token_time = 109.0
    plog.poll(110.0)
    assert [r.getMessage() for r in caplog.records] == [
        "prefill a (remote): 512/3000 tokens (17%), 256 tok/s, about 10 s left",
        "prefill b: 0/5000 tokens (0%)",
        "prefill b: done, 5000 tokens in 4.0 s (1250 tok/s)",
        "prefill a: 2560/3000 tokens (85%), 366 tok/s, about 1 s left",
        "prefill a: done, 3000 tokens in 10.0 s (300 tok/s)",
    ]


def test_nothing_starts_below_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tandem.server")
    plog = PrefillLog(Engine()).start()
    assert not plog._thread.is_alive()


def test_a_prefill_cancelled_before_its_first_token_is_not_done(
        caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine()
    plog = PrefillLog(engine, interval_s=5.0, min_s=2.0)
    caplog.set_level(logging.INFO, logger="tandem.server")
    for t, done in [(0.0, 0), (3.0, 512)]:
        engine.now = {"c": PrefillProgress(done, 7367)}
        plog.poll(t)
    engine.now = {}  # the client went away: no first token
    plog.poll(5.0)
    assert [r.getMessage() for r in caplog.records] == [
        "prefill c: 512/7367 tokens (6%), 171 tok/s, about 40 s left",
        "prefill c: cancelled after 5.0 s"]
