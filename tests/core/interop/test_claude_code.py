"""Claude Code session files: the main line from the last entry back, side chains left out."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from chatflow_cli.core.errors import ImportFormatError
from chatflow_cli.core.interop import detect_format
from chatflow_cli.core.interop.claude_code import NO_RESULT, read_claude_code
from chatflow_cli.core.messages import Message, ToolCall, history_problems

SID = "4f35e220-c435-4cf7-b9b9-f40426042847"


def entry(uuid: str, parent: str | None, kind: str, content: Any, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": kind, "content": content}
    message.update(extra.pop("message", {}))
    return {"parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": "/home/ana/shop",
            "sessionId": SID, "version": "2.0.14", "gitBranch": "main", "type": kind, "message": message,
            "uuid": uuid, "timestamp": "2026-11-30T10:00:00.000Z", **extra}


def session_lines() -> list[dict[str, Any]]:
    return [
        {"type": "summary", "summary": "Fixing the build", "leafUuid": "a4"},
        entry("u1", None, "user", "Why does the build fail?"),
        # one assistant message written as two lines (one per content block), same message.id
        entry("a1", "u1", "assistant", [{"type": "thinking", "thinking": "Look at the log.", "signature": "x"}],
              message={"id": "msg_1", "model": "claude-sonnet-4-5", "usage": {"input_tokens": 10, "output_tokens": 4}}),
        entry("a1b", "a1", "assistant",
              [{"type": "text", "text": "Let me read it."},
               {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "make"}}],
              message={"id": "msg_1", "model": "claude-sonnet-4-5", "usage": {"input_tokens": 10, "output_tokens": 4}}),
        entry("r1", "a1b", "user", [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "error: missing header"}],
                                      "is_error": True}]),
        # an abandoned branch: a reply the user rewound (same parent as a2)
        entry("x1", "r1", "assistant", [{"type": "text", "text": "ABANDONED"}], message={"id": "msg_x"}),
        entry("a2", "r1", "assistant", [{"type": "text", "text": "A header is missing."}],
              message={"id": "msg_2", "model": "claude-sonnet-4-5", "usage": {"input_tokens": 20, "output_tokens": 6}}),
        entry("m1", "a2", "user", "<command-name>/cost</command-name>", isMeta=True),
        entry("u2", "m1", "user", "Fix it, ünïcødé ✓"),
        # a side chain (a subagent's work) written after the main line's last entry
        {**entry("s1", "u2", "user", "SIDECHAIN prompt"), "isSidechain": True},
        entry("a3", "u2", "assistant", [{"type": "text", "text": "Fixed."}], message={"id": "msg_3"}),
        {**entry("s2", "s1", "assistant", [{"type": "text", "text": "SIDECHAIN reply"}]), "isSidechain": True},
        {"type": "file-history-snapshot", "messageId": "a3", "snapshot": {}},
    ]


def lines_of(entries: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(e) for e in entries]


def test_the_main_line_becomes_turns_with_tool_calls_and_results() -> None:
    lines = lines_of(session_lines())
    assert detect_format("\n".join(lines)) == "claude-code"
    [session] = read_claude_code(lines, source="s.jsonl")
    assert session.session_id == SID
    assert session.warnings == []
    assert session.metadata == {"claude_code_cwd": "/home/ana/shop", "claude_code_git_branch": "main",
                                "claude_code_version": "2.0.14"}
    assert [t.key for t in session.turns] == ["u1", "u2"]
    first, second = session.turns
    assert first.messages == [
        Message.user("Why does the build fail?"),
        Message.model("Let me read it.", [ToolCall("toolu_1", "Bash", '{"command": "make"}')],
                      reasoning="Look at the log."),
        Message.tool("toolu_1", "error: missing header", name="Bash", is_error=True),
        Message.model("A header is missing."),
    ]
    assert first.model == "claude-sonnet-4-5"
    assert first.usage == {"input_tokens": 30, "output_tokens": 10}  # msg_1 once, msg_2 once
    assert second.messages == [Message.user("Fix it, ünïcødé ✓"), Message.model("Fixed.")]
    text = json.dumps([m.to_dict() for t in session.turns for m in t.messages])
    assert "ABANDONED" not in text and "SIDECHAIN" not in text and "/cost" not in text
    assert history_problems([m for t in session.turns for m in t.messages]) == []


def test_a_dangling_parent_is_a_warning_and_the_chain_starts_there() -> None:
    entries = session_lines()
    entries = [e for e in entries if e.get("uuid") not in ("u1", "a1", "a1b")]  # the start was lost
    [session] = read_claude_code(lines_of(entries), source="s.jsonl")
    assert any("parent a1b is not in the file" in w for w in session.warnings)
    # the orphaned tool result answers no call: skipped with a warning, and the rest imports
    assert any("answers no open tool call" in w for w in session.warnings)
    assert [m.content for t in session.turns for m in t.messages][:1] == ["Fix it, ünïcødé ✓"]


def test_an_unanswered_tool_call_gets_a_marked_result() -> None:
    entries = [entry("u1", None, "user", "run it"),
               entry("a1", "u1", "assistant", [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}],
                     message={"id": "m1"})]
    [session] = read_claude_code(lines_of(entries))
    assert session.turns[0].messages[-1] == Message.tool("t1", NO_RESULT, name="Bash", is_error=True)


def test_a_compaction_boundary_is_followed_through_its_logical_parent() -> None:
    entries = [entry("u1", None, "user", "first"),
               entry("a1", "u1", "assistant", [{"type": "text", "text": "one"}], message={"id": "m1"}),
               {**entry("c1", None, "user", "This session is being continued..."), "logicalParentUuid": "a1"},
               entry("a2", "c1", "assistant", [{"type": "text", "text": "two"}], message={"id": "m2"})]
    [session] = read_claude_code(lines_of(entries))
    assert [t.messages[0].content for t in session.turns] == ["first", "This session is being continued..."]


@pytest.mark.parametrize(
    ("bad", "message"),
    [("{not json", "line 3: not JSON"), ("[1, 2]", "line 3: not a JSON object"),
     (json.dumps({"type": "user", "message": {"content": "x"}}), "line 3: a user entry with no uuid"),
     (json.dumps({"type": "assistant", "uuid": "q", "message": "text"}), "line 3: the assistant entry's message")],
)
def test_a_malformed_line_is_an_error_naming_it(bad: str, message: str) -> None:
    lines = lines_of(session_lines()[:2]) + [bad, ""]  # a complete file: a newline after each line
    with pytest.raises(ImportFormatError, match=message) as info:
        read_claude_code(lines, source="s.jsonl")
    assert info.value.location == "line 3"


def test_a_file_with_only_side_chains_is_an_error() -> None:
    side = {**entry("s1", None, "user", "x"), "isSidechain": True}
    with pytest.raises(ImportFormatError, match="no conversation entry outside side chains"):
        read_claude_code(lines_of([side]))


def test_a_last_line_cut_mid_write_is_a_warning_and_the_rest_is_read() -> None:
    """Claude Code appends a line at a time: read while it writes, the file may end in part of
    a line (no newline after it). That line is left out with a warning; a broken line with a
    newline after it is still an error."""
    whole = lines_of(session_lines()[:5])
    cut = whole[:4] + [whole[4][:30]]
    [session] = read_claude_code(cut, source="s.jsonl")
    assert session.warnings == [("line 5: cut off mid-write (is Claude Code still writing the file?): left out; "
                                 "import the file again when it is complete")]
    assert session.turns[0].messages[-1] == Message.tool("toolu_1", NO_RESULT, name="Bash", is_error=True)
    [complete] = read_claude_code(whole + [""], source="s.jsonl")
    assert complete.warnings == []
    assert complete.turns[0].messages[-1] == Message.tool("toolu_1", "error: missing header", name="Bash",
                                                          is_error=True)
    with pytest.raises(ImportFormatError, match="line 5: not JSON"):
        read_claude_code(cut + [""], source="s.jsonl")


@pytest.mark.parametrize("where", ["u2", "x1", "s1"])  # on the main line, an abandoned branch, a side chain
def test_a_timestamp_that_is_not_a_time_is_an_error_naming_the_line(where: str) -> None:
    entries = session_lines()
    number = next(k for k, e in enumerate(entries, start=1) if e.get("uuid") == where)
    entries[number - 1] = {**entries[number - 1], "timestamp": "not-a-time"}
    with pytest.raises(ImportFormatError) as caught:
        read_claude_code(lines_of(entries), source="s.jsonl")
    assert str(caught.value) == f"s.jsonl: line {number}: timestamp is not a time: 'not-a-time'"
    assert caught.value.location == f"line {number}"


@pytest.mark.parametrize("value", [12345, 1.5, None, "", True, {"iso": "2026-11-30"}])
def test_a_timestamp_that_is_not_an_iso_string_is_an_error_naming_the_line(value: Any) -> None:
    # Claude Code writes an ISO 8601 string on every user and assistant entry
    entries = session_lines()
    number = next(k for k, e in enumerate(entries, start=1) if e.get("uuid") == "a2")
    entries[number - 1] = {**entries[number - 1], "timestamp": value}
    with pytest.raises(ImportFormatError) as caught:
        read_claude_code(lines_of(entries), source="s.jsonl")
    assert str(caught.value) == f"s.jsonl: line {number}: timestamp is not a time: {value!r}"
    assert caught.value.location == f"line {number}"


def test_an_entry_with_no_timestamp_has_no_time_and_the_session_spans_the_timed_ones() -> None:
    entries = session_lines()
    times = {"u1": "2026-11-30T10:00:00.000Z", "a1": "2026-11-30T10:00:05.000Z", "a1b": "2026-11-30T10:00:06.000Z",
             "r1": "2026-11-30T10:01:00.000Z", "a2": "2026-11-30T10:02:00.000Z", "m1": "2026-11-30T10:03:00.000Z",
             "a3": "2026-11-30T10:09:30.000Z"}
    for k, e in enumerate(entries):
        if e.get("uuid") in times:
            entries[k] = {**e, "timestamp": times[e["uuid"]]}
        elif e.get("uuid") == "u2":
            entries[k] = {key: v for key, v in e.items() if key != "timestamp"}
    [session] = read_claude_code(lines_of(entries), source="s.jsonl")
    first, second = session.turns
    assert first.created_at == datetime.fromisoformat("2026-11-30T10:00:00+00:00").timestamp()
    assert second.created_at is None  # u2 has no timestamp: the import's time is taken
    assert session.created_at == first.created_at
    # the last entry of the conversation (the reply a3), not the first nor the last prompt
    assert session.updated_at == datetime.fromisoformat("2026-11-30T10:09:30+00:00").timestamp()
