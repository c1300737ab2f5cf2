"""Imports through the store: idempotent, resumable, all or nothing per session, exact round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.errors import ImportFormatError, UsageError
from chatflow_cli.core.interop import export_lines, read_source
from chatflow_cli.core.interop.importer import import_sessions
from chatflow_cli.core.memory import INTERRUPTED_TOOL_RESULT, SessionStore
from chatflow_cli.core.events import EventType
from chatflow_cli.core.messages import Message

from .conftest import DATA
from .sample import build_every_event_session, build_rich_session
from .test_claude_code import broken_chain_lines, lines_of, session_lines


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
    assert result.counts == {"turns": 6, "messages": 17, "tool_calls": 3, "events": 29, "rolled_back_in_source": 2,
                             "live_turns": 4}
    before, after = events_of(source, "rich"), events_of(store, "rich")
    assert after[:-1] == before
    assert after[-1][1] == "session.imported"
    assert after[-1][2]["counts"] == result.counts and after[-1][2]["format"] == "chatflow"
    # export again: the same lines apart from times and the import's own event
    again = "".join(export_lines(store, "rich", "chatflow")).splitlines()
    first = path.read_text(encoding="utf-8").splitlines()
    assert [_comparable(x) for x in again[1:-1]] == [_comparable(x) for x in first[1:]]
    assert _comparable(again[0]) == _comparable(first[0])
    assert [r.messages for r in store.load_turns("rich", first=0, include_rolled_back=True)] == [
        r.messages for r in source.load_turns("rich", first=0, include_rolled_back=True)]


def _comparable(line: str) -> dict[str, Any]:
    """An exported line without what the README says may differ: times, custom events'
    idempotency keys, the header's counts."""
    data = json.loads(line)
    data.pop("created_at", None)
    data.pop("idempotency_key", None)
    if "session" in data:
        for key in ("created_at", "updated_at", "events"):
            data["session"].pop(key)
    return data


def test_every_event_type_the_store_writes_round_trips(make_store: Any, tmp_path: Path) -> None:
    """export -> import -> export gives the same events for a log holding every event type
    the store writes (a type added to EventType must be built here, and import back)."""
    source = make_store("source")
    build_every_event_session(source)
    written = {e.type for e in source.events("every")}
    assert {t.value for t in EventType} <= written and "note" in written
    path = tmp_path / "every.jsonl"
    path.write_text("".join(export_lines(source, "every", "chatflow")), encoding="utf-8")
    store = make_store("target")
    [result] = import_file(store, path)
    assert result.created and result.counts["events"] == len(source.events("every")) - 1
    again = "".join(export_lines(store, "every", "chatflow")).splitlines()
    first = path.read_text(encoding="utf-8").splitlines()
    assert [_comparable(x) for x in again[1:-1]] == [_comparable(x) for x in first[1:]]
    assert json.loads(again[-1])["type"] == "session.imported"
    assert _comparable(again[0]) == _comparable(first[0])
    # the state the events derive is the source's: title, archived, agent versions, window
    [mine] = store.list_sessions(archived=True)
    [theirs] = source.list_sessions(archived=True)
    assert (mine.title, mine.archived_at is not None, mine.active_agent_name) == (
        theirs.title, True, theirs.active_agent_name) == ("Order 404, refunded", True, "Billing")
    assert [r.messages for r in store.load_turns("every", first=0, include_rolled_back=True)] == [
        r.messages for r in source.load_turns("every", first=0, include_rolled_back=True)]
    got, want = store.get("every"), source.get("every")
    assert got is not None and want is not None
    assert got.agent_versions == want.agent_versions and got.history == want.history
    assert got.resources == want.resources and [m.name for m in got.resources] == ["notes", "keys"]
    # no lock token leaves the store, not even the one an interrupt request names
    assert "dead-run-token" not in path.read_text(encoding="utf-8")
    tokens = [e.payload["owner"] for e in source.events("every") if e.type == "turn.interrupt_requested"]
    assert tokens and all(token not in path.read_text(encoding="utf-8") for token in tokens)


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
    # the source's rollback to turn 2, plus 1; Billing (the handoff in its turn 2) stays active
    assert rollbacks == [{"to_turn": 3, "removed_turns": [4], "active_agent": "Billing"}]
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
    assert completed[0]["usage"] == {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29}  # the one shape
    assert completed[0]["content"] == "2 + 3 = 5"
    assert store.session_endpoint(first) == ("fake", None)
    imported = [e.payload for e in store.events(first) if e.type == "session.imported"]
    assert imported == [{"format": "llm", "source": str(DATA / "llm-0.27-logs.db"), "source_id": f"llm:{first}",
                         "counts": {"turns": 2, "messages": 5, "tool_calls": 0},
                         "source_created_at": imported[0]["source_created_at"], "turns": [1, 2]}]
    window = store.window_turns(first)
    assert window[0].messages[0].content == "What is the capital of France?"
    assert store.load_turns(first, first=0)[0].messages == (Message.system("Be brief."),)
    assert [r.counts["turns"] for r in import_file(store, DATA / "llm-0.27-logs.db")] == [0, 0, 0]


