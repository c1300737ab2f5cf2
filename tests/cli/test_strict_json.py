"""NaN and Infinity through the real ``chatflow`` process: a database an older chatflow left
holding a bare ``NaN`` is still searched, its session is not exported as JSON a strict reader
refuses, and a file to import holding one is refused naming its line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

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


@pytest.mark.parametrize("source_format", ["openai", "claude-code", "chatflow"])
def test_import_of_text_that_is_not_valid_unicode_names_the_line_and_stores_nothing(
        chatflow: Any, tmp_path: Path, source_format: str) -> None:
    """A lone surrogate escape (``\\ud800``) is valid JSON but not Unicode text: exit 2 naming the
    line, as for any malformed input (it crashed the openai and Claude Code readers: exit 1)."""
    db = str(tmp_path / "new.db")
    source = tmp_path / "in.jsonl"
    if source_format == "openai":
        lines = ['{"messages":[{"role":"user","content":"hi \\ud800 there"},{"role":"assistant","content":"ok"}]}']
    elif source_format == "claude-code":
        from tests.core.interop.test_claude_code import lines_of, session_lines

        entries = session_lines()
        lines = lines_of(entries)
        first_user = next(k for k, e in enumerate(entries) if e.get("type") == "user")
        lines[first_user] = lines[first_user].replace("Why does the build fail?", "Why \\ud800 fail?")
    else:
        made = tmp_path / "made.db"
        chatflow("--db", str(made), "sessions", "import", "-", "--from", "openai",
                 input='{"messages":[{"role":"user","content":"hi there"},{"role":"assistant","content":"ok"}]}\n')
        exported = chatflow("--db", str(made), "sessions", "export", "--all")
        lines = [line.replace("hi there", "hi \\ud800 there") for line in exported.stdout.splitlines()]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = chatflow("--db", db, "sessions", "import", str(source), "--from", source_format)
    assert result.returncode == 2, result
    [error] = result.stderr_lines
    assert re.match(rf"chatflow: error: {re.escape(str(source))}: line \d+: ", error), error
    assert "lone surrogate \\ud800" in error
    dry = chatflow("--db", db, "sessions", "import", str(source), "--from", source_format, "--dry-run", "--json")
    assert dry.returncode == 2 and json.loads(dry.stdout)["exit_code"] == 2
    assert chatflow("--db", db, "sessions", "ls", "--json").json() == []
