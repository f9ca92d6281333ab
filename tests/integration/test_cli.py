"""`tandem run` with the embedded model, through a subprocess as a user runs it: the prompt
from stdin, `-` or `--file`; a closed stdout (`| head -n 1`) ends quietly; the stats line
says `context full` apart from `max tokens`; a `--ctx-size` above the model's is capped
with a note."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
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


LONG = "The history of computing. " * 300  # ~1,500 tokens: a prefill of seconds here
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _stderr_on_a_terminal(args: list[str]) -> tuple[int, str, str]:
    """Run `tandem *args` with stderr on a pseudo-terminal and stdout on a pipe: (exit
    status, stdout, what the terminal received with colours stripped)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", *args], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    received = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        received += chunk
    os.close(master)
    out = proc.stdout.read().decode()
    return proc.wait(timeout=300), out, ANSI.sub("", received.decode())


def test_prefill_progress_on_a_terminal_and_nothing_when_piped(model: str, tmp_path: Path
                                                              ) -> None:
    prompt = tmp_path / "long.txt"
    prompt.write_text(LONG)
    args = ["run", "--model", model, "--file", str(prompt), "--max-tokens", "2", *GREEDY]
    piped = tandem(*args)
    stats = piped.stderr.splitlines()
    assert len(stats) == 1 and stats[0].startswith("TTFT ")  # no progress into a pipe
    n_prompt = int(re.search(r"(\d+) prompt \+", stats[0]).group(1))
    status, out, terminal = _stderr_on_a_terminal(args)
    assert (status, out) == (0, piped.stdout)
    frames = [f for f in re.split(r"[\r\n]", terminal) if f.startswith("prefill ")]
    assert frames, terminal  # the bar, redrawn in place
    done = [int(m.group(1)) for f in frames
            if (m := re.search(rf" (\d+)/{n_prompt} tokens ·", f))]
    assert done and done == sorted(done) and done[-1] < n_prompt
    assert re.search(r" \d+ tok/s · ETA \d:\d\d:\d\d$", frames[-1].rstrip()), frames[-1]
    # the bar is gone when the reply starts: the last line is the stats line
    assert terminal.rstrip().splitlines()[-1].startswith("TTFT ")


def test_ctrl_c_ends_the_line_and_prints_the_stats_so_far(model: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "run", "--model", model, "--raw",
                             "--max-tokens", "2000", *GREEDY, "1, 2, 3, 4, 5, 6,"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as a terminal's Ctrl+C finds it: a suite started as a background
                            # job of a script (`cmd &`) hands its children SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = proc.stdout.read(8)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert (first + rest).endswith("\n")
    line = err.splitlines()[-1]
    assert re.fullmatch(r"TTFT \d+ ms · prefill \d+ tok/s · decode [\d.]+ tok/s · "
                        r"prefix-cached 0 tokens · 17 prompt \+ \d+ generated tokens "
                        r"\(interrupted\)", line), line


@pytest.mark.parametrize("args, message", [
    (["run", "--bogus"], "tandem run: error: unrecognized arguments: --bogus"),
    (["run", "hi", "--max-tokens", "x"],
     "tandem run: error: argument --max-tokens: expected a positive integer, got 'x'"),
    (["models", "pull"], "tandem models pull: error: the following arguments are required: "
                         "name"),
])
def test_argument_errors_are_one_line_and_a_pointer(args: list[str], message: str) -> None:
    r = tandem(*args)
    command = message.split(": error:")[0]
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"{message}\nsee `{command} --help`\n")


@pytest.mark.parametrize("command", ["run", "bench", "serve", "chat", "prefill-worker",
                                     "models", "doctor", "two-box", "models list"])
def test_every_subcommand_help_has_a_description(command: str) -> None:
    r = tandem(*command.split(), "--help")
    assert r.returncode == 0
    body = r.stdout.split("\n\n")
    assert not body[1].startswith(("positional arguments:", "options:")), r.stdout


def test_bench_shows_its_cell_on_a_terminal_and_keeps_stdout_json(model: str) -> None:
    args = ["bench", "--model", model, "--concurrency", "1,2", "--requests", "2",
            "--prompt-tokens", "16", "--max-tokens", "4", "--threads", "1"]
    status, out, terminal = _stderr_on_a_terminal(args)
    assert status == 0
    assert [json.loads(line)["concurrency"] for line in out.splitlines()] == [1, 2]
    cells = {re.sub(r" · \d:\d\d:\d\d$", "", f.strip()) for f in re.split(r"[\r\n]", terminal)
             if f.startswith("bench ")}
    spinner = r"bench \S cell "
    assert {re.sub(spinner, "bench cell ", c) for c in cells} == {
        "bench cell 1 of 2: concurrency 1, 2 requests",
        "bench cell 2 of 2: concurrency 2, 2 requests"}, cells
