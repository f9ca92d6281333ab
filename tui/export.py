"""Chat export as Markdown, and small text helpers (code-block extraction, titles)."""

from __future__ import annotations

import re
from datetime import datetime

from tui.store import Chat, StoredMessage

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.DOTALL | re.MULTILINE)


def chat_to_markdown(chat: Chat, messages: list[StoredMessage]) -> str:
    """A readable Markdown document: title, settings line, then one section per turn."""
    created = datetime.fromtimestamp(chat.created_at).strftime("%Y-%m-%d %H:%M")
    lines = [f"# {chat.title}", "", f"_Exported from tandem chat; started {created}._", ""]
    if chat.settings.system_prompt:
        lines += ["## System", "", chat.settings.system_prompt, ""]
    for msg in messages:
        lines += [f"## {msg.role.capitalize()}", "", msg.content, ""]
    return "\n".join(lines)


def last_code_block(text: str) -> str | None:
    """Body of the last fenced code block in `text` (without the fences), or None."""
    blocks = _FENCE.findall(text)
    return blocks[-1][1] if blocks else None


def title_from(text: str, limit: int = 40) -> str:
    """A chat title from the first user message: first line, cut at a word boundary."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    if len(first) <= limit:
        return first or "Untitled"
    cut = first[:limit].rsplit(" ", 1)[0]
    return (cut or first[:limit]) + "…"


def safe_filename(title: str) -> str:
    """Title reduced to characters every filesystem accepts."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", title).strip("-.")
    return name[:60] or "chat"
