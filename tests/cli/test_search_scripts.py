"""``chatflow sessions search`` with hostile and multilingual queries through the real
process, on SQLite and on PostgreSQL: hits, or exit 2 with one clear line; never a
database error (exit 8) or a traceback."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from chatflow_cli.core.errors import ExitStatus
from chatflow_cli.core.memory.search import MAX_QUERY_WORDS


@pytest.fixture(params=["sqlite", "postgres"])
def db_args(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "postgres":
        return ["--db", request.getfixturevalue("pg_dsn")]
    return []


def _search(chatflow: Callable[..., Any], db_args: list[str], query: str) -> Any:
    r = chatflow(*db_args, "sessions", "search", query, "--json")
    assert "Traceback" not in r.stderr and r.returncode != ExitStatus.STORE, r
    return r


def test_many_exclusions_and_cjk_stretches_are_found(
    chatflow: Callable[..., Any], provider: Any, db_args: list[str]
) -> None:
    for sid, text in (("ja", "uuid_1234を確認してください"), ("en", "alpha beta")):
        r = chatflow(*db_args, "chat", "-s", sid, text)
        assert r.returncode == 0, r
    excluded = " ".join(f"-w{n}" for n in range(93))  # "fts5: parser stack overflow" (exit 8) before
    for query, sessions in (("確認", ["ja"]), (f"alpha {excluded}", ["en"])):
        r = _search(chatflow, db_args, query)
        assert r.returncode == 0, r
        assert [h["session_id"] for h in r.json()] == sessions


def test_too_long_queries_are_exit_2_with_one_short_line(chatflow: Callable[..., Any], db_args: list[str]) -> None:
    for query in (
        f"alpha {' '.join(f'-w{n}' for n in range(2000))}",
        "確" * 10_000,
        "x" * 100_000,
    ):
        r = _search(chatflow, db_args, query)
        assert r.returncode == ExitStatus.USAGE, r
        [line] = r.stderr_lines
        assert line.startswith("chatflow: error: search query") and "prefix*" in line and len(line) < 600