def test_an_llm_reply_cut_by_the_length_limit_imports_as_a_cut_turn(make_store: Any, tmp_path: Path) -> None:
    from tests.helpers.llm_db import corrupted

    db = corrupted(tmp_path, DATA / "llm-0.27-logs.db", "update responses set response_json = json_set("
                   "response_json, '$.finish_reason', 'length') where prompt = 'How many people live there?'")
    store = make_store()
    first = import_file(store, db)[0].session_id
    done = [e.payload.get("finish_reason") for e in store.events(first) if e.type == "turn.completed"]
    assert done == [None, "length"]
    assert store.load_turns(first)[1].messages[-1].finish_reason == "length"


def test_claude_code_import(make_store: Any, tmp_path: Path) -> None:
    path = tmp_path / "4f35.jsonl"
    path.write_text("\n".join(lines_of(session_lines())) + "\n", encoding="utf-8")
    store = make_store()
    [result] = import_file(store, path)
    assert result.counts == {"turns": 2, "messages": 6, "tool_calls": 1}
    turns = store.load_turns(result.session_id)
    assert turns[0].messages[2] == Message.tool("toolu_1", "error: missing header", name="Bash", is_error=True)
    assert store.list_sessions()[0].metadata["claude_code_cwd"] == "/home/ana/shop"


def test_a_claude_code_file_imported_as_it_grows_ends_as_the_final_file_imported_once(make_store: Any,
                                                                                     tmp_path: Path) -> None:
    """Imported after every line Claude Code appends -- a prompt edited after its reply (the
    branch imported before is abandoned), a compaction, a resumed part -- the session ends as
    the final file imported once: no abandoned branch, no compaction summary as a turn."""
    lines = lines_of(broken_chain_lines())
    path = tmp_path / "s.jsonl"
    growing = make_store("growing")
    for k in range(2, len(lines) + 1):
        path.write_text("\n".join(lines[:k]) + "\n", encoding="utf-8")
        import_file(growing, path)
    once = make_store("once")
    [result] = import_file(once, path)
    assert result.skipped["abandoned branch (rewound or edited away)"] == 2
    assert [t[0].content for t in _live(once, result.session_id) if t] == [
        "Why does the build fail?", "Fix it, and add a test", "Now run the tests", "Commit it"]
    assert _live(growing, result.session_id) == _live(once, result.session_id)


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
    # the call has no result in the log: the turn is closed as chatflow closes an interrupted
    # one (a synthetic result, turn.interrupted), not as if it had completed
    waiting = store.load_turns(tools)[0].messages[-1]
    assert (waiting.content, waiting.interrupted, waiting.is_error) == (INTERRUPTED_TOOL_RESULT, True, True)
    ends = [e.type for e in store.events(tools) if e.type in ("turn.completed", "turn.interrupted")]
    assert ends == ["turn.interrupted"]
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


@pytest.mark.parametrize("went_on", ["after it", "in its place"])
def test_a_changed_turn_with_turns_after_it_is_kept_with_a_warning(make_store: Any, tmp_path: Path,
                                                                   went_on: str) -> None:
    """Only the target's last turn can be imported again: once the session went on (here in
    chatflow, after the turn or rolled back to before it), a turn that changed in the source
    is kept as imported, and the import says so."""
    lines = lines_of(session_lines())
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines[:4]) + "\n", encoding="utf-8")
    store = make_store()
    [first] = import_file(store, path)
    session = store.get_or_create(first.session_id, "Assistant")
    if went_on == "in its place":
        session.rollback_to(0)
    session.add_message(Message.user("and in chatflow?"))
    session.add_message(Message.model("yes"))
    session.complete_turn("yes")
    store.save(session)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    [result] = import_file(store, path)
    assert result.counts["turns"] == 1 and result.skipped_turns == 1
    assert result.warnings == [("line 2: changed in the source since it was imported as turn 1, but the session went "
                                "on from there: kept as it was imported")]
    assert [t.messages[0].content for t in store.load_turns(first.session_id)] == [
        *(["Why does the build fail?"] if went_on == "after it" else []), "and in chatflow?", "Fix it, ünïcødé ✓"]


