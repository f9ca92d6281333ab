"""The soak bench's verdicts from a recorded run, and its /metrics reading (no server)."""

from __future__ import annotations

from app.bench.charts import ChartContext
from app.bench.soak_report import Outcome, SoakRecord, chart, summarize, warm_point
from app.bench.soak_sample import parse_metrics


def _record(**kw) -> SoakRecord:
    rec = SoakRecord(meta={"with_worker": True}, duration_s=120.0, warm_s=warm_point(120.0))
    rec.outcomes = [Outcome(1.0, "chat", True, 0.5), Outcome(2.0, "chat", True, 1.5),
                    Outcome(3.0, "malformed", True, 0.01),
                    Outcome(4.0, "kill_inflight", True, 2.0)]
    rec.samples = [{"t_s": t, "server_rss_mb": rss, "server_fds": 20, "kv_blocks_used": 3,
                    "slots_used": 1, "running": 1, "waiting": 2, "remote_prefilling": 1}
                   for t, rss in ((0.0, 90.0), (10.0, 100.0), (60.0, 103.0), (119.0, 104.0))]
    rec.health = [(float(t), 5.0 + t % 7, None) for t in range(100)]
    rec.kills = [{"t_s": 50.0, "restart_s": 3.0, "inflight_ok": True, "next_long_ok": True,
                  "after_restart_ok": True}]
    idle = {"server_rss_mb": 104.0, "kv_blocks_used": 0, "slots_used": 0, "running": 0,
            "waiting": 0, "remote_prefilling": 0}
    rec.start = {"server_fds": 20, "server_rss_mb": 90.0}
    rec.idle_end = {**idle, "server_fds": 22}
    for k, v in kw.items():
        setattr(rec, k, v)
    return rec


def test_a_clean_run_passes_every_goal() -> None:
    s = summarize(_record())
    assert warm_point(120.0) == 10.0 and warm_point(3600.0) == 300.0
    assert s["requests"] == {"total": 4, "failed": 0}
    assert s["classes"]["chat"] == {"count": 2, "failed": 0,
                                    "latency_ms": {"p50": 1000.0, "p99": 1490.0}}
    assert s["rss_mb"]["at_warm_point"] == 100.0 and s["rss_mb"]["end_of_load"] == 104.0
    assert s["rss_growth_pct"] == 4.0  # from the warm-up point, not from the start
    assert s["fds"] == {"start": 20, "idle_end": 22, "tolerance": 3}
    assert s["queue_depth_max"] == 3
    assert s["health_ms"] == {"count": 100, "failed": 0, "p50": 8.0, "p99": 11.0, "max": 11.0}
    assert s["goals"] == {"failed_requests_0": True, "rss_growth_le_5pct": True,
                          "idle_kv_blocks_0": True, "fds_back": True,
                          "health_p99_le_100ms": True, "worker_kills_served": True}
    assert s["pass"] is True


def test_each_goal_fails_on_its_own() -> None:
    failed = [Outcome(5.0, "kill_next_long", False, 1.0, "HTTP 500: boom")]
    s = summarize(_record(outcomes=_record().outcomes + failed))
    assert s["requests"]["failed"] == 1
    assert s["classes"]["kill_next_long"]["errors"] == ["5s: HTTP 500: boom"]
    assert not s["goals"]["failed_requests_0"] and not s["goals"]["worker_kills_served"]
    assert s["pass"] is False
    leaky = _record()
    leaky.samples[-1]["server_rss_mb"] = 106.0
    assert summarize(leaky)["goals"]["rss_growth_le_5pct"] is False
    held = _record()
    held.idle_end["slots_used"] = 1
    assert summarize(held)["goals"]["idle_kv_blocks_0"] is False
    fds = _record()
    fds.idle_end["server_fds"] = 24
    assert summarize(fds)["goals"]["fds_back"] is False
    slow = _record(health=[(float(t), 150.0 if t % 50 == 0 else 5.0, None) for t in range(100)])
    assert summarize(slow)["goals"]["health_p99_le_100ms"] is False
    down = _record(health=[(1.0, 5.0, "ConnectError: refused")])
    assert summarize(down)["goals"]["health_p99_le_100ms"] is False


def test_rss_less_the_saved_prefixes_is_reported_beside_the_raw_growth() -> None:
    rec = _record()
    for x, saved_mib in zip(rec.samples, (0, 10, 20, 40), strict=True):
        x["kv_saved_bytes"] = saved_mib * 2**20
        x["server_rss_mb"] = 90.0 + saved_mib
    s = summarize(rec)
    assert s["rss_growth_pct"] == 30.0  # 100 -> 130 MiB: the goal reads the raw RSS
    assert s["goals"]["rss_growth_le_5pct"] is False
    assert s["kv_saved_mb"] == {"max": 40.0, "end": 40.0}
    assert s["rss_less_kv_saved_mb"] == {"at_warm_point": 90.0, "end_of_load": 90.0}
    assert s["rss_less_kv_saved_growth_pct"] == 0.0


def test_a_run_cut_before_the_warm_point_leaves_rss_unmeasured_and_does_not_pass() -> None:
    rec = _record(duration_s=3600.0, warm_s=300.0, kills=[])
    s = summarize(rec)
    assert s["rss_growth_pct"] is None and s["goals"]["rss_growth_le_5pct"] is None
    assert s["goals"]["worker_kills_served"] is None
    assert s["pass"] is False


def test_chart_is_written(tmp_path) -> None:
    path = tmp_path / "soak.png"
    chart(_record(), path, ChartContext("m", "GGUF Q4_1", "2 clients", "cpu (2 cores)"))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parse_metrics_reads_gauges_and_routes() -> None:
    text = """# TYPE tandem_kv_blocks_used gauge
tandem_kv_blocks_used 7.0
tandem_slots_used 2.0
tandem_requests_waiting 1.0
# TYPE tandem_prefill_route counter
tandem_prefill_route_total{reason="always",route="remote"} 5.0
tandem_prefill_route_total{reason="busy",route="fallback"} 2.0
tandem_generation_tokens_total 99.0
"""
    assert parse_metrics(text) == {
        "kv_blocks_used": 7.0, "slots_used": 2.0, "waiting": 1.0,
        "prefill_routes": {"remote/always": 5.0, "fallback/busy": 2.0}}
