"""One contract suite, run against both stores (in-memory and SQLite on a real file).

Everything here is behaviour a caller may rely on whatever the store: windows, turn
numbers, rollback, the event log, idempotency, status and owners, de-duplication, agent
resolution, deletion, async twins.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import threading
import sys
from collections.abc import Callable, Iterator

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
from chatflow_cli.core.events import EventType, SessionStatus
from chatflow_cli.core.memory import (
    DEFAULT_DEDUP_TTL_HOURS,
    INTERRUPTED_TOOL_RESULT,
    BaseSessionStore,
    MessageState,
    Owner,
    SessionContext,
    SessionStore,
)
from chatflow_cli.core.messages import Message, Role, ToolCall, history_problems
from chatflow_cli.core.sqlite_store import SQLiteSessionStore

from .conftest import FakeClock

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


def test_max_turns_validated_per_session(store: BaseSessionStore, agent: Agent) -> None:
    with pytest.raises(ValueError):
        store.get_or_create("s", agent, max_turns=0)
    with pytest.raises(TypeError):
        store.get_or_create("s", agent, max_turns=2.5)  # type: ignore[arg-type]
    assert store.get("s") is None


@pytest.mark.parametrize("bad", [2**70, 1_000_001])
def test_huge_max_turns_refused_the_same_everywhere(store: BaseSessionStore, agent: Agent, bad: int) -> None:
    with pytest.raises(ValueError, match="at most 1,000,000"):
        SessionContext("s", agent, max_turns=bad)
    with pytest.raises(ValueError, match="at most 1,000,000"):
        store.get_or_create("s", agent, max_turns=bad)
    with pytest.raises(ValueError, match="at most 1,000,000"):
        store.begin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=Owner.current(), max_turns=bad)
    assert store.get("s") is None
    assert store.get_or_create("s", agent, max_turns=1_000_000).max_turns == 1_000_000
    assert store.get("s").max_turns == 1_000_000


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


def test_get_absent_is_none_and_get_or_create_creates_once(store: BaseSessionStore, agent: Agent) -> None:
    assert store.get("nope") is None
    ctx = store.get_or_create("s1", agent, metadata={"channel": "whatsapp"})
    assert ctx.session_id == "s1" and ctx.active_agent is agent and ctx.metadata == {"channel": "whatsapp"}
    again = store.get_or_create("s1", agent, metadata={"channel": "other"})
    assert again.metadata == {"channel": "whatsapp"}
    events = store.events("s1")
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


def test_store_rollback_validates_and_changes_nothing(store: BaseSessionStore, agent: Agent) -> None:
    ctx = store.get_or_create("s", agent)
    add_turn(ctx, 1)
    store.save(ctx)
    before = store.events("s")
    with pytest.raises(ValueError):
        store.rollback("s", 2)
    with pytest.raises(ValueError):
        store.rollback("s", -1)
    with pytest.raises(SessionNotFoundError):
        store.rollback("absent", 0)
    assert store.events("s") == before


def test_rollback_is_atomic(store: BaseSessionStore, agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = store.get_or_create("s", agent)
    for n in range(1, 4):
        add_turn(ctx, n)
    store.save(ctx)
    before_events = store.events("s")
    before_history = store.get("s").history  # type: ignore[union-attr]
    ctx.rollback_to(1)
    ctx.add_message(Message.user("after"))
    real_append = BaseSessionStore._append

    def failing_append(self, tx, session_id, type, payload, turn=None, key=None):
        if type == EventType.MESSAGE_USER.value:  # after the rollback was applied in the transaction
            raise OSError("simulated failure inside the transaction")
        return real_append(self, tx, session_id, type, payload, turn, key)

    monkeypatch.setattr(BaseSessionStore, "_append", failing_append)
    with pytest.raises(OSError):
        store.save(ctx)
    monkeypatch.undo()
    assert store.events("s") == before_events
    reloaded = store.get("s")
    assert reloaded is not None and reloaded.history == before_history and reloaded.turn_count == 3
    # the journal was kept: saving again applies it whole
    store.save(ctx)
    assert [t.number for t in store.get("s").turns] == [1, 2]  # type: ignore[union-attr]


def test_load_turns_marks_window_rollback_and_failure(store: BaseSessionStore, agent: Agent) -> None:
    ctx = store.get_or_create("s", agent, max_turns=2)
    ctx.add_message(Message.system("sys"))
    for n in range(1, 5):
        add_turn(ctx, n)
    ctx.rollback_to(3)
    ctx.add_message(Message.user("u4b"))
    ctx.fail_turn(RuntimeError("provider down"))
    store.save(ctx)
    live = store.load_turns("s")
    assert [(r.number, r.in_window) for r in live] == [(1, False), (2, True), (3, True)]
    everything = store.load_turns("s", first=0, include_rolled_back=True)
    flags = [(r.number, r.messages[0].content, r.rolled_back, r.failed) for r in everything]
    assert flags == [
        (0, "sys", False, False),
        (1, "u1", False, False),
        (2, "u2", False, False),
        (3, "u3", False, False),
        (4, "u4", True, False),
        (4, "u4b", False, True),
    ]
    assert [r.number for r in store.load_turns("s", first=2, last=2)] == [2]
    with pytest.raises(SessionNotFoundError):
        store.load_turns("absent")


def test_list_sessions_and_latest(store: BaseSessionStore, agent: Agent, clock: FakeClock) -> None:
    other = Agent(name="Billing", instructions="Billing")
    assert store.list_sessions() == [] and store.latest_session_id() is None
    for i, sid in enumerate(["a", "b", "c"]):
        clock.advance(10)
        ctx = store.get_or_create(sid, other if sid == "b" else agent)
        add_turn(ctx, "x" * 100 if sid == "a" else sid)
        store.save(ctx)
    clock.advance(10)
    ctx = store.get("a")
    assert ctx is not None
    ctx.update_metadata({"k": 1})
    store.save(ctx)
    summaries = store.list_sessions()
    assert [s.session_id for s in summaries] == ["a", "c", "b"]
    assert summaries[0].preview == ("u" + "x" * 100)[:80] and summaries[0].metadata == {"k": 1}
    assert summaries[0].turn_count == 1 and summaries[0].status is SessionStatus.IDLE
    assert store.latest_session_id() == "a"
    assert [s.session_id for s in store.list_sessions(agent="Billing")] == ["b"]
    assert len(store.list_sessions(limit=2)) == 2
    assert store.list_sessions(status="running") == []


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


def test_seq_restarts_at_1_for_a_new_incarnation_of_a_deleted_id(store: BaseSessionStore, agent: Agent) -> None:
    old = store.get_or_create("s", agent)
    add_turn(old, 1)
    store.save(old)
    assert store.last_seq("s") > 1
    assert store.delete("s") is True
    again = store.get_or_create("s", agent)
    assert [(e.seq, e.type) for e in store.events("s")] == [(1, "session.created")]
    add_turn(old, 2)
    with pytest.raises(SessionDeletedError):  # the old incarnation never writes into the new one
        store.save(old)
    assert store.last_seq("s") == 1 and again.turn_count == 0


def test_events_cover_every_kind_of_change(store: BaseSessionStore, agent: Agent) -> None:
    ctx = store.get_or_create("s", agent)
    ctx.add_message(Message.system("sys"))
    add_turn(ctx, 1, tool=True)
    ctx.set_active_agent(Agent(name="Billing", instructions=""), tool_call_id="call_h")
    ctx.update_metadata({"ticket": "tk_123"})
    ctx.set_status(SessionStatus.RESCHEDULED, "rate limited", retry_at=5.0)
    ctx.record_event(EventType.TOOL_PENDING, {"turn": 1, "tool_use_ids": []})
    events = store.save(ctx)
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
    assert store.events("s")[1:] == events
    loaded = store.get("s")
    assert loaded is not None and loaded.status is SessionStatus.RESCHEDULED
    assert loaded.metadata == {"ticket": "tk_123"}


def test_append_event_idempotency(store: BaseSessionStore, agent: Agent) -> None:
    store.get_or_create("s", agent)
    first = store.append_event("s", "custom.note", {"a": 1}, idempotency_key="k1")
    assert first.idempotency_key == "k1"
    assert store.append_event("s", "custom.note", {"a": 1}, idempotency_key="k1") == first
    with pytest.raises(IdempotencyConflictError):
        store.append_event("s", "custom.note", {"a": 2}, idempotency_key="k1")
    assert [e.type for e in store.events("s")] == ["session.created", "custom.note"]
    with pytest.raises(SessionNotFoundError):
        store.append_event("absent", "x", {})


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
def test_append_event_refuses_reserved_types(store: BaseSessionStore, agent: Agent, kind: object, method: str) -> None:
    store.get_or_create("s", agent)
    before = store.events("s")
    with pytest.raises(UsageError, match=method):
        store.append_event("s", kind, {"status": "terminated", "to_turn": 0})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="reserved"):
        asyncio.run(store.aappend_event("s", kind, {}))  # type: ignore[arg-type]
    assert store.events("s") == before
    loaded = store.get("s")
    assert loaded is not None and loaded.status is SessionStatus.IDLE


def test_custom_event_types_are_accepted_and_type_must_be_a_string(store: BaseSessionStore, agent: Agent) -> None:
    store.get_or_create("s", agent)
    for kind in ("note", "billing.refund", "statusx", "custom.status", "tooling.x"):
        assert store.append_event("s", kind, {"n": 1}).type == kind
    for bad in ("", None, 3):
        with pytest.raises(TypeError):
            store.append_event("s", bad, {})  # type: ignore[arg-type]


def test_record_event_refuses_reserved_types_that_change_state(agent: Agent) -> None:
    ctx = SessionContext("s", agent)
    for kind in ("status", "rollback", "handoff", "message.user", "tool.result", "turn.failed", "metadata.updated"):
        with pytest.raises(UsageError, match="reserved"):
            ctx.record_event(kind, {})
    ctx.record_event(EventType.TOOL_PENDING, {"turn": 0, "tool_use_ids": []})
    ctx.record_event("note", {})
    assert [e.type for e in ctx.events] == ["tool.pending", "note"]


# -- begin_turn, owners, status ---------------------------------------------------------------


def test_running_turn_pid_names_the_running_owner_only_while_a_turn_runs(store: BaseSessionStore,
                                                                         agent: Agent) -> None:
    import os

    assert store.running_turn_pid("s") is None  # no session
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current())
    assert store.running_turn_pid("s") == os.getpid()
    waiting = store.begin_turn("s", default_agent=agent, user_message=Message.user("next"), owner=Owner.current(),
                               enqueue=True)
    assert waiting.queued is not None and store.running_turn_pid("s") == os.getpid()
    store.leave_turn_queue("s", waiting.queued)
    start.session.add_message(Message.model("hello", agent="Assistant"))
    start.session.complete_turn("hello", agent, {})
    store.release(start.session)
    assert store.running_turn_pid("s") is None


def test_begin_turn_creates_claims_and_releases(store: BaseSessionStore, agent: Agent) -> None:
    owner = Owner.current()
    start = store.begin_turn(
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
    assert store.list_sessions()[0].status is SessionStatus.RUNNING
    with pytest.raises(SessionBusyError):
        store.begin_turn("s", default_agent=agent, user_message=Message.user("again"), owner=Owner.current())
    ctx = start.session
    ctx.add_message(Message.model("hello", agent="Assistant"))
    ctx.complete_turn("hello", agent, {"prompt_tokens": 3})
    store.release(ctx)
    assert store.list_sessions()[0].status is SessionStatus.IDLE
    second = store.begin_turn("s", default_agent=agent, user_message=Message.user("more"), owner=owner)
    assert second.turn == 2 and second.session.metadata == {"channel": "cli"}


def _window_loads(store: BaseSessionStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the store's context-window queries (``_Tx.window`` of its transaction class)."""
    from chatflow_cli.core.memory import _MemoryTx
    from chatflow_cli.core.sqlite_store import _SQLiteTx

    tx_class: type = _SQLiteTx if isinstance(store, SQLiteSessionStore) else _MemoryTx
    if type(store).__name__ == "PostgresSessionStore":
        from chatflow_cli.core.postgres_store import _PgTx

        tx_class = _PgTx
    calls: list[int] = []
    original = tx_class.window

    def window(self: object, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        calls.append(first_turn)
        return original(self, session_id, first_turn)

    monkeypatch.setattr(tx_class, "window", window)
    return calls


def _finish(store: BaseSessionStore, ctx: SessionContext, agent: Agent, text: str) -> None:
    ctx.add_message(Message.model(text, agent=agent.name))
    ctx.complete_turn(text, agent)
    store.release(ctx)


def test_begin_turn_loads_the_window_once(
    store: BaseSessionStore, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(1, 4):
        start = store.begin_turn("s", default_agent=agent, user_message=Message.user(f"q{n}"), owner=Owner.current())
        _finish(store, start.session, agent, f"a{n}")
    loads = _window_loads(store, monkeypatch)
    store.begin_turn("s", default_agent=agent, user_message=Message.user("q4"), owner=Owner.current())
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
    store.submit_tool_result("s", "c2", "found")
    store.submit_tool_result("s", "c1", "yes")
    resumed = store.begin_turn("s", default_agent=agent, user_message=None, owner=owner)
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


def test_case5_idempotency_key_with_begin_turn(store: BaseSessionStore, agent: Agent) -> None:
    msg = Message.user("Where is order 404?")
    start = store.begin_turn(
        "s", default_agent=agent, user_message=msg, owner=Owner.current(), idempotency_key="wamid.1"
    )
    running = store.begin_turn(
        "s", default_agent=agent, user_message=msg, owner=Owner.current(), idempotency_key="wamid.1"
    )
    assert running.replayed == {"turn": 1, "outcome": "running"} and running.events == []
    ctx = start.session
    ctx.add_message(Message.model("In transit.", agent="Assistant"))
    ctx.complete_turn("In transit.", agent)
    store.release(ctx)
    before = store.events("s")
    replay = store.begin_turn(
        "s", default_agent=agent, user_message=msg, owner=Owner.current(), idempotency_key="wamid.1"
    )
    assert replay.turn == 1
    assert replay.replayed == {
        "turn": 1,
        "agent": "Assistant",
        "content": "In transit.",
        "usage": {},
        "outcome": "completed",
    }
    assert store.events("s") == before
    assert [r.number for r in store.load_turns("s")] == [1]  # one stored turn
    with pytest.raises(IdempotencyConflictError):
        store.begin_turn(
            "s",
            default_agent=agent,
            user_message=Message.user("other"),
            owner=Owner.current(),
            idempotency_key="wamid.1",
        )
    assert store.events("s") == before


def test_custom_tool_results_then_continue(store: BaseSessionStore, agent: Agent) -> None:
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("approve?"), owner=Owner.current())
    ctx = start.session
    ctx.add_message(Message.model(None, [ToolCall("t1", "approve"), ToolCall("t2", "approve")]))
    ctx.record_event(EventType.TOOL_PENDING, {"turn": 1, "tool_use_ids": ["t1", "t2"]})
    store.release(ctx, reason="waiting for custom tool results")
    with pytest.raises(PendingToolCallsError) as err:
        store.begin_turn("s", default_agent=agent, user_message=Message.user("hello?"), owner=Owner.current())
    assert err.value.tool_use_ids == ["t1", "t2"]
    with pytest.raises(PendingToolCallsError):
        store.begin_turn("s", default_agent=agent, user_message=None, owner=Owner.current())
    with pytest.raises(ToolResultError):
        store.submit_tool_result("s", "nope", "x")
    assert store.submit_tool_result("s", "t2", "no") == ["t1"]
    with pytest.raises(ToolResultError):
        store.submit_tool_result("s", "t2", "again")
    with pytest.raises(PendingToolCallsError) as err:  # lists only the id still missing
        store.begin_turn("s", default_agent=agent, user_message=Message.user("hello?"), owner=Owner.current())
    assert err.value.tool_use_ids == ["t1"] and "t2" not in str(err.value)
    assert store.submit_tool_result("s", "t1", "yes") == []
    with pytest.raises(PendingToolCallsError, match="continue") as err:  # all in: the turn goes on first
        store.begin_turn("s", default_agent=agent, user_message=Message.user("hello?"), owner=Owner.current())
    assert err.value.tool_use_ids == [] and "t1" not in str(err.value)
    resumed = store.begin_turn("s", default_agent=agent, user_message=None, owner=Owner.current())
    tools = [m for m in resumed.session.history if m.role is Role.TOOL]
    assert [(m.tool_call_id, m.content) for m in tools] == [("t1", "yes"), ("t2", "no")]  # call order
    assert resumed.turn == 1 and resumed.session.pending_tool_calls == ()
    submitted = [e.payload for e in store.events("s") if e.type == "tool.result_submitted"]
    assert submitted == [
        {"turn": 1, "tool_use_id": "t2", "output": "no"},
        {"turn": 1, "tool_use_id": "t1", "output": "yes"},
    ]


def test_dead_owner_is_recovered(store: BaseSessionStore, agent: Agent) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        owner = Owner.of_process(child.pid)
        assert owner.alive()
        start = store.begin_turn("s", default_agent=agent, user_message=Message.user("slow job"), owner=owner)
        ctx = start.session
        ctx.add_message(Message.model(None, [ToolCall("call_x", "slow")]))
        store.save(ctx)
        with pytest.raises(SessionBusyError):
            store.begin_turn("s", default_agent=agent, user_message=Message.user("next"), owner=Owner.current())
        assert store.get("s").status is SessionStatus.RUNNING  # a live owner runs it
    finally:
        child.kill()
        child.wait()
    assert not owner.alive()
    seq = store.last_seq("s")
    # every read shows the effective status, and none writes anything
    assert store.list_sessions()[0].status is SessionStatus.IDLE
    assert store.get("s").status is SessionStatus.IDLE
    assert store.get_or_create("s", agent).status is SessionStatus.IDLE
    assert asyncio.run(store.aget("s")).status is SessionStatus.IDLE
    assert store.last_seq("s") == seq
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("next"), owner=Owner.current())
    types = [e.type for e in start.events]
    assert types == ["tool.result", "turn.interrupted", "session.recovered", "status", "status", "message.user"]
    assert start.events[2].payload["owner"]["pid"] == child.pid
    synthetic = [m for m in start.session.history if m.role is Role.TOOL]
    assert synthetic == [Message.tool("call_x", INTERRUPTED_TOOL_RESULT, name="slow", is_error=True, interrupted=True)]
    assert start.turn == 2 and history_problems(start.session.history, pending_ok=True) == []