def _live(store: Any, session_id: str) -> list[tuple[Message, ...]]:
    return [r.messages for r in store.load_turns(session_id, first=0) if not (r.rolled_back or r.failed)]


def test_what_the_openai_export_writes_always_imports_back(make_store: Any, tmp_path: Path) -> None:
    """A session whose only turn failed has no conversation: it is left out with a warning
    (it wrote {"messages": []}, which import refuses); a session waiting for custom tool
    results ends with the calls and imports back waiting."""
    from chatflow_cli.core.messages import ToolCall

    source = make_store("source")
    build_every_event_session(source)
    failed = source.get_or_create("failed", "Assistant")
    failed.add_message(Message.user("never answered"))
    failed.fail_turn(RuntimeError("down"))
    source.save(failed)
    waiting = source.get_or_create("waiting", "Assistant")
    waiting.add_message(Message.user("approve it"))
    waiting.add_message(Message.model(None, [ToolCall("p1", "approve", "{}")], agent="Assistant"))
    waiting.record_event("tool.pending", {"turn": 1, "tool_use_ids": ["p1"]})
    source.save(waiting)
    for per_turn in (False, True):
        warnings: list[str] = []
        text = "".join(piece for sid in ("every", "failed", "waiting")
                       for piece in export_lines(source, sid, "openai", per_turn=per_turn, warn=warnings.append))
        assert len(warnings) == 1 and warnings[0].startswith("failed: not written in the openai format")
        path = tmp_path / f"all-{per_turn}.jsonl"
        path.write_text(text, encoding="utf-8")
        store = make_store(f"target-{per_turn}")
        results = import_file(store, path)
        assert len(results) == len(text.splitlines()) == (2 if not per_turn else source.turn_count("every") + 1)
    # the waiting session imports back waiting for the same call, and takes its result
    last = results[-1]  # waiting's line comes last
    imported = store.get(last.session_id)
    assert imported is not None
    assert [c.id for c in imported.pending_tool_calls] == ["p1"]
    assert store.submit_tool_result(last.session_id, "p1", "approved") == []


def test_md_export_keeps_every_field_of_the_messages_and_the_header(make_store: Any, tmp_path: Path) -> None:
    """md export -> import keeps every message field (agent_version on a tool-call-only reply,
    too), the title, agent, model, max_turns, metadata, the archive state and the session's times."""
    source = make_store("source")
    build_every_event_session(source)
    source.set_session_endpoint("every", "gpt-x", "http://127.0.0.1:9/v1")
    path = tmp_path / "every.md"
    path.write_text("".join(export_lines(source, "every", "md")), encoding="utf-8")
    store = make_store("target")
    [result] = import_file(store, path)
    assert result.created
    assert _live(store, "every") == _live(source, "every")
    calls_only = [m for turn in _live(store, "every") for m in turn if m.tool_calls and not m.content]
    assert calls_only and all(m.agent_version for m in calls_only)
    assert store.list_sessions() == []  # archived in the source: archived here too
    [mine] = store.list_sessions(archived=True)
    [theirs] = source.list_sessions(archived=True)
    assert (mine.title, mine.active_agent_name, mine.max_turns, mine.metadata, mine.archived_at is not None) == (
        theirs.title, theirs.active_agent_name, theirs.max_turns, theirs.metadata, True)
    assert mine.title == "Order 404, refunded"
    assert store.session_endpoint("every") == ("gpt-x", "http://127.0.0.1:9/v1")
    # the front matter's times, to the millisecond it writes
    assert abs(mine.created_at - theirs.created_at) < 0.001 and abs(mine.updated_at - theirs.updated_at) < 0.001


