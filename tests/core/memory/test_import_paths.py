"""Every import path the seeds and the README give keeps resolving after the store split,
to the same objects as the modules that now hold them; importing the package does not
import sqlite3."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

#: (module, name, the module that defines it now)
SEED_NAMES = [
    ("chatflow_cli.core.memory", "SessionContext", "chatflow_cli.core.memory.context"),
    ("chatflow_cli.core.memory", "SessionStore", "chatflow_cli.core.memory.inmemory"),
    ("chatflow_cli.core.memory", "InMemorySessionStore", "chatflow_cli.core.memory.inmemory"),
    ("chatflow_cli.core.memory", "BaseSessionStore", "chatflow_cli.core.memory.base"),
    ("chatflow_cli.core.memory", "SessionDeletedError", "chatflow_cli.core.errors"),
    ("chatflow_cli.core.memory", "DEFAULT_DEDUP_TTL_HOURS", "chatflow_cli.core.memory.base"),
    ("chatflow_cli.core.memory", "DUPLICATE_WAIT_S", "chatflow_cli.core.memory.base"),
    ("chatflow_cli.core.memory", "DEFAULT_MAX_TURNS", "chatflow_cli.core.memory._checks"),
    ("chatflow_cli.core.memory", "MAX_TURNS_LIMIT", "chatflow_cli.core.memory._checks"),
    ("chatflow_cli.core.memory", "INTERRUPTED_TOOL_RESULT", "chatflow_cli.core.memory.context"),
    ("chatflow_cli.core.memory", "RESERVED_EVENT_PREFIXES", "chatflow_cli.core.events"),
    ("chatflow_cli.core.memory", "RESERVED_EVENT_TYPES", "chatflow_cli.core.events"),
    ("chatflow_cli.core.memory", "MessageState", "chatflow_cli.core.memory.values"),
    ("chatflow_cli.core.memory", "Owner", "chatflow_cli.core.memory._port"),
    ("chatflow_cli.core.memory", "SessionSummary", "chatflow_cli.core.memory.values"),
    ("chatflow_cli.core.memory", "SessionStoreProtocol", "chatflow_cli.core.memory.protocol"),
    ("chatflow_cli.core.memory", "TurnStore", "chatflow_cli.core.memory._turns"),
    ("chatflow_cli.core.memory", "ListingStore", "chatflow_cli.core.memory._listing"),
    ("chatflow_cli.core.memory", "SessionLookup", "chatflow_cli.core.memory._listing"),
    ("chatflow_cli.core.memory", "EditStore", "chatflow_cli.core.memory._journal"),
    ("chatflow_cli.core.memory", "ContextStore", "chatflow_cli.core.memory._journal"),
    ("chatflow_cli.core.memory", "ClaimStore", "chatflow_cli.core.memory._claims"),
    ("chatflow_cli.core.memory", "Turn", "chatflow_cli.core.memory.context"),
    ("chatflow_cli.core.memory", "TurnRecord", "chatflow_cli.core.memory.values"),
    ("chatflow_cli.core.memory", "TurnStart", "chatflow_cli.core.memory.values"),
    ("chatflow_cli.core.memory", "TurnOwnerDied", "chatflow_cli.core.memory.base"),
    ("chatflow_cli.core.memory", "storable_text", "chatflow_cli.core.memory._checks"),
    ("chatflow_cli.core.memory", "agent_name_of", "chatflow_cli.core.memory._checks"),
    ("chatflow_cli.core.memory", "check_wait", "chatflow_cli.core.memory._checks"),
    ("chatflow_cli.core.memory", "json_problem", "chatflow_cli.core.memory._checks"),
    ("chatflow_cli.core.memory", "json_sha256", "chatflow_cli.core.memory._checks"),
    ("chatflow_cli.core.memory", "take_context_claim", "chatflow_cli.core.memory._core"),
    ("chatflow_cli.core.memory", "rollback_target", "chatflow_cli.core.memory._rollback"),
    ("chatflow_cli.core.memory", "SQLiteSessionStore", "chatflow_cli.core.memory.sqlite.store"),
    ("chatflow_cli.core.memory", "SearchHit", "chatflow_cli.core.memory.search"),
    ("chatflow_cli.core.memory", "parse_query", "chatflow_cli.core.memory.search"),
    ("chatflow_cli.core.memory", "PostgresSessionStore", "chatflow_cli.core.memory.postgres.store"),
    ("chatflow_cli", "PostgresSessionStore", "chatflow_cli.core.memory.postgres.store"),
    ("chatflow_cli.core.sqlite_store", "SQLiteSessionStore", "chatflow_cli.core.memory.sqlite.store"),
    ("chatflow_cli.core.sqlite_store", "SCHEMA_VERSION", "chatflow_cli.core.memory.sqlite.schema"),
    ("chatflow_cli", "SessionContext", "chatflow_cli.core.memory.context"),
    ("chatflow_cli", "SessionStore", "chatflow_cli.core.memory.inmemory"),
    ("chatflow_cli", "SQLiteSessionStore", "chatflow_cli.core.memory.sqlite.store"),
    ("chatflow_cli", "MessageState", "chatflow_cli.core.memory.values"),
]


@pytest.mark.parametrize(("module", "name", "home"), SEED_NAMES, ids=[f"{m}.{n}" for m, n, _ in SEED_NAMES])
def test_each_documented_name_resolves_to_its_home(module: str, name: str, home: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(importlib.import_module(home), name)


def test_the_package_lists_every_name_it_exports() -> None:
    memory = importlib.import_module("chatflow_cli.core.memory")
    assert sorted(memory.__all__) == sorted({n for m, n, _ in SEED_NAMES if m == "chatflow_cli.core.memory"})
    for name in memory.__all__:
        assert getattr(memory, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    memory = importlib.import_module("chatflow_cli.core.memory")
    with pytest.raises(AttributeError, match="has no attribute 'SQLiteStore'"):
        memory.SQLiteStore  # noqa: B018


def test_the_documented_import_statements_run_as_written() -> None:
    code = (
        "from chatflow_cli.core.memory import SessionContext\n"
        "from chatflow_cli.core.memory import DEFAULT_DEDUP_TTL_HOURS, SessionStore\n"
        "from chatflow_cli.core.memory import BaseSessionStore, SessionDeletedError\n"
        "from chatflow_cli.core.sqlite_store import SQLiteSessionStore\n"
        "assert issubclass(SessionStore, BaseSessionStore) and issubclass(SQLiteSessionStore, BaseSessionStore)\n"
        "print(DEFAULT_DEDUP_TTL_HOURS)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "192"


def test_importing_the_memory_package_does_not_import_sqlite3() -> None:
    code = (
        "import sys\n"
        "from chatflow_cli.core.memory import SessionContext, SessionStore, BaseSessionStore\n"
        "before = 'sqlite3' in sys.modules\n"
        "from chatflow_cli.core.memory import SQLiteSessionStore\n"
        "print(before, 'sqlite3' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


def test_psycopg_is_imported_only_when_a_postgresql_store_is_used() -> None:
    code = (
        "import sys\n"
        "import chatflow_cli\n"
        "from chatflow_cli.core.memory import SessionStore, SQLiteSessionStore\n"
        "from chatflow_cli.core.memory.sqlite import SQLiteSessionStore as S\n"
        "S(':memory:').close()\n"
        "before = 'psycopg' in sys.modules\n"
        "from chatflow_cli.core.memory import PostgresSessionStore\n"
        "print(before, 'psycopg' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # the store module imports psycopg itself only inside its methods: the class alone costs nothing
    assert out.split()[0] == "False"
