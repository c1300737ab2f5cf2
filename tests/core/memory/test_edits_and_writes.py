"""A bounded edit (``store.edit(..., last_turns=N)``) starts from the context the session's
previous edit ended with while the log has not moved: the stored result is the same as when
every edit loads the window afresh, whatever other writers, failed changes and stray uses of a
context happen in between."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import InvalidHistoryError, StoreError, UsageError
from chatflow_cli.core.memory import BaseSessionStore, SessionContext, SessionStore
from chatflow_cli.core.messages import Message, Role, ToolCall
from chatflow_cli.core.sqlite_store import SQLiteSessionStore

SID = "kept"


class Boom(Exception):
    pass


def _change(op: str, n: int) -> Callable[[SessionContext], None]:
    """One edit's change, by name; ``n`` makes its texts and tool-call ids unique."""

    def change(ctx: SessionContext) -> None:
        if op == "user":
            for call in ctx.pending_tool_calls:
                ctx.add_message(Message.tool(call.id, "gap", name=call.name))
            ctx.add_message(Message.user(f"question {n} ✓"))
        elif op == "reply":
            if ctx.turn_count == 0:
                ctx.add_message(Message.user(""))
            for call in ctx.pending_tool_calls:
                ctx.add_message(Message.tool(call.id, "gap", name=call.name))
            ctx.add_message(Message(Role.MODEL, f"answer {n}", agent=getattr(ctx.active_agent, "name", None)))
        elif op == "calls":
            if ctx.turn_count == 0 or ctx.pending_tool_calls:
                return
            ctx.add_message(Message(Role.MODEL, None, (ToolCall(f"c{n}a", "add", "{}"), ToolCall(f"c{n}b", "add", "{}"))))
            ctx.add_message(Message.tool(f"c{n}a", str(n), name="add"))
        elif op == "system":
            ctx.add_message(Message(Role.SYSTEM, f"be brief {n}"))
        elif op == "rollback":
            if not ctx.pending_tool_calls:
                ctx.rollback_to(max(0, ctx.turn_count - 1))
        elif op == "handoff":
            ctx.set_active_agent(f"agent{n % 3}")
        elif op == "metadata":
            ctx.update_metadata({"k": n})
        elif op == "event":
            ctx.record_event("test.note", {"n": n})
        elif op == "raise":
            ctx.add_message(Message.user("never stored"))
            raise Boom()

    return change


def _apply(store: BaseSessionStore, op: str, n: int, last_turns: int, stash: list[SessionContext]) -> None:
    if op.startswith("stray_"):  # a change kept its context: it is used after its edit committed
        if not stash:
            return
        ctx = stash[-1]
        if op == "stray_metadata":
            ctx.metadata["stray"] = n
        elif ctx.pending_tool_calls:
            ctx.add_message(Message.tool(ctx.pending_tool_calls[0].id, "stray", name="add"))
        elif ctx.turn_count:
            ctx.add_message(Message(Role.MODEL, f"stray {n}"))
        return
    if op.startswith("other_"):  # another writer of the same session: what another process does
        return
    try:
        store.edit(SID, _change(op, n), create_agent="Assistant", max_turns=4, last_turns=last_turns)
    except (Boom, InvalidHistoryError):  # nothing of the change is stored
        pass
    if op == "user":  # this edit's change also keeps its context
        store.edit(SID, stash.append, last_turns=last_turns)


def _other(store: BaseSessionStore, op: str, n: int) -> None:
    if op == "other_edit":
        store.edit(SID, _change("reply", n), create_agent="Assistant")  # a full-window edit, no kept context
    elif op == "other_calls":  # tool calls left open: the next edit must see them
        store.edit(SID, _change("calls", n), create_agent="Assistant")
    elif op == "other_rollback" and store.turn_count(SID) > 0:
        store.rollback(SID, last=1)
    elif op == "other_event" and store.log_position(SID) is not None:
        store.append_event(SID, "test.other", {"n": n})


def _dump(store: BaseSessionStore) -> tuple[Any, ...]:
    """The session's log, its turns (rolled-back ones too) and its context window."""
    ctx = store.get(SID)
    if ctx is None:
        return ()
    events = [(e.seq, e.type, e.payload) for e in store.events(SID)]
    turns = [(t.number, [m.to_dict() for m in t.messages]) for t in store.load_turns(SID, include_rolled_back=True)]
    return events, turns, [m.to_dict() for m in ctx.history], ctx.metadata, ctx.active_agent.name