def test_imported_sessions_keep_the_times_of_their_source(make_store: Any, tmp_path: Path) -> None:
    """created_at/updated_at of an imported session are when the conversation happened in
    its source, not the time of the import: the chatflow header's, llm's datetime_utc of
    the first and last response, Claude Code's entry timestamps."""
    from chatflow_cli.core.interop.records import parse_time

    source = make_store("source")
    build_rich_session(source)
    header = json.loads(next(export_lines(source, "rich", "chatflow")))["session"]
    path = tmp_path / "rich.jsonl"
    path.write_text("".join(export_lines(source, "rich", "chatflow")), encoding="utf-8")
    # a chatflow export from long ago: its header's times are the source's
    lines = path.read_text(encoding="utf-8").splitlines()
    head = json.loads(lines[0])
    head["session"].update(created_at="2024-03-01T09:00:00.000Z", updated_at="2024-03-02T18:30:00.000Z")
    lines[0] = json.dumps(head)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    store = make_store("target")
    import_file(store, path)
    [rich] = store.list_sessions()
    assert (rich.created_at, rich.updated_at) == (parse_time("2024-03-01T09:00:00Z"), parse_time("2024-03-02T18:30:00Z"))
    assert header["created_at"] != "2024-03-01T09:00:00.000Z"
    # --since keeps what was active lately in its source: not this import of old history
    assert store.list_sessions(since=parse_time("2025-01-01T00:00:00Z")) == []
    # llm: the first and last response of each conversation
    import_file(store, DATA / "llm-0.27-logs.db")
    by_id = {s.session_id: s for s in store.list_sessions()}
    first = by_id["01m8qrnckyj17s6w205c5jfayw"]
    assert (first.created_at, first.updated_at) == (parse_time("2026-12-01T02:59:07.769496+00:00"),
                                                    parse_time("2026-12-01T02:59:11.061066+00:00"))
    # Claude Code: its entries' timestamps
    claude = tmp_path / "4f35.jsonl"
    claude.write_text("\n".join(lines_of(session_lines())) + "\n", encoding="utf-8")
    [result] = import_file(store, claude)
    cc = next(s for s in store.list_sessions() if s.session_id == result.session_id)
    assert cc.created_at == cc.updated_at == parse_time("2026-11-30T10:00:00.000Z")
    # sessions ls order (newest activity first) is the sources' order
    assert [s.session_id for s in store.list_sessions()][-2:] == [result.session_id, "rich"]
    # and passes them on: its export carries them, another import keeps them again
    again = json.loads(next(export_lines(store, "rich", "chatflow")))["session"]
    assert (again["created_at"], again["updated_at"]) == ("2024-03-01T09:00:00.000Z", "2024-03-02T18:30:00.000Z")
    chain = tmp_path / "llm-first.jsonl"
    chain.write_text("".join(export_lines(store, first.session_id, "chatflow")), encoding="utf-8")
    third = make_store("third")
    import_file(third, chain)
    [copied] = third.list_sessions()
    assert abs(copied.created_at - first.created_at) < 0.001 and abs(copied.updated_at - first.updated_at) < 0.001
    # --into an existing session keeps that session's own creation time
    mine = store.get_or_create("mine", "Assistant")
    store.save(mine)
    made = next(s for s in store.list_sessions() if s.session_id == "mine").created_at
    import_file(store, path, into="mine")
    assert next(s for s in store.list_sessions() if s.session_id == "mine").created_at == made


def test_imported_messages_keep_their_source_times_so_search_since_agrees_with_ls(make_store: Any,
                                                                                 tmp_path: Path) -> None:
    """Conversations from 18 months ago: every imported message's event carries its time in
    the source, so ``search --since 7d`` does not find them while ``ls --since 7d`` does not
    list them, and the hits' ages are the sources'. A session's created/updated times are its
    first and last message's."""
    from chatflow_cli.core.interop.records import parse_time
    from tests.helpers.llm_db import corrupted

    db = corrupted(tmp_path, DATA / "llm-0.27-logs.db",
                   "update responses set datetime_utc = replace(datetime_utc, '2026-12-01', '2025-06-01')")
    entries = session_lines()
    for k, e in enumerate(entries):
        if "timestamp" in e:
            entries[k] = {**e, "timestamp": f"2025-06-02T10:0{k % 10}:00.000Z"}
    claude = tmp_path / "old.jsonl"
    claude.write_text("\n".join(lines_of(entries)) + "\n", encoding="utf-8")
    store = make_store()
    import_file(store, db)
    [cc] = import_file(store, claude)
    week = time.time() - 7 * 86400
    assert store.list_sessions(since=week) == []
    assert store.search("Paris", since=week) == [] and store.search("header", since=week) == []
    [paris] = store.search("Paris")
    assert paris.created_at == parse_time("2025-06-01T02:59:07.769496+00:00")
    [fix] = store.search("ünïcødé")
    assert fix.created_at == parse_time("2025-06-02T10:08:00Z")  # the prompt's entry, line 9
    times = [e.created_at for e in store.events(cc.session_id) if e.type.startswith(("message.", "tool."))]
    assert max(times) < week
    summary = next(s for s in store.list_sessions() if s.session_id == cc.session_id)
    assert (summary.created_at, summary.updated_at) == (min(times), max(times))


