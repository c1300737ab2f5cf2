"""Agent versions recorded with each turn and on the session, the same contract on every store.

Every MODEL message carries the version of the agent that gave it (``agent_version``); the
session keeps the latest version each agent ran and the last turn it ran it in
(``SessionSummary.agent_versions``); ``SessionContext.note_agent_version`` journals one
``agent.changed`` event when an agent starts as another version than the one it last ran,
and the store records the new version with it, so the change is reported once.
"""

from __future__ import annotations

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import UsageError
from chatflow_cli.core.memory import BaseSessionStore
from chatflow_cli.core.messages import Message, ToolCall


@pytest.fixture
def store(any_store: BaseSessionStore) -> BaseSessionStore:
    """The store under test, once per kind of tests/core/memory/conftest.py's STORE_KINDS."""
    return any_store


def _turn(store: BaseSessionStore, session_id: str, agent: Agent, text: str) -> list[str]:
    """One turn answered by ``agent`` as a Runner stores it: the change noted first, the
    reply with its version; the types of the events written."""
    ctx = store.get_or_create(session_id, agent)
    ctx.add_message(Message.user(f"q: {text}"))
    ctx.note_agent_version(agent)
    ctx.add_message(Message.model(text, agent=agent.name, agent_version=agent.version))
    ctx.complete_turn(text, agent, agent_version=agent.version)
    return [e.type for e in store.save(ctx)]


def test_each_reply_keeps_its_version_and_the_session_the_latest(store, make_store) -> None:
    support = Agent("Support", "Help with orders", model="m1")
    v1 = support.version
    _turn(store, "s", support, "a1")
    _turn(store, "s", support, "a2")
    assert len(v1) == 12 and int(v1, 16) >= 0
    summary = store.session_summary("s")
    assert summary.agent_versions == {"Support": {"version": v1, "turn": 2}}
    assert summary.agent_version == v1
    replies = [m for r in store.load_turns("s") for m in r.messages if m.role.value == "model"]
    assert [(m.agent, m.agent_version) for m in replies] == [("Support", v1), ("Support", v1)]
    completed = [e.payload for e in store.events("s") if e.type == "turn.completed"]
    assert [p["agent_version"] for p in completed] == [v1, v1]
    # what another process reads back
    again = make_store()
    assert again.session_summary("s").agent_versions == {"Support": {"version": v1, "turn": 2}}
    assert again.get("s").agent_versions == {"Support": {"version": v1, "turn": 2}}
    assert again.list_sessions()[0].agent_versions == {"Support": {"version": v1, "turn": 2}}


def test_a_changed_agent_is_reported_once_with_the_last_turn_of_the_old_version(store, make_store) -> None:
    support = Agent("Support", "Help with orders", model="m1")
    v1 = support.version
    for n in range(1, 4):
        assert "agent.changed" not in _turn(store, "s", support, f"a{n}")
    support.instructions = "Help with orders and refunds"  # config.toml changed
    v2 = support.version
    assert v2 != v1
    types = _turn(store, "s", support, "a4")
    assert types.count("agent.changed") == 1
    changed = [e for e in store.events("s") if e.type == "agent.changed"]
    assert len(changed) == 1
    assert changed[0].payload == {"turn": 4, "agent": "Support", "version": v2, "previous_version": v1,
                                  "since_turn": 3}
    # the event sits after the turn's user message, before the reply
    kinds = [e.type for e in store.events("s") if e.seq > changed[0].seq - 2][:3]
    assert kinds == ["message.user", "agent.changed", "message.model"]
    assert store.session_summary("s").agent_versions == {"Support": {"version": v2, "turn": 4}}
    # once: the next turns (from another process too) run the known version
    other = make_store()
    assert "agent.changed" not in _turn(other, "s", support, "a5")
    assert [e.type for e in other.events("s")].count("agent.changed") == 1


def test_the_change_is_recorded_even_when_the_turn_fails(store) -> None:
    support = Agent("Support", "v1", model="m1")
    _turn(store, "s", support, "a1")
    support.model = "m2"
    ctx = store.get("s")
    ctx.add_message(Message.user("q2"))
    assert ctx.note_agent_version(support) is not None
    ctx.fail_turn(RuntimeError("the provider said no"))
    store.save(ctx)
    assert store.session_summary("s").agent_versions["Support"]["version"] == support.version
    ctx = store.get("s")
    ctx.add_message(Message.user("q2 again"))
    assert ctx.note_agent_version(support) is None  # said once, not again on the retry


