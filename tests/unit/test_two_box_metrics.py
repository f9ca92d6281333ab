"""Two-box counters in /metrics: where each finished prompt was prefilled and why, with a
remote prefill that failed counted as a fallback under its failure, not as remote."""

from app.engine.types import EngineStats, RequestMetrics
from app.server.metrics import ServerMetrics


class _Engine:
    def stats(self):
        return EngineStats(0, 0, 1, 0, 0, 0, 0, 0)


def _finish(metrics, route):
    m = RequestMetrics()
    m.remote_prefill = route
    metrics.observe_finished("stop", m)


def test_routes_fallbacks_and_bytes():
    metrics = ServerMetrics(_Engine())
    _finish(metrics, {"remote": True, "reason": "faster", "ok": True, "imported_tokens": 100,
                      "bytes": 2_304_000})
    _finish(metrics, {"remote": True, "reason": "always", "ok": False, "failure": "refused"})
    _finish(metrics, {"remote": False, "reason": "short_prompt"})
    _finish(metrics, None)
    lines = [line for line in metrics.render().decode().splitlines()
             if line.startswith(("tandem_prefill_route_total", "tandem_remote_prefill_"))
             and "_created" not in line]
    assert lines == [
        'tandem_prefill_route_total{reason="faster",route="remote"} 1.0',
        'tandem_prefill_route_total{reason="refused",route="fallback"} 1.0',
        'tandem_prefill_route_total{reason="short_prompt",route="local"} 1.0',
        'tandem_remote_prefill_fallbacks_total{reason="refused"} 1.0',
        "tandem_remote_prefill_kv_bytes_total 2.304e+06",
        "tandem_remote_prefill_imported_tokens_total 100.0",
    ]
