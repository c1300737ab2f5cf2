"""Sessions written through the Agents SDK session (``ChatflowSession``), read by the real
``chatflow`` process: ``sessions export --format openai`` and ``sessions show``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the agents-sdk extra (openai-agents) is not installed")

from chatflow_cli.core.messages import Message
from chatflow_cli.core.sdk_session import ChatflowSession
from chatflow_cli.core.sqlite_store import SQLiteSessionStore


def sdk_session(db: Path, session_id: str, items: list[dict[str, Any]]) -> None:
    session = ChatflowSession(session_id, db)
    asyncio.run(session.add_items(items))
    session.close()


def test_openai_export_adds_no_instructions_to_turns_the_sdk_session_added(chatflow: Any, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    sdk_session(db, "sdk", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    sdk_session(db, "sdk", [{"role": "user", "content": "again"}, {"role": "assistant", "content": "yes"}])
    with SQLiteSessionStore(db) as store:
        store.edit("sdk", lambda ctx: ctx.add_message(Message.system("Be brief.")))  # a stored SYSTEM message
        own = store.get_or_create("own", "Assistant")  # chatflow's own turn, same agent name
        own.add_message(Message.user("q"))
        own.add_message(Message.model("a"))
        own.complete_turn("a")
        store.save(own)
    result = chatflow("--db", str(db), "sessions", "export", "sdk", "own", "--format", "openai")
    assert result.returncode == 0, result
    sdk, mine = result.jsonl()
    # before: {"role": "system", "content": "You are a helpful assistant."} first, a prompt that never existed
    assert sdk["messages"] == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                               {"role": "user", "content": "again"}, {"role": "assistant", "content": "yes"}]
    assert mine["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}
    per_turn = chatflow("--db", str(db), "sessions", "export", "sdk", "--format", "openai", "--per-turn")
    assert [line["messages"][0] for line in per_turn.jsonl()] == [{"role": "system", "content": "Be brief."}] * 2
