"""Export formats read back: chatflow (lossless), md (a transcript that imports back), openai."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from chatflow_cli.core.errors import ImportFormatError, UsageError
from chatflow_cli.core.interop import detect_format, export_lines, read_source
from chatflow_cli.core.interop.chatflow_format import read_chatflow
from chatflow_cli.core.interop.importer import import_sessions
from chatflow_cli.core.interop.markdown import export_markdown, read_markdown
from chatflow_cli.core.interop.openai_chat import read_openai
from chatflow_cli.core.memory import SessionStore
from chatflow_cli.core.messages import Message, Role, ToolCall

from .sample import TRICKY, build_rich_session


@pytest.fixture
def rich() -> SessionStore:
    store = SessionStore()
    build_rich_session(store)
    return store


def live_turns(store: SessionStore, session_id: str = "rich") -> list[list[Message]]:
    return [list(r.messages) for r in store.load_turns(session_id, first=1) if not (r.rolled_back or r.failed)]


def test_chatflow_export_is_a_header_then_every_event_in_seq_order(rich: SessionStore) -> None:
    lines = "".join(export_lines(rich, "rich", "chatflow")).splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "chatflow" and header["version"] == 1
    head = header["session"]
    assert head["session_id"] == "rich" and head["agent"] == "Billing"
    assert head["metadata"] == {"channel": "web"}
    assert head["settings"] == {"max_turns": 3, "model": None, "base_url": None}
    assert head["created_at"].endswith("Z") and head["turns"] == 4
    events = [json.loads(line) for line in lines[1:]]
    stored = rich.events("rich")
    assert len(events) == head["events"] == len(stored)
    assert [e["seq"] for e in events] == list(range(1, len(stored) + 1))
    assert [(e["type"], e["data"], e["created_at"]) for e in events] == [
        (e.type, e.payload, e.created_at) for e in stored]
    types = {e["type"] for e in events}
    assert {"rollback", "turn.failed", "turn.interrupted", "handoff", "metadata.updated", "note",
            "turn.completed", "tool.result"} <= types
    assert events[-1]["idempotency_key"] == "note-1"
    [session] = read_chatflow(lines, source="x")
    assert session.session_id == "rich" and session.max_turns == 3
    assert [e["data"] for e in session.events or []] == [e.payload for e in stored]


def test_md_transcript_reads_back_to_the_same_turns(rich: SessionStore) -> None:
    text = "".join(export_lines(rich, "rich", "md"))
    assert text.startswith("---\nchatflow: \"md 1\"\n")
    assert "## Turn 1" in text and "<details><summary>Tool call <code>status</code>" in text
    assert detect_format(text) == "md"
    [session] = read_markdown(text, source="t.md")
    assert session.session_id == "rich" and session.agent == "Billing"
    assert session.system == ["Be brief."]
    assert session.metadata == {"channel": "web"}
    assert [t.messages for t in session.turns] == live_turns(rich)
    assert session.turns[0].usage == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}  # the one shape
    assert session.turns[2].finish_reason == "length"


def test_openai_lines_whole_session_and_per_turn_windows(rich: SessionStore) -> None:
    [line] = "".join(export_lines(rich, "rich", "openai")).splitlines()
    messages = json.loads(line)["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1] == {"role": "user", "content": "Where is order 404?"}
    assert messages[2]["role"] == "assistant" and messages[2]["tool_calls"][0]["function"]["name"] == "status"
    assert {"role": "tool", "tool_call_id": "c1", "content": '{"status": "IN_TRANSIT"}'} in messages
    assert all(m["role"] in ("system", "user", "assistant", "tool") for m in messages)
    windows = [json.loads(x)["messages"] for x in "".join(export_lines(rich, "rich", "openai", per_turn=True)).splitlines()]
    assert len(windows) == 4
    users = [[m["content"] for m in w if m["role"] == "user"] for w in windows]
    assert users[0] == ["Where is order 404?"]
    assert users[3] == ["Refund it", "Tell me a long story", "Interrupted question"]  # max_turns 3
    assert all(w[0]["role"] == "system" for w in windows)
    [session] = read_openai([line], source="o.jsonl")
    assert len(session.turns) == 4 and session.system == ["Be brief."]
    assert session.turns[0].messages[1].tool_calls == (ToolCall("c1", "status", '{"order": 404}'),
                                                       ToolCall("c2", "eta", '{"order": 404}'))


def test_openai_reader_takes_content_parts_and_developer_messages() -> None:
    line = json.dumps({"messages": [
        {"role": "developer", "content": "Rules"},
        {"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image_url", "image_url": {}},
                                     {"type": "text", "text": "File app.py:\n```\nx = 1\n```"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
        {"role": "assistant", "content": "done"}]})
    [session] = read_openai([line])
    assert session.system == ["Rules"]
    # each part a block of its own: a file's text part never runs into the words before it
    assert session.turns[0].messages[0] == Message.user("Look\n\n[image_url]\n\nFile app.py:\n```\nx = 1\n```")
    assert session.session_id.startswith("openai-")


@pytest.mark.parametrize(
    ("line", "match"),
    [("nope", "line 2: not JSON"), ('{"msgs": []}', "line 2: not a"),
     ('{"messages": [{"role": "wizard", "content": "x"}]}', "line 2: unknown role 'wizard'"),
     ('{"messages": [{"role": "assistant", "content": "x"}]}', "line 2: the first message after the system messages must be a user message, not assistant"),
     ('{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "q", "content": "y"}]}',
      "line 2: message 2 is a tool result for call 'q', which the assistant message")],
)
def test_openai_malformed_lines_name_the_line(line: str, match: str) -> None:
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(ImportFormatError, match=match):
        read_openai([good, line], source="o.jsonl")


@pytest.mark.parametrize(
    ("lines", "match"),
    [(['{"seq": 1, "type": "session.created", "data": {}}'], "line 1: an event before any chatflow header"),
     (['{"format": "chatflow", "version": 9, "session": {"session_id": "a"}}'], "line 1: format version 9"),
     (['{"format": "other", "version": 1}'], "a header of format 'other'"),
     (['{"format": "chatflow", "version": 1, "session": {"session_id": "a"}}',
       '{"seq": 2, "type": "session.created", "data": {}}'], "line 2: seq 2 does not follow 0"),
     (['{"format": "chatflow", "version": 1, "session": {"session_id": "a"}}',
       '{"seq": 1, "type": "session.created", "data": {}}',
       '{"seq": 2, "type": "message.user", "data": {"turn": 1, "message": {"role": "alien"}}}'],
      "line 3: the message.user event's message is not a chatflow message"),
     (['{"format": "chatflow", "version": 1, "session": {"session_id": "a"}}', "{oops"], "line 2: not JSON")],
)
def test_chatflow_malformed_lines_name_the_line(lines: list[str], match: str) -> None:
    with pytest.raises(ImportFormatError, match=match):
        read_chatflow(lines, source="c.jsonl")


def test_md_malformed_input_names_the_line() -> None:
    with pytest.raises(ImportFormatError, match="line 1: no front matter"):
        read_markdown("# just notes\n")
    text = '---\nchatflow: "md 1"\nsession: "a"\n---\n<!-- chatflow:message {"role":"user","lines":5} -->\nhi\n'
    with pytest.raises(ImportFormatError, match="line 5: the text of 5 lines runs past the end"):
        read_markdown(text)
    text = '---\nchatflow: "md 1"\nsession: "a"\n---\n<!-- chatflow:message {"role":"user",lines} -->\nhi\n'
    with pytest.raises(ImportFormatError, match="line 5: the chatflow:message comment is not JSON"):
        read_markdown(text)


_HEAD = '---\nchatflow: "md 1"\nsession: "a"\n---\n\n## Turn 1\n\n'


@pytest.mark.parametrize(("body", "line"), [
    # the JSON's closing brace lost: the regex no longer matched and the message was skipped
    ('<!-- chatflow:message {"role":"user","lines":1 -->\nhi\n', 8),
    ('<!-- chatflow:mesage {"role":"user","lines":1} -->\nhi\n', 8),
    ('<!-- chatflow:message {"role":"user","lines":1} --> \nhi\n', 8),
    ('<!-- chatflow:message {"role":"user","lines":1} -->\nhi\n\n<!--chatflow:turn {} -->\n', 11),
    ('<!-- chatflow:message {"role":"user","lines":1} -->\nhi\n\n  <!-- chatflow:turn -->\n', 11),
    # a fenced text whose count is off: its fence does not close where the count says
    ('<!-- chatflow:message {"role":"user","lines":1} -->\nhi\n\n'
     '<!-- chatflow:message {"role":"tool","tool_call_id":"x","lines":1,"fenced":true} -->\n```text\na\nb\n```\n', 14),
])
def test_md_a_malformed_control_comment_is_an_error_naming_its_line(body: str, line: int) -> None:
    with pytest.raises(ImportFormatError, match=rf"^-: line {line}: ") as info:
        read_markdown(_HEAD + body)
    assert info.value.exit_code == 2


def test_detection_and_unknown_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    odd = tmp_path / "odd.txt"
    odd.write_text("hello\n")
    with pytest.raises(UsageError, match="cannot tell the format of .*give --from"):
        read_source(str(odd))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"messages": []}\n\xff\n')
    with pytest.raises(ImportFormatError, match="line 2: not UTF-8"):
        read_source(str(bad), "openai")
    with pytest.raises(UsageError, match="no such file"):
        read_source(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UsageError, match="unknown import format 'xml'"):
        read_source(str(odd), "xml")


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)


@settings(max_examples=60, deadline=None)
@given(user=_text, reply=_text, args=_text, output=_text)
def test_md_round_trips_any_text(user: str, reply: str, args: str, output: str) -> None:
    messages = [Message.user(user), Message.model(None, [ToolCall("c", "f", args)]), Message.tool("c", output, name="f"),
                Message.model(reply, reasoning=TRICKY)]
    header = {"session_id": "h", "settings": {}, "metadata": {}}
    text = "".join(export_markdown(header, [], [{"number": 1, "messages": messages}]))
    [session] = read_markdown(text)
    assert session.turns[0].messages == messages
    assert all(m.role is not Role.SYSTEM for m in session.turns[0].messages)


def test_md_transcripts_one_after_the_other_are_several_sessions(rich: SessionStore) -> None:
    one = "".join(export_lines(rich, "rich", "md"))
    other = SessionStore()
    s = other.get_or_create("other", "Assistant")
    s.add_message(Message.user("---\nchatflow: \"md 1\"\nnot a new transcript: inside a message"))
    s.add_message(Message.model("ok"))
    s.complete_turn("ok")
    other.save(s)
    two = "".join(export_lines(other, "other", "md"))
    sessions = read_markdown(one + two)
    assert [x.session_id for x in sessions] == ["rich", "other"]
    assert sessions[1].turns[0].messages[0].content.startswith("---\nchatflow:")
    assert [t.messages for t in sessions[0].turns] == live_turns(rich)


def _four_turns() -> str:
    store = SessionStore()
    s = store.get_or_create("rb", "Assistant")
    for n in range(1, 5):
        s.add_message(Message.user(f"msg {n}"))
        s.add_message(Message.model(f"ok {n}"))
        s.complete_turn(f"ok {n}")
    store.save(s)
    return "".join(export_lines(store, "rb", "md"))


def test_md_cut_short_at_any_line_is_an_error_naming_the_file() -> None:
    """A file cut at a line boundary never imports as a shorter session: fewer turns than the
    front matter's `turns` is an error (it names the `turns:` line), like a run-on text."""
    lines = _four_turns().split("\n")
    turns_line = lines.index("turns: 4") + 1
    for n in range(lines.index("---", 1) + 1, len(lines) - 12):  # up to the last turn's reply
        with pytest.raises(ImportFormatError, match=r"^c\.md: line \d+: ") as info:
            read_markdown("\n".join(lines[:n]) + "\n", source="c.md")
        assert info.value.exit_code == 2
        if "cut short" in str(info.value):
            assert str(info.value).startswith(f"c.md: line {turns_line}: session rb ends after ")
    [whole] = read_markdown("\n".join(lines), source="c.md")
    assert len(whole.turns) == 4


