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


def test_show_names_the_sdk_items_a_reply_without_text_carries(chatflow: Any, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    sdk_session(db, "tools", [
        {"role": "user", "content": "look it up"},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # reasoning with no text
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
        {"type": "file_search_call", "id": "fs_1", "status": "completed", "queries": ["q"]},
        {"type": "computer_call", "id": "cc_1", "call_id": "c1", "action": {"type": "screenshot"},
         "pending_safety_checks": [], "status": "completed"},
        {"type": "my_custom_item", "data": 1},
        {"role": "developer", "content": "Answer in French."},  # instructions inside a turn
        {"role": "assistant", "type": "message", "content": []},  # a real empty reply
        {"role": "assistant", "content": "Found it."},
    ])
    result = chatflow("--db", str(db), "sessions", "show", "tools")
    assert result.returncode == 0, result
    replies = [line for line in result.stdout.splitlines() if line.startswith("Assistant:")]
    # before: "(empty reply)" for each of the first five
    assert replies == ["Assistant: (reasoning)", "Assistant: (web_search_call)", "Assistant: (file_search_call)",
                       "Assistant: (computer_call)", "Assistant: (my_custom_item)", "Assistant: (developer message)",
                       "Assistant: (empty reply)", "Assistant: Found it."]
