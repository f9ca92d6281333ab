"""`--kv-cache-type`: the flag on every model-loading command, into `RunnerConfig`, and the
one-line refusals (flash attention off, two-box mode, the MLX backend) and the MLX pool's
start-up line. No model needed."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from app.commands.engine_flags import COMMON, add_engine_args, engine_args_from
from app.config import EngineArgs
from app.disagg.peer import PeerConfig
from backends.base import RunnerConfig

ROOT = Path(__file__).resolve().parents[2]


def tandem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)


def test_flag_reaches_the_runner_config_and_defaults_to_f16():
    p = argparse.ArgumentParser()
    add_engine_args(p, COMMON)
    assert engine_args_from(p.parse_args([]), COMMON).runner.kv_cache_type == "f16"
    args = engine_args_from(p.parse_args(["--kv-cache-type", "q8_0"]), COMMON)
    assert (args.runner.kv_cache_type, args.runner.flash_attn) == ("q8_0", "auto")
    with pytest.raises(SystemExit):
        p.parse_args(["--kv-cache-type", "q5_1"])


@pytest.mark.parametrize("command", ["run", "chat", "serve", "bench", "prefill-worker"])
def test_every_model_command_takes_it(command):
    r = tandem(command, "--help")
    assert r.returncode == 0
    assert "--kv-cache-type {f16,q8_0,q4_0}" in r.stdout


def test_flash_attention_off_is_refused_in_one_line():
    with pytest.raises(ValueError) as err:
        RunnerConfig(kv_cache_type="q8_0", flash_attn="off")
    assert str(err.value) == ("--kv-cache-type q8_0 needs flash attention (llama.cpp "
                              "quantizes the V cache only with it), which is off")
    RunnerConfig(kv_cache_type="f16", flash_attn="off")  # f16 needs none
    with pytest.raises(ValueError, match="^kv_cache_type must be f16, q8_0 or q4_0, not 'q5_1'$"):
        RunnerConfig(kv_cache_type="q5_1")


def test_two_box_refuses_a_q4_0_cache_at_start_up():
    peer = PeerConfig("127.0.0.1", 7070, b"")
    with pytest.raises(ValueError) as err:
        EngineArgs(runner=RunnerConfig(kv_cache_type="q4_0"), prefill_peer=peer)
    assert str(err.value) == ("two-box mode sends f16 or q8_0 KV; --kv-cache-type q4_0 is not "
                              "supported with --prefill-peer")
    EngineArgs(runner=RunnerConfig(kv_cache_type="f16"), prefill_peer=peer)
    EngineArgs(runner=RunnerConfig(kv_cache_type="q8_0"), prefill_peer=peer)


def test_two_box_refusals_as_a_user_sees_them():
    r = tandem("run", "--prefill-peer", "127.0.0.1:7070", "--kv-cache-type", "q4_0", "hi")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", (
        "tandem: error: two-box mode sends f16 or q8_0 KV; --kv-cache-type q4_0 is not "
        "supported with --prefill-peer\n"))
    r = tandem("prefill-worker", "--kv-cache-type", "q4_0")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", (
        "tandem prefill-worker: two-box mode sends f16 or q8_0 KV; --kv-cache-type q4_0 is "
        "not supported by prefill-worker\n"))


def test_mlx_refuses_a_q4_0_cache(monkeypatch):
    from backends import loader
    from backends.loader import load_runner

    monkeypatch.setattr(loader, "_choose", lambda requested: "mlx")  # mlx installed or not

    with pytest.raises(ValueError) as err:
        load_runner("model-dir", backend="mlx", config=RunnerConfig(kv_cache_type="q4_0"))
    assert str(err.value) == ("--kv-cache-type q4_0 is for the llamacpp backend; the MLX "
                              "backend's KV cache is f16 or q8_0 (MLX 8-bit affine)")


MLX_Q8_REFUSAL = ("two-box mode sends f16 or llama.cpp's q8_0 KV; --kv-cache-type q8_0 on the "
                  "MLX backend (MLX 8-bit affine) is not supported")


def test_two_box_refuses_mlx_q8_0_at_start_up():
    """MLX's q8_0 is its 8-bit affine layout, not the wire's llama.cpp blocks."""
    peer = PeerConfig("127.0.0.1", 7070, b"")
    with pytest.raises(ValueError) as err:
        EngineArgs(backend="mlx", runner=RunnerConfig(kv_cache_type="q8_0"), prefill_peer=peer)
    assert str(err.value) == f"{MLX_Q8_REFUSAL} with --prefill-peer"
    EngineArgs(backend="mlx", runner=RunnerConfig(kv_cache_type="f16"), prefill_peer=peer)
    EngineArgs(backend="llamacpp", runner=RunnerConfig(kv_cache_type="q8_0"), prefill_peer=peer)
    r = tandem("prefill-worker", "--backend", "mlx", "--kv-cache-type", "q8_0")
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "", f"tandem prefill-worker: {MLX_Q8_REFUSAL} by prefill-worker\n")


def test_serve_start_up_line_of_an_mlx_pool():
    from app.commands.serve import kv_line

    d = {"kv_bytes": 3 * 2**28, "kv_budget_bytes": None, "kv_cache_type": "q8_0",
         "kv_tokens": 16384, "max_seqs": 32}
    assert kv_line(d) == "tandem: paged KV (q8_0): 16384 tokens shared by 32 sequences, 0.75 GiB"
    assert kv_line({**d, "kv_bytes": None}) is None
