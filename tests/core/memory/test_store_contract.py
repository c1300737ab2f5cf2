"""One contract suite, run against both stores (in-memory and SQLite on a real file).

Everything here is behaviour a caller may rely on whatever the store: windows, turn
numbers, rollback, the event log, idempotency, status and owners, de-duplication, agent
resolution, deletion, async twins.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import threading
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import (
    IdempotencyConflictError,
    PendingToolCallsError,
    SessionBusyError,
    SessionDeletedError,
    SessionNotFoundError,
    SessionTerminatedError,
    ToolResultError,
    UsageError,
)
from chatflow_cli.core.events import Event, EventType, SessionStatus
from chatflow_cli.core.memory import (
    DEFAULT_DEDUP_TTL_HOURS,
    INTERRUPTED_TOOL_RESULT,
    BaseSessionStore,
    MessageState,
    Owner,
    SessionContext,
    SessionStore,
    TurnStart,
)
from chatflow_cli.core.messages import Message, Role, ToolCall, history_problems
from chatflow_cli.core.sqlite_store import SQLiteSessionStore

from tests.helpers.clock import FakeClock

HOUR = 3600.0


def add_turn(ctx: SessionContext, n: int | str, *, tool: bool = False) -> None:
    """One whole turn: user, optionally a tool call and its result, then the model's answer."""
    ctx.add_message(Message.user(f"u{n}"))
    if tool:
        ctx.add_message(Message.model(None, [ToolCall(f"call_{n}", "lookup", '{"n": 1}')]))
        ctx.add_message(Message.tool(f"call_{n}", f"r{n}", name="lookup"))
    ctx.add_message(Message.model(f"m{n}"))
    ctx.complete_turn(f"m{n}")


def contents(ctx: SessionContext) -> list[str | None]:
    return [m.content for m in ctx.history]


def all_seqs(store: BaseSessionStore, session_id: str) -> list[int]:
    return [e.seq for e in store.events(session_id)]


# -- construction ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, error",
    [(0, ValueError), (-3, ValueError), ("40", TypeError), (True, TypeError), (2**70, ValueError), (1_000_001, ValueError)],
)
def test_default_max_turns_validated(tmp_path, bad: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        SessionStore(default_max_turns=bad)  # type: ignore[arg-type]
    with pytest.raises(error):
        SQLiteSessionStore(tmp_path / "x.db", default_max_turns=bad)  # type: ignore[arg-type]


def test_max_turns_validated_per_session(any_store: BaseSessionStore, agent: Agent) -> None:
    with pytest.raises(ValueError):
        any_store.get_or_create("s", agent, max_turns=0)
    with pytest.raises(TypeError):
        any_store.get_or_create("s", agent, max_turns=2.5)  # type: ignore[arg-type]
    assert any_store.get("s") is None


@pytest.mark.parametrize("bad", [2**70, 1_000_001])
def test_huge_max_turns_refused_the_same_everywhere(any_store: BaseSessionStore, agent: Agent, bad: int) -> None:
    with pytest.raises(ValueError, match="at most 1,000,000"):
        SessionContext("s", agent, max_turns=bad)
    with pytest.raises(ValueError, match="at most 1,000,000"):
        any_store.get_or_create("s", agent, max_turns=bad)
    with pytest.raises(ValueError, match="at most 1,000,000"):
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=Owner.current(), max_turns=bad)
    assert any_store.get("s") is None
    assert any_store.get_or_create("s", agent, max_turns=1_000_000).max_turns == 1_000_000
    assert any_store.get("s").max_turns == 1_000_000


def test_sqlite_db_path_must_be_text(tmp_path) -> None:
    with pytest.raises(TypeError, match="db_path"):
        SQLiteSessionStore(str(tmp_path / "x.db").encode())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SQLiteSessionStore(42)  # type: ignore[arg-type]
    assert not (tmp_path / "x.db").exists()


