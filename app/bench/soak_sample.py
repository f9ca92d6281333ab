"""What the soak bench reads off the running processes and the server: resident memory and
open file descriptors of a process (psutil), the engine's gauges and the prefill routes
from `GET /metrics` (prometheus-client's parser), and `GET /health` latency."""

from __future__ import annotations

import time

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

# /metrics gauges sampled, by their name in the samples (see app/server/metrics.py)
GAUGES = {
    "tandem_requests_running": "running",
    "tandem_requests_waiting": "waiting",
    "tandem_requests_remote_prefilling": "remote_prefilling",
    "tandem_kv_blocks_used": "kv_blocks_used",
    "tandem_kv_blocks_total": "kv_blocks_total",
    "tandem_slots_used": "slots_used",
    "tandem_slots_total": "slots_total",
    "tandem_kv_saved_bytes": "kv_saved_bytes",
}


def process_stats(pid: int | None) -> dict[str, float | None]:
    """`{"rss_mb", "fds"}` of process `pid` (resident set in MiB, open file descriptors);
    both None when there is no such process (a worker between kill and restart)."""
    if pid is None:
        return {"rss_mb": None, "fds": None}
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return {"rss_mb": round(p.memory_info().rss / 2**20, 1), "fds": p.num_fds()}
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return {"rss_mb": None, "fds": None}


def parse_metrics(text: str) -> dict:
    """The `GAUGES` of a Prometheus exposition, by their short names, plus `prefill_routes`:
    `{"route/reason": count}` from `tandem_prefill_route_total` (two-box mode)."""
    out: dict = {"prefill_routes": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in GAUGES:
                out[GAUGES[s.name]] = s.value
            elif s.name == "tandem_prefill_route_total":
                out["prefill_routes"][f"{s.labels['route']}/{s.labels['reason']}"] = s.value
    return out


async def engine_gauges(http: httpx.AsyncClient) -> dict:
    """`parse_metrics` of the server's `/metrics` (the client's base URL is the server).
    Raises httpx.HTTPError when it cannot be read."""
    r = await http.get("/metrics")
    r.raise_for_status()
    return parse_metrics(r.text)


async def health_latency(http: httpx.AsyncClient) -> tuple[float, str | None]:
    """(milliseconds `GET /health` took, None) or (milliseconds, what went wrong) when it did
    not answer 200."""
    t0 = time.perf_counter()
    try:
        r = await http.get("/health")
        error = None if r.status_code == 200 else f"HTTP {r.status_code}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return (time.perf_counter() - t0) * 1000, error
