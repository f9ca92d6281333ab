"""`tandem serve --log-level info`: long prefills in the log while they run.

An agent's first turn can be a 10K-token prompt that takes a minute to prefill on a small
machine (README, "Use tandem from your agent or editor"); llama-server logs prefill progress
for the same reason. A daemon thread looks at the engine's prompts in flight every
`INTERVAL_S` seconds (it only reads counters: nothing that competes with the step thread)
and logs, at info level on the `tandem.server` logger, each prompt that has been prefilling
for at least `MIN_S` seconds, then one line when its prefill ends:

    tandem: prefill resp-4f2c…: 1536/3569 tokens (43%), 104 tok/s, about 20 s left
    tandem: prefill resp-4f2c…: done, 3569 tokens in 34.2 s (104 tok/s)

(`cancelled after 12.3 s` instead, for a request that went away before its first token.)
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("tandem.server")

INTERVAL_S = 5.0
MIN_S = 2.0


class PrefillLog:
    """Logs `engine`'s long prefills (an `AsyncEngine`: `prefilling()`) until `stop()`."""

    def __init__(self, engine: Any, interval_s: float = INTERVAL_S, min_s: float = MIN_S):
        self.engine = engine
        self.interval_s = interval_s
        self.min_s = min_s
        self._stop = threading.Event()
        self._seen: dict[str, tuple[float, int]] = {}  # id -> (first seen, computed then)
        self._metrics: dict[str, Any] = {}  # id -> its RequestMetrics, for how it ended
        self._logged: dict[str, tuple[float, int]] = {}  # id -> (last logged, prompt tokens)
        self._thread = threading.Thread(target=self._loop, name="tandem-prefill-log",
                                        daemon=True)

    def start(self) -> PrefillLog:
        if log.isEnabledFor(logging.INFO):
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s / 5):
            self.poll(time.monotonic())

    def poll(self, now: float) -> None:
        """One look at the prompts in flight at time `now` (seconds, monotonic): the thread
        calls it; tests call it with their own clock."""
        current = self.engine.prefilling()
        for rid, (t0, start) in list(self._seen.items()):
            if rid in current:
                continue
            del self._seen[rid]
            metrics = self._metrics.pop(rid, None)
            if rid in self._logged:
                total = self._logged.pop(rid)[1]
                dt = now - t0
                if metrics is not None and metrics.first_token_time is None:
                    log.info("prefill %s: cancelled after %.1f s", rid, dt)
                    continue
                log.info("prefill %s: done, %d tokens in %.1f s (%.0f tok/s)", rid, total, dt,
                         (total - start) / dt if dt > 0 else 0.0)
        for rid, p in current.items():
            if rid not in self._seen:
                self._metrics[rid] = self.engine.request_metrics(rid)
            t0, start = self._seen.setdefault(rid, (now, p.computed))
            last = self._logged.get(rid)
            if now - t0 < self.min_s or (last is not None and now - last[0] < self.interval_s):
                continue
            rate = (p.computed - start) / (now - t0)
            speed = (f", {rate:.0f} tok/s, about {(p.total - p.computed) / rate:.0f} s left"
                     if rate > 0 else "")  # no chunk done yet: no rate to give
            where = " (remote)" if p.remote else ""
            log.info("prefill %s%s: %d/%d tokens (%d%%)%s", rid, where, p.computed, p.total,
                     100 * p.computed // max(p.total, 1), speed)
            self._logged[rid] = (now, p.total)
