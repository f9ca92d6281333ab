"""Every key binding of the chat, each with an id that the config file can rebind.

Key choices avoid terminal collisions: the input `TextArea` owns ctrl+a/e/k/u/w/d/x/c/v/z/y,
ctrl+p opens the command palette, ctrl+h/j/s are backspace, line feed and XOFF, ctrl+b is
the tmux prefix. Rarer actions sit on function keys, except F6/F7 (TextArea: select line, select all).
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True, slots=True)
class KeySpec:
    """One binding: id (config key), default keys, action, help text, footer visibility
    (with `label`, the short footer text)."""

    id: str
    keys: str
    action: str
    description: str
    show: bool = False
    priority: bool = False
    label: str = ""


# Keys of the prompt input (PromptInput handles them itself, in typing order); listed here
# so help and config see them.
INPUT_KEYS: list[KeySpec] = [
    KeySpec("input.send", "enter", "submit", "Send the message"),
    KeySpec("input.newline", "ctrl+j,shift+enter", "newline", "Insert a newline"),
]

APP_KEYS: list[KeySpec] = [
    KeySpec("reply.stop", "escape", "stop_reply", "Stop the reply", show=True, label="Stop"),
    KeySpec("app.quit", "ctrl+q", "quit", "Quit", show=True, priority=True, label="Quit"),
    KeySpec("app.interrupt", "ctrl+c", "interrupt", "Stop the reply, else quit", priority=True),
    KeySpec("chat.new", "ctrl+n", "new_chat", "New chat", show=True, label="New"),
    KeySpec(
        "reply.regenerate", "ctrl+r", "regenerate", "Regenerate the last reply", show=True,
        label="Regenerate",
    ),
    KeySpec(
        "message.edit", "ctrl+g", "edit_last", "Edit and resend the last message", show=True,
        label="Edit",
    ),
    KeySpec("reply.copy", "ctrl+o", "copy_reply", "Copy the last reply"),
    KeySpec("reply.copy_code", "ctrl+t", "copy_code", "Copy the last code block"),
    KeySpec("status.details", "ctrl+l", "status_details", "Status bar details, in full"),
    KeySpec("app.help", "f1", "help", "Help: all keys", show=True, label="Help"),
    KeySpec("chat.rename", "f2", "rename_chat", "Rename this chat"),
    KeySpec("chat.settings", "f3", "settings", "Chat settings", show=True, label="Settings"),
    KeySpec("sidebar.toggle", "f4", "toggle_sidebar", "Show or hide the chat list"),
    KeySpec("chat.export", "f5", "export_chat", "Export this chat as Markdown"),
    KeySpec("chat.delete", "f8", "delete_chat", "Delete this chat"),
    KeySpec("app.theme", "f9", "next_theme", "Next theme"),
    KeySpec("app.screenshot", "f10", "screenshot", "Save an SVG screenshot"),
    KeySpec("chat.trim", "f12", "trim_chat", "Drop the oldest turn (frees context)"),
]

ALL_KEYS: list[KeySpec] = INPUT_KEYS + APP_KEYS


def bindings(specs: list[KeySpec]) -> list[Binding]:
    """Textual bindings for `specs`, carrying their ids so `App.set_keymap` can rebind."""
    return [
        Binding(
            s.keys, s.action, s.label or s.description, show=s.show, priority=s.priority,
            tooltip=s.description, id=s.id,
        )
        for s in specs
    ]


def key_for(keymap: dict[str, str], binding_id: str) -> str:
    """The keys bound to `binding_id` once the user's `keymap` is applied, for hints.
    Raises StopIteration for an unknown id."""
    if binding_id in keymap:
        return keymap[binding_id]
    return next(s.keys for s in ALL_KEYS if s.id == binding_id)


def effective_keys(keymap: dict[str, str]) -> list[tuple[str, str, str]]:
    """(keys, description, id) of every binding after applying the user's `keymap`, in key
    order (`key_order`)."""
    rows = [(keymap.get(s.id, s.keys), s.description, s.id) for s in ALL_KEYS]
    return sorted(rows, key=lambda row: key_order(row[0]))


def key_order(keys: str) -> tuple[int, int, str]:
    """Sort key of a binding by its first key: named keys (enter, escape), then ctrl+ keys
    alphabetically, then F-keys by number (f5 < f8 < f12), then the rest."""
    first = keys.split(",")[0].strip()
    if first.startswith("f") and first[1:].isdigit():
        return (2, int(first[1:]), "")
    if first.startswith("ctrl+"):
        return (1, 0, first)
    return (0 if "+" not in first else 3, 0, first)


def unknown_ids(keymap: dict[str, str]) -> list[str]:
    """Ids in a user keymap that match no binding (typos worth reporting)."""
    known = {s.id for s in ALL_KEYS}
    return sorted(k for k in keymap if k not in known)
