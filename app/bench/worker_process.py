"""A `tandem prefill-worker` in a process of its own, for the two-box bench and tests: started
on a free loopback port, ready once it prints that it listens; its output goes to a log file
(outcomes are logged one line per request)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from app.bench.server_process import free_port

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """Args: log_dir: where `worker-<port>.log` goes. extra: more `prefill-worker` flags
    (e.g. `--threads 1`). prefix: a command to run it under (e.g. `taskset -c 0`). port: the
    port to listen on (default: a free one; a restarted worker takes its predecessor's).
    popen_kw: more `subprocess.Popen` arguments (`env`, `start_new_session`). Raises
    RuntimeError if it does not listen within `timeout` s."""

    def __init__(self, log_dir: Path, *extra: str, timeout: float = 120.0,
                 prefix: tuple[str, ...] = (), port: int | None = None, **popen_kw):
        self.port = port or free_port()
        self.log_path = Path(log_dir) / f"worker-{self.port}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "app.cli", "prefill-worker", "--port", str(self.port),
                 *extra], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, **popen_kw)
        deadline = time.monotonic() + timeout
        while "listening on" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prefill worker did not start: {self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text()

    def ended(self) -> int:
        """Requests and connections the worker has finished with (any outcome)."""
        log = self.log()
        return log.count("tandem: prefill for") + log.count("dropped")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process cannot take SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
