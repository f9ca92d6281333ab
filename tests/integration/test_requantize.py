"""`tandem models convert NAME --to q8_0|q4_0`: llama.cpp's quantizer into the store, listed by
`models list`, loadable, keeping the source model's sampling defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A store holding only a link to the embedded model (and its checksum sidecar)."""
    home = tmp_path_factory.mktemp("home")
    store = home / "models"
    store.mkdir()
    (store / embedded_model.name).symlink_to(embedded_model)
    sidecar = embedded_model.with_name(embedded_model.name + ".sha256")  # no re-verification
    (store / sidecar.name).write_bytes(sidecar.read_bytes())
    return {**os.environ, "TANDEM_HOME": str(home)}


def tandem(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def file_type(path: Path) -> str:
    field = gguf.GGUFReader(path).fields["general.file_type"]
    return gguf.LlamaFileType(field.contents()).name


def test_convert_to_q8_0_lists_loads_and_keeps_defaults(env: dict[str, str]) -> None:
    out = Path(env["TANDEM_HOME"]) / "models" / "gguf" / "SmolLM2-135M-Instruct.Q4_1-q8_0.gguf"
    r = tandem(env, "models", "convert", "smollm2-135m-instruct", "--to", "q8_0")
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"{out}\n", "tandem: requantizing SmolLM2-135M-Instruct.Q4_1.gguf to q8_0 "
        "(llama.cpp's quantizer)...\n")
    assert file_type(out) == "MOSTLY_Q8_0"
    again = tandem(env, "models", "convert", "smollm2-135m-instruct", "--to", "q8_0")
    assert (again.returncode, again.stdout, again.stderr) == (
        0, f"{out}\n", "tandem: already converted\n")

    rows = [line.split() for line in tandem(env, "models", "list").stdout.splitlines()]
    assert [row[:5] + row[-1:] for row in rows if row[0].endswith("-q8_0")] == [
        ["SmolLM2-135M-Instruct.Q4_1-q8_0", "(Q8_0)", "145", "MB", "yes", str(out)]]
    # the sampling defaults column is the embedded model's (rep 1.05), not llama.cpp's
    assert [" ".join(row[5:-1]) for row in rows if row[0].endswith("-q8_0")] == [
        "temp 0.2 · top-p 0.9 · rep 1.05"]

    doctor = json.loads(tandem(env, "doctor", "--json").stdout)["weights"]
    assert {k: doctor[k] for k in ("format", "tiled_matmuls", "conversions")} == {
        "format": "Q4_1", "tiled_matmuls": False, "conversions": {"q8_0": str(out)}}
    doctor = json.loads(tandem(env, "doctor", "--json", "--model", str(out)).stdout)["weights"]
    assert (doctor["format"], doctor["tiled_matmuls"]) == ("Q8_0", True)

    run = tandem(env, "run", "--model", str(out), "--max-tokens", "4", "--temperature", "0",
                 "--spec", "off", "The capital of France is")
    assert run.returncode == 0, run.stderr
    assert "4 generated tokens" in run.stderr


def test_convert_to_q4_0_and_refusals(env: dict[str, str], tmp_path: Path) -> None:
    r = tandem(env, "models", "convert", "smollm2-135m-instruct", "--to", "q4_0")
    assert r.returncode == 0, r.stderr
    assert file_type(Path(r.stdout.strip())) == "MOSTLY_Q4_0"

    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    bad = tandem(env, "models", "convert", str(text), "--to", "q8_0")
    assert (bad.returncode, bad.stdout, bad.stderr) == (
        1, "", f"tandem: {text} is not a GGUF file (pass a .gguf model file, an MLX model "
        "directory or a registry name: tandem models list)\n")
