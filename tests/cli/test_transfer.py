"""``chatflow sessions export`` and ``sessions import``, through the real chatflow process."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import db_path
from tests.core.interop.conftest import DATA
from tests.core.interop.sample import build_rich_session
from tests.core.interop.test_claude_code import lines_of, session_lines


@pytest.fixture
def rich_db() -> Path:
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    path = db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with SQLiteSessionStore(path) as store:
        build_rich_session(store)
        other = store.get_or_create("other", "Assistant")
        from chatflow_cli.core.messages import Message

        other.add_message(Message.user("hello"))
        other.add_message(Message.model("hi"))
        other.complete_turn("hi")
        store.save(other)
    return path


def test_export_formats_to_stdout_and_a_file(chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    result = chatflow("sessions", "export", "rich")
    assert result.returncode == 0, result
    lines = result.jsonl()
    assert lines[0]["format"] == "chatflow" and lines[0]["session"]["session_id"] == "rich"
    assert [line["seq"] for line in lines[1:]] == list(range(1, len(lines)))
    md = chatflow("sessions", "export", "rich", "--format", "md")
    assert md.returncode == 0 and md.stdout.startswith("---\nchatflow: \"md 1\"") and "## Turn 4" in md.stdout
    openai = chatflow("sessions", "export", "rich", "other", "--format", "openai")
    assert [len(x["messages"]) for x in openai.jsonl()] == [len(openai.jsonl()[0]["messages"]), 2]
    per_turn = chatflow("sessions", "export", "rich", "--format", "openai", "--per-turn")
    assert len(per_turn.jsonl()) == 4
    as_json = chatflow("sessions", "export", "rich", "--format", "json")
    show = chatflow("sessions", "show", "rich", "--json")
    assert as_json.json() == show.json()
    both = chatflow("sessions", "export", "--all", "--format", "json")
    assert [d["session"]["session_id"] for d in both.json()] == ["rich", "other"]
    out = tmp_path / "all.jsonl"
    written = chatflow("sessions", "export", "--all", "-o", str(out))
    assert written.returncode == 0 and "exported 2 sessions" in written.stderr
    assert out.read_text(encoding="utf-8").count('"format":"chatflow"') == 2
    assert (out.stat().st_mode & 0o777) == 0o600
    recent = chatflow("sessions", "export", "--since", "1h", "--format", "openai")
    assert len(recent.jsonl()) == 2


def test_export_errors(chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    missing = chatflow("sessions", "export", "rich", "nope")
    assert missing.returncode == 3 and missing.stdout == ""
    assert "no session 'nope'" in missing.stderr
    out = tmp_path / "x.md"
    bad = chatflow("sessions", "export", "rich", "--format", "md", "--per-turn", "-o", str(out))
    assert bad.returncode == 2 and not out.exists()
    assert chatflow("sessions", "export", "rich", "--format", "xml").returncode == 2
    assert chatflow("sessions", "export").returncode == 2


def test_round_trip_through_the_command_line(chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    exported = chatflow("sessions", "export", "rich")
    path = tmp_path / "rich.jsonl"
    path.write_text(exported.stdout, encoding="utf-8")
    other_db = tmp_path / "other.db"
    first = chatflow("--db", str(other_db), "sessions", "import", str(path))
    assert first.returncode == 0, first
    assert first.stdout == "rich (new session): added 6 turns, 17 messages\n"
    again = chatflow("--db", str(other_db), "sessions", "import", str(path), "--json")
    assert again.json()["sessions"][0]["counts"]["turns"] == 0
    assert again.json()["sessions"][0]["skipped_turns"] == 6
    re_exported = chatflow("--db", str(other_db), "sessions", "export", "rich").jsonl()
    original = exported.jsonl()
    assert [(e["seq"], e["type"], e["data"]) for e in re_exported[1:-1]] == [
        (e["seq"], e["type"], e["data"]) for e in original[1:]]
    assert re_exported[-1]["type"] == "session.imported"
    # stdin, detected, into a copy
    copy = chatflow("--db", str(other_db), "sessions", "import", "-", "--into", "rich-copy", input=exported.stdout)
    assert copy.returncode == 0 and copy.stdout.startswith("rich-copy (new session)")


def test_import_llm_and_claude_code(chatflow: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs.db"
    shutil.copy(DATA / "llm-0.27-logs.db", logs)
    dry = chatflow("sessions", "import", str(logs), "--dry-run", "--json")
    assert dry.returncode == 0, dry
    assert [s["counts"]["turns"] for s in dry.json()["sessions"]] == [2, 1, 1]
    assert not db_path().exists() or chatflow("sessions", "ls", "--json").json() == []
    done = chatflow("sessions", "import", str(logs))
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 3
    listed = chatflow("sessions", "ls", "--json").json()
    assert len(listed) == 3
    sid = next(s["session_id"] for s in listed if s["preview"].startswith("What is 2+3"))
    shown = chatflow("sessions", "show", sid)
    assert "add" in shown.stdout and "2 + 3 = 5" in shown.stdout
    claude = tmp_path / "4f35e220.jsonl"
    claude.write_text("\n".join(lines_of(session_lines())) + "\n", encoding="utf-8")
    imported = chatflow("sessions", "import", str(claude), "--from", "claude-code")
    assert imported.returncode == 0 and "added 2 turns" in imported.stdout


def test_import_errors_name_the_line_and_store_nothing(chatflow: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "ok"}]}\n{"messages": [{"role": "wizard"}]}\n')
    result = chatflow("sessions", "import", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == f"chatflow: error: {bad}: line 2: unknown role 'wizard'"
    assert not db_path().exists() or chatflow("sessions", "ls", "--json").json() == []
    odd = tmp_path / "odd.txt"
    odd.write_text("hello\n")
    assert chatflow("sessions", "import", str(odd)).returncode == 2
    assert chatflow("sessions", "import", str(tmp_path / "none.jsonl")).returncode == 2
    assert chatflow("sessions", "import", str(odd), "--into", "bad id").returncode == 2
    as_json = chatflow("sessions", "import", str(bad), "--json")
    assert as_json.returncode == 2 and as_json.json()["exit_code"] == 2


def test_an_export_cut_short_at_a_line_boundary_is_refused_and_stores_nothing(chatflow: Any, rich_db: Path,
                                                                                tmp_path: Path) -> None:
    whole = chatflow("sessions", "export", "--all")
    assert whole.returncode == 0, whole
    lines = whole.stdout.splitlines(keepends=True)
    header = json.loads(lines[0])
    announced = header["session"]["events"]
    assert announced >= 4
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:4]))  # the header and three events, ending on a line boundary
    before = chatflow("sessions", "ls", "--json").json()
    result = chatflow("sessions", "import", str(cut), "--into", "cut-copy")
    assert result.returncode == 2, result
    assert result.stderr.strip() == (
        f"chatflow: error: {cut}: line 1: session {header['session']['session_id']} ends after 3 of the "
        f"{announced} events its header announces: the file is cut short")
    assert chatflow("sessions", "ls", "--json").json() == before


def test_the_export_never_carries_a_lock_token(chatflow: Any, provider: Any) -> None:
    assert chatflow("chat", "-s", "shop", "hello").returncode == 0
    exported = chatflow("sessions", "export", "shop")
    assert exported.returncode == 0, exported
    owners = [json.loads(line)["data"]["owner"] for line in exported.stdout.splitlines()
              if "owner" in json.loads(line).get("data", {})]
    assert owners, "a turn's status events name its owner"
    assert all("token" not in owner and "pid" in owner for owner in owners), owners
