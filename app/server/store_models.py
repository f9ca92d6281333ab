"""The models a server can serve: the GGUF files of the model store, by name.

`scan_store(root)` lists `<root>/*.gguf` and `<root>/gguf/*.gguf` (requantized copies)
(dot files, such as a download's `.part` temp file, are skipped; a symbolic link counts as
the file it points to). A file that is a
registry entry's (`models.registry.MODELS`, e.g. `SmolLM2-135M-Instruct.Q4_1.gguf`) is
called by the registry name (`smollm2-135m-instruct`); any other file by its stem
(`my-model.gguf` -> `my-model`). A request may also name a model by its file name or stem
(compared case-insensitively). MLX conversions (`<store>/mlx/`) are not listed: the pool
serves through the backend the server was started with, and GGUF files are what every
backend reads (the MLX one converts them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from models.registry import MODELS


@dataclass(frozen=True)
class StoreModel:
    """One servable model: `name` (what `/v1/models` lists), `path` (its file), `names`
    (every name a request may use for it, lower case)."""

    name: str
    path: Path
    names: frozenset[str]


def model_names(name: str, path: Path, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """`name`, the file's name and stem, and `extra`, lower case."""
    return frozenset(n.lower() for n in (name, path.name, path.stem, *extra) if n)


def store_model(path: Path, name: str | None = None) -> StoreModel:
    """The `StoreModel` of `path`: called `name` if given, else the registry name of a
    registry file, else the file's stem."""
    registry = next((e.name for e in MODELS.values() if e.filename == path.name), None)
    chosen = name or registry or path.stem
    return StoreModel(chosen, path, model_names(chosen, path, (registry or "",)))


def scan_store(root: Path) -> list[StoreModel]:
    """The GGUF files directly in `root`, then those in `root/gguf` (the requantized copies
    `tandem models convert --to q8_0` writes), each by file name; [] when `root` does not
    exist."""
    return [store_model(p) for p in (*_gguf_files(root), *_gguf_files(root / "gguf"))]


def _gguf_files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir()
                      if p.suffix == ".gguf" and not p.name.startswith(".") and p.is_file())
    except OSError:
        return []


def file_size(path: Path) -> int:
    """Bytes of the file (0 if it is gone)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def file_mtime(path: Path) -> float:
    """The file's modification time (seconds since the epoch; 0 if it is gone)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