def test_owner_detects_pid_reuse() -> None:
    me = Owner.current()
    assert me.alive()
    assert not Owner(me.pid, me.start_time + 1, me.host, "t").alive() or me.start_time == 0
    assert Owner(me.pid, me.start_time, "another-host", "t").alive()  # cannot be checked: assumed alive
    assert Owner.from_dict(me.to_dict()) == me


def test_terminated_refuses_writes(store: BaseSessionStore, agent: Agent) -> None:
    ctx = store.get_or_create("s", agent)
    add_turn(ctx, 1)
    store.release(ctx, SessionStatus.TERMINATED, "case closed")
    before = store.events("s")
    ctx.add_message(Message.user("more"))
    with pytest.raises(SessionTerminatedError):
        store.save(ctx)
    with pytest.raises(SessionTerminatedError):
        store.begin_turn("s", default_agent=agent, user_message=Message.user("x"), owner=Owner.current())
    with pytest.raises(SessionTerminatedError):
        store.append_event("s", "note", {})
    with pytest.raises(SessionTerminatedError):
        store.rollback("s", 0)
    with pytest.raises(SessionTerminatedError):
        store.get("s").set_status("idle")  # type: ignore[union-attr]
    assert store.events("s") == before
    assert store.get("s").status is SessionStatus.TERMINATED  # type: ignore[union-attr]