def test_sqlite_store_takes_only_two_parameters(tmp_path) -> None:
    with pytest.raises(TypeError):
        SQLiteSessionStore(db_path=tmp_path / "app.db", busy_timeout=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        SQLiteSessionStore(tmp_path / "app.db", 40, 5)  # type: ignore[call-arg]


# -- sessions, windows -------------------------------------------------------------------------


def test_get_absent_is_none_and_get_or_create_creates_once(any_store: BaseSessionStore, agent: Agent) -> None:
    assert any_store.get("nope") is None
    ctx = any_store.get_or_create("s1", agent, metadata={"channel": "whatsapp"})
    assert ctx.session_id == "s1" and ctx.active_agent is agent and ctx.metadata == {"channel": "whatsapp"}
    again = any_store.get_or_create("s1", agent, metadata={"channel": "other"})
    assert again.metadata == {"channel": "whatsapp"}
    events = any_store.events("s1")
    assert [e.type for e in events] == ["session.created"]
    assert events[0].payload == {"agent": "Assistant", "max_turns": 40, "metadata": {"channel": "whatsapp"}}


def test_saved_window_is_reloaded_exactly(make_store: Callable[..., BaseSessionStore], agent: Agent) -> None:
    store = make_store()
    ctx = store.get_or_create("s", agent, max_turns=3)
    ctx.add_message(Message.system("Be brief."))
    for n in range(1, 7):
        add_turn(ctx, n, tool=n % 2 == 0)
    store.save(ctx)
    assert [t.number for t in ctx.turns] == [4, 5, 6]
    loaded = make_store().get("s")
    assert loaded is not None
    assert loaded.history == ctx.history
    assert [t.number for t in loaded.turns] == [4, 5, 6]
    assert loaded.turn_count == 6
    assert history_problems(loaded.history) == []


def test_turn_numbering_after_rollback(make_store: Callable[..., BaseSessionStore], agent: Agent) -> None:
    store = make_store()
    ctx = store.get_or_create("s", agent)
    for n in range(1, 5):
        add_turn(ctx, n)
    store.save(ctx)
    ctx.rollback_to(2)
    store.save(ctx)
    ctx.add_message(Message.user("new"))
    assert ctx.turn_count == 3
    store.save(ctx)
    loaded = make_store().get("s")
    assert loaded is not None and loaded.turn_count == 3
    assert [(t.number, t.messages[0].content) for t in loaded.turns] == [(1, "u1"), (2, "u2"), (3, "new")]
    user_turns = [e.payload["turn"] for e in store.events("s") if e.type == "message.user"]
    assert user_turns == [1, 2, 3, 4, 3]  # the log keeps the rolled-back turns; nothing renumbered


def test_rollback_reaches_turns_pruned_out_of_the_window(
    make_store: Callable[..., BaseSessionStore], agent: Agent
) -> None:
    store = make_store()
    ctx = store.get_or_create("s", agent, max_turns=2)
    ctx.add_message(Message.system("sys"))
    for n in range(1, 8):
        add_turn(ctx, n, tool=True)
    store.save(ctx)
    loaded = make_store().get("s")  # a fresh context: turns 1-5 exist only in the store
    assert loaded is not None and [t.number for t in loaded.turns] == [6, 7]
    loaded.rollback_to(3)
    assert [t.number for t in loaded.turns] == [2, 3]
    assert contents(loaded) == ["sys", "u2", None, "r2", "m2", "u3", None, "r3", "m3"]
    store.save(loaded)
    again = make_store().get("s")
    assert again is not None and again.history == loaded.history
    # store.rollback does the same in one transaction
    store.rollback("s", 1)
    final = make_store().get("s")
    assert final is not None and contents(final) == ["sys", "u1", None, "r1", "m1"]


def test_store_rollback_validates_and_changes_nothing(any_store: BaseSessionStore, agent: Agent) -> None:
    ctx = any_store.get_or_create("s", agent)
    add_turn(ctx, 1)
    any_store.save(ctx)
    before = any_store.events("s")
    with pytest.raises(ValueError):
        any_store.rollback("s", 2)
    with pytest.raises(ValueError):
        any_store.rollback("s", -1)
    with pytest.raises(SessionNotFoundError):
        any_store.rollback("absent", 0)
    assert any_store.events("s") == before


def test_rollback_is_atomic(any_store: BaseSessionStore, agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = any_store.get_or_create("s", agent)
    for n in range(1, 4):
        add_turn(ctx, n)
    any_store.save(ctx)
    before_events = any_store.events("s")
    before_history = any_store.get("s").history  # type: ignore[union-attr]
    ctx.rollback_to(1)
    ctx.add_message(Message.user("after"))
    real_append = BaseSessionStore._append

    def failing_append(self, tx, session_id, type, payload, turn=None, key=None, **kwargs):
        if type == EventType.MESSAGE_USER.value:  # after the rollback was applied in the transaction
            raise OSError("simulated failure inside the transaction")
        return real_append(self, tx, session_id, type, payload, turn, key, **kwargs)

    monkeypatch.setattr(BaseSessionStore, "_append", failing_append)
    with pytest.raises(OSError):
        any_store.save(ctx)
    monkeypatch.undo()
    assert any_store.events("s") == before_events
    reloaded = any_store.get("s")
    assert reloaded is not None and reloaded.history == before_history and reloaded.turn_count == 3
    # the journal was kept: saving again applies it whole
    any_store.save(ctx)
    assert [t.number for t in any_store.get("s").turns] == [1, 2]  # type: ignore[union-attr]


def test_load_turns_marks_window_rollback_and_failure(any_store: BaseSessionStore, agent: Agent) -> None:
    ctx = any_store.get_or_create("s", agent, max_turns=2)
    ctx.add_message(Message.system("sys"))
    for n in range(1, 5):
        add_turn(ctx, n)
    ctx.rollback_to(3)
    ctx.add_message(Message.user("u4b"))
    ctx.fail_turn(RuntimeError("provider down"))
    any_store.save(ctx)
    live = any_store.load_turns("s")
    assert [(r.number, r.in_window) for r in live] == [(1, False), (2, True), (3, True)]
    everything = any_store.load_turns("s", first=0, include_rolled_back=True)
    flags = [(r.number, r.messages[0].content, r.rolled_back, r.failed) for r in everything]
    assert flags == [
        (0, "sys", False, False),
        (1, "u1", False, False),
        (2, "u2", False, False),
        (3, "u3", False, False),
        (4, "u4", True, False),
        (4, "u4b", False, True),
    ]
    assert [r.number for r in any_store.load_turns("s", first=2, last=2)] == [2]
    with pytest.raises(SessionNotFoundError):
        any_store.load_turns("absent")


def test_list_sessions_and_latest(any_store: BaseSessionStore, agent: Agent, clock: FakeClock) -> None:
    other = Agent(name="Billing", instructions="Billing")
    assert any_store.list_sessions() == [] and any_store.latest_session_id() is None
    for i, sid in enumerate(["a", "b", "c"]):
        clock.advance(10)
        ctx = any_store.get_or_create(sid, other if sid == "b" else agent)
        add_turn(ctx, "x" * 100 if sid == "a" else sid)
        any_store.save(ctx)
    clock.advance(10)
    ctx = any_store.get("a")
    assert ctx is not None
    ctx.update_metadata({"k": 1})
    any_store.save(ctx)
    summaries = any_store.list_sessions()
    assert [s.session_id for s in summaries] == ["a", "c", "b"]
    assert summaries[0].preview == ("u" + "x" * 100)[:80] and summaries[0].metadata == {"k": 1}
    assert summaries[0].turn_count == 1 and summaries[0].status is SessionStatus.IDLE
    assert any_store.latest_session_id() == "a"
    assert [s.session_id for s in any_store.list_sessions(agent="Billing")] == ["b"]
    assert len(any_store.list_sessions(limit=2)) == 2
    assert any_store.list_sessions(status="running") == []


# -- event log -------------------------------------------------------------------------------


def test_event_seq_gap_free_increasing_never_reused(make_store: Callable[..., BaseSessionStore], agent: Agent) -> None:
    store = make_store()
    ctx = store.get_or_create("s", agent)
    for n in range(1, 4):
        add_turn(ctx, n, tool=True)
        store.save(ctx)
    store.rollback("s", 1)
    store.append_event("s", "custom.note", {"x": 1})
    ctx = make_store().get("s")
    assert ctx is not None
    add_turn(ctx, "again")
    store.save(ctx)
    seqs = all_seqs(store, "s")
    assert seqs == list(range(1, len(seqs) + 1))
    assert store.last_seq("s") == seqs[-1]
    types = [e.type for e in store.events("s")]
    assert types.count("rollback") == 1 and types[-1] == "turn.completed"
    assert [e.seq for e in store.events("s", after_seq=5, limit=3)] == [6, 7, 8]


def test_seq_restarts_at_1_for_a_new_incarnation_of_a_deleted_id(any_store: BaseSessionStore, agent: Agent) -> None:
    old = any_store.get_or_create("s", agent)
    add_turn(old, 1)
    any_store.save(old)
    assert any_store.last_seq("s") > 1
    assert any_store.delete("s") is True
    again = any_store.get_or_create("s", agent)
    assert [(e.seq, e.type) for e in any_store.events("s")] == [(1, "session.created")]
    add_turn(old, 2)
    with pytest.raises(SessionDeletedError):  # the old incarnation never writes into the new one
        any_store.save(old)
    assert any_store.last_seq("s") == 1 and again.turn_count == 0


def test_events_cover_every_kind_of_change(any_store: BaseSessionStore, agent: Agent) -> None:
    ctx = any_store.get_or_create("s", agent)
    ctx.add_message(Message.system("sys"))
    add_turn(ctx, 1, tool=True)
    ctx.set_active_agent(Agent(name="Billing", instructions=""), tool_call_id="call_h")
    ctx.update_metadata({"ticket": "tk_123"})
    ctx.set_status(SessionStatus.RESCHEDULED, "rate limited", retry_at=5.0)
    ctx.record_event(EventType.TOOL_PENDING, {"turn": 1, "tool_use_ids": []})
    events = any_store.save(ctx)
    assert [e.type for e in events] == [
        "message.system",
        "message.user",
        "message.model",
        "tool.result",
        "message.model",
        "turn.completed",
        "handoff",
        "metadata.updated",
        "status",
        "tool.pending",
    ]
    assert events[-2].payload == {"status": "rescheduled", "reason": "rate limited", "retry_at": 5.0}
    assert Message.from_dict(events[1].payload["message"]) == Message.user("u1")
    assert any_store.events("s")[1:] == events
    loaded = any_store.get("s")
    assert loaded is not None and loaded.status is SessionStatus.RESCHEDULED
    assert loaded.metadata == {"ticket": "tk_123"}


def test_append_event_idempotency(any_store: BaseSessionStore, agent: Agent) -> None:
    any_store.get_or_create("s", agent)
    first = any_store.append_event("s", "custom.note", {"a": 1}, idempotency_key="k1")
    assert first.idempotency_key == "k1"
    assert any_store.append_event("s", "custom.note", {"a": 1}, idempotency_key="k1") == first
    with pytest.raises(IdempotencyConflictError):
        any_store.append_event("s", "custom.note", {"a": 2}, idempotency_key="k1")
    assert [e.type for e in any_store.events("s")] == ["session.created", "custom.note"]
    with pytest.raises(SessionNotFoundError):
        any_store.append_event("absent", "x", {})


@pytest.mark.parametrize(
    "kind, method",
    [
        ("status", "set_status"),
        (EventType.STATUS, "set_status"),
        ("rollback", "rollback"),
        ("handoff", "set_active_agent"),
        ("message.user", "add_message"),
        ("message.anything", "add_message"),
        ("tool.result", "add_message"),
        ("tool.result_submitted", "submit_tool_result"),
        ("tool.pending", "Runner"),
        ("turn.completed", "complete_turn"),
        ("session.created", "get_or_create"),
        ("metadata.updated", "update_metadata"),
    ],
)
def test_append_event_refuses_reserved_types(any_store: BaseSessionStore, agent: Agent, kind: object, method: str) -> None:
    any_store.get_or_create("s", agent)
    before = any_store.events("s")
    with pytest.raises(UsageError, match=method):
        any_store.append_event("s", kind, {"status": "terminated", "to_turn": 0})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="reserved"):
        asyncio.run(any_store.aappend_event("s", kind, {}))  # type: ignore[arg-type]
    assert any_store.events("s") == before
    loaded = any_store.get("s")
    assert loaded is not None and loaded.status is SessionStatus.IDLE


def test_custom_event_types_are_accepted_and_type_must_be_a_string(any_store: BaseSessionStore, agent: Agent) -> None:
    any_store.get_or_create("s", agent)
    for kind in ("note", "billing.refund", "statusx", "custom.status", "tooling.x"):
        assert any_store.append_event("s", kind, {"n": 1}).type == kind
    for bad in ("", None, 3):
        with pytest.raises(TypeError):
            any_store.append_event("s", bad, {})  # type: ignore[arg-type]


def test_record_event_refuses_reserved_types_that_change_state(agent: Agent) -> None:
    ctx = SessionContext("s", agent)
    for kind in ("status", "rollback", "handoff", "message.user", "tool.result", "turn.failed", "metadata.updated"):
        with pytest.raises(UsageError, match="reserved"):
            ctx.record_event(kind, {})
    ctx.record_event(EventType.TOOL_PENDING, {"turn": 0, "tool_use_ids": []})
    ctx.record_event("note", {})
    assert [e.type for e in ctx.events] == ["tool.pending", "note"]


# -- begin_turn, owners, status ---------------------------------------------------------------


def test_running_turn_pid_names_the_running_owner_only_while_a_turn_runs(any_store: BaseSessionStore,
                                                                         agent: Agent) -> None:
    import os

    assert any_store.running_turn_pid("s") is None  # no session
    start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current())
    assert any_store.running_turn_pid("s") == os.getpid()
    waiting = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("next"), owner=Owner.current(),
                               enqueue=True)
    assert waiting.queued is not None and any_store.running_turn_pid("s") == os.getpid()
    any_store.leave_turn_queue("s", waiting.queued)
    start.session.add_message(Message.model("hello", agent="Assistant"))
    start.session.complete_turn("hello", agent, {})
    any_store.release(start.session)
    assert any_store.running_turn_pid("s") is None


