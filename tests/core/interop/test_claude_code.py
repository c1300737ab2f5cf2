"""Claude Code session files: the main line from the last entry back, side chains left out."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from chatflow_cli.core.errors import ImportFormatError
from chatflow_cli.core.interop import detect_format
from chatflow_cli.core.interop.claude_code import read_claude_code
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


def test_a_compaction_boundary_is_followed_through_its_logical_parent() -> None:
    entries = [entry("u1", None, "user", "first"),
               entry("a1", "u1", "assistant", [{"type": "text", "text": "one"}], message={"id": "m1"}),
               _system("b1", None, "compact_boundary", logicalParentUuid="a1"),
               {**entry("c1", "b1", "user", "This session is being continued..."), "isCompactSummary": True},
               entry("u2", "c1", "user", "second"),
               entry("a2", "u2", "assistant", [{"type": "text", "text": "two"}], message={"id": "m2"})]
    [session] = read_claude_code(lines_of(entries))
    assert [t.messages[0].content for t in session.turns] == ["first", "second"]


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
    assert session.turns[0].outcome == "interrupted"  # the call waits: closed as an interrupted turn
    assert session.turns[0].messages[-1].tool_calls[0].id == "toolu_1"
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


def _system(uuid: str, parent: str | None, subtype: str, **extra: Any) -> dict[str, Any]:
    """A ``"type": "system"`` line as Claude Code writes it: in the parent chain, no message."""
    return {"parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": "/home/ana/shop",
            "sessionId": SID, "version": "2.0.14", "gitBranch": "main", "type": "system", "subtype": subtype,
            "content": "Conversation compacted" if subtype == "compact_boundary" else "ran /cost", "level": "info",
            "isMeta": False, "uuid": uuid, "timestamp": "2026-11-30T10:05:00.000Z", **extra}


def broken_chain_lines() -> list[dict[str, Any]]:
    """A long Claude Code session: a system line between two messages, a prompt edited after
    its reply (an abandoned branch), a side chain, a compaction (boundary, then the summary
    Claude Code sent in place of the older turns), and a resumed part whose first entry names
    a parent in another file and carries the new session's id."""
    resumed = "9a1d3c54-0d2e-4a55-8f0e-5a3c9c1f2b77"
    return [
        {"type": "summary", "summary": "Fixing the build", "leafUuid": "a5"},
        entry("u1", None, "user", "Why does the build fail?"),
        entry("a1", "u1", "assistant", [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                         "input": {"command": "make"}}], message={"id": "msg_1"}),
        entry("r1", "a1", "user", [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "missing header"}]),
        entry("a2", "r1", "assistant", [{"type": "text", "text": "A header is missing."}], message={"id": "msg_2"}),
        _system("y1", "a2", "local_command"),
        entry("u2", "y1", "user", "Fix it"),
        entry("x1", "u2", "assistant", [{"type": "text", "text": "ABANDONED"}], message={"id": "msg_x"}),
        entry("u2b", "y1", "user", "Fix it, and add a test"),  # the prompt edited: a new branch
        {**entry("s1", "u2b", "user", "SIDECHAIN prompt"), "isSidechain": True},
        {**entry("s2", "s1", "assistant", [{"type": "text", "text": "SIDECHAIN reply"}]), "isSidechain": True},
        entry("a3", "u2b", "assistant", [{"type": "text", "text": "Fixed, with a test."}], message={"id": "msg_3"}),
        {"type": "file-history-snapshot", "messageId": "a3", "snapshot": {}},
        _system("b1", None, "compact_boundary", logicalParentUuid="a3",
                compactMetadata={"trigger": "auto", "preTokens": 151000}),
        {**entry("c1", "b1", "user", "This session is being continued from a previous conversation that ran "
                 "out of context. The conversation is summarized below: SUMMARY"),
         "isCompactSummary": True, "isVisibleInTranscriptOnly": True},
        entry("u3", "c1", "user", "Now run the tests"),
        entry("a4", "u3", "assistant", [{"type": "text", "text": "All pass."}], message={"id": "msg_4"}),
        {**entry("u4", "0b7e1f52-3d7c-4c8e-a0f1-missing00001", "user", "Commit it"), "sessionId": resumed},
        {**entry("a5", "u4", "assistant", [{"type": "text", "text": "Committed."}], message={"id": "msg_5"}),
         "sessionId": resumed},
    ]


def test_a_broken_parent_chain_keeps_every_main_line_exchange_and_counts_what_it_left_out() -> None:
    """A system line in the chain, a compaction boundary and a resumed part (a parent in
    another file) each broke the walk back: only the last exchange was imported, and the
    entries before it were dropped with no count."""
    [session] = read_claude_code(lines_of(broken_chain_lines()), source="s.jsonl")
    assert session.session_id == SID  # the file's first entry names it, as it grows too
    assert [[m.content for m in t.messages] for t in session.turns] == [
        ["Why does the build fail?", None, "missing header", "A header is missing."],
        ["Fix it, and add a test", "Fixed, with a test."],
        ["Now run the tests", "All pass."],
        ["Commit it", "Committed."],
    ]
    text = json.dumps([m.to_dict() for t in session.turns for m in t.messages])
    assert "ABANDONED" not in text and "SIDECHAIN" not in text and "SUMMARY" not in text
    assert session.skipped == {"side chain (a subagent's work)": 2, "abandoned branch (rewound or edited away)": 2,
                               "compaction summary (not a message of the conversation)": 1}
    assert any("parent 0b7e1f52-3d7c-4c8e-a0f1-missing00001 is not in the file" in w for w in session.warnings)


