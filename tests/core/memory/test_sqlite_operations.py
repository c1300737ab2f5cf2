"""The SQLite store under the operations issue 31 found on PostgreSQL: a migration applied
without its version row, a migration that fails, a process that forks with the store open.
Real files, real processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import StoreError
from chatflow_cli.core.messages import Message
from chatflow_cli.core.sqlite_store import SQLiteSessionStore

AGENT = Agent(name="Assistant", instructions="Be brief.", model="fake-model")


def _apply(conn: sqlite3.Connection, number: int, *, record: bool = True) -> None:
    from chatflow_cli.core.memory.sqlite.schema import _MIGRATIONS, _MIGRATIONS_TABLE

    conn.execute(_MIGRATIONS_TABLE)
    _, name, steps = _MIGRATIONS[number - 1]
    for step in steps:
        if callable(step):
            step(conn)
        else:
            conn.execute(step)
    if record:
        conn.execute("INSERT INTO chatflow_schema_migrations VALUES (?, ?, 0)", (number, name))


def _versions(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT version FROM chatflow_schema_migrations ORDER BY version")]
    finally:
        conn.close()


def _turn(store: SQLiteSessionStore, session_id: str, text: str) -> None:
    ctx = store.get_or_create(session_id, AGENT)
    ctx.add_message(Message.user(text))
    ctx.add_message(Message.model(f"ok: {text}"))
    ctx.complete_turn(f"ok: {text}")
    store.save(ctx)


def test_a_migration_applied_without_its_version_row_is_finished_at_the_next_open(tmp_path: Path) -> None:
    from chatflow_cli.core.memory.sqlite.schema import SCHEMA_VERSION

    for number in range(1, SCHEMA_VERSION + 1):
        path = tmp_path / f"at-{number}.db"
        conn = sqlite3.connect(path, isolation_level=None)
        for before in range(1, number):
            _apply(conn, before)
        if number > 1:
            conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, max_turns, "
                         "created_at_utc, updated_at_utc) VALUES ('s', 'i', 'Assistant', 20, 0, 0)")
            conn.execute("INSERT INTO chatflow_messages (session_id, turn, position, role, message_json, event_seq) "
                         "VALUES ('s', 1, 0, 'user', '{\"role\":\"user\",\"content\":\"hello\"}', 1)")
        _apply(conn, number, record=False)  # its changes are there, its version row is not
        conn.close()
        store = SQLiteSessionStore(path)
        try:
            _turn(store, "s", "after")
            assert [h.session_id for h in store.search("hello")] == (["s"] if number > 1 else [])
        finally:
            store.close()
        assert _versions(path) == list(range(1, SCHEMA_VERSION + 1)), number


def test_a_failing_migration_names_its_version_and_what_to_do(tmp_path: Path) -> None:
    from chatflow_cli.core.memory.sqlite.schema import _MIGRATIONS

    # the newest migration that adds a column to chatflow_sessions: a view in its way makes it fail
    target = max(number for number, _, steps in _MIGRATIONS
                 if any(isinstance(s, str) and "ALTER TABLE chatflow_sessions ADD COLUMN" in s for s in steps))
    path = tmp_path / "frozen.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for number in range(1, target):
        _apply(conn, number)
    conn.execute("ALTER TABLE chatflow_sessions RENAME TO chatflow_sessions_kept")
    conn.execute("CREATE VIEW chatflow_sessions AS SELECT * FROM chatflow_sessions_kept")
    conn.close()
    with pytest.raises(StoreError) as info:
        SQLiteSessionStore(path)
    text = str(info.value)
    assert f"schema migration {target} (" in text and "view" in text
    assert f"stays at schema version {target - 1}" in text and "open it again" in text
    assert info.value.exit_code == 8 and "\n" not in text
    assert _versions(path) == list(range(1, target))


# ---------------------------------------------------------------------------------------
# a process that forks with the store open
# ---------------------------------------------------------------------------------------


async def _async_turns(store: SQLiteSessionStore, index: int) -> None:
    for k in range(3):
        ctx = await store.aget_or_create(f"child-{index}", AGENT)
        ctx.add_message(Message.user(f"c{index} t{k}"))
        ctx.add_message(Message.model(f"ok: c{index} t{k}"))
        ctx.complete_turn(f"ok: c{index} t{k}")
        await store.asave(ctx)


def _child_work(store: SQLiteSessionStore, index: int) -> int:
    asyncio.run(asyncio.wait_for(_async_turns(store, index), 30))
    _turn(store, f"child-{index}", "sync")
    store.close()  # the child's own connections only
    return 0


def _opened(path: Path) -> SQLiteSessionStore:
    store = SQLiteSessionStore(path)
    _turn(store, "parent", "before the fork")
    asyncio.run(_async_turns(store, 99))  # the writer thread and the async pool exist
    return store


def _check_after(store: SQLiteSessionStore) -> None:
    for index in range(4):
        assert store.turn_count(f"child-{index}") == 4
    _turn(store, "parent", "after the children")
    asyncio.run(_async_turns(store, 98))
    assert store.turn_count("parent") == 2


def test_children_forked_with_os_fork_use_their_own_connections(tmp_path: Path) -> None:
    store = _opened(tmp_path / "forked.db")
    try:
        pids = []
        for index in range(4):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                signal.alarm(60)
                code = 1
                try:
                    code = _child_work(store, index)
                except BaseException as exc:  # noqa: BLE001 - the exit code says it
                    print(f"child {index}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                os._exit(code)
            pids.append(pid)
        deadline = time.monotonic() + 60
        codes: dict[int, int] = {}
        while len(codes) < len(pids) and time.monotonic() < deadline:
            for pid in pids:
                if pid not in codes:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        codes[pid] = os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        for pid in set(pids) - set(codes):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert sorted(codes.values()) == [0, 0, 0, 0], codes
        _check_after(store)
    finally:
        store.close()


def _mp_child(store: SQLiteSessionStore, index: int) -> None:
    sys.exit(_child_work(store, index))


def test_children_of_multiprocessing_fork_use_their_own_connections(tmp_path: Path) -> None:
    store = _opened(tmp_path / "mp.db")
    try:
        fork = multiprocessing.get_context("fork")
        children = [fork.Process(target=_mp_child, args=(store, index)) for index in range(4)]
        for child in children:
            child.start()
        deadline = time.monotonic() + 60
        for child in children:
            child.join(max(0.1, deadline - time.monotonic()))
        hung = [c for c in children if c.is_alive()]
        for child in hung:
            child.kill()
            child.join()
        assert not hung and [c.exitcode for c in children] == [0, 0, 0, 0]
        _check_after(store)
    finally:
        store.close()


def _open_files(path: Path) -> int:
    """How many file descriptors of this process are open on ``path`` (a connection holds one)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found += 1
        except OSError:
            pass
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_short_lived_threads_reuse_connections_rather_than_leave_one_each(tmp_path: Path) -> None:
    # a turn runs each tool call (a memory tool's read or write) on a thread of its own
    import threading

    path = tmp_path / "threads.db"
    store = SQLiteSessionStore(path)
    try:
        store.create_memory_store("notes")
        store.write_document("notes", "a.md", "tally 0\n")
        errors: list[BaseException] = []

        def call(n: int) -> None:
            try:
                assert store.read_document("notes", "a.md").text == f"tally {n}\n"
                store.replace_in_document("notes", "a.md", f"tally {n}\n", f"tally {n + 1}\n")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        for n in range(30):
            thread = threading.Thread(target=call, args=(n,))
            thread.start()
            thread.join()
        assert errors == []
        assert store.read_document("notes", "a.md").text == "tally 30\n"
        assert _open_files(path) <= 2, "each thread that ran a transaction left its connection open"
        # threads at once still get a connection each
        barrier = threading.Barrier(4)

        def together() -> None:
            with store._read():
                barrier.wait(timeout=10)

        threads = [threading.Thread(target=together) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert 4 <= _open_files(path) <= 5
    finally:
        store.close()
    assert _open_files(path) == 0