def test_unknown_and_first_versions_report_nothing(store) -> None:
    support = Agent("Support", "v1", model="m1")
    ctx = store.get_or_create("s", support)
    ctx.add_message(Message.user("q1"))
    assert ctx.note_agent_version(support) is None  # the first this session sees of it
    ctx.add_message(Message.model("a1", agent="Support"))  # a reply with no version: unknown
    ctx.complete_turn("a1")
    store.save(ctx)
    assert store.session_summary("s").agent_versions == {}
    assert store.session_summary("s").agent_version is None
    ctx = store.get("s")
    ctx.add_message(Message.user("q2"))
    assert ctx.note_agent_version("Support") is None  # a bare name: no version to compare
    assert ctx.note_agent_version(support) is None


def test_handoff_records_the_target_version_and_each_agent_keeps_its_own(store) -> None:
    billing = Agent("Billing", "bills", model="m1")
    support = Agent("Support", "orders", model="m1", handoffs=[billing])
    ctx = store.get_or_create("s", support)
    ctx.add_message(Message.user("refund please"))
    ctx.add_message(Message.model(None, [ToolCall("c1", "transfer_to_billing", "{}")], agent="Support",
                                  agent_version=support.version))
    ctx.add_message(Message.tool("c1", "ok", name="transfer_to_billing"))
    ctx.set_active_agent(billing, tool_call_id="c1")
    ctx.add_message(Message.model("refunded", agent="Billing", agent_version=billing.version))
    ctx.complete_turn("refunded", billing, agent_version=billing.version)
    store.save(ctx)
    handoff = next(e for e in store.events("s") if e.type == "handoff")
    assert handoff.payload["to_agent_version"] == billing.version
    assert store.session_summary("s").agent_versions == {
        "Support": {"version": support.version, "turn": 1}, "Billing": {"version": billing.version, "turn": 1}}
    # Billing changes; Support does not: only Billing is reported, when it starts
    billing.instructions = "bills and refunds"
    ctx = store.get("s")
    ctx.add_message(Message.user("and the other invoice?"))
    assert ctx.note_agent_version(support) is None
    change = ctx.note_agent_version(billing)
    assert change is not None and change["agent"] == "Billing" and change["since_turn"] == 1
    assert ctx.note_agent_version(billing) is None  # once within the turn too
    store.save(ctx)
    assert store.session_summary("s").agent_versions["Billing"] == {"version": billing.version, "turn": 2}


def test_fork_keeps_the_versions_of_the_copied_turns(store) -> None:
    support = Agent("Support", "v1", model="m1")
    v1 = support.version
    _turn(store, "src", support, "a1")
    support.instructions = "v2"
    _turn(store, "src", support, "a2")
    summary = store.fork("src", 1, into="f")
    assert summary.agent_versions == {"Support": {"version": v1, "turn": 1}}
    replies = [m for r in store.load_turns("f") for m in r.messages if m.role.value == "model"]
    assert [m.agent_version for m in replies] == [v1]
    # the fork's next turn with the new definition reports the change, the source is untouched
    assert "agent.changed" in _turn(store, "f", support, "a2 in the fork")
    assert [e.type for e in store.events("src")].count("agent.changed") == 1


def test_agent_changed_is_reserved(store) -> None:
    store.get_or_create("s", Agent("Support"))
    with pytest.raises(UsageError, match="reserved"):
        store.append_event("s", "agent.changed", {"agent": "Support", "version": "x"})


def test_an_explicit_version_is_kept_and_names_the_definition(store) -> None:
    pinned = Agent("Support", "v1", model="m1", version="3")
    _turn(store, "s", pinned, "a1")
    pinned.instructions = "v2"  # same explicit version: not a change
    assert "agent.changed" not in _turn(store, "s", pinned, "a2")
    pinned.version = "4"
    assert "agent.changed" in _turn(store, "s", pinned, "a3")
    assert store.session_summary("s").agent_versions["Support"] == {"version": "4", "turn": 3}


