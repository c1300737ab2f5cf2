"""A SQLite file as a chatflow that let NaN through left it (before the stores wrote strict JSON)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from chatflow_cli.core.messages import Message, Role
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from tests.helpers.stored import store_turn

#: A number the legacy database is written with, then replaced by the bare token in place.
PLACEHOLDER = 12345.25


def legacy_nan_db(path: Path, token: str = "NaN") -> Path:
    """A SQLite file as a chatflow that let NaN through left it: session ``good`` (a user
    message "hello there"), session ``bad`` whose user message item, its event and its
    metadata hold a bare ``token`` ("hello" in its text)."""
    with SQLiteSessionStore(path) as store:
        store_turn(store, "good", "hello there", "hi")
        bad = store.get_or_create("bad", "Assistant", metadata={"score": PLACEHOLDER})
        bad.add_message(Message(Role.USER, "hello", items=({"role": "user", "content": "hello",
                                                                          "score": PLACEHOLDER},)))
        bad.add_message(Message.model("hello back"))
        bad.complete_turn("hello back")
        store.save(bad)
    conn = sqlite3.connect(path)
    with conn:
        for table, column in (("chatflow_messages", "message_json"), ("chatflow_events", "payload_json"),
                              ("chatflow_sessions", "metadata_json")):
            conn.execute(f"UPDATE {table} SET {column} = replace({column}, ?, ?)", (repr(PLACEHOLDER), token))
    conn.close()
    return path
