"""Replies that did not finish, through the real ``chatflow`` process and the fake server over HTTP.

Each case checks what a person and a script see (text, stderr, ``--output json``/``jsonl``,
``sessions show``, ``replay``, the exit code), what is stored, and then sends a second
message on the same session: the fake server refuses invalid histories (empty assistant
messages, tool-call arguments that are not a JSON object, unanswered calls), so a second
turn that succeeds proves the stored session is valid for the next request. Covered: replies cut
by the token limit or a filter, tool-call arguments cut or not a JSON object (also in a later
round), streams without a finish reason or with an unusual one, reasoning-only and
whitespace-only replies, and the note a terminal shows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.errors import ExitStatus
from tests.conftest import REPO
from tests.helpers.stored import next_turn_is_valid, one_error_line, stored_events, stored_window
from tests.helpers.terminal import spawn_chatflow

TOOLS_MODULE = '''
import os
from pathlib import Path

from chatflow_cli import tool


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    marks = Path(os.environ["MARKS"])
    marks.mkdir(exist_ok=True)
    with open(marks / "get_weather.log", "a", encoding="utf-8") as fh:
        fh.write(city + "\\n")
    return f"sunny in {city}"
'''

AGENT = '''
[[agents]]
name = "Weather"
instructions = "You tell the weather."
tools = [
    "unfinished_tools:get_weather",
    { name = "approve", description = "Ask a human.", parameters = { type = "object", properties = { what = { type = "string" } }, required = ["what"] } },
]
'''


@pytest.fixture
def tools_env(tmp_path: Path, config_file: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "unfinished_tools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    config_file(AGENT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(tmp_path / "mods")]))
    marks = tmp_path / "marks"
    monkeypatch.setenv("MARKS", str(marks))
    return marks


# ---------------------------------------------------------------------------------------
# cut by the token limit or a content filter
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("finish,phrase", [("length", "cut by the token limit"),
                                           ("content_filter", "stopped by a content filter")])
def test_a_cut_reply_is_stored_marked_and_reported_everywhere(chatflow: Any, provider: Any, finish: str,
                                                               phrase: str) -> None:
    provider.add_text("cut", finish_reason=finish)
    r = chatflow("chat", "-s", "t1", "tell me everything")
    assert r.returncode == ExitStatus.INCOMPLETE == 10, r
    assert r.stdout == "cut\n"
    [note] = [line for line in r.stderr_lines if phrase in line]
    assert note.startswith("chatflow: reply ") and f"finish_reason {finish}" in note and "turn 1" in note
    assert not any(line.startswith("chatflow: error") for line in r.stderr_lines)

    reply = stored_window("t1")[-1]
    assert (reply["role"], reply["content"], reply["finish_reason"]) == ("model", "cut", finish)
    completed = [p for t, p in stored_events("t1") if t == "turn.completed"]
    assert completed[-1]["finish_reason"] == finish and completed[-1]["content"] == "cut"

    provider.add_text("cut again", finish_reason=finish)
    as_json = chatflow("chat", "-s", "t1", "--output", "json", "more")
    assert as_json.returncode == 10, as_json
    data = as_json.json()
    assert data["finish_reason"] == finish and data["content"] == "cut again" and data["is_error"] is False

    provider.add_text("cut thrice", finish_reason=finish)
    as_jsonl = chatflow("chat", "-s", "t1", "--output", "jsonl", "more")
    assert as_jsonl.returncode == 10, as_jsonl
    lines = as_jsonl.jsonl()
    [done] = [ev for ev in lines if ev["type"] == "turn.completed"]
    assert done["data"]["finish_reason"] == finish
    assert lines[-1]["type"] == "result" and lines[-1]["data"]["finish_reason"] == finish

    show = chatflow("sessions", "show", "t1")
    assert show.returncode == 0, show
    assert f"Turn 1 · cut ({finish})" in show.stdout
    assert f"({phrase}, finish_reason {finish})" in show.stdout
    show_json = chatflow("sessions", "show", "t1", "--json").json()
    assert show_json["turns"][0]["messages"][-1]["finish_reason"] == finish

    replay = chatflow("replay", "t1")
    assert replay.returncode == 0, replay
    [completed_line] = [ln for ln in replay.stdout.splitlines() if "turn.completed" in ln and "turn 1 " in ln]
    assert f"{phrase}, finish_reason {finish}" in completed_line
    replayed = [json.loads(ln) for ln in chatflow("replay", "t1", "--json").stdout.splitlines()]
    assert [e["data"]["finish_reason"] for e in replayed if e["type"] == "turn.completed"] == [finish] * 3

    sent = next_turn_is_valid(chatflow, provider, "t1")
    assert {"role": "assistant", "content": "cut"} in sent["messages"]
    whole = chatflow("sessions", "show", "t1", "--json").json()["turns"][-1]["messages"][-1]
    assert "finish_reason" not in whole, "a reply that finished carries no cut mark"


def test_a_reply_that_finished_says_so_in_json(chatflow: Any, provider: Any) -> None:
    r = chatflow("chat", "-s", "ok", "--output", "json", "hi")
    assert r.returncode == 0, r
    assert r.json()["finish_reason"] == "stop"
    assert [p.get("finish_reason") for t, p in stored_events("ok") if t == "turn.completed"] == ["stop"]


# ---------------------------------------------------------------------------------------
# tool-call arguments cut mid-JSON
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["get_weather", "approve"])
@pytest.mark.parametrize("finish", ["length", "tool_calls"])
def test_tool_arguments_that_are_not_a_json_object_never_run_and_the_turn_fails(
        chatflow: Any, provider: Any, tools_env: Path, name: str, finish: str) -> None:
    assert chatflow("chat", "-s", "tc", "first").returncode == 0
    window_before = stored_window("tc")
    provider.add_tool_calls([("call_cut", name, '{"path": "a.t')], split=3, finish_reason=finish)
    r = chatflow("chat", "-s", "tc", "weather in Paris?")
    line = one_error_line(r, ExitStatus.PROVIDER, "call_cut", "not a complete JSON object", "nothing ran")
    assert ("cut by the token limit" in line) == (finish == "length")
    assert r.stdout == ""
    assert not tools_env.exists(), "the tool ran with cut arguments"
    assert "waiting for tool" not in r.stderr, "a cut custom call was offered as pending"
    assert stored_window("tc") == window_before
    types = [t for t, _ in stored_events("tc")]
    assert types[-2:] == ["turn.failed", "status"] and "tool.pending" not in types

    sent = next_turn_is_valid(chatflow, provider, "tc")
    assert all(m.get("tool_calls") is None for m in sent["messages"])
    ls = chatflow("sessions", "ls", "--json").json()
    assert ls[0]["status"] == "idle"


def test_cut_arguments_in_json_output_are_one_error_object(chatflow: Any, provider: Any, tools_env: Path) -> None:
    provider.add_tool_calls([("call_cut", "get_weather", '{"city": "Par')], finish_reason="length")
    r = chatflow("chat", "-s", "tj", "--output", "json", "weather?")
    assert r.returncode == ExitStatus.PROVIDER, r
    data = r.json()
    assert data["is_error"] is True and data["error_type"] == "InvalidToolCallError" and data["exit_code"] == 5


def test_a_cut_reply_whose_tool_calls_are_whole_is_a_normal_tool_round(chatflow: Any, provider: Any,
                                                                       tools_env: Path) -> None:
    provider.add_tool_calls([("call_ok", "get_weather", '{"city": "Oslo"}')], finish_reason="length")
    provider.add_text("It is sunny in Oslo.")
    r = chatflow("chat", "-s", "tw", "weather?")
    assert r.returncode == 0, r
    assert (tools_env / "get_weather.log").read_text() == "Oslo\n"
    next_turn_is_valid(chatflow, provider, "tw")


# ---------------------------------------------------------------------------------------
# the stream ends without a finish reason
# ---------------------------------------------------------------------------------------
BROKEN = {
    "no_finish_reason_then_done": lambda s: s.add_text("Hel", chunks=["Hel"], finish_reason=None),
    "no_finish_reason_no_done": lambda s: s.add_text("Hel", chunks=["Hel"], finish_reason=None, done=False),
    "connection_closed": lambda s: s.add_close_midstream(after=["Hel"]),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_stream_that_ends_without_a_finish_reason_is_an_interrupted_turn(chatflow: Any, provider: Any,
                                                                          case: str) -> None:
    BROKEN[case](provider)
    r = chatflow("chat", "-s", "br", "hello?")
    line = one_error_line(r, ExitStatus.NETWORK, "did not finish", "kept as interrupted turn 1")
    if case == "connection_closed":
        assert "closed mid-reply" in line
    else:
        assert "without a finish reason" in line
    assert r.stdout == "Hel\n"
    window = stored_window("br")
    assert [(m["role"], m.get("content"), m.get("interrupted")) for m in window] == [
        ("user", "hello?", None), ("model", "Hel", True)]
    types = [t for t, _ in stored_events("br")]
    assert "turn.interrupted" in types and "turn.completed" not in types and "turn.failed" not in types
    [interrupted] = [p for t, p in stored_events("br") if t == "turn.interrupted"]
    assert interrupted["reason"] == "broken stream"
    show = chatflow("sessions", "show", "br")
    assert "Turn 1 · interrupted" in show.stdout and "(interrupted)" in show.stdout

    sent = next_turn_is_valid(chatflow, provider, "br")
    assert {"role": "assistant", "content": "Hel"} in sent["messages"]


def test_a_broken_stream_in_json_output(chatflow: Any, provider: Any) -> None:
    provider.add_close_midstream(after=["Hel"])
    r = chatflow("chat", "-s", "bj", "--output", "json", "hello?")
    assert r.returncode == ExitStatus.NETWORK, r
    data = r.json()
    assert data["is_error"] is True and data["error_type"] == "StreamBrokenError" and data["exit_code"] == 6


def test_a_broken_tool_round_keeps_no_partial_call(chatflow: Any, provider: Any, tools_env: Path) -> None:
    provider.add_chunks([
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me look."}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_half", "type": "function", "function": {"name": "get_weather",
                                                                              "arguments": '{"ci'}}]}}]},
        "CLOSE",
    ])
    r = chatflow("chat", "-s", "bt", "weather?")
    one_error_line(r, ExitStatus.NETWORK, "did not finish")
    assert not tools_env.exists()
    assert [(m["role"], m.get("content"), m.get("tool_calls")) for m in stored_window("bt")] == [
        ("user", "weather?", None), ("model", "Let me look.", None)]
    next_turn_is_valid(chatflow, provider, "bt")


@pytest.mark.parametrize("case", ["finish_without_done", "usage_after_finish_then_done"])
def test_a_finish_reason_is_enough_whatever_follows(chatflow: Any, provider: Any, case: str) -> None:
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    text = {"choices": [{"index": 0, "delta": {"content": "whole"}}]}
    if case == "finish_without_done":
        provider.add_chunks([text, finish], done=False)
    else:
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        provider.add_chunks([text, finish, {"choices": [], "usage": usage}, {"choices": [], "usage": usage}])
    r = chatflow("chat", "-s", "fin", "--output", "json", "hi")
    assert r.returncode == 0, r
    assert r.json()["content"] == "whole" and r.json()["finish_reason"] == "stop"
    next_turn_is_valid(chatflow, provider, "fin")


# ---------------------------------------------------------------------------------------
# parallel tool calls that reuse index 0
# ---------------------------------------------------------------------------------------
def test_parallel_calls_at_index_0_are_separate_calls(chatflow: Any, provider: Any, tools_env: Path) -> None:
    provider.add_tool_calls([("call_a", "get_weather", '{"city": "Oslo"}'),
                             ("call_b", "get_weather", '{"city": "Rome"}')], same_index=True)
    provider.add_text("Oslo and Rome are sunny.")
    r = chatflow("chat", "-s", "par", "weather in Oslo and Rome?")
    assert r.returncode == 0, r
    assert sorted((tools_env / "get_weather.log").read_text().split()) == ["Oslo", "Rome"]
    [model] = [m for m in stored_window("par") if m.get("tool_calls")]
    assert [(c["id"], c["arguments"]) for c in model["tool_calls"]] == [
        ("call_a", '{"city": "Oslo"}'), ("call_b", '{"city": "Rome"}')]
    answered = [m["tool_call_id"] for m in stored_window("par") if m["role"] == "tool"]
    assert answered == ["call_a", "call_b"]
    next_turn_is_valid(chatflow, provider, "par")


def test_llama_cpp_repeating_id_and_name_is_still_one_call(chatflow: Any, provider: Any, tools_env: Path) -> None:
    provider.add_tool_calls([("call_W", "get_weather", '{"city": "Paris"}')], split=4, repeat_id_name=True)
    provider.add_text("Sunny.")
    r = chatflow("chat", "-s", "ll", "weather?")
    assert r.returncode == 0, r
    assert (tools_env / "get_weather.log").read_text() == "Paris\n"
    [model] = [m for m in stored_window("ll") if m.get("tool_calls")]
    assert model["tool_calls"] == [{"id": "call_W", "name": "get_weather", "arguments": '{"city": "Paris"}'}]


# ---------------------------------------------------------------------------------------
# a reply that is only reasoning
# ---------------------------------------------------------------------------------------
def test_a_reasoning_only_reply_is_noticed_kept_and_never_sent_back(chatflow: Any, provider: Any) -> None:
    provider.add_reasoning(["The user greets me. ", "I should greet back."])
    r = chatflow("chat", "-s", "rs", "hello")
    assert r.returncode == 0, r
    assert r.stdout == ""
    [note] = [line for line in r.stderr_lines if "reasoning only" in line]
    assert "chatflow sessions show rs --full" in note
    [model] = [m for m in stored_window("rs") if m["role"] == "model"]
    assert model["reasoning"] == "The user greets me. I should greet back." and not model.get("content")

    full = chatflow("sessions", "show", "rs", "--full")
    assert "I should greet back." in full.stdout
    short = chatflow("sessions", "show", "rs")
    assert "reasoning only" in short.stdout and "I should greet back." not in short.stdout
    shown = chatflow("sessions", "show", "rs", "--json").json()
    assert shown["turns"][0]["messages"][-1]["reasoning"] == "The user greets me. I should greet back."

    provider.add_reasoning(["Thinking. "], text="Hi there!")
    as_json = chatflow("chat", "-s", "rs", "--output", "json", "hello again")
    assert as_json.returncode == 0, as_json
    data = as_json.json()
    assert data["content"] == "Hi there!" and data["reasoning"] == "Thinking. "

    sent = next_turn_is_valid(chatflow, provider, "rs")
    assistants = [m for m in sent["messages"] if m["role"] == "assistant"]
    assert assistants == [{"role": "assistant", "content": "Hi there!"}], "an empty assistant message was sent"
    assert all("reasoning" not in json.dumps(m) for m in sent["messages"] if m["role"] == "assistant")


def test_a_reasoning_only_reply_cut_by_the_token_limit_exits_10(chatflow: Any, provider: Any) -> None:
    provider.add_reasoning(["Let me think about this for a long"], finish_reason="length")
    r = chatflow("chat", "-s", "rl", "--output", "json", "hard question")
    assert r.returncode == ExitStatus.INCOMPLETE, r
    data = r.json()
    assert data["finish_reason"] == "length" and data["reasoning"] and data["content"] == ""
    next_turn_is_valid(chatflow, provider, "rl")


# ---------------------------------------------------------------------------------------
# on a terminal: a dim note after the text (chat and the REPL)
# ---------------------------------------------------------------------------------------
def test_on_a_terminal_a_cut_reply_ends_with_a_dim_note(provider: Any) -> None:
    import pexpect

    provider.add_text("the start of it", finish_reason="length")
    child = spawn_chatflow(["chat", "-s", "tty", "tell me"], cols=120, rows=40, timeout=60, encoding="utf-8")
    child.expect(pexpect.EOF)
    child.close()
    out = child.before
    assert child.exitstatus == ExitStatus.INCOMPLETE, out
    text_at, note_at = out.index("the start of it"), out.index("[reply cut by the token limit (finish_reason length)")
    assert text_at < note_at
    assert "\x1b[2m[reply cut" in out, "the note is dim"


def test_the_repl_notes_a_cut_reply_and_a_reasoning_only_one(provider: Any, chatflow: Any) -> None:
    import pexpect

    provider.add_text("half an answer", finish_reason="length")
    provider.add_reasoning(["Only thinking here."])
    child = spawn_chatflow(["chat", "-s", "repl"], cols=120, rows=40, timeout=60, encoding="utf-8")
    child.expect("\u203a")
    child.send("first\r")
    child.expect(r"reply cut by the token limit \(finish_reason length\)")
    child.expect("\u203a")
    child.send("second\r")
    child.expect("the model answered with reasoning only")
    child.expect("\u203a")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    next_turn_is_valid(chatflow, provider, "repl")


# ---------------------------------------------------------------------------------------
# a reply of only whitespace is an empty reply
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("reasoning", [None, "Let me think."])
def test_a_whitespace_only_reply_is_noticed_and_never_sent_back(chatflow: Any, provider: Any,
                                                                 reasoning: str | None) -> None:
    chunks: list[Any] = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}]
    if reasoning:
        chunks.append({"choices": [{"index": 0, "delta": {"reasoning_content": reasoning}}]})
    chunks += [{"choices": [{"index": 0, "delta": {"content": "\n"}}]},
               {"choices": [{"index": 0, "delta": {"content": "\n"}, "finish_reason": "stop"}]}]
    provider.add_chunks(chunks)
    r = chatflow("chat", "-s", "ws", "hello")
    assert r.returncode == 0, r
    note = "reasoning only" if reasoning else "only whitespace"
    assert any(note in line for line in r.stderr_lines), r
    sent = next_turn_is_valid(chatflow, provider, "ws")
    assert [m for m in sent["messages"] if m["role"] == "assistant"] == [], sent["messages"]
    provider.add_chunks(chunks)
    as_json = chatflow("chat", "-s", "ws", "--output", "json", "again")
    assert as_json.returncode == 0 and as_json.json()["is_error"] is False, as_json
    next_turn_is_valid(chatflow, provider, "ws")


def test_a_broken_whitespace_reply_kept_as_interrupted_is_never_sent_back(chatflow: Any, provider: Any) -> None:
    provider.add_text("\n\n", chunks=["\n\n"], finish_reason=None)
    r = chatflow("chat", "-s", "wb", "hello")
    one_error_line(r, ExitStatus.NETWORK, "did not finish", "kept as interrupted turn 1")
    next_turn_is_valid(chatflow, provider, "wb")


# ---------------------------------------------------------------------------------------
# finish reasons that are not a normal end
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("finish", ["error", "abort"])
def test_a_server_that_ends_the_reply_with_error_or_abort_did_not_finish(chatflow: Any, provider: Any,
                                                                         finish: str) -> None:
    provider.add_text("Half an ans", chunks=["Half ", "an ans"], finish_reason=finish)
    r = chatflow("chat", "-s", "fe", "hello")
    one_error_line(r, ExitStatus.NETWORK, f"the server ended it with finish_reason {finish}",
                    "kept as interrupted turn 1")
    reply = stored_window("fe")[-1]
    assert reply["role"] == "model" and reply["content"] == "Half an ans" and reply.get("interrupted"), reply
    assert "turn.interrupted" in [t for t, _ in stored_events("fe")]
    provider.add_text("Half", finish_reason=finish)
    as_json = chatflow("chat", "-s", "fe", "--output", "json", "again")
    assert as_json.returncode == ExitStatus.NETWORK and as_json.json()["error_type"] == "StreamBrokenError"
    next_turn_is_valid(chatflow, provider, "fe")


def test_the_string_null_is_no_finish_reason(chatflow: Any, provider: Any) -> None:
    provider.add_text("Hel", chunks=["Hel"], finish_reason="null")
    r = chatflow("chat", "-s", "fn", "hello")
    one_error_line(r, ExitStatus.NETWORK, "without a finish reason", "kept as interrupted turn 1")
    next_turn_is_valid(chatflow, provider, "fn")


def test_an_unknown_finish_reason_is_marked_and_shown_like_a_cut(chatflow: Any, provider: Any) -> None:
    provider.add_text("whole?", finish_reason="recitation")
    r = chatflow("chat", "-s", "fu", "hello")
    assert r.returncode == ExitStatus.INCOMPLETE, r
    assert r.stdout == "whole?\n"
    assert any("ended with an unknown finish reason (finish_reason recitation)" in line for line in r.stderr_lines), r
    reply = stored_window("fu")[-1]
    assert (reply["content"], reply["finish_reason"]) == ("whole?", "recitation")
    show = chatflow("sessions", "show", "fu")
    assert "Turn 1 · cut (recitation)" in show.stdout, show
    provider.add_text("again?", finish_reason="recitation")
    as_json = chatflow("chat", "-s", "fu", "--output", "json", "again")
    assert as_json.returncode == ExitStatus.INCOMPLETE and as_json.json()["finish_reason"] == "recitation"
    next_turn_is_valid(chatflow, provider, "fu")


@pytest.mark.parametrize("finish", ["length", "tool_calls"])
def test_an_invalid_call_in_a_later_round_keeps_the_rounds_that_ran(chatflow: Any, provider: Any, tools_env: Path,
                                                                    finish: str) -> None:
    provider.add_tool_calls([("call_1", "get_weather", '{"city": "Oslo"}')])
    provider.add_tool_calls([("call_2", "get_weather", '{"city": "Par')], finish_reason=finish)
    r = chatflow("chat", "-s", "lr", "weather?")
    line = one_error_line(r, ExitStatus.PROVIDER, "call_2", "earlier rounds ran get_weather",
                           "turn 1 is kept as interrupted")
    assert "nothing ran" not in line and ("raise the token limit" in line) == (finish == "length"), line
    assert (tools_env / "get_weather.log").read_text() == "Oslo\n"
    window = stored_window("lr")
    assert [m["role"] for m in window] == ["user", "model", "tool"], window
    assert window[2]["content"] == "sunny in Oslo"
    show = chatflow("sessions", "show", "lr")
    assert "Turn 1" in show.stdout and "interrupted" in show.stdout, show
    sent = next_turn_is_valid(chatflow, provider, "lr")
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool", "user"], sent["messages"]
    assert (tools_env / "get_weather.log").read_text() == "Oslo\n", "the tool ran again"


@pytest.mark.parametrize("finish", ["length", "tool_calls"])
def test_the_token_limit_hint_only_when_the_limit_cut_it(chatflow: Any, provider: Any, tools_env: Path,
                                                         finish: str) -> None:
    provider.add_tool_calls([("call_cut", "get_weather", '{"city": "Par')], finish_reason=finish)
    r = chatflow("chat", "-s", "th", "weather?")
    line = one_error_line(r, ExitStatus.PROVIDER, "nothing ran")
    assert ("raise the token limit" in line) == (finish == "length"), line


# ---------------------------------------------------------------------------------------
# arguments that are no JSON object, said plainly; reasoning of a broken reply kept
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("arguments,said", [
    ('{"city": NaN}', "contain NaN, which is not JSON"),
    ('{"city": -Infinity}', "contain -Infinity, which is not JSON"),
    ("null", "are null, not a JSON object"),
    ('["Oslo"]', "are a list, not a JSON object"),
    ('"Oslo"', "are a string, not a JSON object"),
])
def test_arguments_that_are_no_json_object_are_refused_in_plain_words(chatflow: Any, provider: Any,
                                                                       tools_env: Path, arguments: str,
                                                                       said: str) -> None:
    provider.add_tool_calls([("call_x", "get_weather", arguments)])
    r = chatflow("chat", "-s", "nn", "weather?")
    line = one_error_line(r, ExitStatus.PROVIDER, said, "nothing ran")
    assert "NoneType" not in line
    assert not tools_env.exists(), "the tool ran"
    next_turn_is_valid(chatflow, provider, "nn")


def test_a_broken_reply_of_only_reasoning_keeps_the_reasoning(chatflow: Any, provider: Any) -> None:
    provider.add_chunks([{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
                         {"choices": [{"index": 0, "delta": {"reasoning_content": "Step one, step two"}}]}],
                        done=False)
    r = chatflow("chat", "-s", "rb", "hello")
    one_error_line(r, ExitStatus.NETWORK, "did not finish", "kept as interrupted turn 1")
    reply = stored_window("rb")[-1]
    assert reply["role"] == "model" and reply["reasoning"] == "Step one, step two" and reply.get("interrupted"), reply
    assert "Step one, step two" in chatflow("sessions", "show", "rb", "--full").stdout
    sent = next_turn_is_valid(chatflow, provider, "rb")
    assert [m for m in sent["messages"] if m["role"] == "assistant"] == []
