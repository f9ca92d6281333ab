"""Real-terminal smoke test: `tandem chat` in a detached tmux session (100x30).

Types a question in one burst (characters and Enter together, as a fast typist or a paste
would), waits for an answer, presses Esc and Ctrl+Q, and checks a clean exit. Skips without
tmux or without the embedded model (`embedded_model`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
TMUX = shutil.which("tmux")


def _chat_command() -> str:
    exe = Path(sys.executable).parent / "tandem"
    return f"{exe} chat" if exe.exists() else f"{sys.executable} -m app.cli chat"


class Tmux:
    """A private tmux server (own socket) holding one session."""

    def __init__(self, socket: str, session: str):
        self.base = [TMUX, "-L", socket]
        self.session = session

    def run(self, *args: str) -> str:
        return subprocess.run(
            [*self.base, *args], check=True, capture_output=True, text=True
        ).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.session)

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.session, *keys)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; screen:\n{screen}")
            time.sleep(0.25)


def bar_state(screen: str, mark: str) -> bool:
    """Whether the status bar (the line that starts with a state mark) shows `mark`: ● ready,
    ▶ generating. At 100 columns the bar shows the model without its backend."""
    return any(line.strip().startswith(f"{mark} ") and "│ TTFT" in line
               for line in screen.splitlines())


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
def test_chat_in_tmux(model_home, tmp_path):
    home = model_home
    # Short greedy replies keep the test quick on two cores.
    (home / "config.toml").write_text("[defaults]\ntemperature = 0.0\nmax_tokens = 32\n")
    exit_file = tmp_path / "exit"
    command = (
        f"cd {REPO} && TANDEM_HOME={home} {_chat_command()}; "
        f"echo $? > {exit_file}; sleep 60"
    )
    tmux = Tmux(f"tandem-test-{os.getpid()}", "chat")
    tmux.run("new-session", "-d", "-s", "chat", "-x", "100", "-y", "30", command)
    try:
        tmux.wait_for(lambda s: bar_state(s, "●"), 120, "the model to load")
        tmux.keys("What is the capital of France?", "Enter")
        tmux.wait_for(lambda s: bar_state(s, "▶") or "Assistant" in s, 30, "the reply to start")
        screen = tmux.wait_for(lambda s: bar_state(s, "●") and "Assistant" in s, 180,
                               "the reply to finish")
        assert "What is the capital of France?" in screen  # sent whole, not cut short
        after = screen.split("Assistant", 1)[1]
        answer_lines = [line.strip(" │█") for line in after.splitlines()[1:4]]
        assert any(answer_lines), screen
        assert "tok/s" in screen and "– tok/s" not in screen
        tmux.keys("Escape")
        tmux.keys("C-q")
        deadline = time.monotonic() + 30
        while not exit_file.exists() or not exit_file.read_text().strip():
            assert time.monotonic() < deadline, tmux.screen()
            time.sleep(0.2)
        assert exit_file.read_text().strip() == "0"
    finally:
        subprocess.run([*tmux.base, "kill-server"], capture_output=True)
