"""`tandem doctor`: what this machine has, which backends are installed, which would run, why.

Prints chip, platform, memory, GPU, backend packages and versions, llama.cpp's build flags
(`llama_print_system_info`) and the automatic backend choice with its reason. `--json` prints
the same facts as one JSON object. Every probe is best-effort: a failing probe reports
"unknown" instead of failing the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="show hardware, installed backends and the backend that would run",
        description="Show this machine's CPU, memory and accelerators, the installed backends "
        "and their builds, and which backend a model would run on and why; with --model, the "
        "model's repacked-weights verdict and weight buffers.")
    parser.add_argument("--backend", choices=["llamacpp", "mlx"], default=None,
                        help="check this backend instead of the automatic choice (default: automatic)")
    parser.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                        help="the GGUF whose llama.cpp weight buffers (repacked or not) to "
                             "show; its probe runs once if not cached (default: the embedded "
                             "model, if downloaded)")
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.set_defaults(func=run)


def _cmd(argv: list[str], timeout: float = 5.0) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def chip() -> str:
    if platform.system() == "Darwin":
        return _cmd(["sysctl", "-n", "machdep.cpu.brand_string"]) or platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int | None:
    """Physical memory in bytes."""
    if platform.system() == "Darwin":
        v = _cmd(["sysctl", "-n", "hw.memsize"])
        return int(v) if v and v.isdigit() else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def nvidia_gpus() -> list[str]:
    out = _cmd(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader"])
    return [line.strip() for line in out.splitlines() if line.strip()] if out else []


def mlx_facts() -> dict[str, Any]:
    from backends.select import mlx_available, package_version

    facts: dict[str, Any] = {"installed": mlx_available(), "mlx": package_version("mlx"),
                             "mlx_lm": package_version("mlx_lm")}
    if facts["installed"]:
        try:
            import mlx.core as mx

            facts["metal"] = bool(mx.metal.is_available())
            facts["default_device"] = str(mx.default_device())
            if facts["metal"]:
                info = mx.metal.device_info()
                facts["device"] = {k: info[k] for k in ("device_name", "architecture",
                                                        "memory_size") if k in info}
        except Exception as e:  # a broken install should be reported, not crash doctor
            facts["error"] = str(e)
    return facts


def llamacpp_facts() -> dict[str, Any]:
    from backends.select import llamacpp_available, package_version

    facts: dict[str, Any] = {"installed": llamacpp_available(),
                             "version": package_version("llama_cpp")}
    if facts["installed"]:
        try:
            import llama_cpp

            info = llama_cpp.llama_print_system_info()
            text = info.decode() if isinstance(info, bytes) else str(info)
            facts["system_info"] = text.strip().rstrip("|").strip()
            facts["gpu_offload"] = bool(llama_cpp.llama_supports_gpu_offload())
        except Exception as e:
            facts["error"] = str(e)
    from backends.llamacpp.exact import installed, library_dir

    # checked, not loaded: this process has the default library
    facts["exact_library"] = str(library_dir()) if installed() else None
    return facts


def weights_facts(model: str | None) -> dict[str, Any] | None:
    """How llama.cpp loads `model`'s weights here: the repack verdict (cached probe, run
    once if missing) and the buffer types {type: MiB} the probe saw. None when no GGUF is
    at hand (the default model not downloaded, or an MLX directory)."""
    from backends.llamacpp.repack import repack_verdict
    from models.registry import DEFAULT_MODEL
    from models.store import resolve_model

    try:
        path = resolve_model(model or DEFAULT_MODEL, pull_missing=False)
    except Exception as e:  # not downloaded, unknown: say so, do not fail doctor
        return {"model": model or DEFAULT_MODEL, "error": str(e)} if model else None
    if not str(path).endswith(".gguf"):
        return None
    verdict = repack_verdict(path)
    return {"model": Path(path).name, "repacked": verdict.repack, "reason": verdict.reason,
            "weight_buffers": verdict.weight_buffers, **format_facts(path),
            "step_curve": curve_facts(Path(path).name, "llamacpp")}


def curve_facts(model_name: str, backend: str) -> dict[str, Any] | None:
    """The cached step-time curve of `model_name` on `backend` (`app.spec_profile`):
    profile path and count, t(n)/t(1) at n = 2..8, the lowest acceptance at which a draft
    pays and its length (`CachedCurve.break_even`; None: none pays), why it would be
    measured again; None when none is cached."""
    from app.spec_profile import cached_curve

    c = cached_curve(model_name, backend)
    if c is None:
        return None
    return {"path": str(c.path), "profiles": c.profiles,
            "ratios": {str(n): r for n, r in c.ratios.items()},
            "break_even": c.break_even(), "problem": c.problem}


def format_facts(path: Path) -> dict[str, Any]:
    """The GGUF's weight format ("Q4_K_M"), whether llama.cpp runs its multi-token steps
    through tiled matmuls (cheap speculative verify steps), and the requantized copies of it
    in the store (`tandem models convert --to ...`) as {format: path}."""
    from app.bench.charts import model_and_format
    from backends.llamacpp.quantize import TARGETS, TILED_FORMATS
    from models.store import gguf_conversion_path

    fmt = model_and_format(path)[1].removeprefix("GGUF ")
    copies = {to: str(p) for to in TARGETS if (p := gguf_conversion_path(path, to)).is_file()}
    return {"format": fmt, "tiled_matmuls": fmt in TILED_FORMATS, "conversions": copies}


def collect(requested: str | None = None, model: str | None = None) -> dict[str, Any]:
    from backends.select import select_backend_with_reason

    mem = memory_bytes()
    facts: dict[str, Any] = {
        "platform": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "python": platform.python_version(),
        "chip": chip(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1) if mem else None,
        "nvidia_gpus": nvidia_gpus(),
        "mlx": mlx_facts(),
        "llamacpp": llamacpp_facts(),
    }
    if facts["llamacpp"]["installed"]:
        try:
            facts["weights"] = weights_facts(model)
        except Exception as e:
            facts["weights"] = {"model": model, "error": str(e)}
    try:
        sel = select_backend_with_reason(requested)
        facts["backend"], facts["reason"] = sel.backend, sel.reason
    except ValueError as e:
        facts["backend"], facts["reason"] = None, str(e)
    return facts


def _print(f: dict[str, Any]) -> None:
    def line(k, v):
        print(f"{k:<18} {v}")

    line("platform", f["platform"])
    line("chip", f"{f['chip']} ({f['cpus']} CPUs)")
    line("memory", f"{f['memory_gib']} GiB" if f["memory_gib"] else "unknown")
    line("nvidia gpu", "; ".join(f["nvidia_gpus"]) or "none (nvidia-smi not found)")
    m = f["mlx"]
    if m["installed"]:
        where = "Metal" if m.get("metal") else "CPU only"
        dev = m.get("device", {}).get("device_name", "")
        line("mlx", f"mlx {m['mlx']}, mlx-lm {m['mlx_lm']} ({where}{', ' + dev if dev else ''})")
    else:
        line("mlx", "not installed" + (f" (mlx {m['mlx']} without mlx-lm)" if m["mlx"] else ""))
    lc = f["llamacpp"]
    if lc["installed"]:
        gpu = "GPU offload" if lc.get("gpu_offload") else "CPU only"
        line("llama.cpp", f"llama-cpp-python {lc['version']} ({gpu})")
        if lc.get("system_info"):
            line("llama.cpp build", lc["system_info"])
        line("exact mode", f"available (--exact; its llama.cpp: {lc['exact_library']})"
             if lc.get("exact_library") else
             "not installed (`bash installers/install.sh --exact` builds it)")
        w = f.get("weights")
        if w and w.get("error"):
            line("weights", f"{w['model']}: {w['error']}")
        elif w:
            from backends.llamacpp.repack import weight_summary

            shown = (weight_summary(w["weight_buffers"]) if w["repacked"] and
                     w["weight_buffers"] else "as stored in the file")
            state = "on" if w["repacked"] else "off"
            line("weights", f"{w['model']}: {shown} (repacked weights {state}: {w['reason']})")
            line("weight format", _format_advice(w))
            line("step-time curve", _curve_advice(w.get("step_curve")))
    else:
        line("llama.cpp", "not installed")
    if f.get("backend"):
        line("backend", f"{f['backend']}: {f['reason']}")
    else:
        line("backend", f"none: {f['reason']}")


def _format_advice(w: dict[str, Any]) -> str:
    """One line: the format, what it means for speculative verify steps, what to do."""
    fmt = w.get("format") or "unknown"
    copies = ", ".join(f"{to} at {p}" for to, p in w.get("conversions", {}).items())
    if w.get("tiled_matmuls"):
        cost = "tiled matmuls: multi-token verify steps are cheap, drafts can pay"
    else:
        cost = ("per-token dot products: a verify step costs about as many one-token steps "
                "as it has tokens; `tandem models convert MODEL --to q8_0` gives cheap verify "
                "steps in a larger file: compare with `tandem bench --workload prediction "
                "--formats q8_0`")
    return f"{fmt} ({cost})" + (f"; converted: {copies}" if copies else "")


def _curve_advice(c: dict[str, Any] | None) -> str:
    """One line: the cached curve and what acceptance drafts need on it."""
    if c is None:
        return ("not measured yet (the first `tandem run`, `chat` or `serve` with speculation "
                "on measures it, 1-6 s, and caches it)")
    ratios = " · ".join(f"t({n})/t(1) {c['ratios'][n]:.2f}" for n in ("2", "4", "8"))
    if c["break_even"] is None:
        verdict = "no draft pays on it"
    else:
        a, k = c["break_even"]
        verdict = (f"drafts pay above {a:.0%} acceptance per token ({k} at a time), so "
                   "`--spec auto` drafts only where its estimate beats that")
    more = f", newest of {c['profiles']} cached" if c["profiles"] > 1 else ""
    stale = f"; measured again on next use: {c['problem']}" if c["problem"] else ""
    return f"{ratios}{more}: {verdict}{stale}"


def run(args: argparse.Namespace) -> int:
    facts = collect(args.backend, args.model)
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        _print(facts)
    return 0 if facts.get("backend") else 1
