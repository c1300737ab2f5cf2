"""The PostgreSQL store under real operations (issue 31): values kept exactly, migrations
that can be finished, forked processes, a worker with a wrong clock, a server restarting
under a library user. Every test runs against a real server (``pg_dsn``)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import StoreError
from chatflow_cli.core.messages import Message
from tests.helpers.fakeserver import FakeServer
from tests.helpers.pgserver import PgServer

REPO = Path(__file__).resolve().parents[3]
AGENT = Agent(name="Assistant", instructions="Be brief.", model="fake-model")


def _store(dsn: str, **kwargs: Any) -> Any:
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    return PostgresSessionStore(dsn, **kwargs)


def _apply(conn: Any, number: int, *, record: bool = True) -> None:
    """Migration ``number``'s statements and steps, with its version row when ``record``."""
    from chatflow_cli.core.memory.postgres import schema

    conn.execute(schema._MIGRATIONS_TABLE)
    _, name, steps = schema._MIGRATIONS[number - 1]
    for step in steps:
        if step.startswith("_"):
            getattr(schema, step)(conn)
        else:
            conn.execute(step)
    if record:
        conn.execute("INSERT INTO chatflow_schema_migrations VALUES (%s, %s, 0)", (number, name))


def _versions(dsn: str) -> list[int]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT version FROM chatflow_schema_migrations ORDER BY version")]


# ---------------------------------------------------------------------------------------
# values come back as they were written (the contract test covers every store)
# ---------------------------------------------------------------------------------------


def test_rows_written_before_exact_text_are_kept_and_new_writes_are_exact(pg_dsn: str) -> None:
    import psycopg

    from chatflow_cli.core.memory.postgres import schema

    old = Message.user("from an older chatflow")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for number in range(1, 6):
            _apply(conn, number)
        conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, metadata, max_turns, "
                     "turn_count, last_seq, created_at_utc, updated_at_utc, forked_from, agent_versions) VALUES "
                     "('s', 'i', 'Assistant', '{\"n\": 1e16}', 20, 1, 1, 0, 0, "
                     "'{\"session_id\": \"src\", \"turn\": 1, \"seq\": 3}', "
                     "'{\"Assistant\": {\"version\": \"abc\", \"turn\": 1}}')")
        conn.execute("INSERT INTO chatflow_messages (session_id, turn, role, message, event_seq) "
                     "VALUES ('s', 1, 'user', %s::jsonb, 1)", (json.dumps(old.to_dict()),))
        conn.execute("INSERT INTO chatflow_events (session_id, seq, event_type, turn, payload, created_at_utc) "
                     "VALUES ('s', 1, 'note', NULL, '{\"b\": 1, \"a\": 2}'::jsonb, 0)")
    store = _store(pg_dsn)
    try:
        loaded = store.get("s")
        assert loaded is not None and [m.content for m in loaded.history] == [old.content]
        assert loaded.metadata == {"n": 10000000000000000}  # what jsonb had made of it: kept
        assert store.events("s")[0].payload == {"a": 2, "b": 1}
        summary = store.session_summary("s")
        assert summary.forked_from == {"session_id": "src", "turn": 1, "seq": 3}
        assert summary.agent_versions == {"Assistant": {"version": "abc", "turn": 1}}
        store.append_event("s", "note", {"b": 1e16, "a": -0.0})
        assert json.dumps(store.events("s")[-1].payload) == '{"b": 1e+16, "a": -0.0}'
    finally:
        store.close()
    assert _versions(pg_dsn) == list(range(1, schema.SCHEMA_VERSION + 1))
    with psycopg.connect(pg_dsn) as conn:  # one representation: the exact text
        assert conn.execute("SELECT count(*) FROM chatflow_messages WHERE message IS NOT NULL "
                            "OR message_text IS NULL").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM chatflow_events WHERE payload IS NOT NULL "
                            "OR payload_text IS NULL").fetchone() == (0,)


# ---------------------------------------------------------------------------------------
# migrations
# ---------------------------------------------------------------------------------------


