"""Ollama's `/api/tags` and `/api/ps` on a server with a model pool (`app.server.model_pool`).

`/api/tags` lists every model of the store. A model loaded now (or earlier in this server's
life) shows its full facts (`ollama_models.ModelFacts`); one never loaded shows what its
file says without loading it: `size`, `modified_at`, `digest` (the store's sidecar, else
the file hashed once, off the event loop) and `details` with `format` "gguf" only (reading
a GGUF's metadata with the `gguf` package costs seconds per file here).

`/api/ps` lists the loaded models; `expires_at` is when keep-alive unloads each (Ollama's
far-off date for one kept until evicted; for one with running requests, now plus its
keep-alive, as the clock starts when the last request ends).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path
from typing import Any

from app.server.model_pool import ModelContext, Slot, iso_time
from app.server.ollama_models import TAG, _file_digest, facts
from app.server.store_models import file_mtime, file_size

FOREVER = "2318-11-26T00:00:00Z"  # Ollama's expiry of a model kept loaded
_digests: dict[tuple[str, float], str] = {}


async def _digest(path: Path) -> str:
    key = (str(path), file_mtime(path))
    found = _digests.get(key)
    if found is None:
        try:
            found = await asyncio.to_thread(_file_digest, path)
        except OSError:
            return ""
        _digests[key] = found
    return found


def _view(root: Any, slot: Slot) -> ModelContext:
    return ModelContext(root, slot, slot.engine)


async def tags(state: Any, root: Any) -> list[dict[str, Any]]:
    """`/api/tags`' `models`."""
    out = []
    cached = getattr(state, "ollama_facts", None) or {}
    for slot in root.pool.slots():
        f = cached.get(slot.name)
        if f is None and slot.engine is not None:
            f = facts(state, _view(root, slot))
        if f is not None:
            out.append(f.listing(await f.digest()))
            continue
        name = slot.name if ":" in slot.name else slot.name + TAG
        modified = dt.datetime.fromtimestamp(file_mtime(slot.model.path), dt.UTC)
        out.append({"name": name, "model": name,
                    "modified_at": modified.isoformat().replace("+00:00", "Z"),
                    "size": file_size(slot.model.path), "digest": await _digest(slot.model.path),
                    "details": {"parent_model": "", "format": "gguf", "family": "",
                                "families": None, "parameter_size": "",
                                "quantization_level": ""}})
    return out


async def ps(state: Any, root: Any) -> list[dict[str, Any]]:
    """`/api/ps`' `models`: the loaded ones, most recently used first (as Ollama)."""
    from app.server.routes_ollama import ps_entry

    loaded = [s for s in root.pool.slots() if s.engine is not None]
    loaded.sort(key=lambda s: s.last_used, reverse=True)
    out = []
    for slot in loaded:
        if slot.keep_alive is None:
            expires = FOREVER
        elif slot.expires_at is not None:
            expires = iso_time(slot.expires_at)
        else:  # busy: the clock starts when its last request ends
            expires = iso_time(time.time() + slot.keep_alive)
        out.append(await ps_entry(state, _view(root, slot), expires or FOREVER))
    return out