def test_session_deleted_error(store: BaseSessionStore, agent: Agent) -> None:
    ctx = store.get_or_create("s", agent, max_turns=1)
    for n in range(1, 4):
        add_turn(ctx, n)
    store.save(ctx)
    task_view = store.get("s")
    assert task_view is not None
    assert store.delete("s") is True
    assert store.delete("s") is False
    assert store.get("s") is None
    with pytest.raises(SessionDeletedError):
        task_view.rollback_to(1)  # reads pruned turns from the store
    ctx.add_message(Message.user("late"))
    with pytest.raises(SessionDeletedError):
        store.save(ctx)
    store.get_or_create("s", agent)  # same id, new session: the stale task still may not write into it
    with pytest.raises(SessionDeletedError):
        store.save(ctx)
    with pytest.raises(SessionNotFoundError):
        store.events("absent")


def test_stale_context_refused(store: BaseSessionStore, agent: Agent) -> None:
    first = store.get_or_create("s", agent)
    second = store.get("s")
    assert second is not None
    add_turn(first, 1)
    store.save(first)
    add_turn(second, 1)
    with pytest.raises(SessionBusyError):
        store.save(second)
    assert [r.number for r in store.load_turns("s")] == [1]


def test_stale_contexts_patch_metadata_and_keep_every_writers_keys(store: BaseSessionStore, agent: Agent) -> None:
    store.get_or_create("s", agent, metadata={"channel": "whatsapp", "old": 1, "shared": "x"})
    first, second = store.get("s"), store.get("s")
    assert first is not None and second is not None
    first.update_metadata({"ticket": "tk_1"})
    first.metadata["shared"] = "from first"  # changed in place
    store.save(first)
    del second.metadata["old"]  # deleted in place: part of the next patch
    second.update_metadata({"lang": "pt"})
    events = store.save(second)
    expected = {"channel": "whatsapp", "ticket": "tk_1", "shared": "from first", "lang": "pt"}
    assert store.get("s").metadata == expected
    assert second.metadata == expected  # the saved context now shows the stored, merged dict
    [event] = events
    assert event.type == "metadata.updated"
    assert event.payload == {"metadata": expected, "changes": {"lang": "pt"}, "removed": ["old"]}
    assert store.list_sessions()[0].metadata == expected


