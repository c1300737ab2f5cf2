"""Imports through the store: idempotent, resumable, all or nothing per session, exact round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.errors import ImportFormatError, UsageError
from chatflow_cli.core.interop import export_lines, read_source
from chatflow_cli.core.interop.importer import import_sessions
from chatflow_cli.core.memory import SessionStore
from chatflow_cli.core.messages import Message

from .conftest import DATA
from .sample import build_rich_session
from .test_claude_code import lines_of, session_lines


def events_of(store: Any, session_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    return [(e.seq, e.type, e.payload) for e in store.events(session_id)]


def import_file(store: Any, path: Path, fmt: str | None = None, **kwargs: Any) -> list[Any]:
    found, sessions = read_source(str(path), fmt)
    return import_sessions(store, sessions, fmt=found, source=str(path), **kwargs)


@pytest.fixture
def exported(tmp_path: Path) -> tuple[SessionStore, Path]:
    source = SessionStore()
    build_rich_session(source)
    path = tmp_path / "rich.jsonl"
    path.write_text("".join(export_lines(source, "rich", "chatflow")), encoding="utf-8")
    return source, path


def test_chatflow_round_trip_gives_the_same_events(exported: tuple[SessionStore, Path], make_store: Any) -> None:
    source, path = exported
    store = make_store()
    [result] = import_file(store, path)
    assert result.created and result.session_id == "rich"
    assert result.counts == {"turns": 6, "messages": 17, "tool_calls": 3, "events": 29}
    before, after = events_of(source, "rich"), events_of(store, "rich")
    assert after[:-1] == before
    assert after[-1][1] == "session.imported"
    assert after[-1][2]["counts"] == result.counts and after[-1][2]["format"] == "chatflow"
    # export again: the same lines apart from times and the import's own event
    again = "".join(export_lines(store, "rich", "chatflow")).splitlines()
    first = path.read_text(encoding="utf-8").splitlines()

    def strip(line: str) -> dict[str, Any]:
        data = json.loads(line)
        data.pop("created_at", None)
        data.pop("idempotency_key", None)
        if "session" in data:
            for key in ("created_at", "updated_at", "events"):
                data["session"].pop(key)
        return data

    assert [strip(x) for x in again[1:-1]] == [strip(x) for x in first[1:]]
    assert strip(again[0]) == strip(first[0])
    assert [r.messages for r in store.load_turns("rich", first=0, include_rolled_back=True)] == [
        r.messages for r in source.load_turns("rich", first=0, include_rolled_back=True)]


def test_importing_again_writes_nothing(exported: tuple[SessionStore, Path], make_store: Any) -> None:
    _, path = exported
    store = make_store()
    import_file(store, path)
    before = events_of(store, "rich")
    [again] = import_file(store, path)
    assert again.counts == {"turns": 0, "messages": 0, "tool_calls": 0, "events": 0}
    assert again.skipped_turns == 6 and not again.created
    assert events_of(store, "rich") == before


def test_a_malformed_event_imports_nothing_of_that_session(exported: tuple[SessionStore, Path],
                                                          make_store: Any, tmp_path: Path) -> None:
    _, path = exported
    lines = path.read_text(encoding="utf-8").splitlines()
    # a rollback to a turn the log never had, on line 12: the replay check refuses it
    event = json.loads(lines[11])
    lines[11] = json.dumps({"seq": event["seq"], "type": "rollback", "data": {"to_turn": 99, "removed_turns": []}})
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    store = make_store()
    with pytest.raises(ImportFormatError, match=r"line 12: cannot be imported into session rich: cannot roll back to turn 99") as info:
        import_file(store, bad)
    assert info.value.exit_code == 2
    assert store.list_sessions() == []


def test_a_killed_import_stores_nothing_and_runs_again_whole(exported: tuple[SessionStore, Path], tmp_path: Path) -> None:
    _, path = exported
    db = tmp_path / "killed.db"
    child = (
        "import os, signal, sys\n"
        "from chatflow_cli.core.sqlite_store import SQLiteSessionStore\n"
        "from chatflow_cli.core.interop import read_source\n"
        "from chatflow_cli.core.interop.importer import import_sessions\n"
        f"store = SQLiteSessionStore({str(db)!r})\n"
        "from chatflow_cli.core.memory import SessionContext\n"
        "real, calls = SessionContext.add_message, []\n"
        "def add_message(self, msg):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 6:  # inside the import's transaction, turns already written in it\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(self, msg)\n"
        "SessionContext.add_message = add_message\n"
        f"fmt, sessions = read_source({str(path)!r})\n"
        f"import_sessions(store, sessions, fmt=fmt, source={str(path)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], env={**os.environ, "PYTHONPATH": os.getcwd()},
                          capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    with SQLiteSessionStore(db) as store:
        # the session is written in one transaction: killed inside it, nothing of it is stored
        assert store.active_agent_name("rich") is None
        [result] = import_file(store, path)
        assert result.created and result.skipped_turns == 0 and result.counts["turns"] == 6
        clean = SessionStore()
        import_file(clean, path)
        assert [e[:3] for e in events_of(store, "rich") if e[1] != "session.imported"] == [
            e[:3] for e in events_of(clean, "rich") if e[1] != "session.imported"]
        [again] = import_file(store, path)  # and a second run adds nothing
        assert again.counts["turns"] == 0 and again.skipped_turns == 6


def test_an_existing_session_is_refused_without_into(exported: tuple[SessionStore, Path], make_store: Any) -> None:
    _, path = exported
    store = make_store()
    s = store.get_or_create("rich", "Mine")
    s.add_message(Message.user("my own turn"))
    s.complete_turn("")
    store.save(s)
    before = events_of(store, "rich")
    with pytest.raises(UsageError, match="already exists and was not imported from this source: use --into rich"):
        import_file(store, path)
    assert events_of(store, "rich") == before
    # --into adds the imported turns after the session's own, turn numbers shifted
    [result] = import_file(store, path, into="rich")
    assert not result.created
    assert store.turn_count("rich") == 1 + 4
    assert store.load_turns("rich", first=1, last=1)[0].messages[0] == Message.user("my own turn")
    rollbacks = [e[2] for e in events_of(store, "rich") if e[1] == "rollback"]
    assert rollbacks == [{"to_turn": 3, "removed_turns": [4]}]  # the source's rollback to turn 2, plus 1
    [again] = import_file(store, path, into="rich")
    assert again.counts["turns"] == 0


def test_dry_run_writes_nothing_and_counts_what_would_be_added(exported: tuple[SessionStore, Path],
                                                               make_store: Any) -> None:
    _, path = exported
    store = make_store()
    [dry] = import_file(store, path, dry_run=True)
    assert dry.dry_run and store.list_sessions() == []
    [real] = import_file(store, path)
    assert dry.counts == real.counts


def test_llm_logs_import_sessions_turns_tools_and_usage(make_store: Any) -> None:
    store = make_store()
    results = import_file(store, DATA / "llm-0.27-logs.db")
    assert [r.counts["turns"] for r in results] == [2, 1, 1]
    first, tools, _ = (r.session_id for r in results)
    turns = store.load_turns(tools)
    assert [m.role.value for m in turns[0].messages] == ["user", "model", "tool", "model"]
    completed = [e.payload for e in store.events(tools) if e.type == "turn.completed"]
    assert completed[0]["usage"] == {"input_tokens": 19, "output_tokens": 10}
    assert completed[0]["content"] == "2 + 3 = 5"
    assert store.session_endpoint(first) == ("fake", None)
    imported = [e.payload for e in store.events(first) if e.type == "session.imported"]
    assert imported == [{"format": "llm", "source": str(DATA / "llm-0.27-logs.db"), "source_id": f"llm:{first}",
                         "counts": {"turns": 2, "messages": 5, "tool_calls": 0},
                         "source_created_at": imported[0]["source_created_at"]}]
    window = store.window_turns(first)
    assert window[0].messages[0].content == "What is the capital of France?"
    assert store.load_turns(first, first=0)[0].messages == (Message.system("Be brief."),)
    assert [r.counts["turns"] for r in import_file(store, DATA / "llm-0.27-logs.db")] == [0, 0, 0]


def test_claude_code_import(make_store: Any, tmp_path: Path) -> None:
    path = tmp_path / "4f35.jsonl"
    path.write_text("\n".join(lines_of(session_lines())) + "\n", encoding="utf-8")
    store = make_store()
    [result] = import_file(store, path)
    assert result.counts == {"turns": 2, "messages": 6, "tool_calls": 1}
    turns = store.load_turns(result.session_id)
    assert turns[0].messages[2] == Message.tool("toolu_1", "error: missing header", name="Bash", is_error=True)
    assert store.list_sessions()[0].metadata["claude_code_cwd"] == "/home/ana/shop"


@pytest.mark.parametrize("fmt", ["md", "openai"])
def test_md_and_openai_exports_import_back(fmt: str, make_store: Any, tmp_path: Path) -> None:
    source = SessionStore()
    build_rich_session(source)
    path = tmp_path / f"rich.{fmt}"
    path.write_text("".join(export_lines(source, "rich", fmt)), encoding="utf-8")
    store = make_store()
    [result] = import_file(store, path)
    live = [r.messages for r in source.load_turns("rich") if not (r.rolled_back or r.failed)]
    if fmt == "md":
        assert [list(r.messages) for r in store.load_turns(result.session_id)] == [list(t) for t in live]
    else:  # the wire form: agent names, reasoning and flags are not part of it
        got = [[m.content for m in r.messages] for r in store.load_turns(result.session_id)]
        assert got == [[m.content if m.content is not None else "" for m in t if not m.says_nothing] for t in live]
    assert result.counts["turns"] == 4


def test_an_llm_conversation_read_mid_tool_loop_gets_its_turn_whole_later(make_store: Any, tmp_path: Path) -> None:
    """llm logs a tool loop one model call at a time: read after the call that asked for the
    tool, the turn ends in an unanswered call; read again once the loop finished, that turn
    is imported again whole (the short copy rolled back), on a dry run alike."""
    import shutil
    import sqlite3

    early = tmp_path / "early.db"
    shutil.copy(DATA / "llm-0.27-logs.db", early)
    conn = sqlite3.connect(early)
    conn.execute("delete from tool_results")
    conn.execute("delete from responses where prompt = '' or prompt is null")
    conn.commit()
    conn.close()
    store = make_store()
    tools = import_file(store, early)[1].session_id
    assert store.load_turns(tools)[0].messages[-1].content == "No result in the imported log."
    dry = import_file(store, DATA / "llm-0.27-logs.db", dry_run=True)
    real = import_file(store, DATA / "llm-0.27-logs.db")
    assert [(r.counts, r.warnings) for r in dry] == [(r.counts, r.warnings) for r in real]
    assert [r.counts["turns"] for r in real] == [0, 1, 0]
    asked = sqlite3.connect(early).execute("select id from responses where prompt = 'What is 2+3?'").fetchone()[0]
    assert real[1].warnings == [(f"responses row {asked}: grew in the source since it was imported as turn 1: "
                                 "that copy is rolled back and the whole turn imported again")]
    [turn] = store.load_turns(tools)
    assert [m.role.value for m in turn.messages] == ["user", "model", "tool", "model"]
    assert turn.messages[-1].content == "2 + 3 = 5"
    assert [r.counts["turns"] for r in import_file(store, DATA / "llm-0.27-logs.db")] == [0, 0, 0]


def test_a_changed_turn_with_turns_after_it_is_kept_with_a_warning(make_store: Any, tmp_path: Path) -> None:
    """Only the target's last turn can be imported again: once the session went on (here in
    chatflow), a turn that changed in the source is kept as imported, and the import says so."""
    lines = lines_of(session_lines())
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines[:4]) + "\n", encoding="utf-8")
    store = make_store()
    [first] = import_file(store, path)
    session = store.get_or_create(first.session_id, "Assistant")
    session.add_message(Message.user("and in chatflow?"))
    session.add_message(Message.model("yes"))
    session.complete_turn("yes")
    store.save(session)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    [result] = import_file(store, path)
    assert result.counts["turns"] == 1 and result.skipped_turns == 1
    assert result.warnings == [("line 2: changed in the source since it was imported as turn 1, but the session has "
                                "turns after it: kept as it was imported")]
    assert [t.messages[0].content for t in store.load_turns(first.session_id)] == [
        "Why does the build fail?", "and in chatflow?", "Fix it, ünïcødé ✓"]
