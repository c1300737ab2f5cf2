"""Titles, listing filters, cursor pagination and archive: the same contract on every store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from chatflow_cli.core.errors import SessionArchivedError, SessionNotFoundError, UsageError
from chatflow_cli.core.memory import BaseSessionStore, Owner
from chatflow_cli.core.messages import Message
from chatflow_cli.core.sqlite_store import SQLiteSessionStore


def _chat(store: BaseSessionStore, agent, session_id: str, text: str, metadata=None) -> None:
    ctx = store.get_or_create(session_id, agent, metadata=metadata)
    ctx.add_message(Message.user(text))
    ctx.add_message(Message.model("ok"))
    ctx.complete_turn("ok")
    store.save(ctx)


def _ids(summaries) -> list[str]:
    return [s.session_id for s in summaries]


def test_the_default_title_is_the_first_line_of_the_first_user_message(any_store, agent) -> None:
    _chat(any_store, agent, "s", "  Deploy plan for Friday\nwith details on the second line")
    summary = any_store.session_summary("s")
    assert summary.title == "Deploy plan for Friday" and summary.title_set is False
    any_store.set_title("s", "  Friday   deploy ")
    summary = any_store.session_summary("s")
    assert (summary.title, summary.title_set) == ("Friday deploy", True)
    assert any_store.events("s")[-1].type == "session.titled"
    before = any_store.last_seq("s")
    any_store.set_title("s", "Friday deploy")  # no change, no event
    assert any_store.last_seq("s") == before
    any_store.set_title("s", None)
    assert any_store.session_summary("s").title == "Deploy plan for Friday"
    with pytest.raises(ValueError):
        any_store.set_title("s", "x" * 201)
    with pytest.raises(SessionNotFoundError):
        any_store.set_title("missing", "t")


def test_metadata_filters_find_the_session_of_a_ticket(any_store, agent) -> None:
    _chat(any_store, agent, "a", "one", {"ticket": "T-1", "team": "red", "n": 3, "vip": True})
    _chat(any_store, agent, "b", "two", {"ticket": "T-2", "team": "red"})
    _chat(any_store, agent, "c", "three", {"ticket": 'T-"3"'})
    assert _ids(any_store.list_sessions(metadata={"ticket": "T-2"})) == ["b"]
    assert sorted(_ids(any_store.list_sessions(metadata={"team": "red"}))) == ["a", "b"]
    assert _ids(any_store.list_sessions(metadata={"team": "red", "ticket": "T-1"})) == ["a"]
    assert _ids(any_store.list_sessions(metadata={"n": "3"})) == ["a"]
    assert _ids(any_store.list_sessions(metadata={"vip": "true"})) == ["a"]
    assert _ids(any_store.list_sessions(metadata={"ticket": 'T-"3"'})) == ["c"]
    assert any_store.list_sessions(metadata={"ticket": "T-9"}) == []
    assert any_store.list_sessions(metadata={"missing": "x"}) == []


def test_since_until_and_title_filters(any_store, agent) -> None:
    clock = [1_000.0]
    any_store.clock = lambda: clock[0]
    _chat(any_store, agent, "old", "Invoice question")
    clock[0] = 2_000.0
    _chat(any_store, agent, "new", "weather today")
    any_store.set_title("new", "Rain INVOICE report")
    assert _ids(any_store.list_sessions(since=1_500.0)) == ["new"]
    assert _ids(any_store.list_sessions(until=1_500.0)) == ["old"]
    assert _ids(any_store.list_sessions(title="invoice")) == ["new", "old"]
    assert _ids(any_store.list_sessions(title="rain")) == ["new"]
    assert _ids(any_store.list_sessions(title="invoice", limit=1)) == ["new"]


def test_cursor_pages_neither_skip_nor_repeat_while_sessions_update(any_store, agent) -> None:
    clock = [1_000.0]
    any_store.clock = lambda: clock[0]
    for n in range(7):
        clock[0] += 1
        _chat(any_store, agent, f"s{n}", f"message {n}")
    first = any_store.list_sessions(limit=3)
    assert _ids(first) == ["s6", "s5", "s4"]
    clock[0] += 1
    _chat(any_store, agent, "s1", "updated meanwhile")  # moves to the top
    second = any_store.list_sessions(limit=3, after=first[-1].cursor)
    assert _ids(second) == ["s3", "s2", "s0"]
    assert any_store.list_sessions(limit=3, after=second[-1].cursor) == []
    with pytest.raises(UsageError, match="cursor"):
        any_store.list_sessions(after="nonsense")


def test_after_takes_a_session_id_and_refuses_malformed_cursors(any_store, agent) -> None:
    clock = [1_000.0]
    any_store.clock = lambda: clock[0]
    for n in range(4):
        clock[0] += 1
        _chat(any_store, agent, f"s{n}", f"message {n}")
    assert _ids(any_store.list_sessions(after="s2")) == ["s1", "s0"]
    assert _ids(any_store.list_sessions(after="s0")) == []
    for bad in ("nan:x", "inf:s1", "-inf:s1", "1.5:", "nope"):
        with pytest.raises(UsageError, match="neither a session id nor a listing cursor.*'cursor'"):
            any_store.list_sessions(after=bad)


def test_same_time_rows_page_by_id(any_store, agent) -> None:
    any_store.clock = lambda: 5.0
    for sid in ("c", "a", "b"):
        _chat(any_store, agent, sid, sid)
    page = any_store.list_sessions(limit=2)
    assert _ids(page) == ["a", "b"]
    assert _ids(any_store.list_sessions(after=page[-1].cursor)) == ["c"]


def test_archive_hides_keeps_and_refuses_new_turns(any_store, agent) -> None:
    _chat(any_store, agent, "keep", "kept")
    _chat(any_store, agent, "old", "archived one")
    updated = any_store.session_summary("old").updated_at
    assert any_store.archive("old") is True and any_store.archive("old") is False
    assert _ids(any_store.list_sessions()) == ["keep"]
    archived = any_store.list_sessions(archived=True)
    assert _ids(archived) == ["old"] and archived[0].archived_at is not None
    assert archived[0].updated_at == updated
    assert [r.number for r in any_store.load_turns("old")] == [1]  # kept whole
    ctx = any_store.get("old")
    ctx.add_message(Message.user("more"))
    with pytest.raises(SessionArchivedError, match="unarchive old"):
        any_store.save(ctx)
    with pytest.raises(SessionArchivedError):
        any_store.begin_turn("old", default_agent=agent, user_message=Message.user("more"), owner=Owner.current())
    assert any_store.session_summary("old").turn_count == 1
    assert any_store.unarchive("old") is True and any_store.unarchive("old") is False
    _chat(any_store, agent, "old", "back again")
    assert sorted(_ids(any_store.list_sessions())) == ["keep", "old"]
    types = [e.type for e in any_store.events("old")]
    assert "session.archived" in types and "session.unarchived" in types


def test_listing_is_one_query(tmp_path: Path, agent) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    try:
        for n in range(30):
            _chat(store, agent, f"s{n:02d}", f"hello {n}")
        statements: list[str] = []
        conn = store._connection()
        conn.set_trace_callback(statements.append)
        rows = store.list_sessions()
        conn.set_trace_callback(None)
        assert len(rows) == 30 and rows[0].preview.startswith("hello")
        selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert len(selects) == 1, statements
    finally:
        store.close()
