"""The command-line tests' helpers live in ``tests/conftest.py`` so every folder can use them.

The fixtures ``chatflow``, ``provider`` and ``config_file`` (and the autouse
``isolated_home``) come from there; these names are re-exported for the tests that
import them directly (``from tests.cli.conftest import COMMAND, REPO``). ``database`` runs a
test on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, COMMAND, REPO, Result, db_path, run_chatflow  # noqa: F401


class Database:
    """The database every ``chatflow`` process of a test uses: SQLite (the default file in
    ``CHATFLOW_HOME``) or PostgreSQL (``CHATFLOW_DB``, a fresh migrated database)."""

    def __init__(self, kind: str, dsn: str | None = None, server: Any = None, place: Path | None = None) -> None:
        self.kind, self.dsn = kind, dsn
        self._server, self._place = server, place
        self.made: list[str] = []  # the databases fresh() made (PostgreSQL: dropped after the test)

    def fresh(self) -> str:
        """Another empty database of the same kind, as ``--db`` takes it (a fresh home's)."""
        if self.kind == "sqlite":
            assert self._place is not None
            path = self._place / f"fresh-{len(self.made)}.db"
            self.made.append(str(path))
            return str(path)
        name = self._server.create_database()
        self.made.append(name)
        return str(self._server.dsn(name))

    def execute(self, sql: str, params: tuple[Any, ...] = (), *, at: str | None = None) -> list[tuple[Any, ...]]:
        """Run one statement (``?`` placeholders) and return its rows, as another program would;
        ``at``: in that database (a ``fresh()`` one) instead of the test's."""
        if self.kind == "sqlite":
            import sqlite3

            with sqlite3.connect(at or db_path()) as conn:
                return conn.execute(sql, params).fetchall()
        import psycopg

        with psycopg.connect(at or self.dsn, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

    def holds(self, text: str) -> bool:
        """True when ``text`` is anywhere in the database (every table's every row, as text)."""
        if self.kind == "sqlite":
            return text.encode() in Path(db_path()).read_bytes() or any(
                text.encode() in p.read_bytes() for p in Path(db_path()).parent.glob("chatflow.db-*"))
        tables = [r[0] for r in self.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        return any(self.execute(f'SELECT 1 FROM "{t}" AS r WHERE strpos(r::text, ?) > 0', (text,)) for t in tables)


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Database]:
    """The test's chatflow processes on SQLite, then on PostgreSQL (skipped where no server can
    be started, as the ``pg_dsn`` fixtures say)."""
    if request.param == "sqlite":
        yield Database("sqlite", place=request.getfixturevalue("tmp_path"))
        return
    dsn = request.getfixturevalue("pg_dsn_migrated")
    monkeypatch.setenv("CHATFLOW_DB", dsn)
    server = request.getfixturevalue("pg_server")
    database = Database("postgres", dsn, server)
    yield database
    from tests.helpers.pgserver import _drop

    for name in database.made:
        _drop(server, name)
