"""The target's step-time curve, measured once per machine + model + backend and cached.

The cache is a JSON file per key under `<model store>/profiles/`; delete it (or pass
`remeasure=True`) after changing hardware settings the key does not capture.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.profile import measure_step_times
from backends.base import Runner
from models.store import store_dir

PROFILE_VERSION = 2  # 2: fastest of the repeats, monotone (measure_step_times)


def profile_key(model_path: Path, backend: str, runner: Runner) -> str:
    """Identifies what the curve depends on: the model file (name, size), backend, KV
    layout, threads, repacked weights or not (llama.cpp: 1.13-1.43x faster steps), KV
    cache type, machine (host, CPU, cores)."""
    st = model_path.stat() if model_path.exists() else None
    parts = [PROFILE_VERSION, model_path.name, st.st_size if st else 0, backend,
             getattr(runner, "kv_layout", None), getattr(runner, "n_threads", None),
             getattr(getattr(runner, "repack", None), "repack", None),
             platform.node(), platform.machine(), platform.processor(), os.cpu_count()]
    kv_cache_type = getattr(runner, "kv_cache_type", "f16")
    if kv_cache_type != "f16":  # its own curve (quantized attention); f16 keys stay as they were
        parts.append(kv_cache_type)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def step_time_curve(runner: Runner, model_path: Path, backend: str,
                    remeasure: bool = False) -> tuple[StepTimeCurve, bool]:
    """(curve, whether it came from the cache). Measures (about 1-3 s) on a miss and
    stores the result; an unreadable cache file is measured again."""
    path = store_dir() / "profiles" / f"{profile_key(model_path, backend, runner)}.json"
    if not remeasure:
        try:
            points = json.loads(path.read_text())["step_seconds"]
            return StepTimeCurve({int(n): float(t) for n, t in points.items()}), True
        except (OSError, ValueError, KeyError, TypeError):
            pass
    points = measure_step_times(runner)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"model": model_path.name, "backend": backend,
                                    "step_seconds": points}, indent=1))
    except OSError:
        pass  # a read-only store only costs a re-measurement next time
    return StepTimeCurve(points), False