# ---------------------------------------------------------------------------------------
# migrations: a database written before versions were recorded
# ---------------------------------------------------------------------------------------
def _old_turns_then_a_new_one(store: BaseSessionStore) -> None:
    """The session stored before the migration: unknown versions, no report; then recorded."""
    summary = store.session_summary("old")
    assert summary.agent_versions == {} and summary.agent_version is None
    assert [m.agent_version for r in store.load_turns("old") for m in r.messages] == [None, None]
    support = Agent("Assistant", "new instructions", model="m1")
    assert "agent.changed" not in _turn(store, "old", support, "after the upgrade")
    assert store.session_summary("old").agent_versions == {"Assistant": {"version": support.version, "turn": 2}}
    support.instructions = "newer"
    assert "agent.changed" in _turn(store, "old", support, "and changed")


def test_a_sqlite_database_of_schema_6_gains_agent_versions_unknown_for_its_rows(tmp_path) -> None:
    import sqlite3

    from chatflow_cli.core.memory.sqlite.schema import _MIGRATIONS, _MIGRATIONS_TABLE, SCHEMA_VERSION
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    path = tmp_path / "v6.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(_MIGRATIONS_TABLE)
    for number, name, steps in _MIGRATIONS:
        if number > 6:
            break
        for step in steps:
            step(conn) if callable(step) else conn.execute(step)
        conn.execute("INSERT INTO chatflow_schema_migrations VALUES (?, ?, 0)", (number, name))
    conn.close()
    # a session written by the chatflow of schema 6 (its rows have no version column yet)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, max_turns, turn_count, "
                 "created_at_utc, updated_at_utc) VALUES ('old', 'i', 'Assistant', 20, 1, 1, 1)")
    for seq, message in enumerate([Message.user("hello"), Message.model("hi", agent="Assistant")], 1):
        conn.execute("INSERT INTO chatflow_messages (session_id, turn, position, role, message_json, event_seq) "
                     "VALUES ('old', 1, ?, ?, ?, ?)", (seq, message.role.value, message.to_json(), seq))
        conn.execute("INSERT INTO chatflow_events (session_id, seq, event_type, turn, payload_json, created_at_utc) "
                     "VALUES ('old', ?, ?, 1, '{}', 1)", (seq, f"message.{message.role.value}"))
    conn.close()
    store = SQLiteSessionStore(path)
    try:
        _old_turns_then_a_new_one(store)
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        versions = [v for (v,) in conn.execute("SELECT version FROM chatflow_schema_migrations ORDER BY version")]
        assert versions == list(range(1, SCHEMA_VERSION + 1)) and SCHEMA_VERSION >= 7
        assert conn.execute("SELECT agent_versions_json FROM chatflow_sessions").fetchone()[0] is not None
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_a_postgres_database_of_schema_4_gains_agent_versions_unknown_for_its_rows(pg_dsn: str) -> None:
    import json

    import psycopg

    from chatflow_cli.core.memory import postgres
    from chatflow_cli.core.memory.postgres import schema

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(schema._MIGRATIONS_TABLE)
        for number, name, steps in schema._MIGRATIONS:
            if number > 4:
                break
            for step in steps:
                if step.startswith("_"):
                    getattr(schema, step)(conn)
                else:
                    conn.execute(step)
            conn.execute("INSERT INTO chatflow_schema_migrations VALUES (%s, %s, 0)", (number, name))
        conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, metadata, max_turns, "
                     "turn_count, last_seq, created_at_utc, updated_at_utc) VALUES ('old', 'i', 'Assistant', '{}', "
                     "20, 1, 2, 0, 0)")
        for seq, message in enumerate([Message.user("hello"), Message.model("hi", agent="Assistant")], 1):
            conn.execute("INSERT INTO chatflow_messages (session_id, turn, role, message, event_seq) "
                         "VALUES ('old', 1, %s, %s::jsonb, %s)", (message.role.value, json.dumps(message.to_dict()), seq))
            conn.execute("INSERT INTO chatflow_events (session_id, seq, event_type, turn, payload, created_at_utc) "
                         "VALUES ('old', %s, %s, 1, '{}'::jsonb, 0)", (seq, f"message.{message.role.value}"))
    store = postgres.PostgresSessionStore(pg_dsn)
    try:
        _old_turns_then_a_new_one(store)
    finally:
        store.close()
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT version FROM chatflow_schema_migrations ORDER BY version").fetchall()
        assert [r[0] for r in rows] == list(range(1, postgres.SCHEMA_VERSION + 1)) and postgres.SCHEMA_VERSION >= 5
