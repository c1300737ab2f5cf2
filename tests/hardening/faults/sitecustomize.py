"""Fault injection for the hardening tests (issue 7): a crash at an exact COMMIT, a full disk.

This directory is put on ``PYTHONPATH`` of one ``chatflow`` process only; Python imports
``sitecustomize`` at start-up. Nothing of chatflow is changed: its store's connections
are wrapped (or configured) from outside.

Full disk: ``CHATFLOW_HARDEN_MAX_PAGES=N`` runs ``PRAGMA max_page_count = N`` on every
connection the store opens (SQLite keeps the limit at least at the current size, so
``1`` means "not one page more"): any write that needs a new page fails with
SQLITE_FULL, as on a full disk.

Crash: with ``CHATFLOW_HARDEN_KILL=before:N`` (or
``after:N``) the process kills itself with SIGKILL just before (after) the N-th COMMIT
of a write transaction (``BEGIN IMMEDIATE``) of its SQLite store: the first is the turn's
``begin_turn``, the last the turn's final save. The store's connection is wrapped in a
proxy that watches the SQL text going by.

Just before dying it writes the events committed so far (read on a separate connection,
so exactly what a crash must keep) to ``CHATFLOW_HARDEN_SNAPSHOT`` as JSON.
"""

import os

_SPEC = os.environ.get("CHATFLOW_HARDEN_KILL", "")
_MAX_PAGES = os.environ.get("CHATFLOW_HARDEN_MAX_PAGES", "")

if _MAX_PAGES:
    from chatflow_cli.core import sqlite_store as _store_for_pages

    _original_for_pages = _store_for_pages.SQLiteSessionStore._connection
    _limited: set = set()

    def _limited_connection(self):
        conn = _original_for_pages(self)
        if id(conn) not in _limited:
            _limited.add(id(conn))
            target = getattr(conn, "_conn", conn)
            target.execute(f"PRAGMA max_page_count = {int(_MAX_PAGES)}")
        return conn

    _store_for_pages.SQLiteSessionStore._connection = _limited_connection

if _SPEC:
    import json
    import signal
    import sqlite3

    _WHEN, _, _N = _SPEC.partition(":")
    _TARGET = int(_N)
    _state = {"commits": 0}

    def _snapshot(db_path: str) -> None:
        out = os.environ.get("CHATFLOW_HARDEN_SNAPSHOT")
        if not out:
            return
        conn = sqlite3.connect(db_path, timeout=30)
        try:
            rows = conn.execute(
                "SELECT session_id, seq, event_type, payload_json FROM chatflow_events ORDER BY session_id, seq"
            ).fetchall()
        finally:
            conn.close()
        with open(out + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(rows, fh)
        os.replace(out + ".tmp", out)

    def _die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    class _WatchedConnection:
        def __init__(self, conn: sqlite3.Connection, db_path: str) -> None:
            self._conn = conn
            self._db_path = db_path
            self._writing = False

        def execute(self, sql, *args):
            head = sql.strip().upper()
            if head.startswith("BEGIN"):
                self._writing = head.startswith("BEGIN IMMEDIATE")
            elif head == "COMMIT" and self._writing:
                self._writing = False
                _state["commits"] += 1
                if _state["commits"] == _TARGET and _WHEN == "before":
                    _snapshot(self._db_path)
                    _die()
                result = self._conn.execute(sql, *args)
                if _state["commits"] == _TARGET and _WHEN == "after":
                    _snapshot(self._db_path)
                    _die()
                return result
            elif head == "ROLLBACK":
                self._writing = False
            return self._conn.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self._conn, name)

    from chatflow_cli.core import sqlite_store as _store

    _original = _store.SQLiteSessionStore._connection
    _proxies: dict = {}

    def _connection(self):
        conn = _original(self)
        proxy = _proxies.get(id(conn))
        if proxy is None or proxy._conn is not conn:
            proxy = _proxies[id(conn)] = _WatchedConnection(conn, self.db_path)
        return proxy

    _store.SQLiteSessionStore._connection = _connection
