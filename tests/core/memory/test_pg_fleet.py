"""A fleet through a database outage, on a real PostgreSQL server.

The server is stopped and started under a turn (``pg_ctl``), connections are cut with
``pg_terminate_backend``, and delays are injected into the database itself (a trigger that
sleeps, at a row write or at COMMIT) to reach the interleavings a busy fleet meets: a turn
whose ending cannot be written, a lease renewal racing a turn start, a connection lost while
a commit is under way. The long run of worker processes through restarts is
``test_a_fleet_through_restarts_and_cut_connections`` (``ci_long``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import StoreError
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.messages import Message
from tests.helpers.fakeserver import FakeServer
from tests.helpers.pgserver import PASSWORD, PgServer

REPO = Path(__file__).resolve().parents[3]
AGENT = Agent(name="Assistant", instructions="Be brief.", model="fake-model")


def _store(dsn: str, **kwargs: Any) -> Any:
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    return PostgresSessionStore(dsn, **kwargs)


def _runner(store: Any, fake_server: FakeServer) -> Any:
    from chatflow_cli.core.model import ModelClient
    from chatflow_cli.core.runner import Runner

    return Runner(AGENT, store, model_client=ModelClient(base_url=fake_server.url, api_key="k"))


def _wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {predicate}"
        time.sleep(interval)
    return value


def _sql(dsn: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _other_host(name: str) -> Owner:
    me = Owner.current()
    return Owner(me.pid, me.start_time, name, me.token)


# ---------------------------------------------------------------------------------------
# the lease is renewed only while its turn runs
# ---------------------------------------------------------------------------------------


@pytest.mark.ci_long  # ~20 s (a server stop and start); the fast representative is
# tests/core/runner/test_turn_endings.py::test_a_turn_whose_ending_could_not_be_stored_does_not_hold_the_session
def test_a_turn_that_failed_in_an_outage_does_not_hold_the_session(
    pg_server: PgServer, pg_dsn: str, fake_server: FakeServer
) -> None:
    """The server stops mid-turn (the reply arrives while it is down) and starts again: the
    turn's ending cannot be written, and the caller keeps the error -- with its traceback and
    the turn's context. The customer's next message starts at once (the dead attempt
    recovered), not after the 60 s wait that ends in SessionBusyError; and other hosts see
    the lease expired, not renewed."""
    store = _store(pg_dsn, lease_s=1.5)
    runner = _runner(store, fake_server)
    assert runner.run("s", "first").content == "ok: first"
    fake_server.add_text("lost in the outage", delay=1.0)
    stopper = threading.Thread(target=lambda: (_wait_for(lambda: len(fake_server.requests) >= 2),
                                               pg_server.stop("fast")))
    stopper.start()
    with pytest.raises(StoreError) as info:
        runner.run("s", "during the outage", message_id="m1")
    stopper.join()
    assert PASSWORD not in str(info.value)
    pg_server.start()
    kept = info.value  # a handler that logs the error keeps it (and the turn's context) alive
    # another host sees the lease run out: it is not renewed for the ended turn
    other = _store(pg_dsn, lease_s=1.5)
    _wait_for(lambda: other.running_turn_pid("s") is None, timeout=8, interval=0.1)

    async def handler() -> Any:  # the README's recommended handler
        return await runner.run_async("s", "after the outage", message_id="m2", wait=8)

    import asyncio

    started = time.monotonic()
    result = asyncio.run(handler())
    assert result.content == "ok: after the outage"
    assert time.monotonic() - started < 8
    types = [e.type for e in store.events("s")]
    assert "session.recovered" in types
    assert store.message_state("m1").value == "new"  # its redelivery runs
    assert _sql(pg_dsn, "SELECT count(*) FROM chatflow_sessions WHERE status = 'running'") == [(0,)]
    del kept
    other.close()
    store.close()


def test_the_claim_on_a_running_turns_message_is_renewed_with_the_turn(pg_dsn: str) -> None:
    """A turn started under a message id, running longer than the lease: its claim stays in
    progress (renewed with the turn), so a redelivery waits for it instead of running the
    message a second time; once the turn ends unstored, the claim is free at once."""
    a = _store(pg_dsn, lease_s=1.0)
    b = _store(pg_dsn, lease_s=1.0)
    start = a.begin_turn("s", default_agent=AGENT, user_message=Message.user("q"), owner=_other_host("host-a"),
                         message_id="m1")
    time.sleep(2.5)  # well past the first lease
    assert b.message_state("m1").value == "in_progress"
    assert not b.claim_message("m1", owner=_other_host("host-b"))
    a.end_lease(start.session._binding.lease, stored=False)  # the turn ended; its ending was not written
    a.renew_leases()  # (the lease thread's next round)
    assert b.message_state("m1").value == "new"
    assert b.claim_message("m1", owner=_other_host("host-b"))
    a.close()
    b.close()


def test_a_worker_cut_off_past_its_lease_leaves_no_second_ending_and_no_duplicate(
    pg_dsn: str, fake_server: FakeServer
) -> None:
    """Worker A (host-a) runs message m1 and is cut off from the database (its renewals stop)
    while the model answers slowly. The redelivery of m1 on worker B recovers A's turn as
    dead, runs the message and completes it. A's reply then arrives: its save is refused,
    A's caller gets SessionBusyError, and nothing of A lands -- B's completed turn is not
    failed afterwards, the user message is in the window once, m1 is processed."""
    from chatflow_cli.core.errors import SessionBusyError
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    class HostA(PostgresSessionStore):
        def begin_turn(self, session_id: str, **kwargs: Any) -> Any:
            mine = kwargs["owner"]
            kwargs["owner"] = Owner(mine.pid, mine.start_time, "host-a", mine.token)
            return super().begin_turn(session_id, **kwargs)

    a = HostA(pg_dsn, lease_s=0.6)
    b = _store(pg_dsn, lease_s=0.6)
    runner_a, runner_b = _runner(a, fake_server), _runner(b, fake_server)
    fake_server.add_text("A's late answer", delay=2.0)
    out: list[Any] = []

    def worker_a() -> None:
        try:
            out.append(runner_a.run("s", "order 404?", message_id="m1"))
        except Exception as exc:  # noqa: BLE001 - asserted below
            out.append(exc)

    thread = threading.Thread(target=worker_a)
    thread.start()
    _wait_for(lambda: len(fake_server.requests) >= 1)
    a._leases.stop()  # cut off: no more renewals
    time.sleep(0.8)
    result = runner_b.run("s", "order 404?", message_id="m1", wait=10)
    assert result.content == "ok: order 404?"
    thread.join(timeout=30)
    assert isinstance(out[0], SessionBusyError), out[0]
    window = [m.content for r in b.load_turns("s") if r.in_window for m in r.messages]
    assert window == ["order 404?", "ok: order 404?"]
    events = b.events("s")
    endings = [e.type for e in events if e.type.startswith("turn.") and e.type != "turn.interrupt_requested"]
    assert endings == ["turn.failed", "turn.completed"]  # A's recovered (one ending), B's completed
    assert _endings_per_attempt(events) == [["turn.failed"], ["turn.completed"]]
    # A was alive, cut off past its lease: the log and its rendering say so, not that it died
    recovered = next(e for e in events if e.type == "session.recovered")
    assert recovered.payload.get("lease_expired") is True
    from chatflow_cli.render import event_text

    shown = event_text(recovered).plain
    assert "whose lease ran out" in shown and "dead process" not in shown, shown
    failed = next(e for e in events if e.type == "turn.failed")
    assert "lease ran out" in failed.payload["error"] and "died" not in failed.payload["error"]
    assert b.message_state("m1").value == "processed"
    again = runner_b.run("s", "order 404?", message_id="m1", wait=0)
    assert again.replayed and again.content == "ok: order 404?"
    a.close()
    b.close()


def _endings_per_attempt(events: list[Any]) -> list[list[str]]:
    """The endings (completed, failed, interrupted) of each attempt at a turn, in log order:
    each ``message.user`` opens one; an ending with no attempt open is listed alone."""
    attempts: list[list[str]] = []
    open_attempt: list[str] | None = None
    for event in events:
        if event.type == "message.user":
            open_attempt = []
            attempts.append(open_attempt)
        elif event.type in ("turn.completed", "turn.failed", "turn.interrupted"):
            if open_attempt is None:
                attempts.append([event.type])
            else:
                open_attempt.append(event.type)
    return attempts


# ---------------------------------------------------------------------------------------
# lock order and retries
# ---------------------------------------------------------------------------------------


def test_a_lease_renewal_racing_a_turn_start_never_deadlocks(pg_dsn: str) -> None:
    """A worker waits in the session's queue (a ticket) holding a message claim, both renewed
    by its lease thread. Its turn starts -- the queue row, then the claim row -- while the
    renewal runs; a trigger holds the turn start between the two for a second, right where
    a renewal that locked the claim first and the ticket second deadlocked with it."""
    store = _store(pg_dsn, lease_s=30.0)
    busy = _store(pg_dsn, lease_s=30.0)
    running = busy.begin_turn("s", default_agent=AGENT, user_message=Message.user("first"),
                              owner=_other_host("host-b"))
    assert store.claim_message("m1")
    claim = store._leases._claims.copy().pop()
    queued = store.begin_turn("s", default_agent=AGENT, user_message=Message.user("second"), owner=Owner.current(),
                              message_id="m1", message_claim=claim, enqueue=True)
    assert queued.queued is not None
    running.session.set_status("idle", reason="turn completed")
    busy.save(running.session)
    _sql(pg_dsn, "CREATE FUNCTION slow_leave() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN PERFORM pg_sleep(1.5); RETURN OLD; END $$")
    _sql(pg_dsn, "CREATE TRIGGER slow_leave AFTER DELETE ON chatflow_turn_queue FOR EACH ROW "
                 "EXECUTE FUNCTION slow_leave()")
    out: list[Any] = []

    def start_turn() -> None:
        try:
            out.append(store.begin_turn("s", default_agent=AGENT, user_message=Message.user("second"),
                                        owner=Owner.current(), message_id="m1", message_claim=claim,
                                        ticket=queued.queued))
        except Exception as exc:  # noqa: BLE001 - the assertion below shows it
            out.append(exc)

    starter = threading.Thread(target=start_turn)
    starter.start()
    _wait_for(lambda: _sql(pg_dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")[0][0] > 0,
              timeout=10, interval=0.01)
    store.renew_leases()  # must neither fail nor make the turn start fail
    starter.join(timeout=30)
    assert not isinstance(out[0], Exception), out[0]
    assert out[0].turn == 2
    store.renew_leases()
    busy.close()
    store.close()


def test_a_claim_purging_expired_ids_racing_a_turn_start_never_deadlocks(pg_dsn: str) -> None:
    """``mark_message_processed`` purges expired ids while a turn for the same message id
    starts (it purges too): a trigger holds the purge on an expired row for a second. Both
    take the message's lock before the purge's rows, so neither waits for the other in a
    circle (the claim once purged first and locked the message second)."""
    store = _store(pg_dsn)
    store.get_or_create("s", AGENT)
    old = store.clock() - 200 * 3600
    _sql(pg_dsn, "INSERT INTO chatflow_processed_messages (message_id, state, processed_at_utc) "
                 "VALUES ('expired', 'completed', %s)", (old,))
    _sql(pg_dsn, "CREATE FUNCTION slow_purge() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN PERFORM pg_sleep(1.5); RETURN OLD; END $$")
    _sql(pg_dsn, "CREATE TRIGGER slow_purge BEFORE DELETE ON chatflow_processed_messages FOR EACH ROW "
                 "WHEN (OLD.message_id = 'expired') EXECUTE FUNCTION slow_purge()")
    out: list[Any] = []

    def mark() -> None:
        try:
            store.mark_message_processed("m1")
            out.append("marked")
        except Exception as exc:  # noqa: BLE001 - asserted below
            out.append(exc)

    marker = threading.Thread(target=mark)
    marker.start()
    _wait_for(lambda: _sql(pg_dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")[0][0] > 0
              or out, timeout=10, interval=0.01)
    try:
        begun: Any = store.begin_turn("s", default_agent=AGENT, user_message=Message.user("q"),
                                      owner=Owner.current(), message_id="m1")
    except Exception as exc:  # noqa: BLE001 - asserted below
        begun = exc
    marker.join(timeout=30)
    assert out == ["marked"], out
    assert not isinstance(begun, Exception) or "deadlock" not in str(begun), begun
    store.close()


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_a_write_rolled_back_as_retryable_is_run_again(pg_dsn: str, fake_server: FakeServer, sqlstate: str) -> None:
    """PostgreSQL rolls the turn start back as a deadlock victim or a serialization failure
    (a trigger raises it, counted by a sequence, which no rollback undoes): the store runs
    the transaction again and the caller sees nothing of it; past the bounded attempts the
    error says it is retryable and that nothing was written."""
    store = _store(pg_dsn)
    runner = _runner(store, fake_server)
    runner.run("s", "first")
    _sql(pg_dsn, "CREATE SEQUENCE faults")
    _sql(pg_dsn, "CREATE TABLE fault_budget (n bigint)")
    _sql(pg_dsn, "INSERT INTO fault_budget VALUES (2)")
    _sql(pg_dsn, "CREATE FUNCTION retryable_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "IF NEW.event_type = 'message.user' AND nextval('faults') <= (SELECT n FROM fault_budget) THEN "
                 f"RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END IF; RETURN NEW; END $$")
    _sql(pg_dsn, "CREATE TRIGGER retryable_fault BEFORE INSERT ON chatflow_events FOR EACH ROW "
                 "EXECUTE FUNCTION retryable_fault()")
    assert runner.run("s", "second").content == "ok: second"
    assert _sql(pg_dsn, "SELECT last_value FROM faults") == [(3,)]  # two rolled back, the third committed
    _sql(pg_dsn, "UPDATE fault_budget SET n = 1000")
    with pytest.raises(StoreError, match="nothing of it was written") as info:
        runner.run("s", "third")
    assert info.value.retryable and info.value.written is False
    assert [r.messages[0].content for r in store.load_turns("s")] == ["first", "second"]
    store.close()


# ---------------------------------------------------------------------------------------
# what an error says about the write
# ---------------------------------------------------------------------------------------


def test_a_connection_lost_while_committing_says_the_write_may_have_happened(pg_dsn: str) -> None:
    """The connection is cut while COMMIT runs (a deferred trigger holds it): the error says
    the write may have been committed (``written`` is None), never that nothing was written;
    a connection cut before the COMMIT says nothing was written (``written`` is False)."""
    store = _store(pg_dsn)
    store.get_or_create("s", AGENT)
    _sql(pg_dsn, "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN IF NEW.event_type = 'slow.note' THEN PERFORM pg_sleep(3); END IF; RETURN NULL; END $$")
    _sql(pg_dsn, "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON chatflow_events DEFERRABLE INITIALLY "
                 "DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()")

    def cut_the_commit() -> None:
        rows = _wait_for(lambda: _sql(pg_dsn, "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                                              "AND datname = current_database()"), timeout=10, interval=0.01)
        _sql(pg_dsn, "SELECT pg_terminate_backend(%s)", (rows[0][0],))

    cutter = threading.Thread(target=cut_the_commit)
    cutter.start()
    with pytest.raises(StoreError) as info:
        store.append_event("s", "slow.note", {"n": 1})
    cutter.join()
    assert "may have been committed" in str(info.value) and "nothing of it was written" not in str(info.value)
    assert info.value.written is None
    assert PASSWORD not in str(info.value)

    with pytest.raises(StoreError) as before:
        with store._write() as tx:
            row = tx.get_row("s")
            store._append(tx, "s", "note", {"n": 2})
            _sql(pg_dsn, "SELECT pg_terminate_backend(%s)", (tx._conn.info.backend_pid,))
            tx.get_row("s")  # a read before the COMMIT finds the connection gone
            assert row is not None
            tx.update_row(row)
    assert before.value.written is False
    assert "nothing of it was written" in str(before.value)
    store.close()


# ---------------------------------------------------------------------------------------
# a fleet of worker processes through restarts
# ---------------------------------------------------------------------------------------

WORKERS = 4
MESSAGES = 30
SESSIONS = 5


def _worker(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.core.memory.pg_worker", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "CHATFLOW_TEST_LEASE": "2"},
    )


def _attempts(events: list[Any]) -> list[list[str]]:
    """The endings of each attempt at a turn: the events from one ``message.user`` that
    opens a turn to the next."""
    attempts: list[list[str]] = []
    for event in events:
        if event.type == "message.user":
            attempts.append([])
        elif event.type in ("turn.completed", "turn.failed", "turn.interrupted") and attempts:
            attempts[-1].append(event.type)
    return attempts


@pytest.mark.ci_long
def test_a_fleet_through_restarts_and_cut_connections(pg_server: PgServer, pg_dsn: str,
                                                      fake_server: FakeServer) -> None:
    """Worker processes answer webhook deliveries (``run(message_id=...)``, every failure
    delivered again, every success delivered twice) while the server restarts and their
    connections are cut. Afterwards: every message answered once with its own reply, no
    session left running, no claim left in progress, no attempt at a turn with two
    endings (a recovery's interrupted + failed pair aside), every user message once in the
    window, and no deadlock surfaced."""
    for k in range(WORKERS * MESSAGES):
        fake_server.add_text(f"answer {k}", delay=0.05)
    procs = [_worker("fleet", pg_dsn, fake_server.url, str(w), str(MESSAGES), str(SESSIONS)) for w in range(WORKERS)]
    try:
        for round_ in range(2):
            _wait_for(lambda: len(fake_server.requests) >= (round_ + 1) * WORKERS * MESSAGES // 3, timeout=300,
                      interval=0.1)
            pg_server.restart()
            time.sleep(0.5)
            pg_server.admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'chatflow'")
        outputs = [proc.communicate(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    errors: Counter[str] = Counter()
    answered: dict[str, str] = {}
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err.decode()[-3000:]
        report = json.loads(out.decode().strip().splitlines()[-1])
        errors.update(report["errors"])
        answered.update(report["answers"])
    assert not any("deadlock" in e for e in errors), errors
    assert not any("redelivery differs" in e for e in errors), errors
    assert len(answered) == WORKERS * MESSAGES
    store = _store(pg_dsn)
    assert _sql(pg_dsn, "SELECT count(*) FROM chatflow_sessions WHERE status = 'running'") == [(0,)]
    assert _sql(pg_dsn, "SELECT count(*) FROM chatflow_processed_messages WHERE state = 'in_progress'") == [(0,)]
    assert _sql(pg_dsn, "SELECT count(*) FROM chatflow_processed_messages WHERE state = 'completed'") == \
        [(WORKERS * MESSAGES,)]
    for s in range(SESSIONS):
        events = store.events(f"c{s}")
        for endings in _attempts(events):
            assert len(endings) == 1 or sorted(endings) == ["turn.failed", "turn.interrupted"], endings
        texts = [m.content for r in store.load_turns(f"c{s}") if r.in_window for m in r.messages
                 if m.role.value == "user"]
        assert len(texts) == len(set(texts)), Counter(texts).most_common(3)
    for message_id, content in answered.items():
        assert content.startswith("answer ") or content.startswith("ok: "), (message_id, content)
    store.close()