def test_stale_status_or_handoff_change_is_refused(store: BaseSessionStore, agent: Agent) -> None:
    billing = Agent(name="Billing", instructions="Billing specialist")
    store.get_or_create("s", agent)
    first, second, third = store.get("s"), store.get("s"), store.get("s")
    assert first is not None and second is not None and third is not None
    first.set_status(SessionStatus.RESCHEDULED, "retry later", retry_at=1.0)
    store.save(first)
    seq = store.last_seq("s")
    second.set_status(SessionStatus.TERMINATED, "done")
    with pytest.raises(SessionBusyError, match="changed since it was loaded"):
        store.save(second)
    third.set_active_agent(billing, tool_call_id="call_1")
    with pytest.raises(SessionBusyError, match="changed since it was loaded"):
        store.save(third)
    assert store.last_seq("s") == seq  # nothing written
    loaded = store.get("s")
    assert loaded is not None and loaded.status is SessionStatus.RESCHEDULED and loaded.active_agent.name == "Assistant"
    # the saving context moves its base on: a second change from it is not stale
    first.set_active_agent(billing, tool_call_id="call_2")
    store.save(first)
    # a stale context that changes neither status nor agent still saves (metadata is a patch)
    fourth = store.get("s")
    assert fourth is not None
    first.set_status(SessionStatus.IDLE)
    store.save(first)
    fourth.update_metadata({"k": 1})
    store.save(fourth)
    final = store.get("s")
    assert final is not None and final.status is SessionStatus.IDLE and final.metadata == {"k": 1}
    assert final.active_agent.name == "Billing"


def test_the_run_holding_the_lease_may_change_status_after_another_writer(
    store: BaseSessionStore, agent: Agent
) -> None:
    owner = Owner.current()
    run = store.begin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=owner).session
    other = store.get("s")
    assert other is not None and other.status is SessionStatus.RUNNING
    other.set_active_agent(Agent(name="Billing", instructions="b"), tool_call_id="x")
    store.save(other)
    run.add_message(Message.model("a"))
    run.complete_turn("a")
    store.release(run)  # stale base, but this run holds the lease
    loaded = store.get("s")
    assert loaded is not None and loaded.status is SessionStatus.IDLE and loaded.turn_count == 1
    # the lease ends with the run: its context is now an ordinary one, stale once another run starts
    store.begin_turn("s", default_agent=agent, user_message=Message.user("q2"), owner=Owner.current())
    run.set_status(SessionStatus.TERMINATED)
    with pytest.raises(SessionBusyError, match="changed since it was loaded"):
        store.save(run)


