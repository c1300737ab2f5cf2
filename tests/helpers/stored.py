"""Reading back what the real ``chatflow`` process stored, and checking its error line.

The database is the one ``CHATFLOW_HOME`` points at for the test (the autouse
``isolated_home`` fixture). ``next_turn_is_valid`` sends one more message on a session: the
fake server refuses an invalid history with HTTP 400, so a turn that succeeds proves the
stored session is valid for the next request.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from chatflow_cli.core.memory import BaseSessionStore
from chatflow_cli.core.messages import Message
from chatflow_cli.core.sqlite_store import SQLiteSessionStore


def stored_db() -> Path:
    return Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db"



def stored_window(session_id: str) -> list[dict[str, Any]]:
    """The stored context window (what the next request sends), as message dicts."""
    store = SQLiteSessionStore(str(stored_db()))
    try:
        session = store.get(session_id)
        assert session is not None
        return [m.to_dict() for m in session.history]
    finally:
        store.close()



def stored_events(session_id: str) -> list[tuple[str, dict[str, Any]]]:
    store = SQLiteSessionStore(str(stored_db()))
    try:
        return [(e.type, e.payload) for e in store.events(session_id)]
    finally:
        store.close()



def one_error_line(result: Any, code: int, *mentions: str) -> str:
    assert result.returncode == code, result
    errors = [line for line in result.stderr_lines if line.startswith("chatflow: error: ")]
    assert len(errors) == 1, result
    for word in mentions:
        assert word in errors[0], result
    assert "Traceback" not in result.stderr
    return errors[0]



def next_turn_is_valid(chatflow: Any, provider: Any, session_id: str) -> dict[str, Any]:
    """A second message on the session: the fake refuses an invalid history with HTTP 400."""
    again = chatflow("chat", "-s", session_id, "and now?")
    assert again.returncode == 0, again
    assert again.stdout == "ok: and now?\n"
    return provider.requests[-1]


def events_of(store: Any, session_id: str, type_: str) -> list[Any]:
    """The events of one type in a session's log, oldest first."""
    return [e for e in store.events(session_id) if e.type == type_]


def open_store() -> SQLiteSessionStore:
    """The SQLite store the real ``chatflow`` process of this test writes (close it, or use ``with``)."""
    return SQLiteSessionStore(str(stored_db()))


def session_running(chatflow, session_id: str) -> bool:
    """``sessions ls`` shows ``session_id`` running (a process holds its turn)."""
    return any(s["session_id"] == session_id and s["status"] == "running"
               for s in chatflow("sessions", "ls", "--json").json())


def store_turn(store: BaseSessionStore, session_id: str, user: Message | str, reply: str,
               agent: str = "Assistant", metadata: dict[str, Any] | None = None) -> None:
    """One whole turn (``user``, then the model's ``reply``) stored through the library, the
    session made first when it does not exist."""
    session = store.get_or_create(session_id, agent, metadata=metadata)
    session.add_message(Message.user(user) if isinstance(user, str) else user)
    session.add_message(Message.model(reply))
    session.complete_turn(reply)
    store.save(session)
