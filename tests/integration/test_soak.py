"""The soak bench end to end on the embedded model: a real `tandem serve` and prefill
worker, mixed traffic from two clients, one worker kill, then Ctrl+C (SIGINT), which must
still drain, check the idle state and print the summary. About a minute on two idle cores."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert proc.poll() is None, f"soak exited early with {proc.returncode}"
        assert time.monotonic() < deadline, f"no {text!r} in {path.name} after {timeout} s"
        time.sleep(0.5)


def test_short_soak_interrupted_reports_no_failures(embedded_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "soak"
    cmd = [sys.executable, "-m", "app.bench.soak", "--minutes", "10", "--model",
           str(embedded_model), "--out", str(out), "--clients", "2", "--long-words", "150",
           "--ctx-size", "2048", "--idle-s", "2", "--sample-s", "2", "--kill-every-s", "4"]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            # after one whole worker kill cycle (kill, long prompt while down, restart, one
            # more), Ctrl+C: the load stops early and everything is still checked
            _wait_for(out / "outcomes.jsonl", '"restart_next_long"', proc, timeout=300)
            proc.send_signal(signal.SIGINT)
            stdout, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    s = json.loads(stdout)
    assert s == json.loads((out / "summary.json").read_text())
    assert s["interrupted"] is True and 0 < s["load_s"] < 600
    assert s["requests"]["failed"] == 0, s["classes"]
    assert s["requests"]["total"] >= 17  # the warm-up's 15 classes and the kill's 3 prompts
    assert {"chat", "chat_stream", "malformed", "oversized", "vanish", "slow_reader",
            "kill_inflight", "kill_next_long", "restart_next_long"} <= set(s["classes"])
    kill = s["worker_kills"][0]
    assert kill["inflight_ok"] and kill["next_long_ok"] and kill["after_restart_ok"]
    assert kill["restart_s"] > 0
    assert s["idle_end"] == {"kv_blocks_used": 0, "slots_used": 0, "running": 0,
                             "waiting": 0, "remote_prefilling": 0}
    assert s["prefill_routes"].get("remote/always", 0) >= 1  # the worker did prefill
    assert set(s["goals"]) == {"failed_requests_0", "rss_growth_le_5pct", "idle_kv_blocks_0",
                               "fds_back", "health_p99_le_100ms", "worker_kills_served"}
    # timings on a shared CI machine are noise: only the counts are asserted
    assert s["goals"]["failed_requests_0"] and s["goals"]["idle_kv_blocks_0"]
    assert s["goals"]["fds_back"] and s["goals"]["worker_kills_served"]
    assert s["health_ms"]["count"] > 0 and s["health_ms"]["failed"] == 0
    assert (out / "soak.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "samples.jsonl").read_text().count("\n") >= 3
    assert set(s["phases_s"]) == {"start", "warmup", "load", "drain", "idle_end"}
    print("soak phases, s:", s["phases_s"])
    # the children were stopped
    for pid in [s["server_pid"], *s["worker_pids"]]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