def test_a_turn_whose_tool_calls_the_file_never_answers_is_closed_as_interrupted() -> None:
    """The file ends (or the next prompt begins) while a tool call waits: the turn is closed
    the way chatflow closes an interrupted turn, not as if it had completed."""
    entries = [entry("u1", None, "user", "run it"),
               entry("a1", "u1", "assistant", [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}],
                     message={"id": "m1"}),
               entry("u2", "a1", "user", "never mind"),
               entry("a2", "u2", "assistant", [{"type": "tool_use", "id": "t2", "name": "Bash", "input": {}}],
                     message={"id": "m2"})]
    [session] = read_claude_code(lines_of(entries))
    assert [t.outcome for t in session.turns] == ["interrupted", "interrupted"]
    assert [m.role.value for m in session.turns[0].messages] == ["user", "model"]


def test_a_reply_claude_code_recorded_as_cut_by_max_tokens_is_a_cut_turn() -> None:
    """The Messages API says ``stop_reason: "max_tokens"`` on a reply cut by the output
    limit, and Claude Code keeps it on the assistant entry: the MODEL message and its turn
    are marked cut (``finish_reason`` ``"length"``), as llm's ``length`` is; a turn whose
    last reply ended normally is not, even when an earlier reply of it was cut."""
    entries = [
        entry("u1", None, "user", "Write the whole module"),
        entry("a1", "u1", "assistant", [{"type": "text", "text": "Here it is: def f("}],
              message={"id": "m1", "model": "claude-sonnet-4-5", "stop_reason": None}),
        entry("a1b", "a1", "assistant", [{"type": "text", "text": "x, y"}],
              message={"id": "m1", "model": "claude-sonnet-4-5", "stop_reason": "max_tokens"}),
        entry("u2", "a1b", "user", "Go on"),
        entry("a2", "u2", "assistant", [{"type": "text", "text": "part"},
                                        {"type": "tool_use", "id": "t1", "name": "Write", "input": {}}],
              message={"id": "m2", "stop_reason": "max_tokens"}),
        entry("r2", "a2", "user", [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]),
        entry("a3", "r2", "assistant", [{"type": "text", "text": "Done."}],
              message={"id": "m3", "stop_reason": "end_turn"}),
    ]
    [session] = read_claude_code(lines_of(entries))
    cut, whole = session.turns
    assert cut.finish_reason == "length"
    assert cut.messages[-1] == Message.model("Here it is: def f(x, y", finish_reason="length")
    assert whole.finish_reason is None and whole.messages[-1].finish_reason is None
    assert whole.messages[1].finish_reason == "length"  # the cut reply keeps its own mark


CAVEAT = ("<local-command-caveat>Caveat: The messages below were generated by the user while running local commands. "
          "DO NOT respond to these messages or otherwise consider them in your response unless the user explicitly "
          "asks you to.</local-command-caveat>")


def test_local_commands_and_their_output_are_skipped_and_counted_as_such() -> None:
    """A local slash command (``/model``) and Claude Code's ``!`` bash mode write their
    invocation and output as plain user entries (not ``isMeta``) that no reply answers: they
    are no prompts, so they are left out and counted as local commands, not imported as user
    turns with no reply. A custom command the model answered (its prompt expanded in an
    ``isMeta`` entry) stays a turn."""
    entries = [
        entry("u1", None, "user", "Why does the build fail?"),
        entry("a1", "u1", "assistant", [{"type": "text", "text": "A header is missing."}], message={"id": "m1"}),
        entry("c0", "a1", "user", CAVEAT, isMeta=True),
        entry("c1", "c0", "user", "<command-name>/model</command-name>\n            <command-message>model"
              "</command-message>\n            <command-args></command-args>"),
        entry("c2", "c1", "user", "<local-command-stdout>Set model to \x1b[1mopus (claude-opus-4-1)\x1b[22m"
              "</local-command-stdout>"),
        entry("b1", "c2", "user", "<bash-input>git status</bash-input>"),
        entry("b2", "b1", "user", "<bash-stdout>On branch main</bash-stdout><bash-stderr></bash-stderr>"),
        entry("p1", "b2", "user", "<command-message>review is running…</command-message>\n"
              "<command-name>/review</command-name>"),
        entry("p2", "p1", "user", [{"type": "text", "text": "Review the staged changes."}], isMeta=True),
        entry("a2", "p2", "assistant", [{"type": "text", "text": "Looks good."}], message={"id": "m2"}),
        entry("u3", "a2", "user", "Thanks"),
        entry("a3", "u3", "assistant", [{"type": "text", "text": "You're welcome."}], message={"id": "m3"}),
        entry("c3", "a3", "user", "<command-name>/cost</command-name>"),  # the file ends with a local command
    ]
    [session] = read_claude_code(lines_of(entries))
    assert [[m.content for m in t.messages] for t in session.turns] == [
        ["Why does the build fail?", "A header is missing."],
        ["<command-message>review is running…</command-message>\n<command-name>/review</command-name>",
         "Looks good."],
        ["Thanks", "You're welcome."],
    ]
    assert session.skipped == {"local command or its output (run in Claude Code, not a prompt)": 5,
                               "meta entry (a caveat or expanded command Claude Code adds)": 2}
