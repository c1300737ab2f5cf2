"""``chatflow sessions export`` and ``sessions import``, through the real chatflow process."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import COMMAND, REPO, db_path
from tests.core.interop.conftest import DATA, llm_logs_db, upgraded_llm_db  # noqa: F401 (fixtures)
from tests.core.interop.sample import build_rich_session
from tests.core.interop.test_claude_code import lines_of, session_lines
from tests.helpers.llm_db import corrupted
from tests.helpers.stored import store_turn


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
    # other's agent is the default one: its instructions first, then the turn
    assert [len(x["messages"]) for x in openai.jsonl()] == [len(openai.jsonl()[0]["messages"]), 3]
    assert openai.jsonl()[1]["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}
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
    mask = os.umask(0o022)
    os.umask(mask)
    assert (out.stat().st_mode & 0o777) == 0o666 & ~mask  # as open(..., "w") makes it
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
    assert first.stdout == ("rich (new session): added 6 turns, 17 messages, of which 2 turns the source had rolled "
                            "back (kept in its history): the session holds 4 turns\n")
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
    assert chatflow("sessions", "ls", "--json").json() == []  # the dry run stored no session
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
    assert not db_path().exists()  # the file is checked whole before the database is opened
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


PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


def test_llm_newer_schema_attachments_come_in_as_attachments(chatflow: Any, tmp_path: Path) -> None:
    """llm 0.3x keeps an attachment part as ``{"attachment": {"id": ...}}`` and its type and
    path in the ``attachments`` table: the import reads the file there and keeps it as an
    attachment of the user message (the bytes once, in the database)."""
    import base64
    import importlib.util
    import subprocess
    import sys

    from tests.helpers.fakeserver import FakeServer

    if importlib.util.find_spec("llm") is None:
        pytest.skip("the llm CLI is not installed (pip install -e '.[bench]')")
    home = tmp_path / "llm-home"
    home.mkdir()
    image = tmp_path / "dot.png"
    image.write_bytes(base64.b64decode(PNG))
    with FakeServer() as server:
        server.add_text("A dot.")
        (home / "extra-openai-models.yaml").write_text(
            f'- model_id: fake\n  model_name: fake-model\n  api_base: "{server.url}"\n  api_key_name: fakekey\n'
            "  vision: true\n")
        (home / "keys.json").write_text('{"fakekey": "test"}')
        env = {**os.environ, "LLM_USER_PATH": str(home)}
        env.pop("OPENAI_API_KEY", None)
        subprocess.run([sys.executable, "-m", "llm", "-m", "fake", "-a", str(image), "What is this?"], env=env,
                       check=True, capture_output=True, timeout=120)
    import sqlite3

    assert sqlite3.connect(home / "logs.db").execute("select count(*) from parts where type = 'attachment'").fetchone()[0] == 1
    done = chatflow("sessions", "import", str(home / "logs.db"), "--json")
    assert done.returncode == 0, done
    [sid] = [s["session_id"] for s in done.json()["sessions"]]
    exported = chatflow("sessions", "export", sid, "--format", "openai").jsonl()
    user = [m for m in exported[0]["messages"] if m["role"] == "user"]
    assert user == [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()}}]}]
    shown = chatflow("sessions", "show", sid, "--json").json()["turns"][0]["messages"][0]
    assert shown["attachments"][0]["name"] == "dot.png" and shown["content"] == "What is this?"


@pytest.fixture
def mine_with_three_turns(rich_db: Path) -> Path:
    from chatflow_cli.core.messages import Message
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    with SQLiteSessionStore(rich_db) as store:
        mine = store.get_or_create("mine", "Mine")
        for k in range(3):
            mine.add_message(Message.user(f"my question {k}"))
            mine.add_message(Message.model(f"my answer {k}"))
            mine.complete_turn(f"my answer {k}")
            store.save(mine)
    return rich_db


def test_import_into_an_existing_session_carries_rolled_back_turns(chatflow: Any, mine_with_three_turns: Path,
                                                                    tmp_path: Path) -> None:
    exported = chatflow("sessions", "export", "rich")
    path = tmp_path / "rich.jsonl"
    path.write_text(exported.stdout, encoding="utf-8")
    rich_rollbacks = [e["data"]["to_turn"] for e in exported.jsonl()[1:] if e["type"] == "rollback"]
    assert rich_rollbacks == [2]
    dry = chatflow("sessions", "import", str(path), "--into", "mine", "--dry-run")
    assert dry.returncode == 0, dry
    rolled = ", of which 2 turns the source had rolled back (kept in its history): the session {} 7 turns\n"
    assert dry.stdout == "mine: would add 6 turns, 17 messages" + rolled.format("would hold")
    done = chatflow("sessions", "import", str(path), "--into", "mine")
    assert done.returncode == 0, done
    assert done.stdout == "mine: added 6 turns, 17 messages" + rolled.format("holds")
    events = chatflow("sessions", "export", "mine").jsonl()
    # the rolled-back turn is imported rolled back, its target turn after mine's own three
    assert [e["data"]["to_turn"] for e in events[1:] if e["type"] == "rollback"] == [3 + 2]
    shown = chatflow("sessions", "show", "mine", "--json").json()
    rich = chatflow("sessions", "show", "rich", "--json").json()
    assert [t["number"] for t in shown["turns"]] == [0, 1, 2, 3] + [3 + t["number"] for t in rich["turns"][1:]]
    assert [t["messages"][0]["content"] for t in shown["turns"][4:]] == [
        t["messages"][0]["content"] for t in rich["turns"][1:]]


def test_an_import_error_names_the_target_session(chatflow: Any, mine_with_three_turns: Path,
                                                   tmp_path: Path) -> None:
    lines = chatflow("sessions", "export", "rich").stdout.splitlines()
    rollback = next(k for k, line in enumerate(lines) if json.loads(line)["type" if k else "format"] == "rollback")
    event = json.loads(lines[rollback])
    lines[rollback] = json.dumps({**event, "data": {"to_turn": 99, "removed_turns": []}})
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = chatflow("sessions", "export", "mine").stdout
    for extra in (["--dry-run"], []):
        result = chatflow("sessions", "import", str(bad), "--into", "mine", *extra)
        assert result.returncode == 2, result
        assert result.stderr.startswith(f"chatflow: error: {bad}: line {rollback + 1}: cannot be imported into "
                                        "session mine: cannot roll back to turn 102"), result.stderr
        assert "session rich" not in result.stderr
    assert chatflow("sessions", "export", "mine").stdout == before


def openai_line(question: str, call_id: str) -> str:
    return json.dumps({"messages": [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "found"},
        {"role": "assistant", "content": "Here it is."}]})


@pytest.mark.parametrize("target", ["mine", "fresh"])
def test_dry_run_fails_where_the_import_fails_and_a_failed_import_stores_nothing(
        chatflow: Any, mine_with_three_turns: Path, tmp_path: Path, target: str) -> None:
    """The same tool-call id in two source conversations is fine for each alone, but not in
    one session: the dry run runs the real import's edits (rolled back), so it says so too."""
    both = tmp_path / "evals.jsonl"
    both.write_text(openai_line("first", "call_1") + "\n" + openai_line("second", "call_1") + "\n", encoding="utf-8")
    before = chatflow("sessions", "export", "--all").stdout
    dry = chatflow("sessions", "import", str(both), "--into", target, "--dry-run")
    real = chatflow("sessions", "import", str(both), "--into", target)
    for result in (dry, real):
        assert result.returncode == 2, result
        assert result.stderr.startswith(f"chatflow: error: {both}: line 2: cannot be imported into session {target}: "
                                        "tool_call_id_unique: 'call_1'"), result.stderr
    assert chatflow("sessions", "export", "--all").stdout == before  # nothing half-imported
    each = tmp_path / "one.jsonl"
    each.write_text(openai_line("first", "call_1") + "\n", encoding="utf-8")
    assert chatflow("sessions", "import", str(each), "--into", target, "--dry-run").returncode == 0


