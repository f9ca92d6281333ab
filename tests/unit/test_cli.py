"""The command line as a newcomer meets it, without a model: `--version`, every flag's help
states its default, errors that name the flag, `models pull` of a path or a Hugging Face
file (offline, from a cache made here), `bench --url` errors as one line, and the MLX
install hint. CLI behaviour runs `python -m app.cli` in a subprocess."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def tandem(*args: str, env: dict[str, str] | None = None, input: str | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, **(env or {})},
                          input=input, timeout=timeout)


def test_version() -> None:
    r = tandem("--version")
    assert (r.returncode, r.stdout, r.stderr) == (0, "tandem 0.1.0\n", "")


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for sub_name, subsub in _subparsers(sub):
                    yield f"{name} {sub_name}", subsub


def test_every_flag_help_states_its_default() -> None:
    missing = []
    for name, parser in _subparsers(build_parser()):
        for action in parser._actions:
            if (not action.option_strings or action.required
                    or isinstance(action, argparse._HelpAction | argparse._VersionAction)):
                continue
            if "default" not in (action.help or "") or action.help.endswith("default: None)"):
                missing.append(f"{name} {action.option_strings[0]}")
    assert missing == []


def test_sampling_help_says_default_and_range() -> None:
    run = dict(_subparsers(build_parser()))["run"]
    helps = {a.option_strings[0]: a.help for a in run._actions if a.option_strings}
    # the sampling defaults themselves are chosen per model (app.commands.sampling_flags)
    assert "0 < P <= 1; 1 disables it (default: " in helps["--top-p"]
    assert "0 disables it (default: " in helps["--top-k"]
    assert "0 <= P <= 1; 0 disables it (default: " in helps["--min-p"]
    assert helps["--seed"] == ("random seed, for reproducible sampling (default: none, a "
                               "fresh draw each run)")


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-tokens", "0", "argument --max-tokens: expected a positive integer, got 0"),
    ("--top-p", "0", "argument --top-p: expected a number in (0, 1], got '0'"),
    ("--min-p", "2", "argument --min-p: expected a number in [0, 1], got '2'"),
    ("--temperature", "-1", "argument --temperature: expected a number in [0, inf), got '-1'"),
])
def test_errors_name_the_flag(flag: str, value: str, message: str) -> None:
    r = tandem("run", "hi", flag, value)
    assert r.returncode == 2
    assert r.stderr == f"tandem run: error: {message}\nsee `tandem run --help`\n"


@pytest.mark.parametrize(("args", "message"), [
    (["--flash-attn", "off", "--kv-cache-type", "q8_0"],
     "--kv-cache-type q8_0 needs flash attention (llama.cpp quantizes the V cache only with "
     "it), which is off"),
    (["--flash-attn", "off", "--backend", "mlx"],
     "--flash-attn is for the llamacpp backend; the MLX backend runs mlx-lm's own attention"),
])
def test_flash_attention_settings_that_cannot_apply(args: list[str], message: str) -> None:
    r = tandem("run", "hi", "--model", "smollm2-135m-instruct", *args)
    assert r.returncode != 0
    assert message in r.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["hi", "--raw", "--system", "be brief"],
     "--system needs the chat template, which --raw skips; put the system text in the raw "
     "prompt instead"),
    (["   "], "the prompt is empty"),
    (["  \n", "--raw"], "the prompt is empty"),
    (["hi", "--file", "README.md"], "give the prompt as PROMPT or with --file, not both"),
])
def test_run_refuses_before_loading(args: list[str], message: str) -> None:
    r = tandem("run", *args, "--model", "no-such-model")
    assert r.returncode == 2
    assert r.stderr == f"tandem run: error: {message}\nsee `tandem run --help`\n"


def test_empty_prompt_on_stdin_is_refused() -> None:
    r = tandem("run", "--model", "no-such-model", input=" \n")
    assert r.returncode == 2
    assert r.stderr == "tandem run: error: the prompt is empty\nsee `tandem run --help`\n"


def test_model_that_is_an_existing_non_gguf_file() -> None:
    r = tandem("run", "hi", "--model", "README.md")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("tandem: error: README.md is not a GGUF file (pass a .gguf model "
                        "file, an MLX model directory or a registry name: tandem models "
                        "list)\n")


def test_models_pull_of_a_path_does_not_suggest_a_path() -> None:
    r = tandem("models", "pull", "README.md")
    assert r.returncode == 1
    assert r.stderr == ("tandem: README.md is a local path: nothing to pull; use it as is "
                        "(tandem run --model README.md ...)\n")
    r = tandem("models", "pull", "no-such-model")
    assert r.returncode == 1
    assert "pass a path" not in r.stderr
    assert r.stderr.endswith("(or a Hugging Face file: owner/repo/file.gguf)\n")


COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_cache(tmp_path: Path) -> Path:
    """A huggingface-hub cache holding `acme/tiny-GGUF/tiny.gguf` (a 4-byte GGUF stub)."""
    repo = tmp_path / "hub" / "models--acme--tiny-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "tiny.gguf").write_bytes(b"GGUF")
    return tmp_path / "hub"


def test_models_pull_hugging_face_file_offline(hf_cache: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_cache)}
    r = tandem("models", "pull", "acme/tiny-GGUF/tiny.gguf", env=env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == f"{hf_cache}/models--acme--tiny-GGUF/snapshots/{COMMIT}/tiny.gguf\n"
    r = tandem("models", "pull", "acme/tiny-GGUF/other.gguf", env=env)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("tandem: huggingface hub acme/tiny-GGUF/other.gguf: not in the "
                        "Hugging Face cache, and HF_HUB_OFFLINE is set\n")


class _Stub(http.server.BaseHTTPRequestHandler):
    """An OpenAI-shaped server that refuses: 401 without `Bearer k`, else 503."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Authorization") != "Bearer k":
            status, message = 401, "Invalid API key."
        else:
            status, message = 503, "The server is overloaded with requests; please retry shortly."
        body = json.dumps({"error": {"message": message, "type": "x", "param": None,
                                     "code": None}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_bench_url_http_errors_are_one_line(stub_url: str) -> None:
    base = ("bench", "--url", stub_url, "--concurrency", "1", "--requests", "1")
    r = tandem(*base, env={"TANDEM_API_KEY": ""})
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"tandem: error: {stub_url}: HTTP 401: Invalid API key.\n"
    r = tandem(*base, env={"TANDEM_API_KEY": "k"})  # the key is sent: past 401, to the 503
    assert r.stderr == (f"tandem: error: {stub_url}: HTTP 503: The server is overloaded with "
                        "requests; please retry shortly.\n")
    assert r.returncode == 1


def test_bench_bad_png_fails_before_the_run(tmp_path: Path) -> None:
    png = tmp_path / "missing" / "out.png"
    # nothing listens at the URL: the --png check must come first
    r = tandem("bench", "--url", "http://127.0.0.1:9", "--png", str(png))
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"tandem: error: --png {png}: no such directory: {png.parent}\n"


def test_mlx_hint_names_the_installer(monkeypatch: pytest.MonkeyPatch) -> None:
    from backends import select

    monkeypatch.setattr(select, "mlx_available", lambda: False)
    with pytest.raises(ValueError) as err:
        select.select_backend_with_reason("mlx")
    assert str(err.value) == (
        "backend 'mlx' requested but mlx/mlx-lm are not installed (from the clone: bash "
        "installers/install.sh (on Linux: --dev, MLX's CPU build), or .venv/bin/pip install "
        "-e '.[mlx]')")


def test_prefill_worker_off_loopback_needs_a_secret(tmp_path) -> None:
    r = tandem("prefill-worker", "--host", "0.0.0.0")
    assert r.returncode == 2
    assert r.stderr.startswith("tandem prefill-worker: binding 0.0.0.0 exposes this "
                               "machine's model to the network: pass --secret-file")
    short = tmp_path / "secret"
    short.write_text("tooshort\n")
    short.chmod(0o600)
    r = tandem("prefill-worker", "--host", "0.0.0.0", "--secret-file", str(short))
    assert r.returncode == 2
    assert f"the secret in {short} is 8 bytes; at least 16 are needed" in r.stderr


@pytest.mark.parametrize("flags, message", [
    (["--write-timeout", "0"], "argument --write-timeout: expected seconds > 0, got '0'"),
    (["--max-prompts", "0"], "argument --max-prompts: expected a positive integer, got 0"),
    (["--max-queue", "-1"], "argument --max-queue: expected an integer >= 0, got -1"),
    (["--max-handshakes", "x"], "argument --max-handshakes: expected a positive integer, "
                                "got 'x'"),
])
def test_prefill_worker_limits_are_checked(flags, message) -> None:
    r = tandem("prefill-worker", *flags)
    assert r.returncode == 2
    assert r.stderr == (f"tandem prefill-worker: error: {message}\n"
                        "see `tandem prefill-worker --help`\n")


@pytest.mark.parametrize("command", [("prefill-worker",), ("run", "--prefill-peer", "10.0.0.2",
                                                           "hello")])
def test_a_world_readable_secret_is_refused_on_both_sides(tmp_path, command) -> None:
    secret = tmp_path / "tandem-peer.secret"
    secret.write_text("k" * 64 + "\n")
    secret.chmod(0o644)  # what `> tandem-peer.secret` gives
    r = tandem(*command, "--secret-file", str(secret))
    line = (f"the secret file {secret} is open to other users (mode 0644); run: chmod 600 "
            f"{secret}\n")
    if command[0] == "prefill-worker":
        assert (r.returncode, r.stderr) == (2, "tandem prefill-worker: " + line)
    else:
        assert r.returncode == 1
        assert r.stderr.startswith("tandem: error: " + line)


@pytest.mark.parametrize("flags, message", [
    (["--prefill-peer", "spark:x"], "--prefill-peer must be HOST or HOST:PORT, not 'spark:x'"),
    (["--prefill-policy", "always"], "--prefill-policy is for --prefill-peer, which is not "
                                     "given"),
    (["--prefill-peer", "10.0.0.2:7070"], "a prefill peer at 10.0.0.2 needs --secret-file"),
    (["--secret-file", "/nonexistent"], "--secret-file is for --prefill-peer, which is not "
                                        "given"),
])
def test_prefill_peer_flag_errors(flags, message) -> None:
    r = tandem("run", *flags, "hello")
    assert r.returncode == 1
    assert r.stderr.startswith(f"tandem: error: {message}")
