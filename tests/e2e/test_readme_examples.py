"""The README's client examples, run as written against a real `tandem serve`.

Every fenced block of README.md (and docs/apis.md, which it links) that talks to the example server (`127.0.0.1:8000`, key
`secret`) is taken from the README itself — not copied here — and run: Python blocks with
this interpreter (which has the `client` extra's packages: `openai`, `anthropic`,
`ollama`), `curl` commands of bash blocks with curl. The server is the embedded model on a
free port, which replaces 8000 in each block; a block passes when it exits 0 and prints
something.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.bench.server_process import free_port, running

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_URL = "127.0.0.1:8000"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)


DOCS = ("README.md", "docs/apis.md")


def readme_blocks(lang: str) -> list[str]:
    """The fenced `lang` blocks of README.md and docs/apis.md that talk to the example
    server."""
    text = "\n".join((ROOT / doc).read_text() for doc in DOCS)
    return [body for tag, body in FENCE.findall(text) if tag == lang and EXAMPLE_URL in body]


def curl_commands(block: str) -> list[str]:
    """The `curl ...` commands of a bash block (backslash continuations joined)."""
    joined = block.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("curl ")]


PYTHON = readme_blocks("python")
CURL = [c for b in readme_blocks("bash") for c in curl_commands(b)]


def test_the_readme_has_client_examples() -> None:
    assert PYTHON and CURL


@pytest.fixture(scope="module")
def example_server(embedded_model: Path) -> Iterator[str]:
    """`tandem serve --api-key secret` as the README runs it (the default model, the
    embedded one): its `host:port`."""
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--api-key",
           "secret", "--ctx-size", "2048"]
    with running(cmd, port, timeout=300, cwd=ROOT):
        yield f"127.0.0.1:{port}"


@pytest.mark.model
@pytest.mark.parametrize("block", PYTHON, ids=[f"python{i}" for i in range(len(PYTHON))])
def test_python_example_runs_as_written(block: str, example_server: str) -> None:
    r = subprocess.run([sys.executable, "-c", block.replace(EXAMPLE_URL, example_server)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


@pytest.mark.model
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("command", CURL, ids=[f"curl{i}" for i in range(len(CURL))])
def test_curl_example_runs_as_written(command: str, example_server: str) -> None:
    r = subprocess.run(command.replace(EXAMPLE_URL, example_server) + " --fail-with-body -sS",
                       shell=True, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip()
