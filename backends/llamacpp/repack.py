"""Repacked weights: llama.cpp's extra CPU buffer types, on wherever this machine runs them.

At load llama.cpp can copy weights into interleaved layouts (`CPU_REPACK`: Q4_0, Q4_K,
IQ4_NL, ... as 8x8 or 4x8 tiles; `AMX` where the build has it) that its GEMV/GEMM kernels
read faster; llama-server keeps them on. Measured here on Qwen2.5-Coder-1.5B Q4_K_M, one-token
decode is 1.15-1.22x faster with them (README, "Repacked weights"). They are also what once
crashed this project: a *native* build compiled AMX kernels that the kernel refused to the
process, and the first repacked matmul died with SIGILL (shared/notes/llamacpp.md §2).

So "auto" does not trust the build: the first load of a model file on a machine and
llama.cpp build runs `backends.llamacpp.repack_probe` in a subprocess (load with repacking,
one prefill of 8 tokens through the GEMM kernels, two one-token steps through the GEMV ones)
and caches its verdict under `<model store>/probes/`. A probe that dies, fails or hangs
turns repacking off for that model on this machine, and the load says so in one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from backends.base import AUTO_ON_OFF as REPACK_MODES

PROBE_VERSION = 1
PLAIN_BUFFERS = ("CPU", "CPU_Mapped")  # weights as the file has them; other types are repacked
PROBE_TIMEOUT_S = 300.0  # a probe loads the model once: 1-20 s for the models tandem runs

log = logging.getLogger("tandem.llamacpp")


@dataclass(frozen=True, slots=True)
class RepackVerdict:
    """Whether to load a model with repacked weights, and why (one clause, for a note);
    `weight_buffers` {buffer type: MiB} as the probe loaded them (None: no probe ran)."""

    repack: bool
    reason: str
    cached: bool = False
    weight_buffers: dict[str, float] | None = None


def describe(verdict: RepackVerdict) -> str:
    """The verdict as a parenthesis for a start-up line, e.g. "repacked weights on: probe
    passed (CPU_REPACK)"."""
    return f"repacked weights {'on' if verdict.repack else 'off'}: {verdict.reason}"


def weight_summary(buffers: dict[str, float]) -> str:
    """{buffer type: MiB} as one phrase, e.g. "CPU_REPACK 596.5 MiB, CPU_Mapped 1059.9 MiB"."""
    return ", ".join(f"{name} {mib:.1f} MiB" for name, mib in
                     sorted(buffers.items(), key=lambda kv: (kv[0] in PLAIN_BUFFERS, kv[0])))


def probe_command(model_path: Path) -> list[str]:
    """The probe's command line (a test replaces it to simulate a crash)."""
    return [sys.executable, "-m", "backends.llamacpp.repack_probe", str(model_path)]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def probe_key(model_path: Path) -> str:
    """What a verdict depends on: the model file (name, size: its tensor types), the
    llama.cpp build (version, compiled CPU features) and the machine (host, CPU, its
    flags, the kernel, which grants or refuses AMX tiles)."""
    import llama_cpp

    st = model_path.stat()
    system_info = llama_cpp.llama_print_system_info()
    parts = [PROBE_VERSION, model_path.name, st.st_size, llama_cpp.__version__,
             system_info.decode(errors="replace") if isinstance(system_info, bytes)
             else str(system_info),
             platform.node(), platform.machine(), platform.processor(), platform.release(),
             hashlib.sha256(_cpu_flags().encode()).hexdigest()[:16]]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _describe_exit(code: int, stderr: str) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        desc = signal.strsignal(-code) or ""
        return f"the probe died with {name}" + (f" ({desc})" if desc else "")
    last = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    return f"the probe failed (exit {code}: {last})"


def run_probe(model_path: Path, timeout_s: float = PROBE_TIMEOUT_S) -> RepackVerdict:
    """Load `model_path` with repacked weights in a subprocess and decode a few tokens.
    Never raises for the probe's own failure: that is the verdict."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the probe imports `backends`
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        done = subprocess.run(probe_command(model_path), capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return RepackVerdict(False, f"the probe did not finish in {timeout_s:g} s")
    except OSError as exc:
        return RepackVerdict(False, f"the probe could not start ({exc})")
    if done.returncode != 0:
        return RepackVerdict(False, _describe_exit(done.returncode, done.stderr))
    try:
        buffers = json.loads(done.stdout.strip().splitlines()[-1])["weight_buffers"]
    except (ValueError, KeyError, IndexError, TypeError):
        return RepackVerdict(False, "the probe printed no result")
    repacked = sorted(name for name in buffers if name not in PLAIN_BUFFERS)
    return RepackVerdict(True, f"probe passed ({', '.join(repacked)})" if repacked else
                         "probe passed; none of this model's tensor types repack",
                         weight_buffers=buffers)


def _cache_path(model_path: Path) -> Path:
    from models.store import store_dir

    return store_dir() / "probes" / f"repack-{probe_key(model_path)}.json"


def repack_verdict(model_path: str | Path, mode: str = "auto") -> RepackVerdict:
    """Whether to load `model_path` with repacked weights: "on" and "off" as given; "auto"
    by the cached probe verdict for this model, build and machine, probing (a few
    seconds, once) on a miss. Raises ValueError for an unknown mode."""
    if mode not in REPACK_MODES:
        raise ValueError(f"repack must be one of {', '.join(REPACK_MODES)}, not {mode!r}")
    if mode != "auto":
        return RepackVerdict(mode == "on", f"--repack {mode}")
    path = Path(model_path)
    cache = _cache_path(path)
    try:
        saved = json.loads(cache.read_text())
        verdict = RepackVerdict(bool(saved["repack"]), str(saved["reason"]), cached=True,
                                weight_buffers=saved.get("weight_buffers"))
    except (OSError, ValueError, KeyError, TypeError):
        verdict = run_probe(path)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"model": path.name, "repack": verdict.repack,
                                         "reason": verdict.reason,
                                         "weight_buffers": verdict.weight_buffers}))
        except OSError:
            pass  # a read-only store only costs another probe next time
    if not verdict.repack:
        log.warning("tandem: repacked weights off for %s: %s; loading without them "
                    "(slower decode)", path.name, verdict.reason)
    return verdict


def load_model_like_runner(model_path: str | Path, mode: str = "auto"):
    """A `llama_model_p` loaded as `LlamaCppRunner` loads it by default (repacked where the
    verdict of `mode` says so), for benchmarks and references that must run the same
    kernels. The caller frees it with `llama_model_free`. Raises ValueError as
    `runtime.load_model`."""
    from backends.llamacpp import runtime

    return runtime.load_model(model_path, repack_verdict(model_path, mode).repack)[0]
