"""Saved conversations: a small SQLite database (stdlib ``sqlite3``) in the app's data directory."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from app.ui.shared.saved import SavedReply

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id            INTEGER PRIMARY KEY,
    title         TEXT NOT NULL DEFAULT 'New chat',
    system_prompt TEXT NOT NULL DEFAULT '',
    created       REAL NOT NULL,
    updated       REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id              INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role            TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'error')),
    content         TEXT NOT NULL,
    stats           TEXT,          -- JSON: the reply's record (SavedReply: reason, Stats, draft spans)
    created         REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
SCHEMA_VERSION = 1


@dataclass
class Message:
    """One message. ``role`` "error" marks a failed reply shown in the chat but never sent to the model;
    ``saved``: an assistant reply's record (None: none was saved)."""

    id: int
    role: str
    content: str
    saved: SavedReply | None = None


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    updated: float


class Store:
    """Conversations and their messages. One connection, used from the GUI thread only."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.db = sqlite3.connect(self.path)
        self.db.execute("PRAGMA foreign_keys = ON")
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.executescript(SCHEMA)
        self.db.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
        self.db.commit()

    def close(self) -> None:
        self.db.close()

    # -- conversations ------------------------------------------------------------------------------
    def create(self, title: str = "New chat", system_prompt: str = "") -> Conversation:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO conversations(title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
            (title, system_prompt, now, now),
        )
        self.db.commit()
        return Conversation(int(cur.lastrowid or 0), title, system_prompt, now)

    def conversations(self) -> list[Conversation]:
        """All conversations, most recently updated first."""
        rows = self.db.execute(
            "SELECT id, title, system_prompt, updated FROM conversations ORDER BY updated DESC, id DESC"
        )
        return [Conversation(*row) for row in rows]

    def get(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute(
            "SELECT id, title, system_prompt, updated FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        return Conversation(*row) if row else None

    def rename(self, conversation_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))
        self.db.commit()

    def set_system_prompt(self, conversation_id: int, text: str) -> None:
        self.db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (text, conversation_id))
        self.db.commit()

    def delete(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        self.db.commit()

    def touch(self, conversation_id: int) -> None:
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))
        self.db.commit()

    # -- messages -----------------------------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute(
            "SELECT id, role, content, stats FROM messages WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        )
        return [
            Message(i, role, content, SavedReply.from_json(json.loads(stats)) if stats else None)
            for i, role, content, stats in rows
        ]

    def recent_user_messages(self, n: int = 20) -> list[str]:
        """The user's last ``n`` messages over every conversation, newest first."""
        rows = self.db.execute(
            "SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?", (n,)
        )
        return [content for (content,) in rows]

    def add_message(
        self, conversation_id: int, role: str, content: str, saved: SavedReply | None = None
    ) -> Message:
        cur = self.db.execute(
            "INSERT INTO messages(conversation_id, role, content, stats, created) VALUES (?, ?, ?, ?, ?)",
            (conversation_id, role, content, _json(saved), time.time()),
        )
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))
        self.db.commit()
        return Message(int(cur.lastrowid or 0), role, content, saved)

    def update_message(self, message_id: int, content: str, saved: SavedReply | None = None) -> None:
        self.db.execute(
            "UPDATE messages SET content = ?, stats = ? WHERE id = ?", (content, _json(saved), message_id)
        )
        self.db.commit()

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Delete ``message_id`` and every later message of the conversation (regenerate, edit)."""
        self.db.execute(
            "DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id)
        )
        self.db.commit()

    # -- app state ----------------------------------------------------------------------------------
    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))
        self.db.commit()


def _json(saved: SavedReply | None) -> str | None:
    return json.dumps(saved.to_json()) if saved is not None else None
