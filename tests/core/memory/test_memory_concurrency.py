"""8 processes writing one memory document at once, on SQLite and PostgreSQL: every accepted
write is in the history and in the final text, the store's seq has no gap, and every
rejected write was told so (nothing is lost silently)."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chatflow_cli.core.memory import BaseSessionStore

WORKERS = 8
ROUNDS = 12


def _run_workers(place: str) -> list[dict[str, dict[str, object]]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.core.memory.memory_worker", place, str(w), str(ROUNDS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for w in range(WORKERS)]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


def _tags(text: str) -> set[str]:
    return set(re.split(r"[\n|]", text))


def _check(store: BaseSessionStore, results: list[dict[str, dict[str, object]]]) -> None:
    accepted = {tag: seq for r in results for tag, seq in r["accepted"].items()}
    rejected = {tag: why for r in results for tag, why in r["rejected"].items()}
    assert len(accepted) + len(rejected) == WORKERS * ROUNDS
    assert accepted, "no write was accepted"
    history = store.memory_history("notes")
    # seq 1 created the document; each accepted write has its own seq, none is missing
    assert [v.seq for v in history] == list(range(1, len(history) + 1))
    assert sorted(accepted.values()) == [v.seq for v in history[1:]]
    by_seq = {v.seq: v for v in history}
    for tag, seq in accepted.items():
        assert tag in _tags(by_seq[seq].text or ""), (tag, seq)
        assert by_seq[seq].author.session_id == f"worker-{tag.split('-')[0][1:]}"
    final = _tags(store.read_document("notes", "shared.md").text)
    for tag in accepted:  # no accepted write was lost by a later one
        assert tag in final
    for tag, why in rejected.items():
        assert tag not in final
        assert "version" in str(why) or "not in" in str(why)
    assert store.memory_store("notes").last_seq == len(history)


def _seed(store: BaseSessionStore) -> None:
    store.create_memory_store("notes")
    store.write_document("notes", "shared.md", "tally\n")


@pytest.mark.slow
def test_eight_processes_on_sqlite(tmp_path: Path) -> None:
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    db = tmp_path / "sessions.db"
    with SQLiteSessionStore(db) as store:
        _seed(store)
    results = _run_workers(str(db))
    with SQLiteSessionStore(db) as store:
        _check(store, results)


@pytest.mark.slow
def test_eight_processes_on_postgres(pg_dsn_migrated: str) -> None:
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    with PostgresSessionStore(pg_dsn_migrated) as store:
        _seed(store)
    results = _run_workers(pg_dsn_migrated)
    with PostgresSessionStore(pg_dsn_migrated) as store:
        _check(store, results)
