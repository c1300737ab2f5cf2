"""Fixtures of the session-core tests: every store kind behind one fixture, an injectable clock, agents.

``any_store`` is parametrised over :data:`STORE_KINDS`, so a test that takes it runs once per
kind; ``make_store`` opens the store under test again (what another process would see).
Adding a store kind is one line in :data:`STORE_KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.memory import BaseSessionStore, SessionStore
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from tests.helpers.clock import FakeClock


@dataclass(frozen=True)
class StoreKind:
    """How to open one kind of store in a test's directory.

    ``open(place, default_max_turns)`` returns a new store object; ``place`` is the test's
    directory, or the value of the fixture named by ``place_fixture`` (PostgreSQL: a fresh
    database's URL on the test server). With ``shared`` true a second call reaches the same
    data (a new connection to the same database); otherwise the data lives in the object, and
    opening "again" returns the object already open.
    """

    open: Callable[[Any, int], BaseSessionStore]
    shared: bool
    place_fixture: str | None = None


def _postgres(dsn: str, turns: int) -> BaseSessionStore:
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    return PostgresSessionStore(dsn, default_max_turns=turns)


#: Every store kind the contract suite runs against, by the name that appears in test ids.
STORE_KINDS: dict[str, StoreKind] = {
    "memory": StoreKind(lambda tmp, turns: SessionStore(default_max_turns=turns), shared=False),
    "sqlite": StoreKind(lambda tmp, turns: SQLiteSessionStore(tmp / "sessions.db", default_max_turns=turns),
                        shared=True),
    # a fresh database already migrated (a template's copy): the contract is about the store
    "postgres": StoreKind(_postgres, shared=True, place_fixture="pg_dsn_migrated"),
}
#: Stores of a kind that holds server connections kept open at once by one test (a long
#: hypothesis run opens one per example): older ones are closed, as finished processes would be.
_OPEN_CONNECTIONS_KEPT = 6


@pytest.fixture
def agent() -> Agent:
    return Agent(name="Assistant", instructions="Helpful bot", model="gpt-4o")


@pytest.fixture(params=list(STORE_KINDS))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(store_kind: str, tmp_path: Path,
               request: pytest.FixtureRequest) -> Iterator[Callable[..., BaseSessionStore]]:
    """``make_store(default_max_turns=40, fresh=False)``: the store under test, opened again.

    A kind whose data is shared (SQLite) opens a new connection to the same database on
    every call; the in-memory store returns the store already open unless ``fresh`` asks
    for a new, empty one.
    """
    kind = STORE_KINDS[store_kind]
    place = request.getfixturevalue(kind.place_fixture) if kind.place_fixture else tmp_path
    opened: list[BaseSessionStore] = []
    own_data: list[BaseSessionStore] = []

    def make(default_max_turns: int = 40, fresh: bool = False) -> BaseSessionStore:
        if kind.shared:
            store = kind.open(place, default_max_turns)
            if kind.place_fixture:
                for old in [s for s in opened if not getattr(s, "_closed", True)][:-_OPEN_CONNECTIONS_KEPT]:
                    old.close()
        else:
            if fresh or not own_data:
                own_data.append(kind.open(place, default_max_turns))
            store = own_data[-1]
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def any_store(make_store: Callable[..., BaseSessionStore]) -> BaseSessionStore:
    """The store under test, once per kind in :data:`STORE_KINDS`."""
    return make_store()


@pytest.fixture
def clock(any_store: BaseSessionStore) -> FakeClock:
    """A :class:`FakeClock` installed as ``any_store.clock``."""
    fake = FakeClock()
    any_store.clock = fake
    return fake
