"""The target's step-time curve, measured once per machine + model + backend and cached, then
refined from the engine's own steps.

The cache is a JSON file per key under `<model store>/profiles/`: the measured points
(`step_seconds`) and the online estimates the engine has observed since (`online`,
{batch bucket: {n: [seconds, observations]}}, see `app.engine.spec_decode.step_times`).
A cached profile is measured again when it cannot be trusted (`curve_problem`: a core point
missing, t(2)/t(1) too high, a step of fewer tokens dearer than one of more) or is stale
(the engine observed t(1) more than STALE_RATIO away from the measured one, or the curve
with the engine's observations fails the same checks as a measurement). Delete the file
(or pass `remeasure=True`) after changing hardware settings the key does not capture.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.profile import (
    CORE,
    core_points,
    curve_problem,
    fastest_monotone,
    time_steps,
)
from app.engine.spec_decode.step_times import MIN_SAMPLES, OnlineStepTimes
from backends.base import Runner
from models.store import store_dir

log = logging.getLogger("tandem.spec")

PROFILE_VERSION = 3  # 3: t(1..8) first with a budget scaled by t(1); online estimates
STALE_RATIO = 2.0  # observed t(1) this far (either way) from the measured one: measure again

Online = dict[int, dict[int, tuple[float, int]]]


def profile_key(model_path: Path, backend: str, runner: Runner) -> str:
    """Identifies what the curve depends on: the model file (name, size: its weight
    format), backend, KV layout, threads, repacked weights or not (llama.cpp: 1.13-1.43x
    faster steps), KV cache type, exact mode, flash attention off, machine (host, CPU, cores)."""
    st = model_path.stat() if model_path.exists() else None
    parts = [PROFILE_VERSION, model_path.name, st.st_size if st else 0, backend,
             getattr(runner, "kv_layout", None), getattr(runner, "n_threads", None),
             getattr(getattr(runner, "repack", None), "repack", None),
             platform.node(), platform.machine(), platform.processor(), os.cpu_count()]
    kv_cache_type = getattr(runner, "kv_cache_type", "f16")
    if kv_cache_type != "f16":  # its own curve (quantized attention); f16 keys stay as they were
        parts.append(kv_cache_type)
    if getattr(runner, "exact", False):  # another library and no flash attention: other times
        parts.append("exact")
    elif getattr(runner, "flash_attn", "auto") == "off":  # its own attention kernels
        parts.append("flash-attn-off")
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def profile_path(runner: Runner, model_path: Path, backend: str) -> Path:
    return store_dir() / "profiles" / f"{profile_key(model_path, backend, runner)}.json"


@dataclass
class StepProfile:
    """A step-time profile: `points` {n: seconds} measured, `online` estimates since.
    `cached`: read from the file; `trusted`: fit to keep (an untrusted one is used for
    this run, never written)."""

    path: Path
    model: str
    backend: str
    points: dict[int, float]
    online: Online = field(default_factory=dict)
    cached: bool = False
    trusted: bool = True

    def curve(self) -> StepTimeCurve:
        """The one-sequence curve: the points with the online estimates that count."""
        return OnlineStepTimes(self.points, self.online).curve(1)

    def online_times(self) -> OnlineStepTimes:
        """The engine's refining curve, saving into this profile as it learns."""
        return OnlineStepTimes(self.points, self.online,
                               persist=self.save if self.trusted else None)

    def save(self, online: Online | None = None) -> None:
        """Write the file (with `online` as the estimates, if given); a read-only store only
        costs a re-measurement next time."""
        if online is not None:
            self.online = online
        body = {"model": self.model, "backend": self.backend,
                "step_seconds": {str(n): t for n, t in sorted(self.points.items())},
                "online": {str(b): {str(n): [t, c] for n, (t, c) in pts.items()}
                           for b, pts in self.online.items()}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(body, indent=1))
            tmp.replace(self.path)  # a reader never sees half a file
        except OSError:
            pass


def _read(path: Path) -> tuple[dict[int, float], Online]:
    """(points, online) of a profile file. Raises OSError, ValueError, KeyError, TypeError."""
    return _parse(json.loads(path.read_text()))


def _parse(body: dict) -> tuple[dict[int, float], Online]:
    """(points, online) of a profile file's JSON. Raises ValueError, KeyError, TypeError."""
    points = {int(n): float(t) for n, t in body["step_seconds"].items()}
    online = {int(b): {int(n): (float(t), int(c)) for n, (t, c) in pts.items()}
              for b, pts in body.get("online", {}).items()}
    return points, online