def test_imported_replies_carry_the_agent_name(chatflow: Any, tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text(openai_line("where is it?", "call_1") + "\n", encoding="utf-8")
    assert chatflow("sessions", "import", str(path), "--into", "imported").returncode == 0
    shown = chatflow("sessions", "show", "imported")
    assert shown.returncode == 0, shown
    assert "Assistant" in shown.stdout and "model" not in shown.stdout.replace("--model", "")
    data = chatflow("sessions", "show", "imported", "--json").json()
    assert [m.get("agent") for m in data["turns"][0]["messages"] if m["role"] == "model"] == ["Assistant", "Assistant"]


def test_openai_export_starts_with_the_agents_instructions(chatflow: Any, provider: Any, config_file: Any) -> None:
    config_file('[[agents]]\nname = "Support"\ninstructions = "You answer questions about orders."\n')
    assert chatflow("chat", "-s", "shop", "hello").returncode == 0
    exported = chatflow("sessions", "export", "shop", "--format", "openai")
    assert exported.returncode == 0, exported
    [line] = exported.jsonl()
    sent = provider.requests[-1]["messages"]
    assert line["messages"][0] == {"role": "system", "content": "You answer questions about orders."}
    assert line["messages"][:len(sent)] == sent  # what the model was sent, then its reply
    per_turn = chatflow("sessions", "export", "shop", "--format", "openai", "--per-turn").jsonl()
    assert per_turn[0]["messages"][0] == line["messages"][0]


def test_an_id_given_twice_is_exported_once(chatflow: Any, rich_db: Path) -> None:
    twice = chatflow("sessions", "export", "rich", "other", "rich")
    assert twice.returncode == 0, twice
    assert [line["session"]["session_id"] for line in twice.jsonl() if "format" in line] == ["rich", "other"]
    assert len(chatflow("sessions", "export", "rich", "rich", "--format", "openai").jsonl()) == 1
    assert len(chatflow("sessions", "export", "rich", "rich", "--format", "md").stdout.split("\n---\nchatflow:")) == 1
    as_json = chatflow("sessions", "export", "rich", "rich", "--format", "json").json()
    assert as_json["session"]["session_id"] == "rich"


def without_dry_run_flag(document: dict[str, Any]) -> dict[str, Any]:
    return {**document, "dry_run": None, "sessions": [{**s, "dry_run": None} for s in document["sessions"]]}


def test_a_session_twice_in_one_file_dry_run_equals_the_real_run(chatflow: Any, rich_db: Path,
                                                                 tmp_path: Path) -> None:
    """Two exports of one session concatenated (the second taken after it grew): the second
    copy adds only the turn the first lacks, and the dry run reports exactly that."""
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    first = chatflow("sessions", "export", "other").stdout
    with SQLiteSessionStore(rich_db) as store:
        store_turn(store, "other", "and again", "hi again")
    grown = chatflow("sessions", "export", "other").stdout
    twice = tmp_path / "twice.jsonl"
    twice.write_text(first + first + grown, encoding="utf-8")
    target = tmp_path / "target.db"
    dry = chatflow("--db", str(target), "sessions", "import", str(twice), "--dry-run", "--json")
    real = chatflow("--db", str(target), "sessions", "import", str(twice), "--json")
    assert dry.returncode == real.returncode == 0, (dry, real)
    assert without_dry_run_flag(dry.json()) == without_dry_run_flag(real.json())
    assert [(s["created"], s["counts"]["turns"], s["skipped_turns"]) for s in real.json()["sessions"]] == [
        (True, 1, 0), (False, 0, 1), (False, 1, 1)]
    shown = chatflow("--db", str(target), "sessions", "show", "other", "--json").json()
    assert len(shown["turns"]) == 2
    again = chatflow("--db", str(target), "sessions", "import", str(twice), "--json")
    assert [s["counts"]["turns"] for s in again.json()["sessions"]] == [0, 0, 0]


def test_two_sources_with_one_session_id_in_one_file_fail_alike_in_a_dry_run(chatflow: Any, rich_db: Path,
                                                                              tmp_path: Path) -> None:
    """Two different sessions with one id (exported from two databases): the second is refused
    (it did not come from the first's source), in the dry run as in the real run, and
    nothing of that session is stored."""
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    elsewhere = tmp_path / "elsewhere.db"
    with SQLiteSessionStore(elsewhere) as store:
        store_turn(store, "other", "a different session", "yes")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(chatflow("sessions", "export", "other").stdout
                     + chatflow("--db", str(elsewhere), "sessions", "export", "other").stdout, encoding="utf-8")
    target = tmp_path / "target.db"
    dry = chatflow("--db", str(target), "sessions", "import", str(mixed), "--dry-run", "--json")
    real = chatflow("--db", str(target), "sessions", "import", str(mixed), "--json")
    assert dry.returncode == real.returncode == 2, (dry, real)
    assert dry.json() == real.json()
    assert "already exists and was not imported from this source" in real.json()["error"]
    assert chatflow("--db", str(target), "sessions", "ls", "--json").json() == []


def test_reimporting_an_llm_db_after_llm_upgraded_it_adds_only_the_new_turn(chatflow: Any, tmp_path: Path,
                                                                          upgraded_llm_db: Path) -> None:  # noqa: F811
    """Imported from llm 0.27's tables, then again after llm 0.3x migrated the file and
    continued a conversation (now a thread): the same sessions, the new turn added, the dry
    run saying exactly that, and a third import a no-op."""
    old = tmp_path / "logs.db"
    shutil.copy(DATA / "llm-0.27-logs.db", old)
    assert chatflow("sessions", "import", str(old)).returncode == 0
    dry = chatflow("sessions", "import", str(upgraded_llm_db), "--dry-run", "--json")
    real = chatflow("sessions", "import", str(upgraded_llm_db), "--json")
    assert dry.returncode == real.returncode == 0, (dry, real)
    assert without_dry_run_flag(dry.json()) == without_dry_run_flag(real.json())
    assert [(s["created"], s["counts"]["turns"], s["skipped_turns"]) for s in real.json()["sessions"]] == [
        (False, 1, 2), (False, 0, 1), (False, 0, 1)]
    first = real.json()["sessions"][0]["session_id"]
    shown = chatflow("sessions", "show", first)
    assert "Turn 3" in shown.stdout and "Lyon is second." in shown.stdout and "Turn 4" not in shown.stdout
    again = chatflow("sessions", "import", str(upgraded_llm_db), "--json")
    assert [s["counts"]["turns"] for s in again.json()["sessions"]] == [0, 0, 0]
    fresh = chatflow("--db", str(tmp_path / "fresh.db"), "sessions", "import", str(upgraded_llm_db), "--json")
    assert [s["counts"]["turns"] for s in fresh.json()["sessions"]] == [3, 1, 1]


def test_a_malformed_llm_row_is_an_error_naming_it_and_stores_nothing(chatflow: Any, tmp_path: Path) -> None:
    import sqlite3

    logs = tmp_path / "logs.db"
    shutil.copy(DATA / "llm-0.27-logs.db", logs)
    conn = sqlite3.connect(logs)
    conn.execute("update tool_calls set arguments = '{not json' where name = 'add'")
    conn.commit()
    conn.close()
    for extra in ([], ["--dry-run"]):
        result = chatflow("sessions", "import", str(logs), *extra)
        assert result.returncode == 2, result
        assert result.stderr == f"chatflow: error: {logs}: tool_calls row 1: tool call arguments are not JSON: '{{not json'\n"
    assert chatflow("sessions", "ls", "--json").json() == []


@pytest.mark.parametrize(("sql", "column"), [("update messages set role = 'alien' where role = 'tool'", "role"),
                                           ("delete from messages where rowid = 1", "parent_hash"),
                                           # a prompt with no parts rows: before, skipped with a warning, exit 0
                                           (("delete from parts where message_hash = (select hash from messages "
                                             "where role = 'user' order by rowid limit 1)"), "no parts")])
def test_an_llm_row_that_breaks_the_schema_is_an_error_not_a_short_conversation(
        chatflow: Any, llm_logs_db: Path, tmp_path: Path, sql: str, column: str) -> None:
    logs = corrupted(tmp_path, llm_logs_db, sql)
    for extra in ([], ["--dry-run"]):
        result = chatflow("sessions", "import", str(logs), *extra)
        assert result.returncode == 2, result
        assert re.fullmatch(rf"chatflow: error: {re.escape(str(logs))}: messages row b2:\w+: {column} [^\n]+\n",
                            result.stderr), result
    assert chatflow("sessions", "ls", "--json").json() == []


def test_a_claude_code_file_imported_while_it_was_written_grows_on_the_next_import(chatflow: Any,
                                                                                   tmp_path: Path) -> None:
    """Read first with its last turn cut short (the tool call written, its result not yet;
    then the result's line half written), then whole: the cut turn is imported again whole
    (its short copy rolled back), the new turn added, the dry run saying the same."""
    from tests.core.interop.test_claude_code import SID

    lines = lines_of(session_lines())
    path = tmp_path / f"{SID}.jsonl"
    path.write_text("\n".join(lines[:4]) + "\n", encoding="utf-8")
    first = chatflow("sessions", "import", str(path))
    assert first.returncode == 0 and first.stdout == f"{SID} (new session): added 1 turn, 3 messages\n", first
    path.write_text("\n".join(lines[:4]) + "\n" + lines[4][:25], encoding="utf-8")
    cut = chatflow("sessions", "import", str(path))
    assert cut.returncode == 0, cut
    assert cut.stdout == f"{SID}: added 0 turns, 0 messages (1 turn already there)\n"
    assert "line 5: cut off mid-write" in cut.stderr
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    dry = chatflow("sessions", "import", str(path), "--dry-run", "--json")
    real = chatflow("sessions", "import", str(path), "--json")
    assert without_dry_run_flag(dry.json()) == without_dry_run_flag(real.json())
    [result] = real.json()["sessions"]
    assert (result["counts"]["turns"], result["skipped_turns"]) == (2, 0)
    assert result["warnings"] == [("line 2: grew in the source since it was imported as turn 1: that copy is rolled "
                                   "back and the whole turn imported again")]
    shown = chatflow("sessions", "show", SID, "--json").json()
    assert len(shown["turns"]) == 2
    assert "A header is missing." in json.dumps(shown["turns"][0])
    assert "No result in the imported log." not in json.dumps(shown["turns"])
    again = chatflow("sessions", "import", str(path), "--json").json()["sessions"][0]
    assert (again["counts"]["turns"], again["skipped_turns"], again["warnings"]) == (0, 2, [])


def test_a_titled_and_archived_session_round_trips_and_export_all_takes_it(chatflow: Any, rich_db: Path,
                                                                            tmp_path: Path) -> None:
    assert chatflow("sessions", "rename", "rich", "Order 404").returncode == 0
    assert chatflow("sessions", "archive", "rich").returncode == 0
    # --all is every session: a backup drops no archived one
    whole = chatflow("sessions", "export", "--all")
    assert whole.returncode == 0, whole
    assert [x["session"]["session_id"] for x in whole.jsonl() if "format" in x] == ["rich", "other"]
    assert {x.get("type") for x in whole.jsonl()} >= {"session.titled", "session.archived"}
    listed = chatflow("sessions", "export", "--all", "--format", "json").json()
    assert [d["session"]["session_id"] for d in listed] == ["rich", "other"]
    assert chatflow("sessions", "export", "rich", "--since", "1h").returncode == 0  # archived, named, --since
    path = tmp_path / "all.jsonl"
    path.write_text(whole.stdout, encoding="utf-8")
    other_db = tmp_path / "other.db"
    imported = chatflow("--db", str(other_db), "sessions", "import", str(path))
    assert imported.returncode == 0, imported
    again = chatflow("--db", str(other_db), "sessions", "export", "--all")
    assert again.returncode == 0, again

    def events(lines: list[Any]) -> list[Any]:
        return [(e["seq"], e["type"], e["data"]) for e in lines if "format" not in e and e["type"] != "session.imported"]

    assert events(again.jsonl()) == events(whole.jsonl())
    shown = chatflow("--db", str(other_db), "sessions", "ls", "--archived", "--json").json()
    assert [(s["session_id"], s["title"]) for s in shown] == [("rich", "Order 404")]
    refused = chatflow("--db", str(other_db), "chat", "-s", "rich", "more")
    assert refused.returncode != 0 and "archived" in refused.stderr


def test_openai_export_of_a_session_whose_only_turn_failed_writes_nothing_for_it(chatflow: Any, provider: Any,
                                                                                 tmp_path: Path) -> None:
    provider.add_error(400, {"error": {"message": "bad request"}})
    failed = chatflow("chat", "-s", "broken", "hello?")
    assert failed.returncode != 0
    provider.add_text("fine")
    assert chatflow("chat", "-s", "works", "hi").returncode == 0
    out = tmp_path / "evals.jsonl"
    exported = chatflow("sessions", "export", "broken", "works", "--format", "openai", "-o", str(out))
    assert exported.returncode == 0, exported
    assert "warning: broken: not written in the openai format: it has no live turn" in exported.stderr
    assert "exported 1 session to" in exported.stderr
    [line] = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert line["messages"][-1] == {"role": "assistant", "content": "fine"}
    back = chatflow("--db", str(tmp_path / "b.db"), "sessions", "import", str(out))
    assert back.returncode == 0, back
    alone = chatflow("sessions", "export", "broken", "--format", "openai", "--per-turn")
    assert alone.returncode == 0 and alone.stdout == "" and "no live turn" in alone.stderr


def test_md_a_malformed_control_comment_exits_2_and_stores_nothing(chatflow: Any, rich_db: Path,
                                                                   tmp_path: Path) -> None:
    md = chatflow("sessions", "export", "rich", "--format", "md").stdout
    lines = md.split("\n")
    at = next(k for k, x in enumerate(lines) if x.startswith('<!-- chatflow:message {"role":"user"'))
    lines[at] = lines[at].replace("} -->", " -->")  # a brace lost in an edit
    bad = tmp_path / "bad.md"
    bad.write_text("\n".join(lines), encoding="utf-8")
    other_db = tmp_path / "other.db"
    result = chatflow("--db", str(other_db), "sessions", "import", str(bad))
    assert result.returncode == 2
    assert result.stderr.startswith(f"chatflow: error: {bad}: line {at + 1}: a malformed chatflow comment")
    assert not other_db.exists() or chatflow("--db", str(other_db), "sessions", "ls", "--json").json() == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_export_to_a_file_leaves_neither_the_file_nor_a_temp_file(signum: int, tmp_path: Path) -> None:
    from chatflow_cli.core.messages import Message
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    path = db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with SQLiteSessionStore(path) as store:  # about 40 MB of export: it takes a while to write
        s = store.get_or_create("big", "Assistant", max_turns=5)
        for k in range(400):
            s.add_message(Message.user(f"q{k} " + "x" * 50_000))
            s.add_message(Message.model(f"a{k} " + "y" * 50_000))
            s.complete_turn("")
            if k % 50 == 49:
                store.save(s)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "big.jsonl"
    target.write_text("the previous export\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.Popen([*COMMAND, "sessions", "export", "big", "-o", str(target)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        # the temp file beside the target has bytes in it: the export is being written
        while not [p for p in out_dir.iterdir() if p.name.startswith(".big.jsonl.") and p.stat().st_size > 0]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.002)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (130 if signum == signal.SIGINT else -signum), err
    assert sorted(p.name for p in out_dir.iterdir()) == ["big.jsonl"]  # no temp file
    assert target.read_text(encoding="utf-8") == "the previous export\n"  # as it was


def test_imported_sessions_are_listed_by_when_they_happened(chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    exported = chatflow("sessions", "export", "rich", "--format", "md").stdout
    old = re.sub(r'^created: ".*"$', 'created: "2024-03-01T09:00:00.000Z"', exported, count=1, flags=re.M)
    old = re.sub(r'^updated: ".*"$', 'updated: "2024-03-02T18:30:00.000Z"', old, count=1, flags=re.M)
    old = re.sub(r'"created_at":[0-9.]+', '"created_at":1709300000.0', old)  # the turns' times, in between
    path = tmp_path / "old.md"
    path.write_text(old, encoding="utf-8")
    assert chatflow("sessions", "import", str(path), "--into", "old-copy").returncode == 0
    listed = chatflow("sessions", "ls", "--json").json()
    assert [s["session_id"] for s in listed][-1] == "old-copy"  # the oldest activity, last
    recent = chatflow("sessions", "ls", "--since", "30d", "--json").json()
    assert "old-copy" not in [s["session_id"] for s in recent]
    entry = listed[-1]
    assert (entry["created_at"], entry["updated_at"]) == (1709283600.0, 1709404200.0)  # 2024-03-01T09:00, 03-02T18:30


def test_a_time_that_is_not_one_is_an_error_naming_the_file_and_line(chatflow: Any, rich_db: Path,
                                                                      tmp_path: Path) -> None:
    lines = chatflow("sessions", "export", "other").stdout.splitlines()
    header = json.loads(lines[0])
    header["session"]["created_at"] = "someday"
    path = tmp_path / "other.jsonl"
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    result = chatflow("--db", str(tmp_path / "target.db"), "sessions", "import", str(path))
    assert result.returncode == 2
    assert result.stderr == f"chatflow: error: {path}: line 1: not a time: 'someday'\n"


def exports_around_a_rollback(chatflow: Any, tmp_path: Path, fmt: str, texts: list[str], to: int,
                              after: str) -> tuple[Path, Path]:
    """Session ``rb`` chatted through ``texts``, exported (``rb1.FMT``), rolled back to turn
    ``to``, given one more turn (``after``) and exported again (``rb2.FMT``)."""
    for text in texts:
        assert chatflow("chat", "-s", "rb", text).returncode == 0
    old, new = tmp_path / f"rb1.{fmt}", tmp_path / f"rb2.{fmt}"
    assert chatflow("sessions", "export", "rb", "--format", fmt, "-o", str(old)).returncode == 0
    assert chatflow("sessions", "rollback", "rb", "--to", str(to)).returncode == 0
    assert chatflow("chat", "-s", "rb", after).returncode == 0
    assert chatflow("sessions", "export", "rb", "--format", fmt, "-o", str(new)).returncode == 0
    return old, new


@pytest.mark.parametrize("fmt", ["chatflow", "md"])
def test_a_newer_export_imported_over_an_earlier_one_keeps_the_sources_rollback(
        chatflow: Any, provider: Any, tmp_path: Path, fmt: str) -> None:
    old, new = exports_around_a_rollback(chatflow, tmp_path, fmt, [f"rb msg {k}" for k in (1, 2, 3)], 1, "rb new 2")
    db, fresh = str(tmp_path / "r.db"), str(tmp_path / "f.db")

    def live(path: str) -> list[str]:
        shown = chatflow("--db", path, "sessions", "show", "rb", "--json").json()
        return [t["messages"][0]["content"] for t in shown["turns"]]

    assert chatflow("--db", db, "sessions", "import", str(old)).returncode == 0
    dry = chatflow("--db", db, "sessions", "import", str(new), "--dry-run")
    real = chatflow("--db", db, "sessions", "import", str(new))
    assert real.returncode == 0, real
    there = "3 turns" if fmt == "chatflow" else "1 turn"  # the log's turns, or the transcript's live ones
    assert real.stdout == f"rb: added 1 turn, 2 messages, rolled back 2 turns ({there} already there)\n"
    assert dry.stdout == real.stdout.replace("added", "would add").replace("rolled back", "would roll back")
    assert chatflow("--db", fresh, "sessions", "import", str(new)).returncode == 0
    assert live(db) == live(fresh) == live(str(db_path())) == ["rb msg 1", "rb new 2"]


def test_two_imports_of_one_file_at_once_report_what_each_transaction_did(
        chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    path = tmp_path / "all.chatflow"
    assert chatflow("sessions", "export", "--all", "-o", str(path)).returncode == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for attempt in range(4):  # started together: which one commits first varies
        db = str(tmp_path / f"c{attempt}.db")
        procs = [subprocess.Popen([*COMMAND, "--db", db, "sessions", "import", str(path), "--json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
                 for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        reports = [{s["session_id"]: s for s in json.loads(out)["sessions"]} for out, _ in outs]
        for session_id in ("rich", "other"):
            first, second = sorted((r[session_id] for r in reports), key=lambda s: not s["created"])
            assert first["created"] and first["counts"]["turns"] > 0
            assert not second["created"] and second["counts"]["turns"] == 0, reports
            assert second["skipped_turns"] == first["counts"]["turns"]
        listed = chatflow("--db", db, "sessions", "ls", "--json").json()
        assert sorted(s["session_id"] for s in listed) == ["other", "rich"]


#: Ids the store takes from a library user (the Agents SDK session, the store API) and the CLI
#: would never make.
LIBRARY_IDS = ["../bad", " ", "a b", "new\nline", "é", "x" * 300]


@pytest.mark.parametrize("fmt", ["chatflow", "md"])
def test_every_id_the_store_holds_exports_and_imports_back(chatflow: Any, tmp_path: Path, fmt: str) -> None:
    from chatflow_cli.core.messages import Message
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    source = tmp_path / "source.db"
    with SQLiteSessionStore(source) as store:
        for k, sid in enumerate(LIBRARY_IDS):
            session = store.get_or_create(sid, "Assistant")
            session.add_message(Message.user(f"question {k}"))
            session.add_message(Message.model(f"answer {k}"))
            session.complete_turn(f"answer {k}")
            store.save(session)
    out = tmp_path / f"all.{fmt}"
    exported = chatflow("--db", str(source), "sessions", "export", "--all", "--format", fmt, "-o", str(out))
    assert exported.returncode == 0, exported
    fresh = tmp_path / "fresh.db"
    imported = chatflow("--db", str(fresh), "sessions", "import", str(out))
    assert imported.returncode == 0, imported  # before: invalid session id '../bad', exit 2, nothing imported
    listed = chatflow("--db", str(fresh), "sessions", "ls", "--json").json()
    assert sorted(s["session_id"] for s in listed) == sorted(LIBRARY_IDS)
    assert all(s["turns"] == 1 for s in listed)
    # --into: an existing session is named by its id, whatever it is; a new one needs an id chatflow makes
    into = chatflow("--db", str(fresh), "sessions", "import", str(out), "--into", "a b", "--json")
    assert into.returncode == 0, into
    assert into.json()["sessions"][0]["session_id"] == "a b"
    new = chatflow("--db", str(fresh), "sessions", "import", str(out), "--into", "c d")
    assert new.returncode == 2 and "invalid session id 'c d'" in new.stderr
    assert len(chatflow("--db", str(fresh), "sessions", "ls", "--json").json()) == len(LIBRARY_IDS)


def test_a_claude_code_session_was_updated_at_its_last_entry(chatflow: Any, tmp_path: Path) -> None:
    entries = session_lines()
    for k, e in enumerate(entries):
        if "uuid" in e:  # one minute apart, in file order; a3, the last reply, at 10:09
            entries[k] = {**e, "timestamp": f"2026-11-30T10:{k:02d}:00.000Z"}
    path = tmp_path / "cc.jsonl"
    path.write_text("\n".join(lines_of(entries)) + "\n", encoding="utf-8")
    assert chatflow("sessions", "import", str(path)).returncode == 0
    [listed] = chatflow("sessions", "ls", "--json").json()
    assert listed["created_at"] == datetime.fromisoformat("2026-11-30T10:01:00+00:00").timestamp()  # u1
    # before: the first entry's time (u1 at 10:01) or the last prompt's (u2 at 10:08)
    assert listed["updated_at"] == datetime.fromisoformat("2026-11-30T10:10:00+00:00").timestamp()  # a3
    bad = [*entries[:2], {**entries[2], "timestamp": 12345}, *entries[3:]]
    path.write_text("\n".join(lines_of(bad)) + "\n", encoding="utf-8")
    refused = chatflow("--db", str(tmp_path / "other.db"), "sessions", "import", str(path))
    assert refused.returncode == 2 and refused.stderr == f"chatflow: error: {path}: line 3: timestamp is not a time: 12345\n"


@pytest.mark.parametrize("fmt", ["chatflow", "md"])
def test_an_older_export_imported_after_a_newer_one_adds_nothing(
        chatflow: Any, provider: Any, tmp_path: Path, fmt: str) -> None:
    old, new = exports_around_a_rollback(chatflow, tmp_path, fmt, [f"msg {k}" for k in (1, 2, 3, 4)], 2,
                                         "msg 5 after rb")
    db = str(tmp_path / "r.db")

    def live() -> list[str]:
        shown = chatflow("--db", db, "sessions", "show", "rb", "--json").json()
        return [t["messages"][0]["content"] for t in shown["turns"]]

    assert chatflow("--db", db, "sessions", "import", str(new)).returncode == 0
    older = chatflow("--db", db, "sessions", "import", str(old))
    assert older.returncode == 0, older
    assert older.stdout.startswith("rb: added 0 turns, 0 messages (") and "rolled back" not in older.stdout
    assert live() == ["msg 1", "msg 2", "msg 5 after rb"]
    if fmt == "md":  # both exports in one file: where importing them one after the other ends, twice
        both = tmp_path / "both.md"
        both.write_text(old.read_text(encoding="utf-8") + new.read_text(encoding="utf-8"), encoding="utf-8")
        for _ in range(2):
            again = chatflow("--db", db, "sessions", "import", str(both))
            assert again.returncode == 0, again
            assert again.stdout.startswith("rb: added 0 turns, 0 messages (") and "rolled back" not in again.stdout
        assert live() == ["msg 1", "msg 2", "msg 5 after rb"]
        cut = tmp_path / "c.md"
        cut.write_text("\n".join(old.read_text(encoding="utf-8").split("\n")[:45]) + "\n", encoding="utf-8")
        short = chatflow("--db", str(tmp_path / "c.db"), "sessions", "import", str(cut))
        assert short.returncode == 2 and "the file is cut short" in short.stderr and str(cut) in short.stderr


def test_an_import_reports_what_it_left_out_and_old_history_stays_old_in_search(chatflow: Any, tmp_path: Path) -> None:
    """A Claude Code file from 18 months ago with a side chain, an edited prompt and a
    compaction: the import says on stderr and in --json (also --dry-run) how many entries it
    left out and why; ``sessions search --since 7d`` finds its messages no more than
    ``sessions ls --since 7d`` lists the session, and ``search`` shows their age."""
    from tests.core.interop.test_claude_code import broken_chain_lines

    entries = broken_chain_lines()
    for e in entries:
        if "timestamp" in e:
            e["timestamp"] = "2025-06-02T10:00:00.000Z"
    path = tmp_path / "old.jsonl"
    path.write_text("\n".join(lines_of(entries)) + "\n", encoding="utf-8")
    dry = chatflow("sessions", "import", str(path), "--dry-run", "--json")
    assert dry.returncode == 0, dry
    skipped = {"side chain (a subagent's work)": 2, "abandoned branch (rewound or edited away)": 2,
               "compaction summary (not a message of the conversation)": 1}
    assert dry.json()["sessions"][0]["skipped"] == skipped
    done = chatflow("sessions", "import", str(path))
    assert done.returncode == 0 and "added 4 turns" in done.stdout, done
    assert "left out 5 entries of the source: 2 side chain (a subagent's work), 2 abandoned branch" in done.stderr
    assert chatflow("sessions", "ls", "--since", "7d", "--json").json() == []
    assert chatflow("sessions", "search", "Committed", "--since", "7d", "--json").json() == []
    [hit] = chatflow("sessions", "search", "Committed", "--json").json()
    assert hit["age_s"] > 365 * 86400


def test_importing_a_session_rolled_back_in_its_source_says_what_the_session_holds(
        chatflow: Any, provider: Any, tmp_path: Path) -> None:
    for k in range(1, 6):
        assert chatflow("chat", "-s", "rb5", f"turn {k}").returncode == 0
    assert chatflow("sessions", "rollback", "rb5", "--to", "1", "--yes").returncode == 0
    path = tmp_path / "rb5.chatflow"
    assert chatflow("sessions", "export", "rb5", "-o", str(path)).returncode == 0
    db, other = str(tmp_path / "t.db"), str(tmp_path / "u.db")
    dry = chatflow("--db", db, "sessions", "import", str(path), "--dry-run")
    real = chatflow("--db", db, "sessions", "import", str(path))
    assert real.returncode == 0, real
    assert real.stdout.startswith("rb5 (new session): added 5 turns, "), real
    assert real.stdout.endswith(", of which 4 turns the source had rolled back (kept in its history): the session "
                                "holds 1 turn\n"), real
    assert dry.stdout == real.stdout.replace("added", "would add").replace("holds", "would hold"), dry
    shown = chatflow("--db", db, "sessions", "show", "rb5", "--json").json()
    assert [t["messages"][0]["content"] for t in shown["turns"]] == ["turn 1"]
    counts = chatflow("--db", other, "sessions", "import", str(path), "--json").json()["sessions"][0]["counts"]
    assert counts["turns"] == 5 and counts["rolled_back_in_source"] == 4 and counts["live_turns"] == 1, counts