def _chat(store: Any, session_id: str, *texts: str) -> None:
    for text in texts:
        s = store.get_or_create(session_id, "Assistant")
        s.add_message(Message.user(text))
        s.add_message(Message.model(f"ok: {text}"))
        s.complete_turn(f"ok: {text}")
        store.save(s)


def _live_texts(store: Any, session_id: str) -> list[str]:
    return [r.messages[0].content for r in store.load_turns(session_id) if not (r.rolled_back or r.failed)]


@pytest.mark.parametrize("fmt", ["chatflow", "md"])
def test_a_newer_export_imported_over_an_earlier_one_applies_what_happened_since(
        fmt: str, make_store: Any, tmp_path: Path) -> None:
    """An incremental import ends as a fresh import of the newer file: the source's rollback
    (and, in a log, every event after what was imported before) is applied, in order."""
    source = SessionStore()
    _chat(source, "rb", "msg 1", "msg 2", "msg 3")
    old, new = tmp_path / f"rb1.{fmt}", tmp_path / f"rb2.{fmt}"
    old.write_text("".join(export_lines(source, "rb", fmt)), encoding="utf-8")
    source.rollback("rb", 1)
    _chat(source, "rb", "new 2")
    source.set_title("rb", "Renamed")
    new.write_text("".join(export_lines(source, "rb", fmt)), encoding="utf-8")

    store, fresh = make_store(), SessionStore()
    import_file(store, old)
    [dry] = import_file(store, new, dry_run=True)
    assert _live_texts(store, "rb") == ["msg 1", "msg 2", "msg 3"]  # the dry run wrote nothing
    [real] = import_file(store, new)
    assert (dry.counts, dry.skipped_turns, dry.warnings) == (real.counts, real.skipped_turns, real.warnings)
    assert real.counts["rolled_back"] == 2 and real.counts["turns"] == 1
    import_file(fresh, new)
    assert _live_texts(store, "rb") == _live_texts(fresh, "rb") == _live_texts(source, "rb") == ["msg 1", "new 2"]
    if fmt == "chatflow":  # the same log, apart from the session.imported event each import adds
        ours = [(t, p) for _, t, p in events_of(store, "rb") if t != "session.imported"]
        theirs = [(t, p) for _, t, p in events_of(fresh, "rb") if t != "session.imported"]
        assert ours == theirs
    assert store.session_summary("rb").title == fresh.session_summary("rb").title == "Renamed"
    [again] = import_file(store, new)  # and once more: nothing
    assert again.counts["turns"] == 0 and "rolled_back" not in again.counts
    assert _live_texts(store, "rb") == ["msg 1", "new 2"]


def test_an_md_import_keeps_turns_the_session_went_on_with_after_the_source_rolled_back(
        make_store: Any, tmp_path: Path) -> None:
    source = SessionStore()
    _chat(source, "rb", "msg 1", "msg 2")
    old, new = tmp_path / "rb1.md", tmp_path / "rb2.md"
    old.write_text("".join(export_lines(source, "rb", "md")), encoding="utf-8")
    source.rollback("rb", 1)
    _chat(source, "rb", "new 2")
    new.write_text("".join(export_lines(source, "rb", "md")), encoding="utf-8")
    store = make_store()
    import_file(store, old)
    _chat(store, "rb", "mine")  # the imported session went on here
    [result] = import_file(store, new)
    assert "rolled_back" not in result.counts
    assert any("went on from there" in w for w in result.warnings)
    assert _live_texts(store, "rb") == ["msg 1", "msg 2", "mine", "new 2"]


