"""Connections cut under a PostgreSQL store (``pg_terminate_backend``), on a real server.

An error on a connection that turned out lost is a :class:`StoreUnreachableError` whatever
psycopg's message says (its own "cannot exit pipeline mode while busy" included), so a
follower's reconnect and a caller's retry apply; a waiter that could not leave the turn
queue during an outage does not hold the session once the database answers; chatflow's
warnings reach a library user only through the logging it set up.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import StoreError, StoreUnreachableError
from tests.helpers.pgserver import PgServer

AGENT = Agent(name="Assistant", instructions="Be brief.", model="fake-model")


def _terminate_all(pg_server: PgServer, dsn: str) -> None:
    name = dsn.rsplit("/", 1)[1]
    pg_server.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
                    "AND pid <> pg_backend_pid()")


def test_an_error_on_a_connection_that_turned_out_lost_is_unreachable() -> None:
    """psycopg's own error on a terminated connection has no SQLSTATE and names no lost
    connection: the connection's state decides, and the outcome of a sent COMMIT is unknown."""
    from chatflow_cli.core.memory.postgres.errors import _store_error

    exc = psycopg.OperationalError("cannot exit pipeline mode while busy")
    lost = _store_error(exc, "db", broken=True)
    assert isinstance(lost, StoreUnreachableError) and lost.written is False
    committing = _store_error(exc, "db", broken=True, committing=True)
    assert isinstance(committing, StoreUnreachableError) and committing.written is None
    assert "may have been committed" in str(committing)
    admin = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    assert isinstance(_store_error(admin, "db"), StoreUnreachableError)
    try:  # psycopg's error raised while handling the server's: the server's decides
        try:
            raise admin
        except psycopg.Error:
            raise exc  # noqa: B904 - the chain is what psycopg builds
    except psycopg.Error as chained:
        assert chained.__context__ is admin
        told = _store_error(chained, "db")
        assert isinstance(told, StoreUnreachableError) and "administrator command" in str(told)
    # on a connection that is fine, the same text stays a plain store error
    assert type(_store_error(psycopg.OperationalError("cannot exit pipeline mode while busy"), "db")) is StoreError


@pytest.mark.slow
def test_reads_and_waits_under_repeated_terminations_fail_only_as_unreachable(pg_server: PgServer,
                                                                              pg_dsn: str) -> None:
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    store = PostgresSessionStore(pg_dsn)
    store.get_or_create("watched", AGENT)
    store.append_event("watched", "note", {"n": 0})
    stop = threading.Event()
    seen: Counter[str] = Counter()
    other: list[str] = []

    def read(kind: int) -> None:
        while not stop.is_set():
            try:
                if kind == 0:
                    store.last_seq("watched")
                elif kind == 1:
                    store.events("watched", after_seq=0)
                else:
                    store.wait_for_events("watched", 1, 0.05)
                seen["ok"] += 1
            except StoreUnreachableError:
                seen["unreachable"] += 1
            except StoreError as exc:  # anything else breaks a follower's reconnect
                other.append(f"{type(exc).__name__}: {exc}")

    readers = [threading.Thread(target=read, args=(n % 3,), daemon=True) for n in range(5)]
    for r in readers:
        r.start()
    try:
        for _ in range(120):  # bounded: ~6 s of kills
            _terminate_all(pg_server, pg_dsn)
            time.sleep(0.05)
    finally:
        stop.set()
        for r in readers:
            r.join(30)
    try:
        assert other == []
        assert seen["unreachable"] > 0 and seen["ok"] > 0
        assert store.last_seq("watched") == 2  # the store works on after the kills
    finally:
        store.close()


def _other_host(name: str) -> Any:
    from chatflow_cli.core.memory import Owner

    me = Owner.current()
    return Owner(me.pid, me.start_time, name, me.token)