# -- input checked the same way in both stores ------------------------------------------------

LONE = "bad \udc80 text"  # what surrogateescape makes of a stray byte: not valid Unicode


def test_lone_surrogates_refused_before_anything_is_written(store: BaseSessionStore, agent: Agent) -> None:
    ctx = store.get_or_create("s", agent)
    seq = store.last_seq("s")
    with pytest.raises(UsageError, match="lone surrogate"):
        ctx.add_message(Message.user(LONE))
    assert ctx.turn_count == 0 and ctx.history == ()
    with pytest.raises(UsageError, match="lone surrogate"):
        store.begin_turn("s", default_agent=agent, user_message=Message.user(LONE), owner=Owner.current())
    with pytest.raises(UsageError, match="lone surrogate"):
        store.append_event("s", "note", {"text": LONE})
    with pytest.raises(UsageError, match="lone surrogate"):
        ctx.update_metadata({"name": LONE})
    ctx.add_message(Message.user("fine"))
    ctx.add_message(Message.model("fine"))
    ctx.complete_turn(LONE)  # text the context does not check itself: the store refuses it on save
    with pytest.raises(UsageError, match="lone surrogate"):
        store.save(ctx)
    assert store.last_seq("s") == seq and store.get("s").turn_count == 0
    with pytest.raises(UsageError, match="lone surrogate"):
        store.get_or_create(LONE, agent)
    with pytest.raises(UsageError, match="lone surrogate"):
        store.get(LONE)
    with pytest.raises(UsageError, match="lone surrogate"):
        store.claim_message(LONE)
    with pytest.raises(UsageError, match="lone surrogate"):
        store.get_or_create("t", Agent(name=LONE, instructions=""))
    assert [x.session_id for x in store.list_sessions()] == ["s"]


def test_tool_output_with_a_lone_surrogate_is_refused(store: BaseSessionStore, agent: Agent) -> None:
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=Owner.current())
    start.session.add_message(Message.model(None, [ToolCall("c", "custom")]))
    store.release(start.session)
    seq = store.last_seq("s")
    with pytest.raises(UsageError, match="lone surrogate"):
        store.submit_tool_result("s", "c", LONE)
    assert store.last_seq("s") == seq
    assert store.submit_tool_result("s", "c", "ok") == []


@pytest.mark.parametrize(
    "bad", [["a"], "text", {1: "x"}, {"k": {1, 2}}, {"k": object()}, {(1, 2): "x"}], ids=repr
)
def test_metadata_must_be_a_dict_of_json_values(store: BaseSessionStore, agent: Agent, bad: object) -> None:
    with pytest.raises(TypeError, match="metadata"):
        SessionContext("s", agent, metadata=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metadata"):
        store.get_or_create("s", agent, metadata=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metadata"):
        store.begin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=Owner.current(),
                         metadata=bad)  # type: ignore[arg-type]
    assert store.get("s") is None
    ctx = store.get_or_create("s", agent)
    if isinstance(bad, dict):
        with pytest.raises(TypeError, match="metadata"):
            ctx.update_metadata(bad)
        ctx.metadata.update(bad)  # changed in place: refused on save, nothing written
        with pytest.raises(TypeError, match="metadata"):
            store.save(ctx)
    assert store.get("s").metadata == {} and store.last_seq("s") == 1


def test_metadata_is_stored_as_json_in_both_stores(store: BaseSessionStore, agent: Agent) -> None:
    ctx = store.get_or_create("s", agent, metadata={"tags": ("a", "b"), "n": 2**70, "nested": {"x": None}})
    assert ctx.metadata == {"tags": ["a", "b"], "n": 2**70, "nested": {"x": None}}
    assert store.get("s").metadata == ctx.metadata
    event = store.append_event("s", "note", {"pair": (1, 2)})
    assert event.payload == {"pair": [1, 2]} and store.events("s")[-1] == event
    for bad in ({"k": {1}}, {2: "x"}, ["x"]):
        with pytest.raises(TypeError, match="payload"):
            store.append_event("s", "note", bad)  # type: ignore[arg-type]


# -- agents ----------------------------------------------------------------------------------


def test_agent_resolver_and_fallback(store: BaseSessionStore, caplog: pytest.LogCaptureFixture) -> None:
    billing = Agent(name="Billing", instructions="Billing specialist", model="gpt-4o")
    support = Agent(name="Support", instructions="Support", handoffs=[billing], model="gpt-4o")
    ctx = store.get_or_create("s", support)
    ctx.set_active_agent(billing, tool_call_id="call_1")
    store.save(ctx)
    with caplog.at_level(logging.WARNING, logger="chatflow_cli.core.memory"):
        fallback = store.get("s")
    assert fallback is not None and fallback.active_agent.name == "Billing"
    assert fallback.active_agent is not billing and not fallback.active_agent.tools
    assert any("Billing" in r.getMessage() and "fallback" in r.getMessage() for r in caplog.records)
    store.set_agent_resolver(lambda name: billing if name == "Billing" else support)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="chatflow_cli.core.memory"):
        resolved = store.get("s")
    assert resolved is not None and resolved.active_agent is billing
    assert caplog.records == []
    store.set_agent_resolver(lambda name: None)
    with caplog.at_level(logging.WARNING, logger="chatflow_cli.core.memory"):
        unknown = store.get("s")
    assert unknown is not None and unknown.active_agent.name == "Billing" and caplog.records


# -- de-duplication --------------------------------------------------------------------------


def test_dedup_ttl_boundary_and_purge(store: BaseSessionStore, clock: FakeClock) -> None:
    assert DEFAULT_DEDUP_TTL_HOURS == 192
    t0 = clock.now
    assert not store.is_message_processed("wamid.A")
    store.mark_message_processed("wamid.A")
    assert store.is_message_processed("wamid.A")
    clock.now = t0 + 192 * HOUR - 0.001
    assert store.is_message_processed("wamid.A")
    assert store.claim_message("wamid.A") is False
    clock.now = t0 + 192 * HOUR  # now < processed_at + 192 h no longer holds
    assert not store.is_message_processed("wamid.A")
    store.mark_message_processed("wamid.B")  # purges expired records
    clock.now = t0  # were A still stored, it would count again at its own time
    assert not store.is_message_processed("wamid.A")
    clock.now = t0 + 2 * 192 * HOUR - 1
    assert store.is_message_processed("wamid.B")