def test_a_migration_applied_without_its_version_row_is_finished_at_the_next_start(
    pg_server: PgServer, pg_dsn: str
) -> None:
    import psycopg

    from chatflow_cli.core.memory.postgres import schema

    for number in range(1, schema.SCHEMA_VERSION + 1):
        dsn = pg_server.dsn(pg_server.create_database())
        with psycopg.connect(dsn, autocommit=True) as conn:
            for before in range(1, number):
                _apply(conn, before)
            if number > 1:
                conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, metadata, "
                             "max_turns, created_at_utc, updated_at_utc) "
                             "VALUES ('s', 'i', 'Assistant', '{}', 20, 0, 0)")
            _apply(conn, number, record=False)  # its changes are there, its version row is not
        store = _store(dsn)
        try:
            assert store.get_or_create("s", AGENT).session_id == "s"
        finally:
            store.close()
        assert _versions(dsn) == list(range(1, schema.SCHEMA_VERSION + 1)), number
        store = _store(dsn)  # and a start after that has nothing left to do
        store.close()


def test_a_failing_migration_names_its_version_and_what_to_do(pg_dsn: str) -> None:
    import psycopg

    from chatflow_cli.core.memory.postgres import schema

    last = schema.SCHEMA_VERSION
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for number in range(1, last):
            _apply(conn, number)
        conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, metadata, max_turns, "
                     "created_at_utc, updated_at_utc) VALUES ('s', 'i', 'Assistant', '{}', 20, 0, 0)")
        conn.execute("INSERT INTO chatflow_messages (session_id, turn, role, message, event_seq) "
                     "VALUES ('s', 1, 'user', '{\"role\": \"user\", \"content\": \"x\"}', 1)")
        conn.execute("INSERT INTO chatflow_events (session_id, seq, event_type, payload, created_at_utc) "
                     "VALUES ('s', 1, 'note', '{}', 0)")
        # something of the operator's refuses every change: the last migration cannot run
        conn.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$ BEGIN RAISE EXCEPTION 'changes are frozen'; END $$")
        for table in ("chatflow_messages", "chatflow_events", "chatflow_sessions"):
            conn.execute(f"CREATE TRIGGER frozen BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION refuse()")
        # the last migration (attachments) only adds tables: an operator's table of the same
        # name, without the column its index names, makes the index impossible
        conn.execute("CREATE TABLE chatflow_attachment_refs (session_id text)")
    with pytest.raises(StoreError) as info:
        _store(pg_dsn)
    text = str(info.value)
    assert f"schema migration {last} (" in text and 'column "sha256" does not exist' in text
    assert f"stays at schema version {last - 1}" in text and "start chatflow again" in text
    assert info.value.exit_code == 8 and "\n" not in text
    assert _versions(pg_dsn) == list(range(1, last))


def test_a_failing_migration_whose_reason_ends_with_a_full_stop_says_it_once(pg_dsn: str) -> None:
    """PostgreSQL's DETAIL ends with a full stop ("Failing row contains (...)."): the message
    goes on after it without a second one."""
    import psycopg

    from chatflow_cli.core.memory.postgres import schema

    # the migration that moves each message's JSON to its text column
    last = next(n for n, name, _ in schema._MIGRATIONS if "exact JSON text" in name)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for number in range(1, last):
            _apply(conn, number)
        conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, metadata, max_turns, "
                     "created_at_utc, updated_at_utc) VALUES ('s', 'i', 'Assistant', '{}', 20, 0, 0)")
        conn.execute("INSERT INTO chatflow_messages (session_id, turn, role, message, event_seq) "
                     "VALUES ('s', 1, 'user', '{\"role\": \"user\", \"content\": \"x\"}', 1)")
        # an operator's constraint that migration's rewrite of the row breaks
        conn.execute("ALTER TABLE chatflow_messages ADD CONSTRAINT kept CHECK (message IS NOT NULL)")
    with pytest.raises(StoreError) as info:
        _store(pg_dsn)
    text = str(info.value)
    assert f"schema migration {last} (" in text and "violates check constraint" in text, text
    assert ".." not in text and ". It was rolled back" in text, text