@pytest.mark.parametrize("other", ["the same file", "a newer export"])
def test_an_import_that_another_process_beat_reports_what_its_own_transaction_did(
        other: str, tmp_path: Path) -> None:
    """Two imports at once: the one whose transaction comes second reports what that
    transaction did (nothing new, no session created), not what it planned before it.
    The race is forced: another connection to the same SQLite file imports between this
    import's plan and its transaction."""
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    source = SessionStore()
    _chat(source, "rb", "msg 1", "msg 2")
    path, newer = tmp_path / "rb.jsonl", tmp_path / "rb2.jsonl"
    path.write_text("".join(export_lines(source, "rb", "chatflow")), encoding="utf-8")
    _chat(source, "rb", "msg 3")
    newer.write_text("".join(export_lines(source, "rb", "chatflow")), encoding="utf-8")
    db = tmp_path / "race.db"
    with SQLiteSessionStore(db) as store, SQLiteSessionStore(db) as rival:
        real_edit, raced = store.edit, []

        def edit(*args: Any, **kwargs: Any) -> Any:
            if not raced:  # the rival's import commits after this one planned
                raced.append(import_file(rival, path if other == "the same file" else newer)[0])
            return real_edit(*args, **kwargs)

        store.edit = edit  # type: ignore[method-assign]
        [mine] = import_file(store, path)
        [theirs] = raced
        assert theirs.created and theirs.counts["turns"] == (2 if other == "the same file" else 3)
        assert not mine.created and mine.counts["turns"] == 0
        assert mine.skipped_turns == 2
        assert _live_texts(store, "rb") == ["msg 1", "msg 2"] + ([] if other == "the same file" else ["msg 3"])
        assert [t for _, t, _ in events_of(store, "rb")].count("session.imported") == 1


def _rb_exports(tmp_path: Path) -> tuple[Path, Path]:
    """rb1.md: msg 1..4; rb2.md, exported later: rolled back to turn 2, then msg 5 after rb."""
    source = SessionStore()
    _chat(source, "rb", "msg 1", "msg 2", "msg 3", "msg 4")
    old, new = tmp_path / "rb1.md", tmp_path / "rb2.md"
    old.write_text("".join(export_lines(source, "rb", "md")), encoding="utf-8")
    time.sleep(0.01)  # the front matter's `updated` has milliseconds: the newer export is later
    source.rollback("rb", 2)
    _chat(source, "rb", "msg 5 after rb")
    new.write_text("".join(export_lines(source, "rb", "md")), encoding="utf-8")
    return old, new


def test_an_older_md_export_imported_after_a_newer_one_adds_nothing(make_store: Any, tmp_path: Path) -> None:
    old, new = _rb_exports(tmp_path)
    store = make_store()
    import_file(store, new)
    [dry] = import_file(store, old, dry_run=True)
    [result] = import_file(store, old)
    assert result.counts["turns"] == dry.counts["turns"] == 0
    assert "rolled_back" not in result.counts and any("older export" in w for w in result.warnings)
    assert _live_texts(store, "rb") == ["msg 1", "msg 2", "msg 5 after rb"]
    [again] = import_file(store, new)  # the newer one is still what was imported: nothing to do
    assert again.counts["turns"] == 0 and "rolled_back" not in again.counts
    assert _live_texts(store, "rb") == ["msg 1", "msg 2", "msg 5 after rb"]


@pytest.mark.parametrize("order", ["old then new", "new then old"])
def test_md_exports_of_one_session_in_one_file_import_as_one_after_the_other(
        order: str, make_store: Any, tmp_path: Path) -> None:
    old, new = _rb_exports(tmp_path)
    both = tmp_path / "both.md"
    parts = [old, new] if order == "old then new" else [new, old]
    both.write_text("".join(p.read_text(encoding="utf-8") for p in parts), encoding="utf-8")
    store, one_by_one = make_store(), SessionStore()
    import_file(one_by_one, parts[0])
    import_file(one_by_one, parts[1])
    [result] = import_file(store, both)
    assert _live_texts(store, "rb") == _live_texts(one_by_one, "rb") == ["msg 1", "msg 2", "msg 5 after rb"]
    assert any("2 exports of session rb" in w for w in result.warnings)
    [again] = import_file(store, both)  # a second time: nothing added, no error
    assert again.counts["turns"] == 0 and "rolled_back" not in again.counts
    assert _live_texts(store, "rb") == ["msg 1", "msg 2", "msg 5 after rb"]