def test_claim_message_once_then_again_after_expiry(store: BaseSessionStore, clock: FakeClock) -> None:
    assert store.claim_message("MSG-0001") is True
    assert store.claim_message("MSG-0001") is False
    assert store.is_message_processed("MSG-0001")
    clock.advance(192 * HOUR)
    assert store.claim_message("MSG-0001") is True
    assert store.claim_message("MSG-0001") is False


def test_release_message_lets_a_failed_delivery_be_claimed_again(store: BaseSessionStore) -> None:
    assert store.claim_message("MSG-0002") is True
    assert store.release_message("MSG-0002") is True  # the turn failed: not processed after all
    assert not store.is_message_processed("MSG-0002")
    assert store.claim_message("MSG-0002") is True  # the redelivery runs
    assert store.claim_message("MSG-0002") is False
    assert store.release_message("MSG-0003") is False  # never claimed
    assert asyncio.run(store.arelease_message("MSG-0002")) is True


@pytest.mark.parametrize("bad", [None, 5, 5.0, b"wamid.A", "", ["x"]])
@pytest.mark.parametrize("method", ["is_message_processed", "mark_message_processed", "claim_message", "release_message"])
def test_dedup_refuses_ids_that_are_not_non_empty_strings(store: BaseSessionStore, method: str, bad: object) -> None:
    with pytest.raises(TypeError, match="message_id"):
        getattr(store, method)(bad)
    with pytest.raises(TypeError, match="message_id"):
        asyncio.run(getattr(store, "a" + method)(bad))
    assert store.claim_message("5") is True  # nothing was recorded for the refused ids
    assert store.claim_message("5") is False


# -- async twins -----------------------------------------------------------------------------


def test_async_twins(store: BaseSessionStore, agent: Agent) -> None:
    async def main() -> None:
        ctx = await store.aget_or_create("s", agent)
        assert await store.aget("absent") is None
        add_turn(ctx, 1)
        saved = await store.asave(ctx)
        assert saved[-1].type == "turn.completed"
        start = await store.abegin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=Owner.current())
        start.session.add_message(Message.model(None, [ToolCall("c", "custom")]))
        await store.arelease(start.session)
        assert await store.asubmit_tool_result("s", "c", "done") == []
        event = await store.aappend_event("s", "note", {"n": 1}, idempotency_key="k")
        assert (await store.aevents("s", after_seq=event.seq - 1)) == [event]
        assert await store.alast_seq("s") == event.seq
        assert [s.session_id for s in await store.alist_sessions()] == ["s"]
        assert await store.alatest_session_id() == "s"
        assert [r.number for r in await store.aload_turns("s")] == [1, 2]
        await store.arollback("s", 1)
        assert not await store.ais_message_processed("m")
        await store.amark_message_processed("m")
        assert await store.ais_message_processed("m")
        assert await store.aclaim_message("m2") is True
        assert await store.aclaim_message("m2") is False
        assert await store.adelete("s") is True

    asyncio.run(main())


# -- threads -----------------------------------------------------------------------------------


def test_threads_claim_once_and_share_the_event_log(store: BaseSessionStore, agent: Agent) -> None:
    import threading

    store.get_or_create("t", agent)
    barrier = threading.Barrier(8)
    claims: list[bool] = []
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            claims.append(store.claim_message("MSG-0001"))
            for n in range(10):
                store.append_event("t", "note", {"i": i, "n": n})
        except Exception as exc:  # noqa: BLE001  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(claims) == [False] * 7 + [True]
    assert all_seqs(store, "t") == list(range(1, 82))


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
    store: BaseSessionStore, child: _Child
) -> None:
    assert store.message_state("wamid.K") is MessageState.NEW
    assert store.claim_message("wamid.K", owner=child.owner) is True
    assert store.message_state("wamid.K") is MessageState.IN_PROGRESS
    assert store.is_message_processed("wamid.K", wait=0)  # a live holder's claim, no wait: skip it
    assert store.claim_message("wamid.K") is False
    store.mark_message_processed("wamid.K")  # the seed's pair: leaves the live holder's claim alone
    assert store.message_state("wamid.K") is MessageState.IN_PROGRESS
    child.kill()  # the worker died before it answered
    assert store.message_state("wamid.K") is MessageState.NEW
    assert not store.is_message_processed("wamid.K")
    assert store.claim_message("wamid.K") is True  # the redelivery runs
    assert asyncio.run(store.amessage_state("wamid.K")) is MessageState.IN_PROGRESS


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
    store: BaseSessionStore, child: _Child
) -> None:
    """A duplicate delivery checked while another worker holds the id waits: the worker was
    killed before it answered, so the answer is False and this delivery runs the message."""
    import threading

    assert store.claim_message("wamid.W", owner=child.owner) is True
    answers: list[bool] = []
    seen = _watch_in_progress(store)
    checker = threading.Thread(target=lambda: answers.append(store.is_message_processed("wamid.W", wait=60)))
    checker.start()
    assert seen.wait(30)  # the check found the worker on it
    child.kill()
    checker.join(90)
    assert answers == [False]
    assert store.claim_message("wamid.W") is True


def test_is_message_processed_waits_for_another_process_until_it_is_processed(
    store: BaseSessionStore, child: _Child
) -> None:
    import threading

    assert store.claim_message("wamid.P", owner=child.owner) is True
    answers: list[bool] = []
    seen = _watch_in_progress(store)
    checker = threading.Thread(target=lambda: answers.append(store.is_message_processed("wamid.P", wait=60)))
    checker.start()
    assert seen.wait(30)
    store.complete_message("wamid.P")  # the holder answered
    checker.join(90)
    assert answers == [True]