def _positions_unique(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT turn, position FROM chatflow_messages WHERE removed_at_seq IS NULL").fetchall()
    assert len(rows) == len(set(rows)), "two live messages share a (turn, position)"


OPS = ["user", "user", "reply", "calls", "system", "rollback", "handoff", "metadata", "event", "raise",
       "stray_message", "stray_metadata", "other_edit", "other_calls", "other_rollback", "other_event"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.sampled_from(OPS), max_size=16), last_turns=st.sampled_from([1, 2]))
def test_edits_from_a_kept_context_store_what_fresh_loads_store(tmp_path: Path, kind: str, ops: list[str],
                                                                  last_turns: int) -> None:
    base = tmp_path / uuid.uuid4().hex
    base.mkdir()

    def open_pair(name: str) -> tuple[BaseSessionStore, BaseSessionStore]:
        if kind == "memory":
            store = SessionStore()
            return store, store
        return SQLiteSessionStore(base / name), SQLiteSessionStore(base / name)

    kept, kept_other = open_pair("kept.db")
    fresh, fresh_other = open_pair("fresh.db")
    fresh._kept.size = 0  # every edit loads its window
    numbers = iter(range(1, 10_000))
    for store in {kept, kept_other, fresh, fresh_other}:
        store.clock = lambda: 1_700_000_000.0  # the same times in both files
        store.set_agent_resolver(lambda name: Agent(name=name))
    stashes: dict[int, list[SessionContext]] = {id(kept): [], id(fresh): []}
    try:
        for op in ops:
            n = next(numbers)
            for store, other in ((kept, kept_other), (fresh, fresh_other)):
                _apply(store, op, n, last_turns, stashes[id(store)])
                _other(other, op, n)
            assert _dump(kept) == _dump(fresh)
            if kind == "sqlite":
                _positions_unique(base / "kept.db")
    finally:
        for store in {kept, kept_other, fresh, fresh_other}:
            store.close()


