"""Exact mode's settings and library choice (backends/llamacpp/exact.py), without a model:
what it turns off, what it refuses and the exact error text, and that the CLI chooses the
library before anything loads llama.cpp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends.llamacpp import exact

ROOT = Path(__file__).resolve().parents[2]


def test_auto_settings_become_off() -> None:
    assert exact.resolve(flash_attn="auto", repack="auto", kv_cache_type="f16",
                         kv_layout="auto") == ("off", "off")
    assert exact.resolve(flash_attn="off", repack="off", kv_cache_type="f16",
                         kv_layout="split") == ("off", "off")


def test_every_conflict_is_named_in_one_error() -> None:
    with pytest.raises(ValueError) as err:
        exact.resolve(flash_attn="on", repack="on", kv_cache_type="q8_0", kv_layout="unified")
    assert str(err.value) == (
        "--exact cannot be combined with flash attention on (its kernel depends on the "
        "queries in a step); --repack on (a GEMM for 4+ rows, a GEMV below); --kv-cache-type q8_0 "
        "(a quantized V needs flash attention); --kv-layout unified (sequences share one "
        "attention stream)")


def test_system_info_tells_the_builds_apart() -> None:
    default = ("CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
               "REPACK = 1 | ")
    assert not exact.library_is_exact(default)
    assert exact.library_is_exact(default.replace("LLAMAFILE = 1 | ", ""))


def test_missing_library_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(exact.LIB_ENV, str(tmp_path))
    with pytest.raises(ValueError) as err:
        exact.select_library()
    assert str(err.value) == (
        f"--exact needs llama.cpp built without llamafile's tinyBLAS, which is not installed "
        f"at {tmp_path}; run `bash installers/install.sh --exact`")


def test_too_late_once_llama_cpp_is_loaded(tmp_path, monkeypatch) -> None:
    import llama_cpp  # noqa: F401  (the default library, as in this test process)

    (tmp_path / "libllama.so").write_bytes(b"")
    monkeypatch.setenv(exact.LIB_ENV, str(tmp_path))
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    with pytest.raises(ValueError, match="start a new process with --exact"):
        exact.select_library()
    assert "LLAMA_CPP_LIB_PATH" not in os.environ


def test_the_cli_loads_no_llama_cpp_before_choosing_the_library() -> None:
    """`--exact` sets LLAMA_CPP_LIB_PATH while parsing flags; if building the parser
    imported llama_cpp, the default library would already be loaded."""
    code = ("import sys; from app.cli import build_parser; build_parser(); "
            "print('llama_cpp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout == "False\n"


def test_cli_refuses_a_conflicting_flag_before_loading(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "app.cli", "run", "--exact", "--kv-layout",
                        "unified", "hi"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, exact.LIB_ENV: str(tmp_path)}, timeout=60)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("tandem: error: --exact cannot be combined with --kv-layout unified "
                        "(sequences share one attention stream)\n")


@pytest.mark.parametrize("extra", [["--url", "http://127.0.0.1:9"], ["--baseline", "raw"]])
def test_bench_refuses_exact_where_it_would_not_apply(extra) -> None:
    r = subprocess.run([sys.executable, "-m", "app.cli", "bench", "--exact", *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (
        "tandem: error: --exact applies to the in-process llama.cpp engine: not with --url "
        "(start the server with --exact), --baseline raw (it measures the default library) "
        "or --vs-mlx-lm\n")


def test_mlx_is_refused_before_the_library_is_looked_for(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "app.cli", "run", "--exact", "--backend", "mlx",
                        "hi"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, exact.LIB_ENV: str(tmp_path)})
    assert (r.returncode, r.stderr) == (1, f"tandem: error: {exact.NOT_ON_MLX}\n")
