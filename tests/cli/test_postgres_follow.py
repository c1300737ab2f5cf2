"""``replay --follow`` on PostgreSQL outlives a server restart: it reconnects, reads on from
its last seq, prints every event exactly once and says on stderr that it reconnected."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from typing import Any

from tests.helpers.pgserver import PASSWORD, PgServer


def test_a_follower_prints_every_event_once_across_a_server_restart(pg_server: PgServer, pg_dsn: str) -> None:
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.errors import StoreError
    from chatflow_cli.core.memory.postgres import PostgresSessionStore
    from tests.conftest import COMMAND, REPO

    total = 120
    store = PostgresSessionStore(pg_dsn)
    store.get_or_create("watched", Agent(name="Assistant", instructions="Be brief.", model="fake-model"))
    follow = subprocess.Popen([*COMMAND, "--db", pg_dsn, "replay", "watched", "--follow", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    printed: list[dict[str, Any]] = []

    def read() -> None:
        assert follow.stdout is not None
        for line in follow.stdout:
            printed.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    failures = 0
    try:
        deadline = time.monotonic() + 60
        while not printed and time.monotonic() < deadline:  # it is following
            time.sleep(0.05)
        assert printed and printed[0]["type"] == "session.created"
        for n in range(total):
            if n == total // 3:
                pg_server.restart()  # every connection of the follower is cut
            while True:  # the writer retries; the key makes a retry of a write that landed a no-op
                try:
                    store.append_event("watched", "note", {"n": n}, idempotency_key=f"n{n}")
                    break
                except StoreError:
                    failures += 1
                    time.sleep(0.1)
            time.sleep(0.01)
        last = store.last_seq("watched")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and printed[-1].get("seq", 0) < last:
            assert follow.poll() is None, (printed[-1], follow.stderr.read() if follow.stderr else "")
            time.sleep(0.05)
        assert follow.poll() is None  # still following
    finally:
        follow.terminate()
        _, err = follow.communicate(timeout=30)
        reader.join(10)
        store.close()
    seqs = [e["seq"] for e in printed]
    assert seqs == list(range(1, last + 1))  # every event, in order, none twice
    assert [e["data"]["n"] for e in printed if e["type"] == "note"] == list(range(total))
    assert "reconnected to the store" in err, err
    assert PASSWORD not in err


def test_a_follower_prints_every_event_once_while_its_connections_are_terminated_again_and_again(
        pg_server: PgServer, pg_dsn: str) -> None:
    """``pg_terminate_backend`` on every connection of the database, many times while a writer
    appends: psycopg's errors on a terminated connection (its own "cannot exit pipeline mode
    while busy" among them) are a lost connection, which the follower outlives."""
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.errors import StoreError
    from chatflow_cli.core.memory.postgres import PostgresSessionStore
    from tests.conftest import COMMAND, REPO

    total, name = 150, pg_dsn.rsplit("/", 1)[1]
    store = PostgresSessionStore(pg_dsn)
    store.get_or_create("watched", Agent(name="Assistant", instructions="Be brief.", model="fake-model"))
    follow = subprocess.Popen([*COMMAND, "--db", pg_dsn, "replay", "watched", "--follow", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    printed: list[dict[str, Any]] = []

    def read() -> None:
        assert follow.stdout is not None
        for line in follow.stdout:
            printed.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    writing = threading.Event()
    kills = 0

    def terminate() -> None:
        nonlocal kills
        while writing.is_set() and kills < 100:  # bounded
            pg_server.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
                            "AND pid <> pg_backend_pid()")
            kills += 1
            time.sleep(0.05 + 0.1 * (kills % 3))

    killer = threading.Thread(target=terminate, daemon=True)
    try:
        deadline = time.monotonic() + 60
        while not printed and time.monotonic() < deadline:  # it is following
            time.sleep(0.05)
        assert printed and printed[0]["type"] == "session.created"
        writing.set()
        killer.start()
        for n in range(total):
            while True:  # the writer retries; the key makes a retry of a write that landed a no-op
                try:
                    store.append_event("watched", "note", {"n": n}, idempotency_key=f"n{n}")
                    break
                except StoreError:
                    time.sleep(0.05)
            time.sleep(0.02)
        writing.clear()
        killer.join(30)
        last = store.last_seq("watched")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and printed[-1].get("seq", 0) < last:
            assert follow.poll() is None, (printed[-1], follow.stderr.read() if follow.stderr else "")
            time.sleep(0.05)
        assert follow.poll() is None  # still following
    finally:
        writing.clear()
        follow.terminate()
        _, err = follow.communicate(timeout=30)
        reader.join(10)
        store.close()
    assert kills >= 10
    seqs = [e["seq"] for e in printed]
    assert seqs == list(range(1, last + 1)), err  # every event, in order, none twice
    assert [e["data"]["n"] for e in printed if e["type"] == "note"] == list(range(total))
    assert "cannot exit pipeline mode" not in err and PASSWORD not in err
