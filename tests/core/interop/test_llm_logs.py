"""llm's logs.db, both schema generations, read directly and read-only."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from chatflow_cli.core.errors import ImportFormatError
from chatflow_cli.core.interop import read_source
from chatflow_cli.core.interop.llm_logs import read_llm_logs
from chatflow_cli.core.messages import Message, ToolCall
from tests.helpers.llm_db import corrupted

from .conftest import DATA

OLD_DB = DATA / "llm-0.27-logs.db"

EXPECTED_TURNS = [
    # (session index, turn messages, usage)
    (0, [Message.user("What is the capital of France?"), Message.model("Paris is the capital.")],
     {"input_tokens": 14, "output_tokens": 6}),
    (0, [Message.user("How many people live there?"), Message.model("About 2.1 million people.")],
     {"input_tokens": 29, "output_tokens": 6}),
    (1, [Message.user("What is 2+3?"), Message.model(None, [ToolCall("call_1", "add", '{"a": 2, "b": 3}')]),
         Message.tool("call_1", "5", name="add"), Message.model("2 + 3 = 5")],
     {"input_tokens": 19, "output_tokens": 10}),
    (2, [Message.user("Notes: the meeting is at noon.\n\nWhen is the meeting?"), Message.model("At noon.")], None),
]


def check_sessions(path: Path) -> None:
    sessions = read_llm_logs(path)
    assert [len(s.turns) for s in sessions] == [2, 1, 1]
    assert sessions[0].system == ["Be brief."]
    assert sessions[1].system == [] and sessions[2].system == []
    assert sessions[0].metadata["llm_name"] == "What is the capital of France?"
    for s in sessions:
        assert s.metadata["llm_id"] == s.session_id
        assert s.model == "fake"
        assert s.warnings == []
        assert all(t.model == "fake" for t in s.turns)
    flat = [(i, t) for i, s in enumerate(sessions) for t in s.turns]
    for (index, turn), (want_index, messages, usage) in zip(flat, EXPECTED_TURNS, strict=True):
        assert index == want_index
        assert turn.messages == messages
        if usage is not None:
            assert turn.usage == usage
    keys = [t.key for _, t in flat]
    assert len(set(keys)) == len(keys)


def test_older_schema_responses_tables() -> None:
    tables = {r[0] for r in sqlite3.connect(OLD_DB).execute("select name from sqlite_master")}
    assert {"responses", "conversations", "tool_calls", "tool_results"} <= tables
    assert "threads" not in tables
    check_sessions(OLD_DB)


def test_newer_schema_threads_messages_parts(llm_logs_db: Path) -> None:
    tables = {r[0] for r in sqlite3.connect(llm_logs_db).execute("select name from sqlite_master")}
    assert {"threads", "messages", "parts", "turns"} <= tables
    assert sqlite3.connect(llm_logs_db).execute("select count(*) from responses").fetchone()[0] == 0
    check_sessions(llm_logs_db)


def test_a_file_with_both_generations_gives_every_conversation(llm_logs_db: Path, tmp_path: Path) -> None:
    both = tmp_path / "both.db"
    shutil.copy(llm_logs_db, both)
    conn = sqlite3.connect(both)
    conn.execute("ATTACH ? AS old", (str(OLD_DB),))
    for table in ("conversations", "responses", "tool_calls", "tool_results", "fragments", "prompt_fragments"):
        cols = ", ".join(f"[{r[1]}]" for r in conn.execute(f"PRAGMA old.table_info([{table}])"))
        conn.execute(f"DELETE FROM main.[{table}]")  # the fragment rows are the same in both
        conn.execute(f"INSERT INTO main.[{table}] ({cols}) SELECT {cols} FROM old.[{table}]")
    conn.commit()
    conn.close()
    sessions = read_llm_logs(both)
    assert len(sessions) == 6
    assert {s.source_id for s in sessions} == {f"llm:{s.session_id}" for s in sessions}


def test_a_conversation_continued_after_the_upgrade_keeps_its_identity_and_turn_keys(
        upgraded_llm_db: Path) -> None:
    """llm 0.3x continues an older conversation in a thread with the conversation's id, whose
    chain holds the older turns again: read from either generation, it is one session with
    the same source id and the same turn keys, and the new turn follows."""
    before = read_llm_logs(OLD_DB)
    after = read_llm_logs(upgraded_llm_db)
    conn = sqlite3.connect(upgraded_llm_db)
    assert conn.execute("select count(*) from threads where id = ?", (before[0].session_id,)).fetchone()[0] == 1
    new_call = conn.execute("select id from turns").fetchone()[0]
    assert [s.source_id for s in after] == [s.source_id for s in before]
    assert [[t.key for t in s.turns] for s in after] == [
        [t.key for t in before[0].turns] + [new_call], *[[t.key for t in s.turns] for s in before[1:]]]
    assert [t.messages for t in after[0].turns[:2]] == [t.messages for t in before[0].turns]
    assert after[0].turns[2].messages == [Message.user("And the second city?"), Message.model("Lyon is second.")]
    assert after[0].metadata["llm_name"] == "What is the capital of France?"


def test_read_only_the_file_is_not_changed(llm_logs_db: Path, tmp_path: Path) -> None:
    copy = tmp_path / "logs.db"
    shutil.copy(llm_logs_db, copy)
    before = copy.read_bytes()
    copy.chmod(0o444)
    fmt, sessions = read_source(str(copy))  # detected from the SQLite header
    assert fmt == "llm" and len(sessions) == 3
    assert copy.read_bytes() == before
    assert not Path(str(copy) + "-wal").exists()


def test_not_an_llm_database(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("create table t (x)").connection.commit()
    with pytest.raises(ImportFormatError, match="not an llm logs.db"):
        read_llm_logs(other)


def test_a_malformed_part_names_its_row(llm_logs_db: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.db"
    shutil.copy(llm_logs_db, broken)
    conn = sqlite3.connect(broken)
    row = conn.execute("select id from parts where type = 'tool_call'").fetchone()[0]
    conn.execute("update parts set payload = '{not json' where id = ?", (row,))
    conn.commit()
    conn.close()
    with pytest.raises(ImportFormatError, match=f"parts row {row}: payload is not JSON") as info:
        read_llm_logs(broken)
    assert info.value.location == f"parts row {row}"
    assert info.value.exit_code == 2


def test_attachments_with_bytes_come_in_as_attachments_the_others_as_a_documented_line(tmp_path: Path) -> None:
    """An attachment whose bytes llm kept (or whose file is still there) becomes an attachment
    of the user message; one without (a file gone, a URL) gets ``[attachment: <type> <path or url>]``."""
    db = tmp_path / "logs.db"
    shutil.copy(OLD_DB, db)
    conn = sqlite3.connect(db)
    response = conn.execute("select id from responses where prompt = 'What is 2+3?'").fetchone()[0]
    conn.execute("insert into attachments (id, type, path, url, content) values ('a1', 'image/png', '/tmp/sum.png', "
                 "null, null)")
    conn.execute("insert into attachments (id, type, path, url, content) values ('a2', 'application/pdf', null, "
                 "'https://example.com/x.pdf', null)")
    conn.execute("insert into prompt_attachments (response_id, attachment_id, [order]) values (?, 'a1', 0)", (response,))
    conn.execute("insert into prompt_attachments (response_id, attachment_id, [order]) values (?, 'a2', 1)", (response,))
    conn.execute("insert into attachments (id, type, path, url, content) values ('a3', 'text/csv', null, null, ?)",
                 (b"n,sum\n2,5\n",))
    conn.execute("insert into prompt_attachments (response_id, attachment_id, [order]) values (?, 'a3', 2)", (response,))
    conn.commit()
    conn.close()
    sessions = read_llm_logs(db)
    message = sessions[1].turns[0].messages[0]
    assert message.content == ("What is 2+3?\n[attachment: image/png /tmp/sum.png]\n"
                               "[attachment: application/pdf https://example.com/x.pdf]")
    [kept] = message.attachments
    assert (kept.data, kept.media_type, kept.name) == (b"n,sum\n2,5\n", "text/plain", None)



@pytest.mark.parametrize(("sql", "where", "problem"), [
    ("update tool_calls set arguments = '{\"a\": 2,' where name = 'add'", "tool_calls row 1",
     "tool call arguments are not JSON: '{\"a\": 2,'"),
    ("update responses set input_tokens = 'many' where prompt = 'What is 2+3?'", "responses row {add}",
     "input_tokens is not a token count: 'many'"),
    ("update responses set output_tokens = -4 where prompt = 'What is 2+3?'", "responses row {add}",
     "output_tokens is not a token count: '-4'"),
    ("update responses set input_tokens = 2.5 where prompt = 'What is 2+3?'", "responses row {add}",
     "input_tokens is not a token count: '2.5'"),
    ("update responses set prompt = x'00ff' where prompt = 'What is 2+3?'", "responses row {add}",
     "prompt is not text (a BLOB of 2 bytes)"),
    ("update responses set datetime_utc = 'yesterday' where prompt = 'What is 2+3?'", "responses row {add}",
     "datetime_utc is not a time: 'yesterday'"),
])
def test_a_value_llm_never_writes_is_an_error_naming_table_row_and_column(
        tmp_path: Path, sql: str, where: str, problem: str) -> None:
    add = sqlite3.connect(OLD_DB).execute("select id from responses where prompt = 'What is 2+3?'").fetchone()[0]
    where = where.format(add=add)
    db = corrupted(tmp_path, OLD_DB, sql)
    with pytest.raises(ImportFormatError) as info:
        read_llm_logs(db)
    assert str(info.value) == f"{db}: {where}: {problem}"
    assert info.value.location == where and info.value.exit_code == 2


@pytest.mark.parametrize("sql", [
    "update turns set input_tokens = 'lots'",
    "update parts set payload = json_set(payload, '$.arguments', '{\"a\": 2,') where type = 'tool_call'",
])
def test_the_newer_schema_is_checked_alike(llm_logs_db: Path, tmp_path: Path, sql: str) -> None:
    db = corrupted(tmp_path, llm_logs_db, sql)
    with pytest.raises(ImportFormatError, match=r": (turns|parts) row [^:]+: (input_tokens is not a token count"
                                                r"|tool call arguments are not JSON)"):
        read_llm_logs(db)


def test_what_llm_can_write_is_kept_as_it_is(tmp_path: Path) -> None:
    """llm keeps a model's unparseable arguments as ``{"_raw": ...}`` and parses the rest with
    json.loads (a list is possible): both are kept verbatim, a non-object with a warning; a
    NULL token count is unknown, left out of the usage; an integral REAL is a count."""
    db = corrupted(tmp_path, OLD_DB, "update tool_calls set arguments = '[2, 3]' where name = 'add'")
    conn = sqlite3.connect(db)
    conn.execute("update responses set input_tokens = null, output_tokens = 6.0 where prompt = 'What is 2+3?'")
    conn.commit()
    conn.close()
    session = read_llm_logs(db)[1]
    assert session.turns[0].messages[1].tool_calls[0].arguments == "[2, 3]"
    assert session.warnings == ["tool_calls row 1: tool call arguments are a JSON list, not an object; kept as they are"]
    # the first call's input unknown (NULL) and output 6.0, the second call's 13 and 7
    assert session.turns[0].usage == {"input_tokens": 13, "output_tokens": 13}
    (tmp_path / "raw").mkdir()
    raw = corrupted(tmp_path / "raw", OLD_DB,
                    """update tool_calls set arguments = '{"_raw": "{\\"a\\": 2,"}' where name = 'add'""")
    assert read_llm_logs(raw)[1].turns[0].messages[1].tool_calls[0].arguments == '{"_raw": "{\\"a\\": 2,"}'
    assert read_llm_logs(raw)[1].warnings == []


@pytest.mark.parametrize(("sql", "where", "problem"), [
    ("update messages set role = 'alien' where role = 'tool'", "messages row {tool}",
     "role is not one llm writes (system, user, assistant, tool): 'alien'"),
    ("update parts set type = 'video' where type = 'tool_call'", "parts row {call_part}",
     "type is not one llm writes (text, reasoning, tool_call, tool_result, attachment): 'video'"),
    ("delete from messages where rowid = 1", "messages row {second}", "parent_hash names no messages row: '{first}'"),
    ("gap", "", ""),  # a part gone from a message that keeps one after it: see the test body
    ("insert into parts (id, message_hash, position, type, text) values (99, 'b2:gone', 0, 'text', 'hi')",
     "parts row 99", "message_hash names no messages row: 'b2:gone'"),
    ("delete from threads where rowid = 1", "messages row {first}", "no thread reaches it (its thread is gone)"),
    ("update turns set tip_message_hash = 'b2:gone' where rowid = 1", "turns row {turn}",
     "tip_message_hash names no messages row: 'b2:gone'"),
])
def test_rows_that_break_llms_schema_are_errors_naming_the_row(
        llm_logs_db: Path, tmp_path: Path, sql: str, where: str, problem: str) -> None:
    """A role or part type llm does not write, a reference to a row that is not there (llm
    never deletes one), a part missing from a message: an error naming the table, row and
    column, never a conversation imported short or left out in silence."""
    conn = sqlite3.connect(llm_logs_db)
    first, second = [r[0] for r in conn.execute("select hash from messages order by rowid limit 2")]
    tool = conn.execute("select hash from messages where role = 'tool' order by rowid").fetchone()[0]
    call_part = conn.execute("select id from parts where type = 'tool_call' order by rowid").fetchone()[0]
    turn = conn.execute("select id from turns order by rowid").fetchone()[0]
    conn.close()
    if sql == "gap":  # a message that keeps a part after the one deleted
        db = corrupted(tmp_path, llm_logs_db, "insert into parts (id, message_hash, position, type, text) "
                                              f"select 98, message_hash, 1, 'text', 'more' from parts where id = {call_part}")
        conn = sqlite3.connect(db)
        conn.execute(f"delete from parts where id = {call_part}")
        conn.commit()
        conn.close()
        call_hash = sqlite3.connect(db).execute("select message_hash from parts where id = 98").fetchone()[0]
        where, problem = f"messages row {call_hash}", "its parts are at positions 1..1, not 0..0: a part is missing"
    else:
        db = corrupted(tmp_path, llm_logs_db, sql)
    where = where.format(tool=tool, call_part=call_part, first=first, second=second, turn=turn)
    with pytest.raises(ImportFormatError) as info:
        read_llm_logs(db)
    assert str(info.value) == f"{db}: {where}: {problem.format(first=first)}"
    assert info.value.location == where


@pytest.mark.parametrize(("sql", "where", "problem"), [
    ("delete from conversations where rowid = 1", "responses row {first}", "conversation_id names no conversations row"),
    ("delete from responses where prompt = 'What is 2+3?'", "tool_calls row 1", "response_id names no responses row"),
])
def test_dangling_references_in_the_older_schema_are_errors(tmp_path: Path, sql: str, where: str,
                                                             problem: str) -> None:
    first = sqlite3.connect(OLD_DB).execute(
        "select r.id from responses r join conversations c on c.id = r.conversation_id "
        "where c.rowid = 1 order by r.rowid").fetchone()[0]
    db = corrupted(tmp_path, OLD_DB, sql)
    with pytest.raises(ImportFormatError) as info:
        read_llm_logs(db)
    assert str(info.value).startswith(f"{db}: {where.format(first=first)}: {problem}: ")


@pytest.mark.parametrize("role", ["user", "assistant"])
def test_a_message_with_no_parts_is_an_error_naming_it(llm_logs_db: Path, tmp_path: Path, role: str) -> None:
    """llm writes every message with its parts: one with none lost them, and importing
    without it would shorten or merge the conversation in silence."""
    conn = sqlite3.connect(llm_logs_db)
    bare = conn.execute("select hash from messages where role = ? order by rowid", (role,)).fetchone()[0]
    conn.close()
    db = corrupted(tmp_path, llm_logs_db, f"delete from parts where message_hash = '{bare}'")
    with pytest.raises(ImportFormatError) as info:
        read_llm_logs(db)
    assert str(info.value) == (f"{db}: messages row {bare}: no parts rows "
                               "(llm writes every message with at least one part): its parts are missing")
    assert info.value.location == f"messages row {bare}"


def test_a_reply_before_the_first_prompt_is_named_with_its_article(llm_logs_db: Path, tmp_path: Path) -> None:
    conn = sqlite3.connect(llm_logs_db)
    first_user = conn.execute("select hash from messages where role = 'user' order by rowid").fetchone()[0]
    conn.close()
    db = corrupted(tmp_path, llm_logs_db, f"update messages set role = 'assistant' where hash = '{first_user}'")
    warnings = [w for s in read_llm_logs(db) for w in s.warnings]
    assert f"messages row {first_user}: an assistant message before the first prompt; skipped" in warnings


def test_a_reply_llm_recorded_as_cut_by_the_length_limit_keeps_that_mark(tmp_path: Path) -> None:
    """llm stores the model's response JSON; a streamed OpenAI reply cut by max_tokens has
    ``"finish_reason": "length"`` there. The turn and its MODEL message keep the mark, as
    chatflow marks a cut reply of its own; a reply that stopped normally has none."""
    db = corrupted(tmp_path, OLD_DB, "update responses set response_json = json_set(response_json, "
                                     "'$.finish_reason', 'length') where prompt = 'What is the capital of France?'")
    first = read_llm_logs(db)[0]
    cut, whole = first.turns
    assert cut.finish_reason == "length"
    assert cut.messages[-1] == Message.model("Paris is the capital.", finish_reason="length")
    assert whole.finish_reason is None and whole.messages[-1].finish_reason is None


def _oldest_logs_db(tmp_path: Path) -> Path:
    """The 0.27 file with rows in llm's oldest table, ``logs``, as llm's migrations left it
    (llm 0.5 kept the table when it held rows): a conversation of two prompts (the second
    names the first in ``chat_id``) and a single prompt."""
    db = tmp_path / "logs.db"
    shutil.copy(OLD_DB, db)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE [logs] ([id] INTEGER PRIMARY KEY, [model] TEXT, [prompt] TEXT, [system] TEXT, "
                 "[prompt_json] TEXT, [options_json] TEXT, [response] TEXT, [response_json] TEXT, "
                 "[reply_to_id] INTEGER REFERENCES [logs]([id]), [chat_id] INTEGER, [duration_ms] INTEGER, "
                 "[datetime_utc] TEXT)")
    rows = [(1, "gpt-3.5-turbo", "Name a colour", "Be terse.", "Blue.", None, "2023-06-01T09:00:00.000001"),
            (2, "gpt-3.5-turbo", "Another", "Be terse.", "Red.", 1, "2023-06-01T09:00:30.000001"),
            (3, "gpt-4", "What is 3+4?", None, "7", None, "2023-06-02T10:00:00.000001")]
    for rid, model, prompt, system, response, chat, at in rows:
        conn.execute("INSERT INTO logs (id, model, prompt, system, response, chat_id, duration_ms, datetime_utc) "
                     "VALUES (?, ?, ?, ?, ?, ?, 900, ?)", (rid, model, prompt, system, response, chat, at))
    conn.commit()
    conn.close()
    return db


def test_rows_of_llms_oldest_logs_table_are_imported(tmp_path: Path) -> None:
    """llm 0.5 moved to the responses tables and kept the older ``logs`` table when it held
    rows: those conversations were skipped without a word."""
    sessions = read_llm_logs(_oldest_logs_db(tmp_path))
    assert len(sessions) == 5
    colours, sums = sessions[0], sessions[1]  # the oldest first
    assert colours.session_id == "llm-log-1" and colours.system == ["Be terse."]
    assert [t.messages for t in colours.turns] == [[Message.user("Name a colour"), Message.model("Blue.")],
                                                   [Message.user("Another"), Message.model("Red.")]]
    assert colours.model == "gpt-3.5-turbo" and sums.turns[0].model == "gpt-4"
    assert sums.session_id == "llm-log-3" and sums.system == []
    assert {s.source_id for s in sessions[2:]} == {f"llm:{s.session_id}" for s in sessions[2:]}


def test_a_thread_starts_at_its_first_model_call_not_at_its_thread_row(llm_logs_db: Path) -> None:
    """llm makes a thread's row a moment apart from its first message (the model call's
    ``turns`` row holds that time): the session began with its first message."""
    from chatflow_cli.core.interop.records import parse_time

    conn = sqlite3.connect(llm_logs_db)
    for session in read_llm_logs(llm_logs_db):
        first = min(t.created_at for t in session.turns if t.created_at is not None)
        assert session.created_at == first
        row = conn.execute("select datetime_utc from threads where id = ?", (session.session_id,)).fetchone()[0]
        assert parse_time(row) != first


def test_a_cut_reply_in_the_newer_schema_keeps_its_mark(llm_logs_db: Path, tmp_path: Path) -> None:
    """llm 0.3x stores each model call's response JSON in its ``turns`` row."""
    db = corrupted(tmp_path, llm_logs_db, "update turns set response_json = json_set(response_json, "
                                          "'$.finish_reason', 'length') where rowid = 1")
    cut, whole = read_llm_logs(db)[0].turns
    assert cut.finish_reason == "length"
    assert cut.messages[-1] == Message.model("Paris is the capital.", finish_reason="length")
    assert whole.finish_reason is None and whole.messages[-1].finish_reason is None
