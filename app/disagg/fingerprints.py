"""The local model's fingerprint, cached: reading it from a GGUF takes seconds (the
vocabulary through `gguf`), so it is computed once per file and kept as JSON under
`<model store>/fingerprints/`, keyed by the file's path, size and modification time."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from models.fingerprint import ModelFingerprint, fingerprint_gguf
from models.store import store_dir


def _checked_sha256(path: Path) -> str | None:
    """The sha256 the model store recorded for `path` after checking it (its `.sha256`
    sidecar, if written after the file), else None."""
    sidecar = path.with_name(path.name + ".sha256")
    try:
        if sidecar.stat().st_mtime_ns < path.stat().st_mtime_ns:
            return None
        return sidecar.read_text().split()[0]
    except (OSError, IndexError):
        return None


def model_fingerprint(path: str | Path) -> ModelFingerprint:
    """Fingerprint of the GGUF at `path` (see models.fingerprint). Raises FileNotFoundError,
    ValueError (not a GGUF)."""
    path = Path(path).resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cache = store_dir() / "fingerprints" / f"{key}.json"
    try:
        return ModelFingerprint.from_dict(json.loads(cache.read_text()))
    except (OSError, ValueError):
        pass
    fp = fingerprint_gguf(path, _checked_sha256(path))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(fp.to_dict(), indent=1))
    except OSError:
        pass  # a read-only store only costs the seconds again next time
    return fp
