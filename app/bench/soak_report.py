"""The soak bench's record of a run and what is concluded from it: the JSON summary with a
verdict per goal of issue 33 and the PNG over time. Pure functions of `SoakRecord`, so a
run cut short (Ctrl+C, an error) still gets both from what was recorded.

Goals (issue 33, "60-minute soak"):
- `failed_requests_0`: no request of any class failed (`app.bench.soak_traffic`: a class
  that should succeed did not, or a refusal that should be a 4xx was not);
- `rss_growth_le_5pct`: the server's RSS at the end of the load, against its RSS at the
  warm-up point (`warm_s`: 5 minutes, or 1/12 of a shorter run), grew at most 5%. The
  same less the host memory of saved prefixes (`tandem_kv_saved_bytes`) is reported beside
  it, to tell the prefix cache's growth from anything else's;
- `idle_kv_blocks_0`: after the idle pause, 0 KV blocks and 0 slots held, nothing running
  or waiting;
- `fds_back`: the server's open file descriptors after the idle pause within
  `FD_TOLERANCE` of the idle count before the load;
- `health_p99_le_100ms`: `/health` latency p99 over the whole run at most 100 ms, and no
  probe failed;
- `worker_kills_served` (with a worker): the long prompt in flight at each worker kill, the
  next one while it is down and the next after its restart were all served.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from app.bench.stats import percentiles

FD_TOLERANCE = 3  # descriptors: a lazily opened file or an idle socket not yet reaped
RSS_GROWTH_MAX_PCT = 5.0
HEALTH_P99_MAX_MS = 100.0
KILL_CLASSES = ("kill_inflight", "kill_next_long", "restart_next_long")


@dataclass(slots=True)
class Outcome:
    """One request: `t_s` seconds from the start of the load (or of the warm-up, for
    `warmup` ones) when it was sent, its class, whether it went as that class should,
    seconds it took, and what went wrong."""

    t_s: float
    cls: str
    ok: bool
    latency_s: float
    error: str | None = None
    warmup: bool = False


@dataclass
class SoakRecord:
    """Everything a run records. `samples`: dicts with `t_s`, `server_rss_mb`,
    `server_fds`, `worker_rss_mb`, `worker_fds` and the `/metrics` gauges
    (`app.bench.soak_sample.GAUGES`); `health`: (t_s, ms, error or None); `kills`: one dict
    per worker kill (`t_s`, `restart_s`, and the three long prompts' `ok`); `start` and
    `idle_end`: the idle state before and after the load (process stats and gauges)."""

    meta: dict
    duration_s: float
    warm_s: float
    outcomes: list[Outcome] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    health: list[tuple[float, float, str | None]] = field(default_factory=list)
    kills: list[dict] = field(default_factory=list)
    start: dict = field(default_factory=dict)
    idle_end: dict = field(default_factory=dict)
    prefill_routes: dict = field(default_factory=dict)
    load_s: float = 0.0  # seconds the load actually ran
    interrupted: bool = False


def warm_point(duration_s: float) -> float:
    """Seconds after which RSS growth is counted: 5 minutes, or 1/12 of a shorter run
    (the issue's "after the first 5 minutes" of 60)."""
    return min(300.0, duration_s / 12)


def class_table(outcomes: list[Outcome]) -> dict[str, dict]:
    """Per class: `count`, `failed`, `latency_ms` {p50, p99} and up to 5 `errors`."""
    table: dict[str, dict] = {}
    for cls in sorted({o.cls for o in outcomes}):
        mine = [o for o in outcomes if o.cls == cls]
        errors = [f"{o.t_s:.0f}s: {o.error}" for o in mine if not o.ok][:5]
        table[cls] = {"count": len(mine), "failed": sum(not o.ok for o in mine),
                      "latency_ms": percentiles([o.latency_s for o in mine]),
                      **({"errors": errors} if errors else {})}
    return table


def _net_rss(s: dict) -> float | None:
    """The server's RSS less its saved prefixes' host memory, MiB."""
    if s.get("server_rss_mb") is None or s.get("kv_saved_bytes") is None:
        return None
    return round(s["server_rss_mb"] - s["kv_saved_bytes"] / 2**20, 1)


def rss_growth(samples: list[dict], warm_s: float, key=lambda s: s.get("server_rss_mb")
               ) -> tuple[float | None, float | None, float | None]:
    """(`key(sample)` at the first sample at or after `warm_s`, at the last sample under
    load, growth in percent); Nones when fewer than two such samples have it. `key`: the
    server's RSS in MiB by default."""
    after = [key(s) for s in samples
             if not s.get("idle") and s["t_s"] >= warm_s and key(s) is not None]
    if len(after) < 2:
        return None, None, None
    warm, end = after[0], after[-1]
    return warm, end, round((end - warm) / warm * 100, 2)


def summarize(rec: SoakRecord) -> dict:
    """The JSON summary: inputs, request counts, per-class table, worker kills, RSS, fds,
    idle state, /health latency, and `goals` (each True/False, None where not measured) with
    `pass` (all measured goals met and none unmeasured)."""
    classes = class_table(rec.outcomes)
    failed = sum(c["failed"] for c in classes.values())
    warm, end, growth = rss_growth(rec.samples, rec.warm_s)
    net_warm, net_end, net_growth = rss_growth(rec.samples, rec.warm_s, _net_rss)
    saved = [s["kv_saved_bytes"] / 2**20 for s in rec.samples if "kv_saved_bytes" in s]
    rss_all = [s["server_rss_mb"] for s in rec.samples if s.get("server_rss_mb") is not None]
    health_ms = [ms for _, ms, _ in rec.health]
    health_failed = sum(err is not None for _, _, err in rec.health)
    health = {"count": len(rec.health), "failed": health_failed,
              **percentiles([ms / 1000 for ms in health_ms]),
              "max": round(max(health_ms), 2) if health_ms else None}
    queue = [s.get("waiting", 0) + s.get("remote_prefilling", 0) for s in rec.samples
             if "waiting" in s]
    start, idle = rec.start, rec.idle_end
    fds_back = None
    if start.get("server_fds") is not None and idle.get("server_fds") is not None:
        fds_back = abs(idle["server_fds"] - start["server_fds"]) <= FD_TOLERANCE
    idle_zero = None
    if "kv_blocks_used" in idle:
        idle_zero = all(idle.get(k) == 0 for k in ("kv_blocks_used", "slots_used", "running",
                                                   "waiting", "remote_prefilling"))
    goals = {
        "failed_requests_0": failed == 0,
        "rss_growth_le_5pct": None if growth is None else growth <= RSS_GROWTH_MAX_PCT,
        "idle_kv_blocks_0": idle_zero,
        "fds_back": fds_back,
        "health_p99_le_100ms": (None if health["p99"] is None
                                else health["p99"] <= HEALTH_P99_MAX_MS and health_failed == 0),
    }
    if rec.meta.get("with_worker"):
        kill_failed = sum(classes.get(c, {}).get("failed", 0) for c in KILL_CLASSES)
        goals["worker_kills_served"] = (None if not rec.kills
                                        else kill_failed == 0 and all(k.get("restart_s")
                                                                      for k in rec.kills))
    if "server_exit_code" in rec.meta:
        goals["server_kept_running"] = False
    return {
        **rec.meta,
        "duration_s": round(rec.duration_s, 1),
        "load_s": round(rec.load_s, 1),
        "interrupted": rec.interrupted,
        "requests": {"total": len(rec.outcomes), "failed": failed},
        "classes": classes,
        "worker_kills": rec.kills,
        "prefill_routes": rec.prefill_routes,
        "rss_mb": {"start": start.get("server_rss_mb"), "warm_point_s": round(rec.warm_s, 1),
                   "at_warm_point": warm, "end_of_load": end,
                   "max": max(rss_all) if rss_all else None,
                   "idle_end": idle.get("server_rss_mb")},
        "rss_growth_pct": growth,
        # the host memory of saved prefixes (the prefix cache's blocks no slot holds) taken
        # out: what grows besides that cache
        "kv_saved_mb": {"max": round(max(saved), 1) if saved else None,
                        "end": round(saved[-1], 1) if saved else None},
        "rss_less_kv_saved_mb": {"at_warm_point": net_warm, "end_of_load": net_end},
        "rss_less_kv_saved_growth_pct": net_growth,
        "fds": {"start": start.get("server_fds"), "idle_end": idle.get("server_fds"),
                "tolerance": FD_TOLERANCE},
        "idle_end": {k: idle.get(k) for k in ("kv_blocks_used", "slots_used", "running",
                                              "waiting", "remote_prefilling")},
        "queue_depth_max": max(queue) if queue else None,
        "health_ms": health,
        "goals": goals,
        "pass": all(v is True for v in goals.values()),
    }


def chart(rec: SoakRecord, path: str | Path, context) -> None:
    """Six panels over the run's time (minutes): server and worker RSS, open fds, KV blocks
    used, slots used and queue depth, /health latency against its 100 ms goal, and requests
    finished and failed since the start (cumulative); worker kills as dotted red lines, the warm-up
    point as a dashed grey one. `context` is an `app.bench.charts.ChartContext`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from app.bench.charts import BETTER, save, suptitle

    fig, axes = plt.subplots(3, 2, figsize=(12, 10), layout="constrained")
    ax = list(axes.flat)
    s = rec.samples
    t = [x["t_s"] / 60 for x in s]

    def line(a, key, label):
        pts = [(ti, x.get(key)) for ti, x in zip(t, s, strict=True) if x.get(key) is not None]
        if pts:
            a.plot(*zip(*pts, strict=True), label=label, marker=".", markersize=3)

    line(ax[0], "server_rss_mb", "tandem serve")
    line(ax[0], "worker_rss_mb", "prefill worker")
    for x in s:
        if "kv_saved_bytes" in x:
            x["kv_saved_mb"] = x["kv_saved_bytes"] / 2**20
    line(ax[0], "kv_saved_mb", "serve: saved prefixes (host KV)")
    for x in s:
        x["server_rss_less_kv_saved_mb"] = _net_rss(x)
    line(ax[0], "server_rss_less_kv_saved_mb", "serve less its saved prefixes")
    line(ax[1], "server_fds", "tandem serve")
    line(ax[1], "worker_fds", "prefill worker")
    line(ax[2], "kv_blocks_used", "KV blocks used")
    line(ax[3], "slots_used", "slots used")
    line(ax[3], "running", "running")
    for x in s:
        if "waiting" in x:
            x["queue_depth"] = x["waiting"] + x.get("remote_prefilling", 0)
    line(ax[3], "queue_depth", "queue depth (waiting + remote prefilling)")
    if rec.health:
        ht, hms, herr = zip(*rec.health, strict=True)
        ax[4].scatter([x / 60 for x in ht], hms, s=4, label="GET /health")
        bad = [(x / 60, ms) for x, ms, e in rec.health if e]
        if bad:
            ax[4].scatter(*zip(*bad, strict=True), s=12, color="red", label="failed")
        ax[4].axhline(HEALTH_P99_MAX_MS, color="grey", linestyle="--", linewidth=1,
                      label="goal: p99 100 ms")
    ends = sorted((o.t_s + o.latency_s, o.ok) for o in rec.outcomes if not o.warmup)
    if ends:
        ax[5].step([e / 60 for e, _ in ends], range(1, len(ends) + 1), where="post",
                   label="finished")
        failed = [e / 60 for e, ok in ends if not ok]
        ax[5].step([0.0, *failed], range(len(failed) + 1), where="post", color="red",
                   label="failed")
    labels = [("resident memory, MiB", "lower", "Memory (RSS)"),
              ("open file descriptors", "lower", "File descriptors"),
              ("KV blocks held", "lower", "KV cache in use"),
              ("sequences", "lower", "Slots and queue"),
              ("latency, ms", "lower", "/health latency"),
              ("requests since the start", "higher", "Requests finished and failed")]
    for a, (ylabel, better, title) in zip(ax, labels, strict=True):
        for k in rec.kills:
            a.axvline(k["t_s"] / 60, color="red", linestyle=":", linewidth=1)
        a.axvline(rec.warm_s / 60, color="grey", linestyle="--", linewidth=0.8)
        a.set_xlabel("minutes since the load began")
        a.set_ylabel(f"{ylabel} ({BETTER[better]})")
        a.set_title(title, fontsize=10)
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    verdict = "pass" if summarize(rec)["pass"] else "FAIL"
    suptitle(fig, context, f"Soak: {rec.load_s / 60:.1f} min of mixed traffic ({verdict}); "
             "red dotted: worker killed, grey dashed: warm-up point")
    save(fig, path)