def test_is_message_processed_waits_at_most_wait_seconds_for_a_live_holder(
    store: BaseSessionStore, child: _Child
) -> None:
    """A live worker still on it after ``wait`` seconds: skip (True), and the claim is untouched."""
    import time

    assert store.claim_message("wamid.L", owner=child.owner) is True
    started = time.monotonic()
    assert store.is_message_processed("wamid.L", wait=0.3) is True
    assert time.monotonic() - started >= 0.3
    assert asyncio.run(store.ais_message_processed("wamid.L", wait=0.3)) is True
    assert store.message_state("wamid.L") is MessageState.IN_PROGRESS
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            store.is_message_processed("wamid.L", wait=bad)


def test_ais_message_processed_waits_for_another_process_without_blocking_the_loop(
    store: BaseSessionStore, child: _Child
) -> None:
    assert store.claim_message("wamid.A2", owner=child.owner) is True
    seen = _watch_in_progress(store)

    async def main() -> bool:
        check = asyncio.create_task(store.ais_message_processed("wamid.A2", wait=60))
        while not seen.is_set():  # the loop runs other tasks meanwhile: this one kills the holder
            assert not check.done()
            await asyncio.sleep(0.01)
        await asyncio.to_thread(child.kill)
        return await check

    assert asyncio.run(main()) is False


def test_is_message_processed_answers_at_once_for_a_claim_held_in_this_process(store: BaseSessionStore) -> None:
    """The holder is a thread or task of this process (a blocking wait would deadlock its event
    loop); a failed turn frees the claim and its own delivery is delivered again."""
    assert store.claim_message("wamid.S") is True
    assert store.is_message_processed("wamid.S", wait=3600) is True
    assert asyncio.run(store.ais_message_processed("wamid.S", wait=3600)) is True
    assert store.release_message("wamid.S") is True  # its processing failed
    assert store.is_message_processed("wamid.S", wait=3600) is False


def test_a_claimed_turn_completes_the_claim_when_it_completes(
    store: BaseSessionStore, agent: Agent, clock: FakeClock
) -> None:
    assert store.claim_message("wamid.C") is True
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current(),
                             message_id="wamid.C", message_claim=_claim_token(store))
    assert store.message_state("wamid.C") is MessageState.IN_PROGRESS
    t0 = clock.now
    _finish(store, start.session, agent, "hello")
    assert store.message_state("wamid.C") is MessageState.PROCESSED  # in the turn.completed transaction
    clock.now = t0 + 192 * HOUR - 0.001
    assert store.is_message_processed("wamid.C")
    clock.now = t0 + 192 * HOUR
    assert store.message_state("wamid.C") is MessageState.NEW


@pytest.mark.parametrize("ending", ["failed", "interrupted"])
def test_a_claimed_turn_that_fails_or_is_interrupted_frees_the_claim(
    store: BaseSessionStore, agent: Agent, ending: str
) -> None:
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current(),
                             message_id="wamid.F")
    ctx = start.session
    if ending == "failed":
        ctx.fail_turn(RuntimeError("provider down"))
    else:
        ctx.interrupt_turn("cancelled")
    store.release(ctx)
    assert store.message_state("wamid.F") is MessageState.NEW
    assert store.claim_message("wamid.F") is True


def test_a_processed_message_id_replays_its_turn_and_writes_nothing(
    store: BaseSessionStore, agent: Agent
) -> None:
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("where is 404?"),
                             owner=Owner.current(), message_id="wamid.R")
    _finish(store, start.session, agent, "in transit")
    seq = store.last_seq("s")
    again = store.begin_turn("s", default_agent=agent, user_message=Message.user("where is 404?"),
                             owner=Owner.current(), message_id="wamid.R")
    assert again.replayed is not None
    assert again.replayed["outcome"] == "completed" and again.replayed["content"] == "in transit"
    assert again.turn == 1 and store.last_seq("s") == seq


def test_a_message_id_another_live_holder_runs_is_busy_until_the_holder_dies(
    store: BaseSessionStore, agent: Agent, child: _Child
) -> None:
    assert store.claim_message("wamid.B", owner=child.owner)
    with pytest.raises(SessionBusyError, match="wamid.B' is being processed by pid"):
        store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current(),
                         message_id="wamid.B")
    child.kill()
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("hi"), owner=Owner.current(),
                             message_id="wamid.B")
    assert start.replayed is None and start.turn == 1


def test_complete_message_marks_an_id_handled_without_a_turn(store: BaseSessionStore) -> None:
    assert store.claim_message("wamid.M") is True
    store.complete_message("wamid.M")
    assert store.message_state("wamid.M") is MessageState.PROCESSED


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
    store: BaseSessionStore, agent: Agent, child: _Child, key: dict[str, str]
) -> None:
    _dead_keyed_turn(store, agent, child, **key)
    retry = store.begin_turn("s", default_agent=agent, user_message=Message.user("refund order 7"),
                             owner=Owner.current(), **key)
    assert retry.replayed is None, "the retry runs the turn again"
    types = [e.type for e in retry.events]
    assert types[:4] == ["tool.result", "turn.interrupted", "turn.failed", "session.recovered"]
    assert types[-1] == "message.user"
    assert retry.turn == 1
    users = [m.content for m in retry.session.history if m.role is Role.USER]
    assert users == ["refund order 7"], "the retry replaces the interrupted attempt in the window"
    logged = [e for e in store.events("s") if e.type == "message.user"]
    assert len(logged) == 2, "the log keeps both attempts"
    assert history_problems(retry.session.history, pending_ok=True) == []


def test_a_redelivery_claimed_again_before_its_turn_recovers_replaces_the_attempt(
    store: BaseSessionStore, agent: Agent, child: _Child
) -> None:
    """claim_message, then the turn: the new claim (the dead holder's is free) keeps naming the
    dead attempt, so the turn's recovery still takes that attempt out of the window."""
    _dead_keyed_turn(store, agent, child, message_id="wamid.9")
    assert store.claim_message("wamid.9") is True
    retry = store.begin_turn("s", default_agent=agent, user_message=Message.user("refund order 7"),
                             owner=Owner.current(), message_id="wamid.9", message_claim=_claim_token(store))
    assert [m.content for m in retry.session.history if m.role is Role.USER] == ["refund order 7"]
    _finish(store, retry.session, agent, "refunded")
    assert store.message_state("wamid.9") is MessageState.PROCESSED


