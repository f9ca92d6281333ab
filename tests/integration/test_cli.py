"""`tandem run` with the embedded model, through a subprocess as a user runs it: the prompt
from stdin, `-` or `--file`; a closed stdout (`| head -n 1`) ends quietly; the stats line
says `context full` apart from `max tokens`; a `--ctx-size` above the model's is capped
with a note."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GREEDY = ("--temperature", "0", "--spec", "off", "--threads", "1")


def tandem(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, input=input, timeout=300)


@pytest.fixture(scope="module")
def model(embedded_model: Path) -> str:
    return str(embedded_model)


def test_prompt_from_stdin_dash_and_file(model: str, tmp_path: Path) -> None:
    base = ("run", "--model", model, "--max-tokens", "4", *GREEDY)
    as_arg = tandem(*base, "Say hi")
    assert as_arg.returncode == 0 and as_arg.stdout.strip()
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Say hi")
    for args, stdin in [((), "Say hi"), (("-",), "Say hi"), (("--file", str(prompt)), None)]:
        r = tandem(*base, *args, input=stdin)
        assert (r.returncode, r.stdout) == (0, as_arg.stdout), args


def test_closed_stdout_ends_quietly(model: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "run", "--model", model, "--raw", "--max-tokens",
         "400", *GREEDY, "1, 2, 3, 4, 5, 6,"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(1)  # like `head -c 1`: read, then close the pipe
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert (proc.wait(timeout=120), stderr) == (0, "")


def test_context_full_is_not_max_tokens(model: str) -> None:
    r = tandem("run", "--model", model, "--raw", "--ctx-size", "40", *GREEDY,
               "1, 2, 3, 4, 5, 6,")
    assert r.returncode == 0
    assert r.stderr.splitlines()[-1].endswith(" · 17 prompt + 23 generated tokens (context full)")


def test_ctx_size_above_the_model_is_capped_with_a_note(model: str) -> None:
    r = tandem("run", "--model", model, "--ctx-size", "100000", "--max-tokens", "2", *GREEDY,
               "hi")
    assert r.returncode == 0
    lines = r.stderr.splitlines()
    assert lines[0] == ("tandem: note: --ctx-size 100000 is above the model's context; using "
                        "8192 tokens")
    assert lines[-1].endswith(" generated tokens (max tokens)")