@pytest.mark.parametrize(("edit", "line"), [
    # one more line of text than the comment counts: it was dropped
    (lambda t: t.replace('"lines":1} -->\nmsg 2\n', '"lines":1} -->\nmsg 2\nadded by hand\n'), "the text of the message"),
    (lambda t: t.replace('"lines":1} -->\nmsg 2\n', '"lines":1} -->\nmsg 2\n\nadded by hand\n'), "the text of the message"),
    # a count of 0: the message imported as ""
    (lambda t: t.replace('{"role":"user","lines":1} -->\nmsg 2\n', '{"role":"user","lines":0} -->\nmsg 2\n'),
     "the text of the message"),
])
def test_md_text_that_does_not_match_its_line_count_is_an_error_naming_the_line(edit: Any, line: str) -> None:
    text = edit(_four_turns())
    assert text != _four_turns()
    with pytest.raises(ImportFormatError, match=rf"^e\.md: line \d+: {line} on line \d+ does not end") as info:
        read_markdown(text, source="e.md")
    assert info.value.exit_code == 2


def test_md_keeps_the_agents_sdk_items_of_every_message() -> None:
    """A message's items come back exactly as its comment holds them: a `developer` item
    stays one (a SYSTEM message before the first turn; after it, the SDK session keeps such
    an item on a MODEL message), and so do a tool call's items."""
    developer = {"role": "developer", "content": "Be terse."}
    system = Message(Role.SYSTEM, "Be terse.", items=(developer,))
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    turn = [Message.user("hi"), Message(Role.MODEL, None, (ToolCall("c1", "f", "{}"),), items=(call,)),
            Message.tool("c1", "done", name="f"), Message(Role.MODEL, None, items=({**developer, "content": "Later."},)),
            Message.model("ok")]
    header = {"session_id": "sdk", "settings": {}, "metadata": {}}
    [session] = read_markdown("".join(export_markdown(header, [system], [{"number": 1, "messages": turn}])))
    assert session.system == [system]
    assert session.turns[0].messages == turn
    assert [m.items for m in session.turns[0].messages] == [m.items for m in turn]
    store = SessionStore()
    import_sessions(store, [session], fmt="md", source="-")
    stored = [e.payload["message"] for e in store.events("sdk") if e.type == "message.system"]
    assert stored[0] == system.to_dict() and stored[0]["items"] == [developer]