def test_begin_turn_creates_claims_and_releases(any_store: BaseSessionStore, agent: Agent) -> None:
    owner = Owner.current()
    start = any_store.begin_turn(
        "s",
        default_agent=agent,
        user_message=Message.user("hi"),
        owner=owner,
        system="Be brief.",
        metadata={"channel": "cli"},
    )
    assert start.turn == 1 and start.replayed is None
    assert [e.type for e in start.events] == ["session.created", "message.system", "status", "message.user"]
    assert start.session.status is SessionStatus.RUNNING
    assert contents(start.session) == ["Be brief.", "hi"]
    assert any_store.list_sessions()[0].status is SessionStatus.RUNNING
    with pytest.raises(SessionBusyError):
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("again"), owner=Owner.current())
    ctx = start.session
    ctx.add_message(Message.model("hello", agent="Assistant"))
    ctx.complete_turn("hello", agent, {"prompt_tokens": 3})
    any_store.release(ctx)
    assert any_store.list_sessions()[0].status is SessionStatus.IDLE
    second = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("more"), owner=owner)
    assert second.turn == 2 and second.session.metadata == {"channel": "cli"}


def _window_loads(store: BaseSessionStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the store's context-window loads (``_Tx.live_window`` of its transaction class)."""
    from chatflow_cli.core.memory.inmemory import _MemoryTx
    from chatflow_cli.core.memory.sqlite.tx import _SQLiteTx

    tx_class: type = _SQLiteTx if isinstance(store, SQLiteSessionStore) else _MemoryTx
    if type(store).__name__ == "PostgresSessionStore":
        from chatflow_cli.core.memory.postgres.tx import _PgTx

        tx_class = _PgTx
    calls: list[int] = []
    original = tx_class.live_window

    def live_window(self: object, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        calls.append(first_turn)
        return original(self, session_id, first_turn)

    monkeypatch.setattr(tx_class, "live_window", live_window)
    return calls


def _finish(store: BaseSessionStore, ctx: SessionContext, agent: Agent, text: str) -> None:
    ctx.add_message(Message.model(text, agent=agent.name))
    ctx.complete_turn(text, agent)
    store.release(ctx)


def test_begin_turn_loads_the_window_once(
    any_store: BaseSessionStore, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(1, 4):
        start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user(f"q{n}"), owner=Owner.current())
        _finish(any_store, start.session, agent, f"a{n}")
    loads = _window_loads(any_store, monkeypatch)
    any_store.begin_turn("s", default_agent=agent, user_message=Message.user("q4"), owner=Owner.current())
    assert len(loads) == 1, f"begin_turn loaded the context window {len(loads)} times"


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_begin_turn_gives_the_window_a_fresh_load_would(
    make_store: Callable[..., BaseSessionStore], agent: Agent, system: str | None
) -> None:
    """At the max_turns edge the new turn pushes the oldest one out; the context begin_turn
    returns equals the stored session loaded again (window, numbering, status, pending calls,
    metadata), and reaches pruned turns through the store (rollback)."""
    store = make_store()
    owner = Owner.current()
    for n in range(1, 4):
        start = store.begin_turn("s", default_agent=agent, user_message=Message.user(f"q{n}"), owner=owner,
                                 max_turns=3, system=system, metadata={"n": n})
        assert start.turn == n
        _finish(store, start.session, agent, f"a{n}")
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("q4"), owner=owner,
                             metadata={"n": 4})
    fresh = make_store().get("s")
    assert fresh is not None
    ctx = start.session
    for got in (ctx, fresh):
        assert [m.content for m in got.history if m.role is Role.USER] == ["q2", "q3", "q4"]
    assert ctx.history == fresh.history
    assert [t.number for t in ctx.turns] == [t.number for t in fresh.turns] == [2, 3, 4]
    assert ctx.turn_count == fresh.turn_count == start.turn == 4
    assert ctx.status is fresh.status is SessionStatus.RUNNING
    assert ctx.metadata == fresh.metadata == {"n": 4}
    assert ctx.active_agent.name == fresh.active_agent.name
    # tool calls in the new turn, then custom results: the continued turn matches a fresh load too
    ctx.add_message(Message.model(None, [ToolCall("c1", "approve"), ToolCall("c2", "lookup")]))
    ctx.record_event(EventType.TOOL_PENDING, {"turn": 4, "tool_use_ids": ["c1", "c2"]})
    store.release(ctx, reason="waiting for custom tool results")
    assert store.submitted_tool_results("s") == {}
    assert store.submit_tool_result("s", "c2", "found") == ["c1"]
    assert make_store().submitted_tool_results("s") == {"c2": "found"}  # c2 is answered, c1 still waits
    assert store.submit_tool_result("s", "c1", "yes") == []
    assert store.submitted_tool_results("s") == {"c1": "yes", "c2": "found"}
    resumed = store.begin_turn("s", default_agent=agent, user_message=None, owner=owner)
    assert store.submitted_tool_results("s") == {}  # the turn went on: nothing waits
    again = make_store().get("s")
    assert again is not None
    assert resumed.session.history == again.history
    assert [t.number for t in resumed.session.turns] == [2, 3, 4]
    assert resumed.session.pending_tool_calls == again.pending_tool_calls == ()
    _finish(store, resumed.session, agent, "a4")
    # a pruned turn is still reachable: roll back through the store
    back = make_store().get("s")
    assert back is not None
    back.rollback_to(1)
    assert [m.content for m in back.history if m.role is not Role.SYSTEM] == ["q1", "a1"]


def test_begin_turn_with_a_repeated_idempotency_key(any_store: BaseSessionStore, agent: Agent) -> None:
    msg = Message.user("Where is order 404?")
    start = any_store.begin_turn(
        "s", default_agent=agent, user_message=msg, owner=Owner.current(), idempotency_key="wamid.1"
    )
    running = any_store.begin_turn(
        "s", default_agent=agent, user_message=msg, owner=Owner.current(), idempotency_key="wamid.1"
    )
    assert running.replayed == {"turn": 1, "outcome": "running"} and running.events == []
    ctx = start.session
    ctx.add_message(Message.model("In transit.", agent="Assistant"))
    ctx.complete_turn("In transit.", agent)
    any_store.release(ctx)
    before = any_store.events("s")
    replay = any_store.begin_turn(
        "s", default_agent=agent, user_message=msg, owner=Owner.current(), idempotency_key="wamid.1"
    )
    assert replay.turn == 1
    assert replay.replayed == {
        "turn": 1,
        "agent": "Assistant",
        "content": "In transit.",
        "usage": None,  # no usage given: unknown
        "outcome": "completed",
    }
    assert any_store.events("s") == before
    assert [r.number for r in any_store.load_turns("s")] == [1]  # one stored turn
    with pytest.raises(IdempotencyConflictError):
        any_store.begin_turn(
            "s",
            default_agent=agent,
            user_message=Message.user("other"),
            owner=Owner.current(),
            idempotency_key="wamid.1",
        )
    assert any_store.events("s") == before


def test_custom_tool_results_then_continue(any_store: BaseSessionStore, agent: Agent) -> None:
    start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("approve?"), owner=Owner.current())
    ctx = start.session
    ctx.add_message(Message.model(None, [ToolCall("t1", "approve"), ToolCall("t2", "approve")]))
    ctx.record_event(EventType.TOOL_PENDING, {"turn": 1, "tool_use_ids": ["t1", "t2"]})
    any_store.release(ctx, reason="waiting for custom tool results")
    with pytest.raises(PendingToolCallsError) as err:
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("hello?"), owner=Owner.current())
    assert err.value.tool_use_ids == ["t1", "t2"]
    with pytest.raises(PendingToolCallsError):
        any_store.begin_turn("s", default_agent=agent, user_message=None, owner=Owner.current())
    with pytest.raises(ToolResultError):
        any_store.submit_tool_result("s", "nope", "x")
    assert any_store.submit_tool_result("s", "t2", "no") == ["t1"]
    with pytest.raises(ToolResultError):
        any_store.submit_tool_result("s", "t2", "again")
    with pytest.raises(PendingToolCallsError) as err:  # lists only the id still missing
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("hello?"), owner=Owner.current())
    assert err.value.tool_use_ids == ["t1"] and "t2" not in str(err.value)
    assert any_store.submit_tool_result("s", "t1", "yes") == []
    with pytest.raises(PendingToolCallsError, match="continue") as err:  # all in: the turn goes on first
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("hello?"), owner=Owner.current())
    assert err.value.tool_use_ids == [] and "t1" not in str(err.value)
    resumed = any_store.begin_turn("s", default_agent=agent, user_message=None, owner=Owner.current())
    tools = [m for m in resumed.session.history if m.role is Role.TOOL]
    assert [(m.tool_call_id, m.content) for m in tools] == [("t1", "yes"), ("t2", "no")]  # call order
    assert resumed.turn == 1 and resumed.session.pending_tool_calls == ()
    submitted = [e.payload for e in any_store.events("s") if e.type == "tool.result_submitted"]
    assert submitted == [
        {"turn": 1, "tool_use_id": "t2", "output": "no"},
        {"turn": 1, "tool_use_id": "t1", "output": "yes"},
    ]


