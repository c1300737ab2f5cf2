"""Fixtures of the session-core tests: both stores behind one fixture, an injectable clock, agents."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.memory import BaseSessionStore, SessionStore
from chatflow_cli.core.sqlite_store import SQLiteSessionStore


class FakeClock:
    """A settable clock (UTC epoch seconds) for ``store.clock``."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def agent() -> Agent:
    return Agent(name="Assistant", instructions="Helpful bot", model="gpt-4o")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., BaseSessionStore]]:
    """Build the store under test; for SQLite every call opens the same real file again."""
    opened: list[BaseSessionStore] = []
    memory: list[SessionStore] = []
    dsn = request.getfixturevalue("pg_dsn") if store_kind == "postgres" else ""

    def make(default_max_turns: int = 40, fresh: bool = False) -> BaseSessionStore:
        if store_kind == "memory":
            if fresh or not memory:
                memory.append(SessionStore(default_max_turns=default_max_turns))
            store: BaseSessionStore = memory[-1]
        elif store_kind == "postgres":
            from chatflow_cli.core.postgres_store import PostgresSessionStore

            store = PostgresSessionStore(dsn, default_max_turns=default_max_turns)
            # each store holds its own connections, as a process would: the older ones of a
            # long hypothesis run are closed so the server's connection slots last
            pg_open = [s for s in opened if isinstance(s, PostgresSessionStore) and not s._closed]
            for old in pg_open[:-6]:
                old.close()
        else:
            store = SQLiteSessionStore(tmp_path / "sessions.db", default_max_turns=default_max_turns)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., BaseSessionStore]) -> BaseSessionStore:
    return make_store()


@pytest.fixture
def clock(store: BaseSessionStore) -> FakeClock:
    fake = FakeClock()
    store.clock = fake
    return fake
