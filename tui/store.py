"""SQLite persistence of chats, messages, per-chat settings and app preferences.

The schema version lives in `PRAGMA user_version`; `MIGRATIONS[i]` upgrades version i to
i+1, each in one transaction, so a crash mid-upgrade leaves the old version intact.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tui.chat_settings import ChatSettings

MIGRATIONS: list[str] = [
    # 0 -> 1: chats with JSON settings, messages in insertion order, key/value prefs.
    # AUTOINCREMENT: a deleted chat's id is never reused (prefs and export names refer to it).
    """
    CREATE TABLE chats (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        title TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        settings TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        created_at REAL NOT NULL,
        meta TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX messages_by_chat ON messages(chat_id, id);
    CREATE TABLE prefs (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
]

DEFAULT_TITLE = "New chat"


@dataclass(slots=True)
class Chat:
    """A conversation's header row."""

    id: int
    title: str
    created_at: float
    updated_at: float
    settings: ChatSettings = field(default_factory=ChatSettings)


@dataclass(slots=True)
class StoredMessage:
    """One turn. `meta` carries reply stats and the finish reason for assistant turns."""

    id: int
    chat_id: int
    role: str
    content: str
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict)


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer tandem."""


class ChatStore:
    """All chat data in one SQLite file (`chats.db` under the data dir).

    Args:
        path: database file; its directory is created. ":memory:" works for tests.
    """

    def __init__(self, path: Path | str):
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # isolation_level=None: we manage transactions explicitly in migrations.
        self._db = sqlite3.connect(str(path), isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    # -- schema ---------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        version = self.schema_version
        if version > len(MIGRATIONS):
            raise SchemaTooNewError(
                f"{self.path} has schema version {version}; this tandem knows up to "
                f"{len(MIGRATIONS)}. Upgrade tandem or use another TANDEM_HOME."
            )
        for target in range(version + 1, len(MIGRATIONS) + 1):
            self._db.executescript(
                f"BEGIN; {MIGRATIONS[target - 1]}; PRAGMA user_version = {target}; COMMIT;"
            )

    # -- chats ----------------------------------------------------------------------------

    def create_chat(self, title: str = DEFAULT_TITLE, settings: ChatSettings | None = None) -> Chat:
        now = time.time()
        settings = settings or ChatSettings()
        cur = self._db.execute(
            "INSERT INTO chats (title, created_at, updated_at, settings) VALUES (?, ?, ?, ?)",
            (title, now, now, json.dumps(settings.to_dict())),
        )
        return Chat(cur.lastrowid, title, now, now, settings)

    def list_chats(self) -> list[Chat]:
        """All chats, most recently active first."""
        rows = self._db.execute("SELECT * FROM chats ORDER BY updated_at DESC, id DESC")
        return [_chat(r) for r in rows]

    def get_chat(self, chat_id: int) -> Chat | None:
        row = self._db.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)).fetchone()
        return _chat(row) if row else None

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def update_settings(self, chat_id: int, settings: ChatSettings) -> None:
        self._db.execute(
            "UPDATE chats SET settings = ? WHERE id = ?",
            (json.dumps(settings.to_dict()), chat_id),
        )

    def delete_chat(self, chat_id: int) -> None:
        self._db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    # -- messages -------------------------------------------------------------------------

    def messages(self, chat_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,)
        )
        return [_message(r) for r in rows]

    def add_message(
        self, chat_id: int, role: str, content: str, meta: dict[str, Any] | None = None
    ) -> StoredMessage:
        now = time.time()
        meta = meta or {}
        cur = self._db.execute(
            "INSERT INTO messages (chat_id, role, content, created_at, meta) VALUES (?, ?, ?, ?, ?)",
            (chat_id, role, content, now, json.dumps(meta)),
        )
        self._db.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))
        return StoredMessage(cur.lastrowid, chat_id, role, content, now, meta)

    def delete_messages_from(self, chat_id: int, message_id: int) -> None:
        """Delete `message_id` and every later message of the chat (edit, regenerate, trim)."""
        self._db.execute(
            "DELETE FROM messages WHERE chat_id = ? AND id >= ?", (chat_id, message_id)
        )

    def delete_message(self, message_id: int) -> None:
        self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    # -- preferences ----------------------------------------------------------------------

    def get_pref(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM prefs WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_pref(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO prefs (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def close(self) -> None:
        self._db.close()


def _chat(row: sqlite3.Row) -> Chat:
    settings = ChatSettings.from_dict(json.loads(row["settings"] or "{}"))
    return Chat(row["id"], row["title"], row["created_at"], row["updated_at"], settings)


def _message(row: sqlite3.Row) -> StoredMessage:
    meta = json.loads(row["meta"] or "{}")
    return StoredMessage(
        row["id"], row["chat_id"], row["role"], row["content"], row["created_at"], meta
    )