def test_dead_owner_is_recovered(any_store: BaseSessionStore, agent: Agent) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        owner = Owner.of_process(child.pid)
        assert owner.alive()
        start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("slow job"), owner=owner)
        ctx = start.session
        ctx.add_message(Message.model(None, [ToolCall("call_x", "slow")]))
        any_store.save(ctx)
        with pytest.raises(SessionBusyError):
            any_store.begin_turn("s", default_agent=agent, user_message=Message.user("next"), owner=Owner.current())
        assert any_store.get("s").status is SessionStatus.RUNNING  # a live owner runs it
    finally:
        child.kill()
        child.wait()
    assert not owner.alive()
    seq = any_store.last_seq("s")
    # every read shows the effective status, and none writes anything
    assert any_store.list_sessions()[0].status is SessionStatus.IDLE
    assert any_store.get("s").status is SessionStatus.IDLE
    assert any_store.get_or_create("s", agent).status is SessionStatus.IDLE
    assert asyncio.run(any_store.aget("s")).status is SessionStatus.IDLE
    assert any_store.last_seq("s") == seq
    start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("next"), owner=Owner.current())
    types = [e.type for e in start.events]
    assert types == ["tool.result", "turn.interrupted", "session.recovered", "status", "status", "message.user"]
    assert start.events[2].payload["owner"]["pid"] == child.pid
    synthetic = [m for m in start.session.history if m.role is Role.TOOL]
    assert synthetic == [Message.tool("call_x", INTERRUPTED_TOOL_RESULT, name="slow", is_error=True, interrupted=True)]
    assert start.turn == 2 and history_problems(start.session.history, pending_ok=True) == []


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the start time is read from /proc/<pid>/stat")
def test_owner_detects_pid_reuse() -> None:
    me = Owner.current()
    assert me.start_time > 0
    assert me.alive() is True
    assert Owner(me.pid, me.start_time + 1, me.host, "t").alive() is False  # same pid, another process
    assert Owner(me.pid, me.start_time, "another-host", "t").alive()  # cannot be checked: assumed alive
    assert Owner.from_dict(me.to_dict()) == me


def test_an_owner_recorded_without_a_start_time_is_alive_while_its_pid_runs() -> None:
    """A lease written where there is no /proc has start time 0: pid reuse cannot be told,
    so the owner counts as alive exactly while a process with its pid exists."""
    me = Owner.current()
    assert Owner(me.pid, 0, me.host, "t").alive() is True
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert Owner(child.pid, 0, me.host, "t").alive() is False


def test_terminated_refuses_writes(any_store: BaseSessionStore, agent: Agent) -> None:
    ctx = any_store.get_or_create("s", agent)
    add_turn(ctx, 1)
    any_store.release(ctx, SessionStatus.TERMINATED, "case closed")
    before = any_store.events("s")
    ctx.add_message(Message.user("more"))
    with pytest.raises(SessionTerminatedError):
        any_store.save(ctx)
    with pytest.raises(SessionTerminatedError):
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("x"), owner=Owner.current())
    with pytest.raises(SessionTerminatedError):
        any_store.append_event("s", "note", {})
    with pytest.raises(SessionTerminatedError):
        any_store.rollback("s", 0)
    with pytest.raises(SessionTerminatedError):
        any_store.get("s").set_status("idle")  # type: ignore[union-attr]
    assert any_store.events("s") == before
    assert any_store.get("s").status is SessionStatus.TERMINATED  # type: ignore[union-attr]


def test_session_deleted_error(any_store: BaseSessionStore, agent: Agent) -> None:
    ctx = any_store.get_or_create("s", agent, max_turns=1)
    for n in range(1, 4):
        add_turn(ctx, n)
    any_store.save(ctx)
    task_view = any_store.get("s")
    assert task_view is not None
    assert any_store.delete("s") is True
    assert any_store.delete("s") is False
    assert any_store.get("s") is None
    with pytest.raises(SessionDeletedError):
        task_view.rollback_to(1)  # reads pruned turns from the store
    ctx.add_message(Message.user("late"))
    with pytest.raises(SessionDeletedError):
        any_store.save(ctx)
    any_store.get_or_create("s", agent)  # same id, new session: the stale task still may not write into it
    with pytest.raises(SessionDeletedError):
        any_store.save(ctx)
    with pytest.raises(SessionNotFoundError):
        any_store.events("absent")


def test_stale_context_refused(any_store: BaseSessionStore, agent: Agent) -> None:
    first = any_store.get_or_create("s", agent)
    second = any_store.get("s")
    assert second is not None
    add_turn(first, 1)
    any_store.save(first)
    add_turn(second, 1)
    with pytest.raises(SessionBusyError):
        any_store.save(second)
    assert [r.number for r in any_store.load_turns("s")] == [1]


def test_stale_contexts_patch_metadata_and_keep_every_writers_keys(any_store: BaseSessionStore, agent: Agent) -> None:
    any_store.get_or_create("s", agent, metadata={"channel": "whatsapp", "old": 1, "shared": "x"})
    first, second = any_store.get("s"), any_store.get("s")
    assert first is not None and second is not None
    first.update_metadata({"ticket": "tk_1"})
    first.metadata["shared"] = "from first"  # changed in place
    any_store.save(first)
    del second.metadata["old"]  # deleted in place: part of the next patch
    second.update_metadata({"lang": "pt"})
    events = any_store.save(second)
    expected = {"channel": "whatsapp", "ticket": "tk_1", "shared": "from first", "lang": "pt"}
    assert any_store.get("s").metadata == expected
    assert second.metadata == expected  # the saved context now shows the stored, merged dict
    [event] = events
    assert event.type == "metadata.updated"
    assert event.payload == {"metadata": expected, "changes": {"lang": "pt"}, "removed": ["old"]}
    assert any_store.list_sessions()[0].metadata == expected


def test_stale_status_or_handoff_change_is_refused(any_store: BaseSessionStore, agent: Agent) -> None:
    billing = Agent(name="Billing", instructions="Billing specialist")
    any_store.get_or_create("s", agent)
    first, second, third = any_store.get("s"), any_store.get("s"), any_store.get("s")
    assert first is not None and second is not None and third is not None
    first.set_status(SessionStatus.RESCHEDULED, "retry later", retry_at=1.0)
    any_store.save(first)
    seq = any_store.last_seq("s")
    second.set_status(SessionStatus.TERMINATED, "done")
    with pytest.raises(SessionBusyError, match="changed since it was loaded"):
        any_store.save(second)
    third.set_active_agent(billing, tool_call_id="call_1")
    with pytest.raises(SessionBusyError, match="changed since it was loaded"):
        any_store.save(third)
    assert any_store.last_seq("s") == seq  # nothing written
    loaded = any_store.get("s")
    assert loaded is not None and loaded.status is SessionStatus.RESCHEDULED and loaded.active_agent.name == "Assistant"
    # the saving context moves its base on: a second change from it is not stale
    first.set_active_agent(billing, tool_call_id="call_2")
    any_store.save(first)
    # a stale context that changes neither status nor agent still saves (metadata is a patch)
    fourth = any_store.get("s")
    assert fourth is not None
    first.set_status(SessionStatus.IDLE)
    any_store.save(first)
    fourth.update_metadata({"k": 1})
    any_store.save(fourth)
    final = any_store.get("s")
    assert final is not None and final.status is SessionStatus.IDLE and final.metadata == {"k": 1}
    assert final.active_agent.name == "Billing"


