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
    from chatflow_cli.core.memory.postgres import _store_error

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