def _live_tickets(dsn: str, session_id: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM chatflow_turn_queue WHERE session_id = %s "
                           "AND lease_expires_at > clock_timestamp()", (session_id,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_waiter_that_could_not_leave_the_queue_holds_nobody_up_once_the_database_is_back(
        pg_server: PgServer, pg_dsn: str) -> None:
    """The database goes away while a turn waits in the session's queue: the waiter fails and
    cannot remove its ticket. Once the database answers, the ticket's lease is expired on the
    database clock within seconds (not when its 30 s lease runs out), so waiters on other
    hosts are not held up by it."""
    from chatflow_cli.core.cancel import CancelToken
    from chatflow_cli.core._run.lifecycle import TurnRequest, begin_turn_when_free
    from chatflow_cli.core.memory.postgres import PostgresSessionStore
    from chatflow_cli.core.messages import Message

    store = PostgresSessionStore(pg_dsn, lease_s=30.0)
    running = store.begin_turn("cust-6", default_agent=AGENT, user_message=Message.user("first"),
                               owner=_other_host("host-b"))
    out: list[BaseException] = []

    def wait() -> None:
        try:
            begin_turn_when_free(store, "cust-6", TurnRequest(Message.user("second")), wait=120.0,
                                 cancel=CancelToken(), default_agent=AGENT, on_wait=None)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            out.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    try:
        waiter.start()
        deadline = time.monotonic() + 30
        while _live_tickets(pg_dsn, "cust-6") == 0:
            assert time.monotonic() < deadline and waiter.is_alive()
            time.sleep(0.05)
        pg_server.stop()
        waiter.join(60)
        assert not waiter.is_alive() and len(out) == 1 and isinstance(out[0], StoreUnreachableError), out
        pg_server.start()
        back = time.monotonic()
        while _live_tickets(pg_dsn, "cust-6") and time.monotonic() - back < 10:
            time.sleep(0.1)
        assert _live_tickets(pg_dsn, "cust-6") == 0, "the ticket still holds the queue"
        assert time.monotonic() - back < 10
    finally:
        if not pg_server.started:
            pg_server.start()
        del running
        store.close()


_LIBRARY_USER = """
import sys, time
from chatflow_cli.core.agents import Agent
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.memory.postgres import PostgresSessionStore
from chatflow_cli.core.messages import Message

store = PostgresSessionStore(sys.argv[1], lease_s=1.5)  # renewed every 0.5 s
running = store.begin_turn("s", default_agent=Agent(name="A", instructions="x", model="m"),
                           user_message=Message.user("q"), owner=Owner.current())
print("running", flush=True)
sys.stdin.readline()  # the server was stopped: renewals fail
time.sleep(2.0)
print("done", flush=True)
sys.stdin.readline()
"""


def test_a_library_user_without_logging_sees_no_warnings_of_chatflow_during_an_outage(
        pg_server: PgServer, pg_dsn: str) -> None:
    """The lease thread's "could not renew the leases held in ..." goes to logging only."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    user = subprocess.Popen([sys.executable, "-c", _LIBRARY_USER, pg_dsn], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(repo)})
    assert user.stdin is not None and user.stdout is not None
    try:
        assert user.stdout.readline() == "running\n"
        pg_server.stop()
        user.stdin.write("\n")
        user.stdin.flush()
        assert user.stdout.readline() == "done\n"
        pg_server.start()
        out, err = user.communicate("\n", timeout=60)
    finally:
        if user.poll() is None:
            user.kill()
            user.communicate()
        if not pg_server.started:
            pg_server.start()
    assert user.returncode == 0 and err == ""


def test_an_application_that_set_up_logging_still_gets_chatflow_warnings() -> None:
    """The library's NullHandler drops nothing an application's own logging set-up shows."""
    import logging
    import subprocess
    import sys

    script = ("import logging, sys; import chatflow_cli; "
              "logging.basicConfig(); logging.getLogger('chatflow_cli.core.memory.postgres').warning('seen')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "seen" in done.stderr
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("chatflow_cli").handlers)