def test_a_claude_code_file_first_imported_with_only_its_prompt_gets_its_model_and_settings_later(
        make_store: Any, tmp_path: Path) -> None:
    """Claude Code writes the prompt line before the reply: a file imported in that state
    names no model yet. Imported again once it grew, the session ends as the final file
    imported once -- its model (so ``sessions show``, exports and the context budget know
    it) and the settings the source gives (here a git branch switched mid-session)."""
    entries = session_lines()
    for e in entries[2:]:
        if "gitBranch" in e:
            e["gitBranch"] = "fix-build"
    lines = lines_of(entries)
    path = tmp_path / "s.jsonl"
    growing = make_store("growing")
    for k in (2, len(lines)):  # the summary line and the first prompt; then the whole file
        path.write_text("\n".join(lines[:k]) + "\n", encoding="utf-8")
        import_file(growing, path)
    once = make_store("once")
    [result] = import_file(once, path)
    assert once.session_endpoint(result.session_id) == ("claude-sonnet-4-5", None)
    assert growing.session_endpoint(result.session_id) == once.session_endpoint(result.session_id)
    summary = growing.session_summary(result.session_id)
    assert summary.metadata["claude_code_git_branch"] == "fix-build"
    assert summary.metadata == once.session_summary(result.session_id).metadata
    assert _live(growing, result.session_id) == _live(once, result.session_id)
    again = import_file(growing, path)[0]  # nothing new: nothing written
    assert again.counts["turns"] == 0 and growing.session_summary(result.session_id).metadata == summary.metadata


def _tool_loop_times(store: Any, session_id: str) -> list[tuple[str, float]]:
    return [(e.type, e.created_at) for e in store.events(session_id)
            if e.type in ("message.user", "message.model", "tool.result")]


@pytest.mark.parametrize("schema", ["responses", "threads"])
def test_each_message_of_an_llm_tool_loop_keeps_its_own_model_calls_time(
        schema: str, make_store: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """One chatflow turn built from two llm model calls (the tool call, then the reply after
    the result, here 40 s later: a slow tool): the tool result (sent with the second call)
    and the reply carry the second call's time, not the first's, and the session was last
    active at its last message."""
    from chatflow_cli.core.interop.records import parse_time
    from tests.helpers.llm_db import corrupted

    if schema == "responses":
        db = corrupted(tmp_path, DATA / "llm-0.27-logs.db", "update responses set datetime_utc = "
                       "'2026-12-01T03:00:00.000000+00:00' where response = '2 + 3 = 5'")
        table, ask = "responses", "select datetime_utc from responses where prompt = 'What is 2+3?'"
    else:
        db = corrupted(tmp_path, request.getfixturevalue("llm_logs_db"),
                       "update turns set datetime_utc = '2099-12-01T03:00:00.000000+00:00' where tip_message_hash "
                       "in (select message_hash from parts where type = 'text' and text = '2 + 3 = 5')")
        table, ask = "turns", ("select datetime_utc from turns where tip_message_hash in (select message_hash "
                               "from parts where type = 'tool_call')")
    import sqlite3

    conn = sqlite3.connect(db)
    first = parse_time(conn.execute(ask).fetchone()[0])
    second = parse_time(conn.execute(f"select max(datetime_utc) from {table}").fetchone()[0]
                        if schema == "threads" else "2026-12-01T03:00:00+00:00")
    conn.close()
    store = make_store()
    tools = next(r.session_id for r in import_file(store, db) if r.counts["tool_calls"])
    assert _tool_loop_times(store, tools) == [("message.user", first), ("message.model", first),
                                              ("tool.result", second), ("message.model", second)]
    assert store.session_summary(tools).updated_at == second


def test_a_claude_code_reply_cut_by_max_tokens_imports_as_a_cut_turn(make_store: Any, tmp_path: Path) -> None:
    entries = session_lines()
    entries[6]["message"]["stop_reason"] = "max_tokens"  # a2, the first turn's last reply
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines_of(entries)) + "\n", encoding="utf-8")
    store = make_store()
    [result] = import_file(store, path)
    done = [e.payload.get("finish_reason") for e in store.events(result.session_id) if e.type == "turn.completed"]
    assert done == ["length", None]
    assert store.load_turns(result.session_id)[0].messages[-1].finish_reason == "length"
