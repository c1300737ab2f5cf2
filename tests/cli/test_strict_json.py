"""NaN and Infinity through the real ``chatflow`` process: a database an older chatflow left
holding a bare ``NaN`` is still searched, its session is not exported as JSON a strict reader
refuses, and a file to import holding one is refused naming its line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers.nan_db import PLACEHOLDER, legacy_nan_db


def test_search_of_a_file_holding_nan_finds_every_session(chatflow: Any, tmp_path: Path) -> None:
    # before: "old.db is corrupt or truncated (malformed JSON)", exit 8, for every session
    db = str(legacy_nan_db(tmp_path / "old.db"))
    found = chatflow("--db", db, "sessions", "search", "hello", "--json")
    assert found.returncode == 0, found
    assert sorted(hit["session_id"] for hit in found.json()) == ["bad", "good"]
    assert chatflow("--db", db, "sessions", "search", "there").stdout.startswith("good · turn 1")


def test_sqlite_json_refusing_a_stored_value_is_not_called_a_corrupt_file(chatflow: Any, tmp_path: Path) -> None:
    # the metadata filter reads metadata with SQLite's JSON functions, which refuse NaN
    db = str(legacy_nan_db(tmp_path / "old.db"))
    listed = chatflow("--db", db, "sessions", "ls", "--metadata", "score=1")
    assert listed.returncode == 8, listed
    assert "corrupt" not in listed.stderr.replace("not corrupt", "")
    assert "a stored value is not strict JSON (malformed JSON; e.g. a NaN or Infinity" in listed.stderr


def test_export_of_a_session_holding_nan_is_an_error_and_writes_no_file(chatflow: Any, tmp_path: Path) -> None:
    db = str(legacy_nan_db(tmp_path / "old.db"))
    message = ("chatflow: error: session bad cannot be exported: a float NaN or Infinity "
               "(stored by an older chatflow) cannot be written as strict JSON")
    for fmt in ("chatflow", "md", "json"):
        out = tmp_path / f"bad.{fmt}"
        result = chatflow("--db", db, "sessions", "export", "bad", "--format", fmt, "-o", str(out))
        assert result.returncode == 8 and result.stderr_lines == [message], result
        assert not out.exists() and not list(tmp_path.glob(".bad.*"))
    good = chatflow("--db", db, "sessions", "export", "good")
    assert good.returncode == 0 and "NaN" not in good.stdout
    openai = chatflow("--db", db, "sessions", "export", "bad", "--format", "openai")  # no items, no metadata in it
    assert openai.returncode == 0 and json.loads(openai.stdout)["messages"][0] == {"role": "user", "content": "hello"}


def test_import_of_a_line_holding_nan_names_the_line_and_stores_nothing(chatflow: Any, tmp_path: Path) -> None:
    db = str(tmp_path / "new.db")
    source = tmp_path / "evals.jsonl"
    lines = ('{"messages":[{"role":"user","content":"one"}]}\n'
             f'{{"messages":[{{"role":"user","content":"two","score":{PLACEHOLDER}}}]}}\n')
    source.write_text(lines.replace(repr(PLACEHOLDER), "NaN"), encoding="utf-8")
    result = chatflow("--db", db, "sessions", "import", str(source), "--from", "openai")
    assert result.returncode == 2, result
    expected = f"chatflow: error: {source}: line 2: not JSON (NaN is not JSON (strict JSON has no NaN or Infinity))"
    assert result.stderr_lines == [expected]
    assert chatflow("--db", db, "sessions", "ls", "--json").json() == []