def test_an_edit_after_another_process_wrote_starts_from_the_stored_window(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(db)
    try:
        store.edit(SID, _change("user", 1), create_agent="Assistant", last_turns=1)
        store.edit(SID, _change("reply", 2), last_turns=1)  # kept: the context holds turn 1
        code = (
            "import sys\n"
            "from chatflow_cli.core.sqlite_store import SQLiteSessionStore\n"
            "from chatflow_cli.core.messages import Message, Role\n"
            "s = SQLiteSessionStore(sys.argv[1])\n"
            "s.edit('kept', lambda c: (c.add_message(Message.user('from the other process')), "
            "c.add_message(Message(Role.MODEL, 'other answer'))), last_turns=1)\n"
            "s.close()\n"
        )
        subprocess.run([sys.executable, "-c", code, str(db)], check=True, timeout=60)
        store.edit(SID, _change("reply", 3), last_turns=1)  # appends to turn 2, the other process's
        turns = store.load_turns(SID)
        assert [(t.number, [m.content for m in t.messages]) for t in turns] == [
            (1, ["question 1 ✓", "answer 2"]),
            (2, ["from the other process", "other answer", "answer 3"]),
        ]
        _positions_unique(db)
    finally:
        store.close()


def test_a_context_used_after_its_edit_writes_nothing_at_the_next_edit(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    stash: list[SessionContext] = []
    try:
        store.edit(SID, _change("user", 1), create_agent="Assistant", last_turns=1)
        store.edit(SID, stash.append, last_turns=1)
        stash[0].add_message(Message(Role.MODEL, "stray"))  # journalled on a context no edit saves
        stash[0].metadata["stray"] = True
        store.edit(SID, _change("reply", 2), last_turns=1)
        assert [m.content for m in store.load_turns(SID)[0].messages] == ["question 1 ✓", "answer 2"]
        assert store.session_summary(SID).metadata == {}
    finally:
        store.close()


def test_async_writes_of_one_store_run_in_the_order_they_were_made(tmp_path: Path) -> None:
    """Writes queue on the store's writer thread: the log's order is the order of the calls."""
    store = SQLiteSessionStore(tmp_path / "s.db")
    store.edit(SID, _change("user", 0), create_agent="Assistant")
    threads: set[str] = set()

    def note(n: int) -> Callable[[SessionContext], None]:
        def change(ctx: SessionContext) -> None:
            threads.add(threading.current_thread().name)
            ctx.record_event("test.order", {"n": n})
        return change

    async def many() -> None:
        await asyncio.gather(*(store.aedit(SID, note(n), last_turns=1) for n in range(40)))

    try:
        asyncio.run(many())
        order = [e.payload["n"] for e in store.events(SID) if e.type == "test.order"]
        assert order == list(range(40))
        assert len(threads) == 1
    finally:
        store.close()


def test_an_async_write_on_a_closed_store_is_refused(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    asyncio.run(store.aedit(SID, _change("user", 1), create_agent="Assistant"))  # the writer thread starts
    store.close()
    with pytest.raises(StoreError, match="closed"):
        asyncio.run(store.aedit(SID, _change("reply", 2)))


def test_a_rollback_on_a_context_after_its_edit_is_refused(tmp_path: Path) -> None:
    """Turns outside the context's window are read in its edit's transaction: afterwards, never."""
    store = SQLiteSessionStore(tmp_path / "s.db")
    stash: list[SessionContext] = []
    try:
        for n in range(3):
            store.edit(SID, _change("user", n), create_agent="Assistant", last_turns=1)
        store.edit(SID, stash.append, last_turns=1)
        with pytest.raises(UsageError, match="used after the edit"):
            stash[0].rollback_to(1)
        store.edit(SID, lambda ctx: ctx.rollback_to(1), last_turns=1)  # inside an edit: turn 2 is read there
        assert [t.number for t in store.load_turns(SID)] == [1]
    finally:
        store.close()


def _locked(db: Path) -> tuple[sqlite3.Connection, threading.Timer]:
    """Another connection holding the file's write lock, released after 0.6 s."""
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    timer = threading.Timer(0.6, lambda: holder.execute("COMMIT"))
    return holder, timer


def test_a_cancelled_write_that_started_has_landed_when_the_caller_sees_the_cancellation(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(db)
    store.edit(SID, _change("user", 1), create_agent="Assistant")
    holder, release = _locked(db)

    async def cancel_a_running_write() -> list[str]:
        task = asyncio.ensure_future(store.aappend_event(SID, "test.cancelled", {}))
        await asyncio.sleep(0.3)  # the write waits for the lock in SQLite's busy handler
        release.start()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return [e.type for e in SQLiteSessionStore(db).events(SID)]  # at once, from another connection

    try:
        assert "test.cancelled" in asyncio.run(cancel_a_running_write())
    finally:
        release.join()
        holder.close()
        store.close()


def test_a_cancelled_write_still_queued_never_runs(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(db)
    store.edit(SID, _change("user", 1), create_agent="Assistant")
    holder, release = _locked(db)

    async def cancel_a_queued_write() -> None:
        first = asyncio.ensure_future(store.aappend_event(SID, "test.first", {}))
        await asyncio.sleep(0.3)  # the writer thread is busy with the first
        second = asyncio.ensure_future(store.aappend_event(SID, "test.second", {}))
        await asyncio.sleep(0.05)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        release.start()
        await first

    try:
        asyncio.run(cancel_a_queued_write())
        types = [e.type for e in store.events(SID)]
        assert "test.first" in types and "test.second" not in types
    finally:
        release.join()
        holder.close()
        store.close()


_CLOSE_DURING_A_WRITE = """
import asyncio, sqlite3, sys, threading
from chatflow_cli.core.errors import StoreError
from chatflow_cli.core.messages import Message
from chatflow_cli.core.sqlite_store import SQLiteSessionStore

db = sys.argv[1]
store = SQLiteSessionStore(db)
store.edit("kept", lambda c: c.add_message(Message.user("hi")), create_agent="A")
holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
holder.execute("BEGIN IMMEDIATE")
threading.Timer(0.6, lambda: holder.execute("COMMIT")).start()

async def main():
    task = asyncio.ensure_future(store.aappend_event("kept", "test.during_close", {}))
    await asyncio.sleep(0.3)  # the write waits for the lock on the writer thread
    store.close()  # waits for it
    print("landed", (await task).type)
    try:
        await store.aappend_event("kept", "test.after_close", {})
    except StoreError as exc:
        print("refused", exc)

asyncio.run(main())
"""


def test_closing_a_store_while_another_thread_writes_waits_for_the_write(tmp_path: Path) -> None:
    """close() used to close a connection under a running statement: the process crashed (SIGSEGV)."""
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CLOSE_DURING_A_WRITE, str(tmp_path / "s.db")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "landed test.during_close" in done.stdout
    assert "refused" in done.stdout and "closed" in done.stdout