def test_the_run_holding_the_lease_may_change_status_after_another_writer(
    any_store: BaseSessionStore, agent: Agent
) -> None:
    owner = Owner.current()
    run = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=owner).session
    other = any_store.get("s")
    assert other is not None and other.status is SessionStatus.RUNNING
    other.set_active_agent(Agent(name="Billing", instructions="b"), tool_call_id="x")
    any_store.save(other)
    run.add_message(Message.model("a"))
    run.complete_turn("a")
    any_store.release(run)  # stale base, but this run holds the lease
    loaded = any_store.get("s")
    assert loaded is not None and loaded.status is SessionStatus.IDLE and loaded.turn_count == 1
    # the lease ends with the run: its context is now an ordinary one, stale once another run starts
    any_store.begin_turn("s", default_agent=agent, user_message=Message.user("q2"), owner=Owner.current())
    run.set_status(SessionStatus.TERMINATED)
    with pytest.raises(SessionBusyError, match="changed since it was loaded"):
        any_store.save(run)


# -- input checked the same way in both stores ------------------------------------------------

LONE = "bad \udc80 text"  # what surrogateescape makes of a stray byte: not valid Unicode


def test_lone_surrogates_refused_before_anything_is_written(any_store: BaseSessionStore, agent: Agent) -> None:
    ctx = any_store.get_or_create("s", agent)
    seq = any_store.last_seq("s")
    with pytest.raises(UsageError, match="lone surrogate"):
        ctx.add_message(Message.user(LONE))
    assert ctx.turn_count == 0 and ctx.history == ()
    with pytest.raises(UsageError, match="lone surrogate"):
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user(LONE), owner=Owner.current())
    with pytest.raises(UsageError, match="lone surrogate"):
        any_store.append_event("s", "note", {"text": LONE})
    with pytest.raises(UsageError, match="lone surrogate"):
        ctx.update_metadata({"name": LONE})
    ctx.add_message(Message.user("fine"))
    ctx.add_message(Message.model("fine"))
    ctx.complete_turn(LONE)  # text the context does not check itself: the store refuses it on save
    with pytest.raises(UsageError, match="lone surrogate"):
        any_store.save(ctx)
    assert any_store.last_seq("s") == seq and any_store.get("s").turn_count == 0
    with pytest.raises(UsageError, match="lone surrogate"):
        any_store.get_or_create(LONE, agent)
    with pytest.raises(UsageError, match="lone surrogate"):
        any_store.get(LONE)
    with pytest.raises(UsageError, match="lone surrogate"):
        any_store.claim_message(LONE)
    with pytest.raises(UsageError, match="lone surrogate"):
        any_store.get_or_create("t", Agent(name=LONE, instructions=""))
    assert [x.session_id for x in any_store.list_sessions()] == ["s"]


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_nan_and_infinity_refused_before_anything_is_written(any_store: BaseSessionStore, agent: Agent,
                                                              number: float) -> None:
    # SQLite's JSON functions and strict JSON readers refuse a bare NaN: one stored value
    # broke every search of the file. Every writer refuses it as it refuses a set: TypeError.
    ctx = any_store.get_or_create("s", agent)
    seq = any_store.last_seq("s")
    with pytest.raises(TypeError, match="user message cannot be stored as JSON: a float NaN or Infinity"):
        ctx.add_message(Message(Role.USER, "q", items=({"role": "user", "score": number},)))
    assert ctx.turn_count == 0 and ctx.history == ()
    with pytest.raises(TypeError, match="NaN or Infinity"):
        any_store.begin_turn("s", default_agent=agent, owner=Owner.current(),
                             user_message=Message(Role.USER, "q", items=({"score": [number]},)))
    with pytest.raises(TypeError, match="payload cannot be stored as JSON: a float NaN or Infinity"):
        any_store.append_event("s", "note", {"score": number})
    with pytest.raises(TypeError, match="metadata changes cannot be stored as JSON: a float NaN or Infinity"):
        ctx.update_metadata({"score": number})
    with pytest.raises(TypeError, match="metadata cannot be stored as JSON: a float NaN or Infinity"):
        any_store.get_or_create("t", agent, metadata={"score": number})
    ctx.add_message(Message.user("fine"))
    ctx.add_message(Message(Role.MODEL, "fine", items=({"type": "message", "score": 0.5},)))
    ctx.complete_turn("fine", usage={"cost": number})  # not checked by the context: the store refuses it on save
    with pytest.raises(TypeError, match="turn.completed event cannot be stored as JSON: a float NaN or Infinity"):
        any_store.save(ctx)
    assert any_store.last_seq("s") == seq and any_store.get("s").turn_count == 0
    assert [x.session_id for x in any_store.list_sessions()] == ["s"]


def test_tool_output_with_a_lone_surrogate_is_refused(any_store: BaseSessionStore, agent: Agent) -> None:
    start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=Owner.current())
    start.session.add_message(Message.model(None, [ToolCall("c", "custom")]))
    any_store.release(start.session)
    seq = any_store.last_seq("s")
    with pytest.raises(UsageError, match="lone surrogate"):
        any_store.submit_tool_result("s", "c", LONE)
    assert any_store.last_seq("s") == seq
    assert any_store.submit_tool_result("s", "c", "ok") == []


@pytest.mark.parametrize(
    "bad", [["a"], "text", {1: "x"}, {"k": {1, 2}}, {"k": object()}, {(1, 2): "x"}],
    ids=["list", "text", "int-key", "set-value", "object-value", "tuple-key"],  # the same ids in every process
)
def test_metadata_must_be_a_dict_of_json_values(any_store: BaseSessionStore, agent: Agent, bad: object) -> None:
    with pytest.raises(TypeError, match="metadata"):
        SessionContext("s", agent, metadata=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metadata"):
        any_store.get_or_create("s", agent, metadata=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metadata"):
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=Owner.current(),
                         metadata=bad)  # type: ignore[arg-type]
    assert any_store.get("s") is None
    ctx = any_store.get_or_create("s", agent)
    if isinstance(bad, dict):
        with pytest.raises(TypeError, match="metadata"):
            ctx.update_metadata(bad)
        ctx.metadata.update(bad)  # changed in place: refused on save, nothing written
        with pytest.raises(TypeError, match="metadata"):
            any_store.save(ctx)
    assert any_store.get("s").metadata == {} and any_store.last_seq("s") == 1


def test_metadata_is_stored_as_json_in_both_stores(any_store: BaseSessionStore, agent: Agent) -> None:
    ctx = any_store.get_or_create("s", agent, metadata={"tags": ("a", "b"), "n": 2**70, "nested": {"x": None}})
    assert ctx.metadata == {"tags": ["a", "b"], "n": 2**70, "nested": {"x": None}}
    assert any_store.get("s").metadata == ctx.metadata
    event = any_store.append_event("s", "note", {"pair": (1, 2)})
    assert event.payload == {"pair": [1, 2]} and any_store.events("s")[-1] == event
    for bad in ({"k": {1}}, {2: "x"}, ["x"]):
        with pytest.raises(TypeError, match="payload"):
            any_store.append_event("s", "note", bad)  # type: ignore[arg-type]


#: Values a JSON store could rewrite: key order (not sorted, longer keys first), floats
#: that read like ints (1e16, 1.0), negative zero, ints beyond 64 bits, escapes, nesting.
_EXACT = {
    "zeta": 1, "a": {"yy": [1e16, 1e-7, -0.0, 1.0, 1, 2**70, -(2**64) - 1, 0.1 + 0.2], "b": None},
    "f16": 1e16, "mid": {"z": {"y": {"x": [True, False, {}, []]}}, "k": "\u00e9\u2028\U0001f600 \\u0041 \"q\" \x1f"},
    "é": "snow ☃", "": "empty key", "1": "digit key",
}
#: The same with a NUL character (which PostgreSQL's jsonb cannot hold at all).
_EXACT_NUL = {"zeta": 1, "nul": "a\x00b", "a": 1e16}


def _text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("value", [_EXACT, _EXACT_NUL], ids=["plain", "nul"])
def test_messages_items_metadata_and_payloads_come_back_byte_for_byte(
    make_store: Callable[..., BaseSessionStore], agent: Agent, value: dict[str, object]
) -> None:
    """Every store returns what it was given: the same JSON text (key order, number forms)."""
    store = make_store()
    ctx = store.get_or_create("s", agent, metadata=value)
    sent = [
        Message.user(_text(value)),
        Message(Role.MODEL, "done", items=({"type": "message", "zz": 1e16, "content": [value], "a": -0.0},)),
    ]
    for message in sent:
        ctx.add_message(message)
    ctx.complete_turn("done")
    store.save(ctx)
    store.append_event("s", "note", {"exact": value, "first": 1.0})

    again = make_store()  # what another process sees
    loaded = again.get("s")
    assert loaded is not None
    assert _text(loaded.metadata) == _text(value)
    assert [_text(m.to_dict()) for m in loaded.history] == [_text(m.to_dict()) for m in sent]
    assert [_text(m.to_dict()) for m in again.load_turns("s")[-1].messages] == [_text(m.to_dict()) for m in sent]
    assert _text(again.events("s")[-1].payload) == _text({"exact": value, "first": 1.0})
    created = again.events("s")[0]
    assert _text(created.payload["metadata"]) == _text(value)
    (summary,) = again.list_sessions()
    assert _text(summary.metadata) == _text(value)
    # the metadata filter compares the value's JSON text: the same answer on every store
    assert [s.session_id for s in again.list_sessions(metadata={"a" if "nul" in value else "f16": "1e+16"})] == ["s"]
    assert again.list_sessions(metadata={"f16": "10000000000000000", "a": "10000000000000000"}) == []
    assert [s.session_id for s in again.list_sessions(metadata={"zeta": "1"})] == ["s"]


def test_fork_origins_and_agent_versions_keep_their_order(make_store: Callable[..., BaseSessionStore]) -> None:
    store = make_store()
    for name in ("Zeta-Support", "A"):  # the longer name first: a store that sorts keys shows it
        agent = Agent(name=name, instructions="Help", model="m1")
        ctx = store.get_or_create("s", agent)
        ctx.add_message(Message.user(f"to {name}"))
        ctx.note_agent_version(agent)
        ctx.add_message(Message.model("ok", agent=agent.name, agent_version=agent.version))
        ctx.complete_turn("ok", agent, agent_version=agent.version)
        store.save(ctx)
    store.fork("s", 1, into="f")
    again = make_store()
    versions = again.session_summary("s").agent_versions
    assert [(name, list(entry)) for name, entry in versions.items()] == [
        ("Zeta-Support", ["version", "turn"]), ("A", ["version", "turn"])]
    assert list(again.session_summary("f").forked_from or {}) == ["session_id", "turn", "seq"]


# -- agents ----------------------------------------------------------------------------------


def test_agent_resolver_and_fallback(any_store: BaseSessionStore, caplog: pytest.LogCaptureFixture) -> None:
    billing = Agent(name="Billing", instructions="Billing specialist", model="gpt-4o")
    support = Agent(name="Support", instructions="Support", handoffs=[billing], model="gpt-4o")
    ctx = any_store.get_or_create("s", support)
    ctx.set_active_agent(billing, tool_call_id="call_1")
    any_store.save(ctx)
    with caplog.at_level(logging.WARNING, logger="chatflow_cli.core.memory"):
        fallback = any_store.get("s")
    assert fallback is not None and fallback.active_agent.name == "Billing"
    assert fallback.active_agent is not billing and not fallback.active_agent.tools
    assert any("Billing" in r.getMessage() and "fallback" in r.getMessage() for r in caplog.records)
    any_store.set_agent_resolver(lambda name: billing if name == "Billing" else support)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="chatflow_cli.core.memory"):
        resolved = any_store.get("s")
    assert resolved is not None and resolved.active_agent is billing
    assert caplog.records == []
    any_store.set_agent_resolver(lambda name: None)
    with caplog.at_level(logging.WARNING, logger="chatflow_cli.core.memory"):
        unknown = any_store.get("s")
    assert unknown is not None and unknown.active_agent.name == "Billing" and caplog.records