def stale(points: dict[int, float], online: Online) -> str | None:
    """Why the engine's observations say the cached curve is off, or None: its t(1) (one
    sequence, MIN_SAMPLES observations at least) more than STALE_RATIO from the measured,
    or the one-sequence curve with the observations that count fails `curve_problem` (a
    t(2) observed at 7x t(1) while another process ran was once cached and trusted)."""
    seen = online.get(1, {}).get(1)
    if seen is not None and seen[1] >= MIN_SAMPLES and 1 in points:
        ratio = seen[0] / points[1]
        if ratio > STALE_RATIO or ratio < 1 / STALE_RATIO:
            return (f"the engine's steps took {seen[0] * 1e3:.1f} ms for t(1), measured "
                    f"{points[1] * 1e3:.1f} ms")
    used = {n: t for n, (t, c) in online.get(1, {}).items() if c >= MIN_SAMPLES}
    problem = curve_problem({**points, **used}, []) if used else None
    return None if problem is None else f"with the engine's observations, {problem}"


def load_profile(runner: Runner, model_path: Path, backend: str,
                 remeasure: bool = False) -> StepProfile:
    """The cached profile when it can be trusted; else measured (about 1-6 s), measured a
    second time when the first cannot be trusted, and stored only when trusted."""
    path = profile_path(runner, model_path, backend)
    core = core_points(runner)
    if not remeasure:
        try:
            points, online = _read(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        else:
            problem = curve_problem(points, core) or stale(points, online)
            if problem is None:
                return StepProfile(path, model_path.name, backend, points, online, cached=True)
            log.info("step-time profile %s not trusted (%s): measuring again", path.name,
                     problem)
    problem = None
    for attempt in range(2):
        times = time_steps(runner)
        problem = curve_problem({n: min(ts) for n, ts in times.items()}, core)
        if problem is None:
            break
        log.info("step-time profile %s: measurement %d not trusted (%s)", path.name,
                 attempt + 1, problem)
    profile = StepProfile(path, model_path.name, backend, fastest_monotone(times),
                          trusted=problem is None)
    if profile.trusted:
        profile.save()
    else:
        log.warning("step-time profile %s: used for this run, not cached (%s)", path.name,
                    problem)
    return profile


@dataclass
class CachedCurve:
    """What the store holds for a model on a backend, for `tandem doctor`: `profiles` files
    (one per key: threads, KV layout, repacking...), the newest's one-sequence curve as
    t(n)/t(1) `ratios` at n = 2..8, and why it would be measured again (`problem`, None if
    trusted)."""

    path: Path
    profiles: int
    ratios: dict[int, float]
    problem: str | None

    def break_even(self) -> tuple[float, int] | None:
        """(acceptance, k): the lowest per-token acceptance a at which a k-token draft pays
        on this curve, over k = 1..7, or None if none can. A verify step of k + 1 tokens
        yields 1 + a + ... + a^k tokens on average for t(k+1)/t(1) of a plain step's time
        (the expected-tokens formula of Leviathan et al., arXiv 2211.17192), so it pays where
        that sum exceeds the ratio; a ratio of k + 1 or more never pays."""
        best = None
        for k in range(1, 8):
            ratio = self.ratios[k + 1]
            if ratio >= k + 1:
                continue
            lo, hi = 0.0, 1.0
            for _ in range(40):  # the sum grows with a: bisect for sum = ratio
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if sum(mid ** i for i in range(k + 1)) < ratio else (lo, mid)
            if best is None or hi < best[0]:
                best = (round(hi, 3), k)
        return best


def cached_curve(model_name: str, backend: str) -> CachedCurve | None:
    """The newest readable profile in the store for the model file `model_name` on
    `backend`, or None if there is none. Measures nothing."""
    found = []
    for path in (store_dir() / "profiles").glob("*.json"):
        try:
            body = json.loads(path.read_text())
            if (body.get("model"), body.get("backend")) != (model_name, backend):
                continue
            points, online = _parse(body)
            curve = OnlineStepTimes(points, online).curve(1)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        found.append((path.stat().st_mtime, path, points, online, curve))
    if not found:
        return None
    _, path, points, online, curve = max(found, key=lambda f: f[0])
    core = list(range(1, CORE + 1))  # what a runner with room for them must have
    return CachedCurve(path, len(found), {n: round(curve(n) / curve(1), 3) for n in range(2, 9)},
                       curve_problem(points, core) or stale(points, online))


def step_time_curve(runner: Runner, model_path: Path, backend: str,
                    remeasure: bool = False) -> tuple[StepTimeCurve, bool]:
    """(curve, whether it came from the cache): `load_profile`'s one-sequence curve."""
    profile = load_profile(runner, model_path, backend, remeasure)
    return profile.curve(), profile.cached
