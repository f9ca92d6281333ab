"""MLX from the command line: `--model DIR` runs a converted MLX directory (the backend
follows), `models list` shows converted copies, and `run` says when it uses one. Each
command runs in a subprocess with its own model store (TANDEM_HOME)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

ROOT = Path(__file__).resolve().parents[2]
GREEDY = ("--max-tokens", "3", "--temperature", "0", "--spec", "off")


@pytest.fixture(scope="module")
def store(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment whose model store holds `smol.gguf` (a link to the embedded model)
    and its MLX conversion."""
    home = tmp_path_factory.mktemp("home")
    (home / "smol.gguf").symlink_to(embedded_model)
    env = {**os.environ, "TANDEM_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "app.cli", "models", "convert",
                        str(home / "smol.gguf"), "--to", "mlx"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return env


def tandem(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_models_list_shows_the_conversion(store: dict[str, str]) -> None:
    r = tandem(store, "models", "list")
    converted = Path(store["TANDEM_HOME"]) / "models" / "mlx" / "smol-float16"
    rows = [line.split() for line in r.stdout.splitlines()]
    assert [(row[:5], row[-1]) for row in rows if row[0] == "smol-float16"] == [
        (["smol-float16", "(MLX)", "271", "MB", "yes"], str(converted))]


def test_model_dir_runs_on_mlx(store: dict[str, str]) -> None:
    converted = Path(store["TANDEM_HOME"]) / "models" / "mlx" / "smol-float16"
    r = tandem(store, "run", "--model", str(converted), *GREEDY, "hi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_run_says_it_uses_the_conversion(store: dict[str, str]) -> None:
    home = Path(store["TANDEM_HOME"])
    r = tandem(store, "run", "--model", str(home / "smol.gguf"), "--backend", "mlx", *GREEDY,
               "hi")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == (
        f"tandem: note: using the MLX conversion {home / 'models' / 'mlx' / 'smol-float16'}")