# -- de-duplication --------------------------------------------------------------------------


def test_dedup_ttl_boundary_and_purge(any_store: BaseSessionStore, clock: FakeClock) -> None:
    assert DEFAULT_DEDUP_TTL_HOURS == 192
    t0 = clock.now
    assert not any_store.is_message_processed("wamid.A")
    any_store.mark_message_processed("wamid.A")
    assert any_store.is_message_processed("wamid.A")
    clock.now = t0 + 192 * HOUR - 0.001
    assert any_store.is_message_processed("wamid.A")
    assert any_store.claim_message("wamid.A") is False
    clock.now = t0 + 192 * HOUR  # now < processed_at + 192 h no longer holds
    assert not any_store.is_message_processed("wamid.A")
    any_store.mark_message_processed("wamid.B")  # purges expired records
    clock.now = t0  # were A still stored, it would count again at its own time
    assert not any_store.is_message_processed("wamid.A")
    clock.now = t0 + 2 * 192 * HOUR - 1
    assert any_store.is_message_processed("wamid.B")


def test_claim_message_once_then_again_after_expiry(any_store: BaseSessionStore, clock: FakeClock) -> None:
    assert any_store.claim_message("MSG-0001") is True
    assert any_store.claim_message("MSG-0001") is False
    assert any_store.is_message_processed("MSG-0001")
    clock.advance(192 * HOUR)
    assert any_store.claim_message("MSG-0001") is True
    assert any_store.claim_message("MSG-0001") is False


def test_release_message_lets_a_failed_delivery_be_claimed_again(any_store: BaseSessionStore) -> None:
    assert any_store.claim_message("MSG-0002") is True
    assert any_store.release_message("MSG-0002") is True  # the turn failed: not processed after all
    assert not any_store.is_message_processed("MSG-0002")
    assert any_store.claim_message("MSG-0002") is True  # the redelivery runs
    assert any_store.claim_message("MSG-0002") is False
    assert any_store.release_message("MSG-0003") is False  # never claimed
    assert asyncio.run(any_store.arelease_message("MSG-0002")) is True


@pytest.mark.parametrize("bad", [None, 5, 5.0, b"wamid.A", "", ["x"]])
@pytest.mark.parametrize("method", ["is_message_processed", "mark_message_processed", "claim_message", "release_message"])
def test_dedup_refuses_ids_that_are_not_non_empty_strings(any_store: BaseSessionStore, method: str, bad: object) -> None:
    with pytest.raises(TypeError, match="message_id"):
        getattr(any_store, method)(bad)
    with pytest.raises(TypeError, match="message_id"):
        asyncio.run(getattr(any_store, "a" + method)(bad))
    assert any_store.claim_message("5") is True  # nothing was recorded for the refused ids
    assert any_store.claim_message("5") is False


# -- async twins -----------------------------------------------------------------------------


def test_async_twins(any_store: BaseSessionStore, agent: Agent) -> None:
    async def main() -> None:
        ctx = await any_store.aget_or_create("s", agent)
        assert await any_store.aget("absent") is None
        add_turn(ctx, 1)
        saved = await any_store.asave(ctx)
        assert saved[-1].type == "turn.completed"
        start = await any_store.abegin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=Owner.current())
        start.session.add_message(Message.model(None, [ToolCall("c", "custom")]))
        await any_store.arelease(start.session)
        assert await any_store.asubmit_tool_result("s", "c", "done") == []
        event = await any_store.aappend_event("s", "note", {"n": 1}, idempotency_key="k")
        assert (await any_store.aevents("s", after_seq=event.seq - 1)) == [event]
        assert await any_store.alast_seq("s") == event.seq
        assert [s.session_id for s in await any_store.alist_sessions()] == ["s"]
        assert await any_store.alatest_session_id() == "s"
        assert [r.number for r in await any_store.aload_turns("s")] == [1, 2]
        await any_store.arollback("s", 1)
        assert not await any_store.ais_message_processed("m")
        await any_store.amark_message_processed("m")
        assert await any_store.ais_message_processed("m")
        assert await any_store.aclaim_message("m2") is True
        assert await any_store.aclaim_message("m2") is False
        assert await any_store.adelete("s") is True

    asyncio.run(main())


def test_an_async_twin_runs_the_method_the_store_has_now(any_store: BaseSessionStore, agent: Agent) -> None:
    """A twin calls its method by name on the store, so a backend's override (PostgreSQL's
    ``begin_turn`` holding the turn's lease) is what ``await store.a<name>(...)`` runs."""
    calls: list[str] = []
    own_begin, own_save = any_store.begin_turn, any_store.save

    def begin_turn(session_id: str, **kwargs: Any) -> TurnStart:
        calls.append("begin_turn")
        return own_begin(session_id, **kwargs)

    def save(session: SessionContext) -> list[Event]:
        calls.append("save")
        return own_save(session)

    any_store.begin_turn = begin_turn  # type: ignore[method-assign]
    any_store.save = save  # type: ignore[method-assign]

    async def main() -> None:
        start = await any_store.abegin_turn("s", default_agent=agent, user_message=Message.user("q"),
                                            owner=Owner.current())
        start.session.add_message(Message.model("a"))
        start.session.complete_turn("a")
        await any_store.asave(start.session)

    asyncio.run(main())
    assert calls == ["begin_turn", "save"]
    assert [r.number for r in any_store.load_turns("s")] == [1]


# -- threads -----------------------------------------------------------------------------------


def test_threads_claim_once_and_share_the_event_log(any_store: BaseSessionStore, agent: Agent) -> None:
    import threading

    any_store.get_or_create("t", agent)
    barrier = threading.Barrier(8)
    claims: list[bool] = []
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            claims.append(any_store.claim_message("MSG-0001"))
            for n in range(10):
                any_store.append_event("t", "note", {"i": i, "n": n})
        except Exception as exc:  # noqa: BLE001  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(claims) == [False] * 7 + [True]
    assert all_seqs(any_store, "t") == list(range(1, 82))


