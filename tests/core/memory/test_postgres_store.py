"""The PostgreSQL store on a real server: many processes, leases across hosts, faults.

The store contract and the property tests run on PostgreSQL through the ``postgres`` store
kind (tests/core/memory/conftest.py); this file holds what only a shared server has: worker
processes writing at once, owners on other "hosts" (owner identities whose pids the other
workers cannot see) recovered when their lease runs out, and the server failing under a turn.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import SchemaTooNewError, SessionBusyError, StoreError
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.messages import Message
from tests.helpers.fakeserver import FakeServer
from tests.helpers.pgserver import PASSWORD, PgServer

REPO = Path(__file__).resolve().parents[3]
AGENT = Agent(name="Assistant", instructions="Be brief.", model="fake-model")


def _store(dsn: str, **kwargs: Any) -> Any:
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    return PostgresSessionStore(dsn, **kwargs)


def _worker(*args: str, env: dict[str, str] | None = None, stderr: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.core.memory.pg_worker", *args],
        stdout=subprocess.PIPE, stderr=stderr, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def _wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
        time.sleep(interval)


def _other_host(name: str) -> Owner:
    me = Owner.current()
    return Owner(me.pid, me.start_time, name, me.token)


def _assert_gap_free(store: Any, session_id: str) -> list[Any]:
    events = store.events(session_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), session_id
    return events


# ---------------------------------------------------------------------------------------
# migrations and schema versions
# ---------------------------------------------------------------------------------------


@pytest.mark.xdist_group("load")  # many processes: one such test at a time
@pytest.mark.ci_long  # a load run, in CI's second pass; the default run keeps SQLite's (test_sqlite_store.py)
def test_sixteen_processes_opening_a_fresh_database_migrate_it_once(pg_dsn: str) -> None:
    code = (
        "import sys; from chatflow_cli.core.memory.postgres import PostgresSessionStore as S; "
        "s = S(sys.argv[1]); s.close(); print('ok')"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, pg_dsn], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}) for _ in range(16)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == b"ok", err.decode()
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT version FROM chatflow_schema_migrations ORDER BY version").fetchall()
    from chatflow_cli.core.memory.postgres import SCHEMA_VERSION

    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))


def test_a_database_from_a_newer_chatflow_is_refused_unchanged(pg_dsn: str) -> None:
    import psycopg

    store = _store(pg_dsn)
    store.get_or_create("s", AGENT)
    store.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO chatflow_schema_migrations VALUES (99, 'from the future', 0)")
        before = conn.execute("SELECT count(*) FROM chatflow_events").fetchone()
    with pytest.raises(SchemaTooNewError, match="schema version 99") as info:
        _store(pg_dsn)
    assert PASSWORD not in str(info.value)
    assert info.value.exit_code == 8
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM chatflow_events").fetchone() == before


def test_a_version_1_database_gets_token_counts_and_a_search_index_and_keeps_its_messages(pg_dsn: str) -> None:
    import psycopg

    from chatflow_cli.core.memory.postgres import schema
    from chatflow_cli.core.tokens import estimate_tokens

    user, reply = Message.user("what is the capital of France? " * 5), Message.model("Paris.")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(schema._MIGRATIONS_TABLE)
        for statement in schema._MIGRATIONS[0][2]:
            conn.execute(statement)
        conn.execute("INSERT INTO chatflow_schema_migrations VALUES (1, 'first', 0)")
        conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, metadata, max_turns, "
                     "turn_count, last_seq, created_at_utc, updated_at_utc) VALUES ('s', 'i', 'Assistant', '{}', 20, 1, "
                     "2, 0, 0)")
        for seq, message in enumerate([user, reply], 1):
            conn.execute("INSERT INTO chatflow_messages (session_id, turn, role, message, event_seq) "
                         "VALUES ('s', 1, %s, %s::jsonb, %s)", (message.role.value, json.dumps(message.to_dict()), seq))
            conn.execute("INSERT INTO chatflow_events (session_id, seq, event_type, turn, payload, created_at_utc) "
                         "VALUES ('s', %s, 'message', 1, %s::jsonb, 0)", (seq, json.dumps(message.to_dict())))
    store = _store(pg_dsn)
    try:
        history = store.get("s").history
        assert [m.content for m in history] == [user.content, "Paris."]
        assert [m.tokens for m in history] == [estimate_tokens(user), estimate_tokens(reply)]
        hits = store.search("paris")  # the migration indexed the rows it found
        assert [(h.session_id, h.turn, h.role, h.removed) for h in hits] == [("s", 1, "model", None)]
    finally:
        store.close()
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT version FROM chatflow_schema_migrations ORDER BY version").fetchall()
        assert [r[0] for r in rows] == list(range(1, schema.SCHEMA_VERSION + 1))
        assert conn.execute("SELECT count(*) FROM chatflow_messages WHERE tokens IS NULL").fetchone() == (0,)


# ---------------------------------------------------------------------------------------
# connection faults
# ---------------------------------------------------------------------------------------


def test_a_server_that_refuses_the_connection_is_a_store_error(pg_server: PgServer) -> None:
    from tests.helpers.pgserver import free_port

    dsn = f"postgresql://chatflow:{PASSWORD}@127.0.0.1:{free_port()}/nothing"
    started = time.monotonic()
    with pytest.raises(StoreError, match="cannot connect") as info:
        _store(dsn)
    assert time.monotonic() - started < 10
    assert PASSWORD not in str(info.value) and "chatflow:***@" in str(info.value)
    assert info.value.exit_code == 8


def test_bad_credentials_are_a_store_error_without_the_password(pg_server: PgServer, pg_dsn: str) -> None:
    wrong = pg_dsn.replace(PASSWORD, "Wrong-Secret-123")
    with pytest.raises(StoreError, match="authentication failed") as info:
        _store(wrong)
    assert "Wrong-Secret-123" not in str(info.value) and PASSWORD not in str(info.value)
    assert "Wrong-Secret-123" not in repr(info.value)


def test_a_connection_lost_inside_a_transaction_writes_nothing(pg_server: PgServer, pg_dsn: str) -> None:
    store = _store(pg_dsn)
    store.get_or_create("s", AGENT)
    before = store.last_seq("s")
    with pytest.raises(StoreError, match="lost the connection") as info:
        with store._write() as tx:
            row = tx.get_row("s")
            assert row is not None
            store._append(tx, "s", "note", {"written": "before the cut"})
            pid = tx._conn.info.backend_pid
            pg_server.admin(f"SELECT pg_terminate_backend({pid})")
            store._append(tx, "s", "note", {"written": "after the cut"})
            tx.update_row(row)
            tx.flush()
    assert PASSWORD not in str(info.value)
    assert store.last_seq("s") == before  # the next transaction works, on another connection
    assert [e.type for e in store.events("s")] == ["session.created"]
    store.close()


def test_the_server_restarted_mid_turn_the_turn_ends_cleanly_and_the_next_works(
    pg_server: PgServer, pg_dsn: str, fake_server: FakeServer
) -> None:
    """A restart between the turn's transactions: the pooled connections are dead, the save
    takes a fresh one; a server still down at save time is a clean StoreError, and once it
    is back the next turn works and the interrupted one was closed."""
    from chatflow_cli.core.model import ModelClient
    from chatflow_cli.core.runner import Runner

    store = _store(pg_dsn, lease_s=2.0)
    runner = Runner(AGENT, store, model_client=ModelClient(base_url=fake_server.url, api_key="k"))
    assert runner.run("s", "first").content == "ok: first"

    fake_server.add_text("slow answer", delay=1.0)
    restarted = threading.Thread(target=lambda: (_wait_for(lambda: len(fake_server.requests) >= 2), pg_server.restart()))
    restarted.start()
    result = runner.run("s", "during a restart")
    restarted.join()
    assert result.content == "slow answer"

    fake_server.add_text("never saved", delay=1.0)
    stopper = threading.Thread(target=lambda: (_wait_for(lambda: len(fake_server.requests) >= 3),
                                               pg_server.stop("fast")))
    stopper.start()
    failed_at = time.monotonic()
    with pytest.raises(StoreError) as info:
        runner.run("s", "server down at save time")
    assert time.monotonic() - failed_at < 15  # said at once, not after the pool's 30 s wait
    stopper.join()
    assert PASSWORD not in str(info.value)
    pg_server.start()
    del info
    again = _store(pg_dsn)
    # nothing half-written: the log has whole turns; the turn begun before the stop is still
    # marked running (its ending could not be written) until the next turn recovers it
    events = _assert_gap_free(again, "s")
    assert [e.type for e in events].count("turn.completed") == 2
    runner2 = Runner(AGENT, again, model_client=ModelClient(base_url=fake_server.url, api_key="k"))
    store.close()  # the turn ended (unstored): its owner counts as dead, its lease is not renewed
    again.close()
    third = _store(pg_dsn, lease_s=1.0)
    runner3 = Runner(AGENT, third, model_client=ModelClient(base_url=fake_server.url, api_key="k"))
    del runner2
    assert runner3.run("s", "after the restart", wait=60).content == "ok: after the restart"
    types = [e.type for e in _assert_gap_free(third, "s")]
    assert types.count("turn.completed") == 3
    assert "session.recovered" in types  # the stopped turn was closed before the next one
    third.close()


# ---------------------------------------------------------------------------------------
# leases: owners on other hosts
# ---------------------------------------------------------------------------------------


def test_a_live_owner_on_another_host_keeps_its_turn_while_it_renews_its_lease(pg_dsn: str) -> None:
    a = _store(pg_dsn, lease_s=1.0)
    b = _store(pg_dsn, lease_s=1.0)
    start = a.begin_turn("s", default_agent=AGENT, user_message=Message.user("q1"), owner=_other_host("host-a"))

    import psycopg

    def lease() -> Any:
        with psycopg.connect(pg_dsn) as conn:
            return conn.execute("SELECT lease_expires_at FROM chatflow_sessions WHERE session_id = 's'").fetchone()[0]

    first = lease()
    # renewed twice, well past the first lease's end: still busy for host-b
    second = _wait_for(lambda: (v := lease()) > first and v, timeout=10)
    _wait_for(lambda: lease() > second, timeout=10)
    with pytest.raises(SessionBusyError, match="host-a"):
        b.begin_turn("s", default_agent=AGENT, user_message=Message.user("q2"), owner=_other_host("host-b"))
    assert b.running_turn_pid("s") == os.getpid()

    # host-a dies (stops renewing): host-b takes the turn over once the lease has run out
    a._leases.stop()
    a_session = start.session
    del start
    taken = _wait_for(lambda: _try_begin(b, "s", "q2", _other_host("host-b")), timeout=15, interval=0.1)
    types = [e.type for e in taken.events]
    assert types[:2] == ["turn.interrupted", "session.recovered"], types
    assert taken.turn == 2
    events = _assert_gap_free(b, "s")
    began = next(e for e in events if e.type == "status" and e.payload.get("status") == "running")
    recovered = next(e for e in events if e.type == "session.recovered")
    assert recovered.payload["owner"]["host"] == "host-a"
    assert recovered.created_at - began.created_at >= 1.0  # not before the lease expired
    del a_session
    a.close()
    b.close()


def _try_begin(store: Any, session_id: str, text: str, owner: Owner) -> Any:
    try:
        return store.begin_turn(session_id, default_agent=AGENT, user_message=Message.user(text), owner=owner)
    except SessionBusyError:
        return None


def test_a_claim_held_on_another_host_is_free_again_when_its_lease_runs_out(pg_dsn: str) -> None:
    a = _store(pg_dsn, lease_s=1.0)
    b = _store(pg_dsn, lease_s=1.0)
    assert a.claim_message("wamid.1", owner=_other_host("host-a"))
    assert not b.claim_message("wamid.1", owner=_other_host("host-b"))
    assert b.message_state("wamid.1").value == "in_progress"
    a._leases.stop()  # host-a dies
    _wait_for(lambda: b.message_state("wamid.1").value == "new", timeout=15, interval=0.1)
    assert b.claim_message("wamid.1", owner=_other_host("host-b"))
    a.close()
    b.close()


# ---------------------------------------------------------------------------------------
# worker processes
# ---------------------------------------------------------------------------------------

PROCESSES = 8
TURNS = 50


@pytest.mark.xdist_group("load")  # many processes: one such test at a time
@pytest.mark.slow
@pytest.mark.parametrize(("processes", "turns"), [
    pytest.param(PROCESSES, TURNS, id="8x50", marks=pytest.mark.ci_long),
    pytest.param(4, 8, id="4x8"),  # the same checks in the default run, on fewer turns
])
def test_eight_worker_processes_own_and_shared_sessions(processes: int, turns: int, pg_dsn: str,
                                                        fake_server: FakeServer) -> None:
    procs = [_worker("turns", pg_dsn, fake_server.url, str(p), str(turns)) for p in range(processes)]
    outputs = [proc.communicate(timeout=900) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err.decode()[-2000:]
        report = json.loads(out.decode().strip().splitlines()[-1])
        assert report == {"done": 2 * turns, "errors": []}
    assert len(fake_server.requests) == processes * turns * 2

    store = _store(pg_dsn)
    for p in range(processes):
        records = store.load_turns(f"own-{p}", include_rolled_back=True)
        assert [r.number for r in records] == list(range(1, turns + 1))
        assert [r.messages[0].content for r in records] == [f"p{p} own t{k}" for k in range(turns)]
        _assert_gap_free(store, f"own-{p}")
    records = store.load_turns("shared", include_rolled_back=True)
    assert [r.number for r in records] == list(range(1, processes * turns + 1))
    counts = Counter(r.messages[0].content for r in records)
    assert set(counts) == {f"p{p} shared t{k}" for p in range(processes) for k in range(turns)}
    assert set(counts.values()) == {1}
    per_process: dict[str, list[int]] = defaultdict(list)
    for r in records:
        assert [m.role.value for m in r.messages] == ["user", "model"], r
        assert r.messages[1].content == f"ok: {r.messages[0].content}"
        who, _, k = r.messages[0].content.partition(" shared t")
        per_process[who].append(int(k))
    assert all(ks == sorted(ks) for ks in per_process.values())
    events = _assert_gap_free(store, "shared")
    spans: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if isinstance(e.payload.get("turn"), int) and e.payload["turn"] > 0:
            spans[e.payload["turn"]].append(e.seq)
    for turn, seqs in spans.items():
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (turn, seqs)
    assert sum(1 for e in events if e.type == "message.user") == processes * turns
    store.close()


@pytest.mark.xdist_group("load")  # many processes: one such test at a time
@pytest.mark.slow
@pytest.mark.ci_long  # a load run, in CI's second pass; the default run keeps the 16 processes on
# SQLite (tests/hardening/test_concurrency.py) and the 4x8 workers here
def test_sixteen_processes_claiming_one_message_id_call_the_model_once(pg_dsn: str, fake_server: FakeServer) -> None:
    procs = [_worker("claim", pg_dsn, fake_server.url, str(i), "wamid.SAME-0001") for i in range(16)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert len(fake_server.requests) == 1, "the model was called more than once for one message id"
    assert [r["content"] for r in results] == ["ok: order status?"] * 16
    assert sum(1 for r in results if not r["replayed"]) == 1
    store = _store(pg_dsn)
    stored = [s for s in store.list_sessions() if s.turn_count]
    assert len(stored) == 1 and stored[0].turn_count == 1
    assert store.message_state("wamid.SAME-0001").value == "processed"
    store.close()


@pytest.mark.slow
def test_a_worker_killed_mid_turn_on_another_host_is_taken_over_after_its_lease(pg_dsn: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.err"
    with open(log, "wb") as err:
        proc = _worker("hold", pg_dsn, "http://127.0.0.1:9/v1", "s", stderr=err,
                       env={"CHATFLOW_TEST_HOST": "host-a", "CHATFLOW_TEST_LEASE": "1.5"})
    assert proc.stdout is not None
    first_line = proc.stdout.readline()
    assert first_line, log.read_text()
    line = json.loads(first_line)
    assert line["begun"] == 1
    store = _store(pg_dsn, lease_s=1.5)
    with pytest.raises(SessionBusyError):
        store.begin_turn("s", default_agent=AGENT, user_message=Message.user("q2"), owner=_other_host("host-b"))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()  # the killed worker's pipe: left open it is a ResourceWarning, an error here
    killed_at = time.time()
    taken = _wait_for(lambda: _try_begin(store, "s", "q2", _other_host("host-b")), timeout=20, interval=0.05)
    assert [e.type for e in taken.events][:2] == ["turn.interrupted", "session.recovered"]
    assert taken.turn == 2
    events = _assert_gap_free(store, "s")
    interrupted = next(e for e in events if e.type == "turn.interrupted")
    assert interrupted.payload["turn"] == 1
    # the interrupted turn keeps its user message, as on SQLite
    [first] = [r for r in store.load_turns("s") if r.number == 1]
    assert first.messages[0].content == "a long question"
    assert time.time() - killed_at < 20
    store.close()


# ---------------------------------------------------------------------------------------
# LISTEN / NOTIFY
# ---------------------------------------------------------------------------------------


def test_every_commit_that_appends_events_notifies_the_session(pg_dsn: str) -> None:
    import hashlib

    import psycopg

    from chatflow_cli.core.memory.postgres import NOTIFY_CHANNEL

    store = _store(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        ctx = store.get_or_create("watched", AGENT)
        ctx.add_message(Message.user("hello"))
        store.save(ctx)
        store.append_event("watched", "note", {"n": 1})
        notes = [n.payload for n in listener.notifies(timeout=10, stop_after=3)]
    key = hashlib.md5(b"watched").hexdigest()
    assert notes == [key, key, key]  # created, the message's save, the note: one per commit
    store.close()


def test_wait_for_events_wakes_when_another_store_appends(pg_dsn: str) -> None:
    reader = _store(pg_dsn)
    writer = _store(pg_dsn)
    writer.get_or_create("s", AGENT)
    cursor = reader.last_seq("s")
    assert reader.wait_for_events("s", cursor, timeout=0.2) is False
    woke: list[bool] = []
    waiting = threading.Thread(target=lambda: woke.append(reader.wait_for_events("s", cursor, timeout=60)))
    waiting.start()
    writer.append_event("s", "note", {"n": 1})
    waiting.join(timeout=60)
    assert woke == [True]
    assert [e.type for e in reader.events("s", after_seq=cursor)] == ["note"]
    writer.delete("s")
    assert reader.wait_for_events("s", cursor, timeout=5) is True  # deleted: the next read says so
    reader.close()
    writer.close()


# ---------------------------------------------------------------------------------------
# passwords
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://bot:s3cr%40t@db:5432/chat", "postgresql://bot:***@db:5432/chat"),
        ("postgres://bot:s3cret@db/chat?sslmode=require", "postgres://bot:***@db/chat?sslmode=require"),
        ("postgresql://db/chat?password=s3cret&sslmode=require", "postgresql://db/chat?password=***&sslmode=require"),
        ("host=db password='s3 cret' user=bot", "host=db password=*** user=bot"),
        ("postgresql://bot@db/chat", "postgresql://bot@db/chat"),
    ],
)
def test_dsn_passwords_are_redacted(text: str, shown: str) -> None:
    from chatflow_cli.core.dsn import redact_dsn

    assert redact_dsn(text) == shown
    assert redact_dsn(f"error on {text}: refused") == f"error on {shown}: refused"


def test_the_store_never_shows_its_password(pg_dsn: str) -> None:
    store = _store(pg_dsn)
    assert PASSWORD not in repr(store) and "chatflow:***@" in repr(store)
    assert PASSWORD not in store._label
    store.close()


def test_the_password_may_come_from_pgpassword(pg_server: PgServer, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name = pg_dsn.rsplit("/", 1)[1]
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    store = _store(pg_server.dsn(name, password=None))
    assert store.get_or_create("s", AGENT).session_id == "s"
    store.close()
    monkeypatch.setenv("PGPASSWORD", "not-the-password")
    with pytest.raises(StoreError, match="authentication failed") as info:
        _store(pg_server.dsn(name, password=None))
    assert "not-the-password" not in str(info.value)


def test_redaction_hides_a_password_written_with_a_raw_at_whole() -> None:
    from chatflow_cli.core.dsn import raw_url_password, redact_dsn, url_problem

    url = "postgresql://bot2:p@ss:w/rd%Z9@127.0.0.1:5432/chatflow2"
    assert redact_dsn(url) == "postgresql://bot2:***@127.0.0.1:5432/chatflow2"
    assert raw_url_password(url) == "p@ss:w/rd%Z9"
    assert url_problem(url) is not None and "p@ss" not in url_problem(url)
    assert url_problem("postgresql://bot:p%40ss%2Fw@db:5432/chat?sslmode=require") is None
    assert url_problem("postgresql://bot@db/chat") is None
