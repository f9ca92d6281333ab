"""The repack verdict's pieces that need no model: how a probe's end is worded, the weight
summary, the cache (a failed probe, cached, is not run again)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from backends.llamacpp import repack


def test_a_probe_killed_by_a_signal_is_named():
    assert repack._describe_exit(-4, "") == "the probe died with SIGILL (Illegal instruction)"
    assert repack._describe_exit(-9, "") == "the probe died with SIGKILL (Killed)"


def test_a_failed_probe_gives_its_last_stderr_line():
    assert (repack._describe_exit(1, "loading\nllama_decode failed\n")
            == "the probe failed (exit 1: llama_decode failed)")
    assert repack._describe_exit(2, "") == "the probe failed (exit 2: no message)"


def test_weight_summary_lists_repacked_buffers_first():
    assert (repack.weight_summary({"CPU_Mapped": 1059.89, "CPU_REPACK": 596.53})
            == "CPU_REPACK 596.5 MiB, CPU_Mapped 1059.9 MiB")
    assert repack.weight_summary({"CPU_Mapped": 92.1}) == "CPU_Mapped 92.1 MiB"


def test_describe_says_on_or_off_and_why():
    assert (repack.describe(repack.RepackVerdict(True, "probe passed (CPU_REPACK)"))
            == "repacked weights on: probe passed (CPU_REPACK)")
    assert (repack.describe(repack.RepackVerdict(False, "--repack off"))
            == "repacked weights off: --repack off")


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def test_probe_results_are_parsed_and_cached(fake_gguf, monkeypatch):
    printed = json.dumps({"weight_buffers": {"CPU_Mapped": 10.0, "CPU_REPACK": 5.5}})
    monkeypatch.setattr(repack, "probe_command",
                        lambda path: [sys.executable, "-c", f"print('noise'); print({printed!r})"])
    first = repack.repack_verdict(fake_gguf)
    assert first == repack.RepackVerdict(True, "probe passed (CPU_REPACK)", False,
                                         {"CPU_Mapped": 10.0, "CPU_REPACK": 5.5})
    monkeypatch.setattr(repack, "probe_command", lambda path: pytest.fail("probed twice"))
    assert repack.repack_verdict(fake_gguf) == repack.RepackVerdict(
        True, "probe passed (CPU_REPACK)", True, {"CPU_Mapped": 10.0, "CPU_REPACK": 5.5})


def test_a_probe_without_a_result_line_fails_closed(fake_gguf, monkeypatch):
    monkeypatch.setattr(repack, "probe_command",
                        lambda path: [sys.executable, "-c", "print('loaded')"])
    assert repack.repack_verdict(fake_gguf) == repack.RepackVerdict(
        False, "the probe printed no result")


def test_a_hanging_probe_is_cut_off(fake_gguf, monkeypatch):
    monkeypatch.setattr(repack, "probe_command",
                        lambda path: [sys.executable, "-c", "import time; time.sleep(30)"])
    assert repack.run_probe(fake_gguf, timeout_s=0.5) == repack.RepackVerdict(
        False, "the probe did not finish in 0.5 s")


def test_the_key_follows_the_model_file(fake_gguf):
    key = repack.probe_key(fake_gguf)
    assert key == repack.probe_key(fake_gguf)
    fake_gguf.write_bytes(b"GGUF" + bytes(61))
    assert repack.probe_key(fake_gguf) != key
