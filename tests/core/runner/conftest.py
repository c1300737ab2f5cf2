"""Fixtures for the Runner tests: a SQLite store in a real file, a model client on the fake server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.model import ModelClient
from chatflow_cli.core.runner import Runner
from tests.helpers.fakeserver import FakeServer


def open_sqlite_store(path: Path, **kwargs: Any) -> Any:
    """A SQLiteSessionStore on ``path`` (a new connection: what another process would see)."""
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    return SQLiteSessionStore(str(path), **kwargs)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
def sqlite_store(db_path: Path) -> Iterator[Any]:
    """A SQLiteSessionStore on a file in the test's directory (the Runner tests' store)."""
    s = open_sqlite_store(db_path)
    yield s
    s.close()


@pytest.fixture
def client(fake_server: FakeServer) -> Iterator[ModelClient]:
    """A ModelClient on the fake server; no retries unless a test asks for them."""
    c = ModelClient(fake_server.url, "test-key", max_retries=0, timeout=20)
    yield c
    c.close()


@pytest.fixture
def make_runner(sqlite_store: Any, client: ModelClient) -> Callable[..., Runner]:
    """``make_runner(agent, **kwargs)``: a Runner on the SQLite store and the fake server."""
    made: list[Runner] = []

    def make(agent: Agent, **kwargs: Any) -> Runner:
        kwargs.setdefault("model_client", client)
        runner = Runner(agent, kwargs.pop("session_store", sqlite_store), **kwargs)
        made.append(runner)
        return runner

    return make
