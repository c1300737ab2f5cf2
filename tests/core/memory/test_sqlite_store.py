"""SQLite-only behaviour: real files, real processes, failures of the file system."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from chatflow_cli.core.memory.sqlite import store as sqlite_store_module
from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import SchemaTooNewError, StoreError
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.messages import Message
from chatflow_cli.core.sqlite_store import SCHEMA_VERSION, SQLiteSessionStore

from tests.helpers.clock import FakeClock
from tests.helpers.wait import wait_until

AGENT = Agent(name="Assistant", instructions="Helpful bot")


def run_workers(code: str, count: int, *args: str, timeout: float = 60) -> list[str]:
    """Start ``count`` Python processes running ``code``; they begin together when a go-file appears."""
    go = Path(args[0]).parent.parent / f"go-{time.monotonic_ns()}"  # outside the directory under test
    prelude = textwrap.dedent(
        f"""
        import os, sys, time
        go = {str(go)!r}
        open(go + ".ready-" + sys.argv[1], "w").close()
        while not os.path.exists(go):
            time.sleep(0.001)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", prelude + textwrap.dedent(code), str(i), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    ready = [Path(f"{go}.ready-{i}") for i in range(count)]
    wait_until(lambda: all(p.exists() for p in ready) or any(p.poll() is not None for p in procs), timeout,
               "every worker to start and wait on the go-file")
    go.touch()
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        outs.append(out.strip())
    return outs


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- concurrency across processes -------------------------------------------------------


def test_two_processes_claiming_the_same_message_at_once_one_wins(tmp_path: Path) -> None:
    for round_ in range(3):
        db = tmp_path / f"dedup-{round_}.db"
        SQLiteSessionStore(db).close()
        # each holder stays alive until both have claimed: a dead holder's claim is free again
        code = """
            from chatflow_cli.core.sqlite_store import SQLiteSessionStore
            store = SQLiteSessionStore(sys.argv[2])
            claimed = store.claim_message("MSG-0001")
            open(sys.argv[2] + ".claimed-" + sys.argv[1], "w").close()
            while sum(os.path.exists(sys.argv[2] + ".claimed-" + n) for n in "01") < 2:
                time.sleep(0.005)
            print(claimed)
        """
        results = run_workers(code, 2, str(db))
        assert sorted(results) == ["False", "True"]