# ---------------------------------------------------------------------------------------
# the message-claim TTL on the database's clock
# ---------------------------------------------------------------------------------------

_STEPPED_WORKER = """
import json, sys, time
from chatflow_cli.core.memory.postgres import PostgresSessionStore
store = PostgresSessionStore(sys.argv[1])
real = time.time
time.time = lambda: real() + 200 * 3600  # this host's clock steps 200 hours forward
out = {"claimed": store.claim_message("m-1"), "processed": store.is_message_processed("m-1", wait=0),
       "state": store.message_state("m-1").value, "other": store.claim_message("m-2")}
store.close()
print(json.dumps(out))
"""


def test_a_worker_whose_clock_stepped_forward_does_not_claim_a_processed_message_again(pg_dsn: str) -> None:
    store = _store(pg_dsn)
    try:
        assert store.claim_message("m-1")
        store.complete_message("m-1")
        done = subprocess.run([sys.executable, "-c", _STEPPED_WORKER, pg_dsn], capture_output=True, text=True,
                              timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen == {"claimed": False, "processed": True, "state": "processed", "other": True}
        # its purge judged the TTL on the database's clock too: nothing of ours was dropped
        assert store.message_state("m-1").value == "processed" and not store.claim_message("m-1")
    finally:
        store.close()


# ---------------------------------------------------------------------------------------
# a process that forks while the store is open
# ---------------------------------------------------------------------------------------


def _child_turns(dsn_store: Any, base_url: str, index: int) -> int:
    """Three turns on a session of its own through the store inherited over fork; 0 when all
    three answered."""
    from chatflow_cli.core.model import ModelClient
    from chatflow_cli.core.runner import Runner

    runner = Runner(AGENT, dsn_store, model_client=ModelClient(base_url=base_url, api_key="test-key"))
    for k in range(3):
        result = runner.run(f"child-{index}", f"c{index} t{k}", wait=60)
        if result.content != f"ok: c{index} t{k}":
            return 1
    return 0


def _child_main(store: Any, base_url: str, index: int) -> None:
    signal.alarm(100)  # a hang dies here instead of holding the test
    code = 1
    try:
        code = _child_turns(store, base_url, index)
    except BaseException as exc:  # noqa: BLE001 - reported by the exit code and on stderr
        print(f"child {index}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    os._exit(code)


def _parent_works_after(store: Any, base_url: str) -> None:
    from chatflow_cli.core.model import ModelClient
    from chatflow_cli.core.runner import Runner

    runner = Runner(AGENT, store, model_client=ModelClient(base_url=base_url, api_key="test-key"))
    assert runner.run("parent", "after the children").content == "ok: after the children"
    history = store.get("parent").history
    assert [m.content for m in history][-2:] == ["after the children", "ok: after the children"]


def _open_and_use(dsn: str, base_url: str) -> Any:
    from chatflow_cli.core.model import ModelClient
    from chatflow_cli.core.runner import Runner

    store = _store(dsn, pool_size=8)
    runner = Runner(AGENT, store, model_client=ModelClient(base_url=base_url, api_key="test-key"))
    assert runner.run("parent", "before the fork").content == "ok: before the fork"  # the pool holds connections
    return store


def test_children_forked_with_os_fork_open_their_own_connections(pg_dsn: str, fake_server: FakeServer) -> None:
    store = _open_and_use(pg_dsn, fake_server.url)
    try:
        pids = []
        for index in range(4):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                _child_main(store, fake_server.url, index)
            pids.append(pid)
        deadline = time.monotonic() + 110
        codes = {}
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
        for index in range(4):
            assert store.turn_count(f"child-{index}") == 3
        _parent_works_after(store, fake_server.url)
    finally:
        store.close()


def _mp_child(store: Any, base_url: str, index: int) -> None:
    sys.exit(_child_turns(store, base_url, index))


def test_children_of_multiprocessing_fork_open_their_own_connections(pg_dsn: str, fake_server: FakeServer) -> None:
    store = _open_and_use(pg_dsn, fake_server.url)
    try:
        fork = multiprocessing.get_context("fork")
        children = [fork.Process(target=_mp_child, args=(store, fake_server.url, index)) for index in range(4)]
        for child in children:
            child.start()
        deadline = time.monotonic() + 110
        for child in children:
            child.join(max(0.1, deadline - time.monotonic()))
        hung = [c for c in children if c.is_alive()]
        for child in hung:
            child.kill()
            child.join()
        assert not hung and [c.exitcode for c in children] == [0, 0, 0, 0]
        for index in range(4):
            assert store.turn_count(f"child-{index}") == 3
        _parent_works_after(store, fake_server.url)
    finally:
        store.close()


# ---------------------------------------------------------------------------------------
# a library user while the server restarts
# ---------------------------------------------------------------------------------------

_LIBRARY_USER = """
import sys, time
from chatflow_cli import ChatflowError
from chatflow_cli.core.memory.postgres import PostgresSessionStore
store = PostgresSessionStore(sys.argv[1], pool_size=4)
store.append_event(store.get_or_create("bot", "Assistant").session_id, "note", {"n": 0})
print("ready", flush=True)
sys.stdin.readline()  # the server is restarted meanwhile
deadline = time.monotonic() + 60
n, failures = 1, 0
while n <= 20 and time.monotonic() < deadline:
    try:
        store.append_event("bot", "note", {"n": n}, idempotency_key=f"k{n}")
        n += 1
    except ChatflowError:
        failures += 1
        time.sleep(0.1)
store.close()
print("done", n - 1, failures, flush=True)
"""


def test_a_library_user_sees_none_of_the_pools_warnings_while_the_server_restarts(
    pg_server: PgServer, pg_dsn: str
) -> None:
    user = subprocess.Popen([sys.executable, "-c", _LIBRARY_USER, pg_dsn], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert user.stdout is not None and user.stdin is not None
        assert user.stdout.readline().strip() == "ready"
        pg_server.restart()
        user.stdin.write("go\n")
        user.stdin.flush()
        out, err = user.communicate(timeout=120)
    finally:
        if user.poll() is None:
            user.kill()
            user.communicate()
    assert user.returncode == 0, err
    assert out.split()[:2] == ["done", "20"], out
    assert err == "", err  # the pool's chatter stayed in logging


# ---------------------------------------------------------------------------------------
# an Agents SDK session on PostgreSQL
# ---------------------------------------------------------------------------------------


def test_agents_sdk_items_come_back_from_postgres_as_they_were_added(pg_dsn: str, tmp_path: Path) -> None:
    import asyncio

    pytest.importorskip("agents", reason="the agents-sdk extra (openai-agents) is not installed")
    from chatflow_cli.core.sdk_session import ChatflowSession
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    items = [
        {"role": "user", "content": "add 1e16 and -0.0"},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a":1e16,"b":-0.0}',
         "status": "completed", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c1", "output": "1e+16"},
        {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "sum"}], "zz": 1e16,
         "encrypted_content": None, "a": -0.0, "big": 2**70, "one": 1.0},
        {"role": "assistant", "content": "1e16", "type": "message", "status": "completed", "id": "m1"},
    ]
    pg = _store(pg_dsn)
    sqlite = SQLiteSessionStore(tmp_path / "s.db")
    try:
        asyncio.run(ChatflowSession("sdk", pg).add_items(items))
        asyncio.run(ChatflowSession("sdk", sqlite).add_items(items))
        again = _store(pg_dsn)
        try:
            from_pg = asyncio.run(ChatflowSession("sdk", again).get_items())
        finally:
            again.close()
        from_sqlite = asyncio.run(ChatflowSession("sdk", sqlite).get_items())
    finally:
        pg.close()
        sqlite.close()
    assert json.dumps(from_pg) == json.dumps(items) == json.dumps(from_sqlite)