# -- message claims: holder, turn, state -----------------------------------------------------


class _Child:
    """A live process to stand for another worker; ``kill()`` makes it a dead holder/owner."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        self.owner = Owner.of_process(self.proc.pid)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def child() -> Iterator[_Child]:
    made = _Child()
    yield made
    made.kill()


def _claim_token(store: BaseSessionStore) -> str:
    from chatflow_cli.core.memory import take_context_claim

    claim = take_context_claim(store)
    assert claim is not None
    return claim[1]


def test_a_claim_records_its_holder_and_is_free_again_once_the_holder_dies(
    any_store: BaseSessionStore, child: _Child
) -> None:
    assert any_store.message_state("wamid.K") is MessageState.NEW
    assert any_store.claim_message("wamid.K", owner=child.owner) is True
    assert any_store.message_state("wamid.K") is MessageState.IN_PROGRESS
    assert any_store.is_message_processed("wamid.K", wait=0)  # a live holder's claim, no wait: skip it
    assert any_store.claim_message("wamid.K") is False
    any_store.mark_message_processed("wamid.K")  # the seed's pair: leaves the live holder's claim alone
    assert any_store.message_state("wamid.K") is MessageState.IN_PROGRESS
    child.kill()  # the worker died before it answered
    assert any_store.message_state("wamid.K") is MessageState.NEW
    assert not any_store.is_message_processed("wamid.K")
    assert any_store.claim_message("wamid.K") is True  # the redelivery runs
    assert asyncio.run(any_store.amessage_state("wamid.K")) is MessageState.IN_PROGRESS


def _watch_in_progress(store: BaseSessionStore) -> threading.Event:
    """An event set once a look at a message's state finds it in progress (the check is waiting)."""
    import threading

    seen = threading.Event()
    real = store.message_state

    def watched(message_id: str) -> MessageState:
        state = real(message_id)
        if state is MessageState.IN_PROGRESS:
            seen.set()
        return state

    store.message_state = watched  # type: ignore[method-assign]
    return seen


def test_is_message_processed_waits_for_another_process_until_its_holder_dies(
    any_store: BaseSessionStore, child: _Child
) -> None:
    """A duplicate delivery checked while another worker holds the id waits: the worker was
    killed before it answered, so the answer is False and this delivery runs the message."""
    import threading

    assert any_store.claim_message("wamid.W", owner=child.owner) is True
    answers: list[bool] = []
    seen = _watch_in_progress(any_store)
    checker = threading.Thread(target=lambda: answers.append(any_store.is_message_processed("wamid.W", wait=60)))
    checker.start()
    assert seen.wait(30)  # the check found the worker on it
    child.kill()
    checker.join(90)
    assert answers == [False]
    assert any_store.claim_message("wamid.W") is True


def test_is_message_processed_waits_for_another_process_until_it_is_processed(
    any_store: BaseSessionStore, child: _Child
) -> None:
    import threading

    assert any_store.claim_message("wamid.P", owner=child.owner) is True
    answers: list[bool] = []
    seen = _watch_in_progress(any_store)
    checker = threading.Thread(target=lambda: answers.append(any_store.is_message_processed("wamid.P", wait=60)))
    checker.start()
    assert seen.wait(30)
    any_store.complete_message("wamid.P")  # the holder answered
    checker.join(90)
    assert answers == [True]


def test_is_message_processed_waits_at_most_wait_seconds_for_a_live_holder(
    any_store: BaseSessionStore, child: _Child
) -> None:
    """A live worker still on it after ``wait`` seconds: skip (True), and the claim is untouched."""
    import time

    assert any_store.claim_message("wamid.L", owner=child.owner) is True
    started = time.monotonic()
    assert any_store.is_message_processed("wamid.L", wait=0.3) is True
    assert time.monotonic() - started >= 0.3
    assert asyncio.run(any_store.ais_message_processed("wamid.L", wait=0.3)) is True
    assert any_store.message_state("wamid.L") is MessageState.IN_PROGRESS
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            any_store.is_message_processed("wamid.L", wait=bad)


def test_ais_message_processed_waits_for_another_process_without_blocking_the_loop(
    any_store: BaseSessionStore, child: _Child
) -> None:
    assert any_store.claim_message("wamid.A2", owner=child.owner) is True
    seen = _watch_in_progress(any_store)

    async def main() -> bool:
        check = asyncio.create_task(any_store.ais_message_processed("wamid.A2", wait=60))
        while not seen.is_set():  # the loop runs other tasks meanwhile: this one kills the holder
            assert not check.done()
            await asyncio.sleep(0.01)
        await asyncio.to_thread(child.kill)
        return await check

    assert asyncio.run(main()) is False


def test_is_message_processed_answers_at_once_for_a_claim_held_in_this_process(any_store: BaseSessionStore) -> None:
    """The holder is a thread or task of this process (a blocking wait would deadlock its event
    loop); a failed turn frees the claim and its own delivery is delivered again."""
    assert any_store.claim_message("wamid.S") is True
    assert any_store.is_message_processed("wamid.S", wait=3600) is True
    assert asyncio.run(any_store.ais_message_processed("wamid.S", wait=3600)) is True
    assert any_store.release_message("wamid.S") is True  # its processing failed
    assert any_store.is_message_processed("wamid.S", wait=3600) is False


def test_a_claimed_turn_completes_the_claim_when_it_completes(
    any_store: BaseSessionStore, agent: Agent, clock: FakeClock
) -> None:
    assert any_store.claim_message("wamid.C") is True
    start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current(),
                             message_id="wamid.C", message_claim=_claim_token(any_store))
    assert any_store.message_state("wamid.C") is MessageState.IN_PROGRESS
    t0 = clock.now
    _finish(any_store, start.session, agent, "hello")
    assert any_store.message_state("wamid.C") is MessageState.PROCESSED  # in the turn.completed transaction
    clock.now = t0 + 192 * HOUR - 0.001
    assert any_store.is_message_processed("wamid.C")
    clock.now = t0 + 192 * HOUR
    assert any_store.message_state("wamid.C") is MessageState.NEW


@pytest.mark.parametrize("ending", ["failed", "interrupted"])
def test_a_claimed_turn_that_fails_or_is_interrupted_frees_the_claim(
    any_store: BaseSessionStore, agent: Agent, ending: str
) -> None:
    start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current(),
                             message_id="wamid.F")
    ctx = start.session
    if ending == "failed":
        ctx.fail_turn(RuntimeError("provider down"))
    else:
        ctx.interrupt_turn("cancelled")
    any_store.release(ctx)
    assert any_store.message_state("wamid.F") is MessageState.NEW
    assert any_store.claim_message("wamid.F") is True


def test_a_processed_message_id_replays_its_turn_and_writes_nothing(
    any_store: BaseSessionStore, agent: Agent
) -> None:
    start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("where is 404?"),
                             owner=Owner.current(), message_id="wamid.R")
    _finish(any_store, start.session, agent, "in transit")
    seq = any_store.last_seq("s")
    again = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("where is 404?"),
                             owner=Owner.current(), message_id="wamid.R")
    assert again.replayed is not None
    assert again.replayed["outcome"] == "completed" and again.replayed["content"] == "in transit"
    assert again.turn == 1 and any_store.last_seq("s") == seq


def test_a_message_id_another_live_holder_runs_is_busy_until_the_holder_dies(
    any_store: BaseSessionStore, agent: Agent, child: _Child
) -> None:
    assert any_store.claim_message("wamid.B", owner=child.owner)
    with pytest.raises(SessionBusyError, match="wamid.B' is being processed by pid"):
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current(),
                         message_id="wamid.B")
    child.kill()
    start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current(),
                             message_id="wamid.B")
    assert start.replayed is None and start.turn == 1


def test_complete_message_marks_an_id_handled_without_a_turn(any_store: BaseSessionStore) -> None:
    assert any_store.claim_message("wamid.M") is True
    any_store.complete_message("wamid.M")
    assert any_store.message_state("wamid.M") is MessageState.PROCESSED


def _dead_keyed_turn(store: BaseSessionStore, agent: Agent, child: _Child, **key: str) -> None:
    """A turn started under an idempotency key or message id by ``child``, which then dies mid-reply."""
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("refund order 7"),
                             owner=child.owner, **key)
    ctx = start.session
    ctx.add_message(Message.model(None, [ToolCall("call_r", "refund")]))
    store.save(ctx)
    child.kill()


