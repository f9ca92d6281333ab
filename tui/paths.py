"""Where the chat keeps its data and reads its config.

`TANDEM_HOME` overrides both (data in `$TANDEM_HOME/data`, config in
`$TANDEM_HOME/config.toml`), so tests and portable installs stay self-contained.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "tandem"


def data_dir() -> Path:
    """Directory of the chat database (created on demand by the store)."""
    home = os.environ.get("TANDEM_HOME")
    if home:
        return Path(home) / "data"
    return Path(platformdirs.user_data_dir(APP_NAME))


def config_path() -> Path:
    """Path of the user's TOML config file (it may not exist)."""
    home = os.environ.get("TANDEM_HOME")
    if home:
        return Path(home) / "config.toml"
    return Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"