def test_another_message_after_a_keyed_turn_died_and_then_its_retry(
    store: BaseSessionStore, agent: Agent, child: _Child
) -> None:
    _dead_keyed_turn(store, agent, child, idempotency_key="k-7")
    other = store.begin_turn("s", default_agent=agent, user_message=Message.user("hello?"), owner=Owner.current())
    _finish(store, other.session, agent, "hi")
    retry = store.begin_turn("s", default_agent=agent, user_message=Message.user("refund order 7"),
                             owner=Owner.current(), idempotency_key="k-7")
    assert retry.replayed is None
    _finish(store, retry.session, agent, "refunded")
    window = store.get("s")
    assert window is not None
    assert [m.content for m in window.history if m.role is Role.USER] == ["hello?", "refund order 7"]
    assert [t.number for t in window.turns] == [1, 2]
    assert history_problems(window.history) == []


# -- turns waiting for a busy session ---------------------------------------------------------


def test_waiting_turns_start_in_arrival_order(store: BaseSessionStore, agent: Agent, child: _Child) -> None:
    running = store.begin_turn("s", default_agent=agent, user_message=Message.user("first"), owner=Owner.current())
    late, later = Owner.current(), Owner.current()
    first = store.begin_turn("s", default_agent=agent, user_message=Message.user("second"), owner=late,
                             enqueue=True)
    second = store.begin_turn("s", default_agent=agent, user_message=Message.user("third"), owner=later,
                              enqueue=True)
    dead = store.begin_turn("s", default_agent=agent, user_message=Message.user("never"), owner=child.owner,
                            enqueue=True)
    assert first.queued is not None and second.queued is not None and dead.queued is not None
    assert first.queued < second.queued < dead.queued and first.turn == 0
    seq = store.last_seq("s")
    assert seq == running.events[-1].seq, "queueing writes no event"
    _finish(store, running.session, agent, "one")
    with pytest.raises(SessionBusyError, match="1 earlier turn"):  # a newcomer queues behind them all
        store.begin_turn("s", default_agent=agent, user_message=Message.user("newcomer"), owner=Owner.current(),
                         ticket=second.queued)
    with pytest.raises(SessionBusyError):
        store.begin_turn("s", default_agent=agent, user_message=Message.user("newcomer"), owner=Owner.current())
    go = store.begin_turn("s", default_agent=agent, user_message=Message.user("second"), owner=late,
                          ticket=first.queued)
    assert go.turn == 2
    _finish(store, go.session, agent, "two")
    child.kill()  # a dead waiter's ticket is skipped
    go = store.begin_turn("s", default_agent=agent, user_message=Message.user("third"), owner=later,
                          ticket=second.queued)
    assert go.turn == 3
    _finish(store, go.session, agent, "three")
    start = store.begin_turn("s", default_agent=agent, user_message=Message.user("newcomer"), owner=Owner.current())
    assert start.turn == 4


def test_leaving_the_queue_lets_the_next_waiter_start(store: BaseSessionStore, agent: Agent) -> None:
    running = store.begin_turn("s", default_agent=agent, user_message=Message.user("first"), owner=Owner.current())
    gone = store.begin_turn("s", default_agent=agent, user_message=Message.user("x"), owner=Owner.current(),
                            enqueue=True)
    _finish(store, running.session, agent, "one")
    assert gone.queued is not None
    store.leave_turn_queue("s", gone.queued)
    assert store.begin_turn("s", default_agent=agent, user_message=Message.user("y"), owner=Owner.current()).turn == 2


# -- the model endpoint stored with a session ---------------------------------------------
def test_session_endpoint_round_trip_and_goes_with_the_session(
        store: BaseSessionStore, agent: Agent, make_store: Callable[..., BaseSessionStore]) -> None:
    store.get_or_create("s", agent)
    assert store.session_endpoint("s") == (None, None)
    store.set_session_endpoint("s", "fake-model", "http://127.0.0.1:9/v1")
    assert store.session_endpoint("s") == ("fake-model", "http://127.0.0.1:9/v1")
    assert make_store().session_endpoint("s") == ("fake-model", "http://127.0.0.1:9/v1")  # SQLite: reopened file
    store.set_session_endpoint("s", "other", None)  # /model other: replaces both values
    assert store.session_endpoint("s") == ("other", None)
    assert asyncio.run(store.asession_endpoint("s")) == ("other", None)
    asyncio.run(store.aset_session_endpoint("s", "m3", "http://h/v1"))
    assert store.session_endpoint("s") == ("m3", "http://h/v1")
    assert store.delete("s") is True
    store.get_or_create("s", agent)  # a new incarnation starts with nothing stored
    assert store.session_endpoint("s") == (None, None)


def test_session_endpoint_refuses_unknown_sessions_and_bad_values(store: BaseSessionStore, agent: Agent) -> None:
    with pytest.raises(SessionNotFoundError):
        store.session_endpoint("absent")
    with pytest.raises(SessionNotFoundError):
        store.set_session_endpoint("absent", "m", None)
    store.get_or_create("s", agent)
    with pytest.raises(TypeError):
        store.set_session_endpoint("s", 5, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.set_session_endpoint("s", "m" * 2049, None)
    assert store.session_endpoint("s") == (None, None)  # nothing written by a refused call


def test_preview_of_a_session_whose_first_turn_failed_is_the_failed_message(
        store: BaseSessionStore, agent: Agent) -> None:
    ctx = store.get_or_create("s", agent)
    ctx.add_message(Message.user("first try"))
    ctx.fail_turn(RuntimeError("bad key"))
    store.save(ctx)
    ctx.add_message(Message.user("second try"))
    ctx.fail_turn(RuntimeError("bad key"))
    store.save(ctx)
    [summary] = store.list_sessions()
    assert summary.turn_count == 0 and summary.preview == "second try"  # the newest failed message
    add_turn(ctx, "ok")
    store.save(ctx)
    assert store.list_sessions()[0].preview == "uok"  # a live first turn wins
    store.rollback("s", 0)
    assert store.list_sessions()[0].preview == "second try"  # rolled back is not failed: never shown