@pytest.mark.parametrize("key", [{"idempotency_key": "k-7"}, {"message_id": "wamid.7"}])
def test_a_retry_after_the_owner_died_recovers_first_and_replaces_the_attempt(
    any_store: BaseSessionStore, agent: Agent, child: _Child, key: dict[str, str]
) -> None:
    _dead_keyed_turn(any_store, agent, child, **key)
    retry = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("refund order 7"),
                             owner=Owner.current(), **key)
    assert retry.replayed is None, "the retry runs the turn again"
    types = [e.type for e in retry.events]
    # one ending for the dead attempt: turn.failed takes it out of the window, no turn.interrupted too
    assert types[:2] == ["turn.failed", "session.recovered"], types
    assert types[-1] == "message.user"
    assert retry.turn == 1
    users = [m.content for m in retry.session.history if m.role is Role.USER]
    assert users == ["refund order 7"], "the retry replaces the interrupted attempt in the window"
    logged = [e for e in any_store.events("s") if e.type == "message.user"]
    assert len(logged) == 2, "the log keeps both attempts"
    assert history_problems(retry.session.history, pending_ok=True) == []
    endings = [e for e in any_store.events("s") if e.type in ("turn.completed", "turn.failed", "turn.interrupted")]
    assert [(e.type, e.payload["turn"], e.payload["error_type"]) for e in endings] == [
        ("turn.failed", 1, "TurnOwnerDied")], "the dead attempt has one ending"


def test_a_redelivery_claimed_again_before_its_turn_recovers_replaces_the_attempt(
    any_store: BaseSessionStore, agent: Agent, child: _Child
) -> None:
    """claim_message, then the turn: the new claim (the dead holder's is free) keeps naming the
    dead attempt, so the turn's recovery still takes that attempt out of the window."""
    _dead_keyed_turn(any_store, agent, child, message_id="wamid.9")
    assert any_store.claim_message("wamid.9") is True
    retry = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("refund order 7"),
                             owner=Owner.current(), message_id="wamid.9", message_claim=_claim_token(any_store))
    assert [m.content for m in retry.session.history if m.role is Role.USER] == ["refund order 7"]
    _finish(any_store, retry.session, agent, "refunded")
    assert any_store.message_state("wamid.9") is MessageState.PROCESSED


def test_another_message_after_a_keyed_turn_died_and_then_its_retry(
    any_store: BaseSessionStore, agent: Agent, child: _Child
) -> None:
    _dead_keyed_turn(any_store, agent, child, idempotency_key="k-7")
    other = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("hello?"), owner=Owner.current())
    _finish(any_store, other.session, agent, "hi")
    retry = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("refund order 7"),
                             owner=Owner.current(), idempotency_key="k-7")
    assert retry.replayed is None
    _finish(any_store, retry.session, agent, "refunded")
    window = any_store.get("s")
    assert window is not None
    assert [m.content for m in window.history if m.role is Role.USER] == ["hello?", "refund order 7"]
    assert [t.number for t in window.turns] == [1, 2]
    assert history_problems(window.history) == []


# -- turns waiting for a busy session ---------------------------------------------------------


def test_waiting_turns_start_in_arrival_order(any_store: BaseSessionStore, agent: Agent, child: _Child) -> None:
    running = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("first"), owner=Owner.current())
    late, later = Owner.current(), Owner.current()
    first = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("second"), owner=late,
                             enqueue=True)
    second = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("third"), owner=later,
                              enqueue=True)
    dead = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("never"), owner=child.owner,
                            enqueue=True)
    assert first.queued is not None and second.queued is not None and dead.queued is not None
    assert first.queued < second.queued < dead.queued and first.turn == 0
    seq = any_store.last_seq("s")
    assert seq == running.events[-1].seq, "queueing writes no event"
    _finish(any_store, running.session, agent, "one")
    with pytest.raises(SessionBusyError, match="1 earlier turn"):  # a newcomer queues behind them all
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("newcomer"), owner=Owner.current(),
                         ticket=second.queued)
    with pytest.raises(SessionBusyError):
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("newcomer"), owner=Owner.current())
    go = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("second"), owner=late,
                          ticket=first.queued)
    assert go.turn == 2
    _finish(any_store, go.session, agent, "two")
    child.kill()  # a dead waiter's ticket is skipped
    go = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("third"), owner=later,
                          ticket=second.queued)
    assert go.turn == 3
    _finish(any_store, go.session, agent, "three")
    start = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("newcomer"), owner=Owner.current())
    assert start.turn == 4


def test_leaving_the_queue_lets_the_next_waiter_start(any_store: BaseSessionStore, agent: Agent) -> None:
    running = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("first"), owner=Owner.current())
    gone = any_store.begin_turn("s", default_agent=agent, user_message=Message.user("x"), owner=Owner.current(),
                            enqueue=True)
    _finish(any_store, running.session, agent, "one")
    assert gone.queued is not None
    any_store.leave_turn_queue("s", gone.queued)
    assert any_store.begin_turn("s", default_agent=agent, user_message=Message.user("y"), owner=Owner.current()).turn == 2


# -- the model endpoint stored with a session ---------------------------------------------
def test_session_endpoint_round_trip_and_goes_with_the_session(
        any_store: BaseSessionStore, agent: Agent, make_store: Callable[..., BaseSessionStore]) -> None:
    any_store.get_or_create("s", agent)
    assert any_store.session_endpoint("s") == (None, None)
    any_store.set_session_endpoint("s", "fake-model", "http://127.0.0.1:9/v1")
    assert any_store.session_endpoint("s") == ("fake-model", "http://127.0.0.1:9/v1")
    assert make_store().session_endpoint("s") == ("fake-model", "http://127.0.0.1:9/v1")  # SQLite: reopened file
    any_store.set_session_endpoint("s", "other", None)  # /model other: replaces both values
    assert any_store.session_endpoint("s") == ("other", None)
    assert asyncio.run(any_store.asession_endpoint("s")) == ("other", None)
    asyncio.run(any_store.aset_session_endpoint("s", "m3", "http://h/v1"))
    assert any_store.session_endpoint("s") == ("m3", "http://h/v1")
    assert any_store.delete("s") is True
    any_store.get_or_create("s", agent)  # a new incarnation starts with nothing stored
    assert any_store.session_endpoint("s") == (None, None)


def test_a_base_url_password_is_never_stored_and_an_old_one_never_read_back(
        any_store: BaseSessionStore, agent: Agent) -> None:
    any_store.get_or_create("s", agent)
    any_store.set_session_endpoint("s", "m", "http://bot:S3cretPw@127.0.0.1:9/v1")
    assert any_store.session_endpoint("s") == ("m", "http://127.0.0.1:9/v1")
    with any_store._read() as tx:  # what the store holds, not only what it gives back
        assert tx.endpoint_get("s") == ("m", "http://127.0.0.1:9/v1")
    # a row written before passwords were left out: redacted on every read, and not copied by fork
    with any_store._write() as tx:
        tx.endpoint_put("s", "m", "https://bot:Old@Pw9@h.example:8443/v1?x=1", 0.0)
    assert any_store.session_endpoint("s") == ("m", "https://h.example:8443/v1?x=1")
    assert asyncio.run(any_store.asession_endpoint("s")) == ("m", "https://h.example:8443/v1?x=1")
    forked = any_store.fork("s")
    with any_store._read() as tx:
        assert tx.endpoint_get(forked.session_id) == ("m", "https://h.example:8443/v1?x=1")


def test_session_endpoint_refuses_unknown_sessions_and_bad_values(any_store: BaseSessionStore, agent: Agent) -> None:
    with pytest.raises(SessionNotFoundError):
        any_store.session_endpoint("absent")
    with pytest.raises(SessionNotFoundError):
        any_store.set_session_endpoint("absent", "m", None)
    any_store.get_or_create("s", agent)
    with pytest.raises(TypeError):
        any_store.set_session_endpoint("s", 5, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        any_store.set_session_endpoint("s", "m" * 2049, None)
    assert any_store.session_endpoint("s") == (None, None)  # nothing written by a refused call


def test_preview_of_a_session_whose_first_turn_failed_is_the_failed_message(
        any_store: BaseSessionStore, agent: Agent) -> None:
    ctx = any_store.get_or_create("s", agent)
    ctx.add_message(Message.user("first try"))
    ctx.fail_turn(RuntimeError("bad key"))
    any_store.save(ctx)
    ctx.add_message(Message.user("second try"))
    ctx.fail_turn(RuntimeError("bad key"))
    any_store.save(ctx)
    [summary] = any_store.list_sessions()
    assert summary.turn_count == 0 and summary.preview == "second try"  # the newest failed message
    add_turn(ctx, "ok")
    any_store.save(ctx)
    assert any_store.list_sessions()[0].preview == "uok"  # a live first turn wins
    any_store.rollback("s", 0)
    assert any_store.list_sessions()[0].preview == "second try"  # rolled back is not failed: never shown