@pytest.mark.xdist_group("load")  # many processes: one such test at a time
def test_sixteen_processes_open_a_fresh_file_at_once(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "sessions.db"
    code = """
        from chatflow_cli.core.agents import Agent
        from chatflow_cli.core.sqlite_store import SQLiteSessionStore
        from chatflow_cli.core.messages import Message
        store = SQLiteSessionStore(sys.argv[2])
        ctx = store.get_or_create("s" + sys.argv[1], Agent(name="A", instructions=""))
        ctx.add_message(Message.user("hi"))
        store.save(ctx)
        print("ok")
    """
    assert run_workers(code, 16, str(db)) == ["ok"] * 16
    conn = sqlite3.connect(db)
    try:
        versions = conn.execute("SELECT version FROM chatflow_schema_migrations ORDER BY version").fetchall()
        assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]  # each applied once
        assert conn.execute("SELECT COUNT(*) FROM chatflow_sessions").fetchone()[0] == 16
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_event_seq_allocated_in_transaction_across_processes(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    store = SQLiteSessionStore(db)
    store.get_or_create("shared", AGENT)
    code = """
        from chatflow_cli.core.sqlite_store import SQLiteSessionStore
        store = SQLiteSessionStore(sys.argv[2])
        for n in range(25):
            store.append_event("shared", "worker.note", {"worker": sys.argv[1], "n": n})
        print("ok")
    """
    run_workers(code, 4, str(db))
    seqs = [e.seq for e in store.events("shared")]
    assert seqs == list(range(1, 102))
    per_worker = {}
    for e in store.events("shared")[1:]:
        per_worker.setdefault(e.payload["worker"], []).append(e.payload["n"])
    assert all(ns == list(range(25)) for ns in per_worker.values()) and len(per_worker) == 4
    store.close()


# -- durability ---------------------------------------------------------------------------


def test_dedup_survives_reopening(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    clock = FakeClock()
    store = SQLiteSessionStore(db)
    store.clock = clock
    store.mark_message_processed("wamid.HBgLMjAyNjEwMzAA")
    store.close()
    again = SQLiteSessionStore(db)
    again.clock = clock
    assert again.is_message_processed("wamid.HBgLMjAyNjEwMzAA")
    assert again.claim_message("wamid.HBgLMjAyNjEwMzAA") is False
    clock.advance(192 * 3600)
    assert not again.is_message_processed("wamid.HBgLMjAyNjEwMzAA")
    again.close()


def test_running_session_survives_restart_and_window_query_uses_index(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(db)
    start = store.begin_turn("s", default_agent=AGENT, user_message=Message.user("hi"), owner=Owner.current())
    store.close()
    again = SQLiteSessionStore(db)
    ctx = again.get("s")
    assert ctx is not None and ctx.history == start.session.history
    plan = (
        again._connection()
        .execute(
            "EXPLAIN QUERY PLAN SELECT turn, message_json FROM chatflow_messages WHERE session_id = ? AND turn >= ? "
            "AND removed_at_seq IS NULL ORDER BY turn, position",
            ("s", 3),
        )
        .fetchall()
    )
    assert any("chatflow_messages_live" in row[-1] for row in plan), plan
    again.close()


# -- files ------------------------------------------------------------------------------


def test_new_files_are_private(tmp_path: Path) -> None:
    db = tmp_path / "private" / "deeper" / "s.db"
    store = SQLiteSessionStore(db)
    store.get_or_create("s", AGENT)
    for directory in (db.parent, db.parent.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in ("s.db", "s.db-wal", "s.db-shm"):
        assert stat.S_IMODE((db.parent / name).stat().st_mode) == 0o600, name
    store.close()


def _future_schema(path: Path) -> None:
    SQLiteSessionStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO chatflow_schema_migrations VALUES (?, 'from the future', 0)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _text_file(path: Path) -> None:
    path.write_text("these are my notes, not a database\n" * 200)


@pytest.mark.parametrize(
    "make_file, error, match",
    [
        (_future_schema, SchemaTooNewError, "newer than this chatflow"),
        (_text_file, StoreError, "not a SQLite database"),
    ],
)
def test_refused_files_are_left_unchanged(tmp_path: Path, make_file, error: type[Exception], match: str) -> None:
    path = tmp_path / "existing.db"
    make_file(path)
    before = sha256(path)
    with pytest.raises(error, match=match) as raised:
        SQLiteSessionStore(path)
    assert "\n" not in str(raised.value)
    assert sha256(path) == before


def test_truncated_database(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = SQLiteSessionStore(db)
    ctx = store.get_or_create("s", AGENT)
    for n in range(300):
        ctx.add_message(Message.user(f"user message number {n} " * 5))
        ctx.add_message(Message.model("answer " * 20))
    store.save(ctx)
    store.close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])
    with pytest.raises(StoreError) as err:
        broken = SQLiteSessionStore(db)
        broken.get("s")
        broken.load_turns("s")
    assert "\n" not in str(err.value)
    assert str(err.value) == f"{db} is corrupt or truncated (database disk image is malformed)"


def test_disk_full_fails_cleanly(tmp_path: Path) -> None:
    db = tmp_path / "full.db"
    store = SQLiteSessionStore(db)
    ctx = store.get_or_create("s", AGENT)
    add = 0
    conn = store._connection()
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 5}")
    with pytest.raises(StoreError, match="disk is full"):
        while True:
            add += 1
            ctx.add_message(Message.user("x" * 2000))
            store.save(ctx)
    assert add > 1
    saved_turns = len(store.load_turns("s"))
    assert saved_turns == add - 1  # the failed save left nothing behind
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store.close()
    check = sqlite3.connect(db)
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    check.close()


def _as_unprivileged(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a process that obeys file permissions.

    Root ignores them; as root the child runs under ``setpriv`` without the
    CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH capabilities, so a 0555 directory is read-only to it.
    """
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:  # pragma: no cover
            pytest.skip("running as root without setpriv: cannot make a directory read-only")
        prefix = [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--"]
    return subprocess.run(
        [*prefix, sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("existing", [False, True])
def test_read_only_directory(tmp_path: Path, existing: bool) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    db = locked / "s.db"
    if existing:
        SQLiteSessionStore(db).close()
        os.chmod(db, 0o644)
    os.chmod(locked, 0o555)
    code = """
        import sys
        from chatflow_cli.core.errors import StoreError
        from chatflow_cli.core.sqlite_store import SQLiteSessionStore
        try:
            store = SQLiteSessionStore(sys.argv[1])
            store.mark_message_processed("m")
        except StoreError as exc:
            print(type(exc).__name__, exc)
        else:
            print("no error")
    """
    result = _as_unprivileged(code, str(db))
    os.chmod(locked, 0o755)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("StoreError "), line
    assert len(line.splitlines()) == 1
    reason = "attempt to write a readonly database" if existing else f"[Errno 13] Permission denied: {str(db)!r}"
    assert line == f"StoreError {db} cannot be written: read-only file or directory ({reason})"


# -- async: the private pool --------------------------------------------------------------


def test_blocking_io_pool_for_files_and_loop_for_memory(tmp_path: Path) -> None:
    assert sqlite_store_module._BLOCKING_IO_WORKERS == 4

    def threads_used(store: SQLiteSessionStore) -> set[str]:
        seen: set[str] = set()

        def resolver(name: str) -> Agent:
            seen.add(threading.current_thread().name)
            time.sleep(0.05)
            return AGENT

        store.get_or_create("s", AGENT)
        store.set_agent_resolver(resolver)

        async def main() -> None:
            await asyncio.gather(*(store.aget("s") for _ in range(12)))

        asyncio.run(main())
        store.close()
        return seen

    on_disk = threads_used(SQLiteSessionStore(tmp_path / "pool.db"))
    assert 1 < len(on_disk) <= 4 and all(n.startswith("chatflow-sqlite") for n in on_disk), on_disk
    for ephemeral in (":memory:", "file::memory:?cache=shared", f"file:{tmp_path / 'm'}?mode=memory&cache=shared"):
        assert threads_used(SQLiteSessionStore(ephemeral)) == {threading.current_thread().name}, ephemeral


def test_ephemeral_database_works_as_a_store() -> None:
    store = SQLiteSessionStore(":memory:")
    ctx = store.get_or_create("s", AGENT)
    ctx.add_message(Message.user("hi"))
    store.save(ctx)
    assert store.get("s").history == (Message.user("hi"),)  # type: ignore[union-attr]
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.get("s")


def test_stored_json_is_one_message_a_row(tmp_path: Path) -> None:
    db = tmp_path / "rows.db"
    store = SQLiteSessionStore(db)
    ctx = store.get_or_create("s", AGENT, metadata={"user_id": "cust_882"})
    ctx.add_message(Message.user("olá"))
    store.save(ctx)
    store.close()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT turn, role, message_json FROM chatflow_messages").fetchall()
    assert rows == [
        (1, "user", json.dumps({"role": "user", "content": "olá"}, ensure_ascii=False, separators=(",", ":")))
    ]
    meta = conn.execute("SELECT active_agent_name, metadata_json FROM chatflow_sessions").fetchone()
    assert meta == ("Assistant", '{"user_id":"cust_882"}')
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("DELETE FROM chatflow_sessions")
    assert conn.execute("SELECT COUNT(*) FROM chatflow_messages").fetchone()[0] == 0  # ON DELETE CASCADE
    conn.close()


def test_importing_the_stores_does_not_import_asyncio_or_concurrent_futures() -> None:
    """Startup cost: sync callers (``chatflow sessions ls``) must not pay for asyncio's import."""
    import subprocess
    import sys

    code = ("import sys, chatflow_cli.core.sqlite_store, chatflow_cli.core.memory; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('asyncio', 'concurrent')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_migration_2_keeps_processed_ids_of_a_version_1_file(tmp_path: Path) -> None:
    """A file written before message claims existed: its processed ids stay processed."""
    from chatflow_cli.core.memory import MessageState
    from chatflow_cli.core.memory.sqlite.schema import _MIGRATIONS, _MIGRATIONS_TABLE

    db = tmp_path / "v1.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(_MIGRATIONS_TABLE)
    for statement in _MIGRATIONS[0][2]:
        conn.execute(statement)
    conn.execute("INSERT INTO chatflow_schema_migrations VALUES (1, 'v1', 0)")
    conn.execute("INSERT INTO chatflow_processed_messages VALUES ('wamid.OLD', ?)", (time.time(),))
    conn.close()
    store = SQLiteSessionStore(db)
    try:
        assert store.message_state("wamid.OLD") is MessageState.PROCESSED
        assert store.claim_message("wamid.OLD") is False
        assert store.claim_message("wamid.NEW") is True
    finally:
        store.close()
    conn = sqlite3.connect(db)
    try:
        versions = conn.execute("SELECT version FROM chatflow_schema_migrations ORDER BY version").fetchall()
        assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_a_version_1_database_gains_session_endpoints_and_keeps_its_sessions(tmp_path: Path) -> None:
    """A file made before session endpoints existed gains their table in one migration."""
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.memory.sqlite.schema import _MIGRATIONS

    db = tmp_path / "v1.db"
    conn = sqlite3.connect(db)
    conn.execute("""CREATE TABLE chatflow_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,
                    applied_at_utc REAL NOT NULL)""")
    for statement in _MIGRATIONS[0][2]:
        conn.execute(statement)
    conn.execute("INSERT INTO chatflow_schema_migrations VALUES (1, 'v1', 0)")
    conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, max_turns, "
                 "created_at_utc, updated_at_utc) VALUES ('old', 'i', 'A', 5, 1, 1)")
    conn.commit()
    conn.close()
    store = SQLiteSessionStore(db)
    try:
        assert [s.session_id for s in store.list_sessions()] == ["old"]
        assert store.session_endpoint("old") == (None, None)
        store.set_session_endpoint("old", "m", "http://x/v1")
        assert store.session_endpoint("old") == ("m", "http://x/v1")
        store.get_or_create("new", Agent(name="A", instructions=""))
    finally:
        store.close()
    conn = sqlite3.connect(db)
    try:
        versions = [v for (v,) in conn.execute("SELECT version FROM chatflow_schema_migrations ORDER BY version")]
        assert versions == list(range(1, SCHEMA_VERSION + 1))
    finally:
        conn.close()
