"""The chat's TOML config file (`config.toml` in the user config dir).

Example:

    theme = "nord"
    export_dir = "~/Documents/chats"

    [keymap]
    "reply.regenerate" = "ctrl+r,f11"   # the ids are listed on the F1 screen

    [defaults]          # settings for new chats
    temperature = 0.7
    system_prompt = "Answer briefly."
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tui.chat_settings import ChatSettings


@dataclass(slots=True)
class ChatConfig:
    """Parsed config. `problems` lists what was ignored, for a notification at start."""

    keymap: dict[str, str] = field(default_factory=dict)
    theme: str | None = None
    export_dir: Path | None = None
    defaults: ChatSettings = field(default_factory=ChatSettings)
    problems: list[str] = field(default_factory=list)


def load_config(path: Path, base: ChatSettings | None = None) -> ChatConfig:
    """Read `path`; a missing file gives the defaults, a broken one defaults plus a problem.

    `base` (e.g. `ChatSettings.for_model(name)`) is what new chats get for every setting
    `[defaults]` leaves out; None: `ChatSettings()`."""
    base = base or ChatSettings()
    config = ChatConfig(defaults=base)
    if not path.exists():
        return config
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        config.problems.append(f"{path}: {exc}; using defaults")
        return config
    keymap = data.get("keymap", {})
    if isinstance(keymap, dict):
        config.keymap = {str(k): str(v) for k, v in keymap.items()}
    else:
        config.problems.append("[keymap] must be a table")
    if isinstance(data.get("theme"), str):
        config.theme = data["theme"]
    if isinstance(data.get("export_dir"), str):
        config.export_dir = Path(data["export_dir"]).expanduser()
    defaults = data.get("defaults", {})
    if isinstance(defaults, dict):
        try:
            settings = ChatSettings.from_dict({**base.to_dict(), **defaults})
            settings.validate()
            config.defaults = settings
        except (TypeError, ValueError) as exc:
            config.problems.append(f"[defaults]: {exc}")
    return config
