"""Helpers for TUI tests with the embedded model: find it, share the store with a temp home."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.registry import DEFAULT_MODEL
from models.store import is_present, store_dir

# Resolved at import, before the autouse fixture points TANDEM_HOME at a temp dir.
REAL_STORE = store_dir()
PRESENT = is_present(DEFAULT_MODEL)


def link_store(home: Path) -> Path:
    """Make `home` (a temp TANDEM_HOME) see the real model store; skip if the model is absent."""
    if not PRESENT:
        pytest.skip(f"{DEFAULT_MODEL} is not in the model store ({REAL_STORE}); "
                    f"run `tandem models pull {DEFAULT_MODEL}`")
    home.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(REAL_STORE, target_is_directory=True)
    return home
