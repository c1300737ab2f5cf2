"""Replies that did not finish, through the real ``chatflow`` process and the fake server over HTTP.

Each case checks what a person and a script see (text, stderr, ``--output json``/``jsonl``,
``sessions show``, ``replay``, the exit code), what is stored, and then sends a second
message on the same session: the fake server refuses invalid histories (empty assistant
messages, tool-call arguments that are not a JSON object, unanswered calls), so a second
turn that succeeds proves the stored session is valid for the next request.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.errors import ExitStatus
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from tests.conftest import COMMAND, REPO

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


def _db() -> Path:
    return Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db"


def _window(session_id: str) -> list[dict[str, Any]]:
    """The stored context window (what the next request sends), as message dicts."""
    store = SQLiteSessionStore(str(_db()))
    try:
        session = store.get(session_id)
        assert session is not None
        return [m.to_dict() for m in session.history]
    finally:
        store.close()


def _events(session_id: str) -> list[tuple[str, dict[str, Any]]]:
    store = SQLiteSessionStore(str(_db()))
    try:
        return [(e.type, e.payload) for e in store.events(session_id)]
    finally:
        store.close()


def _one_error_line(result: Any, code: int, *mentions: str) -> str:
    assert result.returncode == code, result
    errors = [line for line in result.stderr_lines if line.startswith("chatflow: error: ")]
    assert len(errors) == 1, result
    for word in mentions:
        assert word in errors[0], result
    assert "Traceback" not in result.stderr
    return errors[0]


def _next_turn_is_valid(chatflow: Any, provider: Any, session_id: str) -> dict[str, Any]:
    """A second message on the session: the fake refuses an invalid history with HTTP 400."""
    again = chatflow("chat", "-s", session_id, "and now?")
    assert again.returncode == 0, again
    assert again.stdout == "ok: and now?\n"
    return provider.requests[-1]


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
# 1. cut by the token limit or a content filter
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

    reply = _window("t1")[-1]
    assert (reply["role"], reply["content"], reply["finish_reason"]) == ("model", "cut", finish)
    completed = [p for t, p in _events("t1") if t == "turn.completed"]
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

    sent = _next_turn_is_valid(chatflow, provider, "t1")
    assert {"role": "assistant", "content": "cut"} in sent["messages"]
    whole = chatflow("sessions", "show", "t1", "--json").json()["turns"][-1]["messages"][-1]
    assert "finish_reason" not in whole, "a reply that finished carries no cut mark"


def test_a_reply_that_finished_says_so_in_json(chatflow: Any, provider: Any) -> None:
    r = chatflow("chat", "-s", "ok", "--output", "json", "hi")
    assert r.returncode == 0, r
    assert r.json()["finish_reason"] == "stop"
    assert [p.get("finish_reason") for t, p in _events("ok") if t == "turn.completed"] == ["stop"]


# ---------------------------------------------------------------------------------------
# 2. tool-call arguments cut mid-JSON
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["get_weather", "approve"])
@pytest.mark.parametrize("finish", ["length", "tool_calls"])
def test_tool_arguments_that_are_not_a_json_object_never_run_and_the_turn_fails(
        chatflow: Any, provider: Any, tools_env: Path, name: str, finish: str) -> None:
    assert chatflow("chat", "-s", "tc", "first").returncode == 0
    window_before = _window("tc")
    provider.add_tool_calls([("call_cut", name, '{"path": "a.t')], split=3, finish_reason=finish)
    r = chatflow("chat", "-s", "tc", "weather in Paris?")
    line = _one_error_line(r, ExitStatus.PROVIDER, "call_cut", "not a complete JSON object", "nothing ran")
    assert ("cut by the token limit" in line) == (finish == "length")
    assert r.stdout == ""
    assert not tools_env.exists(), "the tool ran with cut arguments"
    assert "waiting for tool" not in r.stderr, "a cut custom call was offered as pending"
    assert _window("tc") == window_before
    types = [t for t, _ in _events("tc")]
    assert types[-2:] == ["turn.failed", "status"] and "tool.pending" not in types

    sent = _next_turn_is_valid(chatflow, provider, "tc")
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
    _next_turn_is_valid(chatflow, provider, "tw")


# ---------------------------------------------------------------------------------------
# 3. the stream ends without a finish reason
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
    line = _one_error_line(r, ExitStatus.NETWORK, "did not finish", "kept as interrupted turn 1")
    if case == "connection_closed":
        assert "closed mid-reply" in line
    else:
        assert "without a finish reason" in line
    assert r.stdout == "Hel\n"
    window = _window("br")
    assert [(m["role"], m.get("content"), m.get("interrupted")) for m in window] == [
        ("user", "hello?", None), ("model", "Hel", True)]
    types = [t for t, _ in _events("br")]
    assert "turn.interrupted" in types and "turn.completed" not in types and "turn.failed" not in types
    [interrupted] = [p for t, p in _events("br") if t == "turn.interrupted"]
    assert interrupted["reason"] == "broken stream"
    show = chatflow("sessions", "show", "br")
    assert "Turn 1 · interrupted" in show.stdout and "(interrupted)" in show.stdout

    sent = _next_turn_is_valid(chatflow, provider, "br")
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
    _one_error_line(r, ExitStatus.NETWORK, "did not finish")
    assert not tools_env.exists()
    assert [(m["role"], m.get("content"), m.get("tool_calls")) for m in _window("bt")] == [
        ("user", "weather?", None), ("model", "Let me look.", None)]
    _next_turn_is_valid(chatflow, provider, "bt")


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
    _next_turn_is_valid(chatflow, provider, "fin")


# ---------------------------------------------------------------------------------------
# 4. parallel tool calls that reuse index 0
# ---------------------------------------------------------------------------------------
def test_parallel_calls_at_index_0_are_separate_calls(chatflow: Any, provider: Any, tools_env: Path) -> None:
    provider.add_tool_calls([("call_a", "get_weather", '{"city": "Oslo"}'),
                             ("call_b", "get_weather", '{"city": "Rome"}')], same_index=True)
    provider.add_text("Oslo and Rome are sunny.")
    r = chatflow("chat", "-s", "par", "weather in Oslo and Rome?")
    assert r.returncode == 0, r
    assert sorted((tools_env / "get_weather.log").read_text().split()) == ["Oslo", "Rome"]
    [model] = [m for m in _window("par") if m.get("tool_calls")]
    assert [(c["id"], c["arguments"]) for c in model["tool_calls"]] == [
        ("call_a", '{"city": "Oslo"}'), ("call_b", '{"city": "Rome"}')]
    answered = [m["tool_call_id"] for m in _window("par") if m["role"] == "tool"]
    assert answered == ["call_a", "call_b"]
    _next_turn_is_valid(chatflow, provider, "par")


def test_llama_cpp_repeating_id_and_name_is_still_one_call(chatflow: Any, provider: Any, tools_env: Path) -> None:
    provider.add_tool_calls([("call_W", "get_weather", '{"city": "Paris"}')], split=4, repeat_id_name=True)
    provider.add_text("Sunny.")
    r = chatflow("chat", "-s", "ll", "weather?")
    assert r.returncode == 0, r
    assert (tools_env / "get_weather.log").read_text() == "Paris\n"
    [model] = [m for m in _window("ll") if m.get("tool_calls")]
    assert model["tool_calls"] == [{"id": "call_W", "name": "get_weather", "arguments": '{"city": "Paris"}'}]


# ---------------------------------------------------------------------------------------
# 5. a reply that is only reasoning
# ---------------------------------------------------------------------------------------
def test_a_reasoning_only_reply_is_noticed_kept_and_never_sent_back(chatflow: Any, provider: Any) -> None:
    provider.add_reasoning(["The user greets me. ", "I should greet back."])
    r = chatflow("chat", "-s", "rs", "hello")
    assert r.returncode == 0, r
    assert r.stdout == ""
    [note] = [line for line in r.stderr_lines if "reasoning only" in line]
    assert "chatflow sessions show rs --full" in note
    [model] = [m for m in _window("rs") if m["role"] == "model"]
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

    sent = _next_turn_is_valid(chatflow, provider, "rs")
    assistants = [m for m in sent["messages"] if m["role"] == "assistant"]
    assert assistants == [{"role": "assistant", "content": "Hi there!"}], "an empty assistant message was sent"
    assert all("reasoning" not in json.dumps(m) for m in sent["messages"] if m["role"] == "assistant")


def test_a_reasoning_only_reply_cut_by_the_token_limit_exits_10(chatflow: Any, provider: Any) -> None:
    provider.add_reasoning(["Let me think about this for a long"], finish_reason="length")
    r = chatflow("chat", "-s", "rl", "--output", "json", "hard question")
    assert r.returncode == ExitStatus.INCOMPLETE, r
    data = r.json()
    assert data["finish_reason"] == "length" and data["reasoning"] and data["content"] == ""
    _next_turn_is_valid(chatflow, provider, "rl")


# ---------------------------------------------------------------------------------------
# 6. a reader that closes the pipe
# ---------------------------------------------------------------------------------------
def _with_closed_stdout(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run chatflow with stdout a pipe whose reader is already gone: every write is EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        return subprocess.run([*COMMAND, *args], stdin=subprocess.DEVNULL, stdout=write_end,
                              stderr=subprocess.PIPE, env=env, timeout=60)
    finally:
        os.close(write_end)


def test_a_closed_stdout_ends_every_command_quietly_with_0(chatflow: Any, provider: Any) -> None:
    provider.add_text("A long answer " * 200)
    assert chatflow("chat", "-s", "p1", "hi").returncode == 0
    commands = [
        ("sessions", "show", "p1"),
        ("sessions", "show", "p1", "--json"),
        ("replay", "p1", "--json"),
        ("replay", "p1"),
        ("sessions", "ls"),
        ("sessions", "ls", "--json"),
        ("agents", "ls"),
        ("config", "show"),
        ("--help",),
        ("chat", "-s", "p1", "more"),
        ("chat", "-s", "p1", "--output", "jsonl", "more"),
    ]
    for args in commands:
        r = _with_closed_stdout(*args)
        assert (r.returncode, r.stderr) == (0, b""), (args, r)
    # the chat whose reader left stopped its turn and kept it as interrupted: the session is valid
    _next_turn_is_valid(chatflow, provider, "p1")


def test_head_reads_the_first_line_and_chatflow_exits_0(chatflow: Any, provider: Any) -> None:
    """The shell form of the case: ``chatflow sessions show ID | head -1`` under ``pipefail``."""
    for k in range(30):
        provider.add_text(f"answer {k} " + "words " * 300)
    lines = "".join(json.dumps({"message": f"question {k}"}) + "\n" for k in range(30))
    assert chatflow("chat", "-s", "p2", "--input", "jsonl", input=lines).returncode == 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    chatflow_cmd = " ".join(f"'{part}'" for part in COMMAND)
    for args, reader in (("sessions show p2", "head -1"), ("replay p2 --json", "head -c 10")):
        proc = subprocess.run(["bash", "-c", f"set -o pipefail; {chatflow_cmd} {args} | {reader}"],
                              capture_output=True, env=env, timeout=60)
        assert proc.returncode == 0 and proc.stderr == b"", (args, proc)
        assert proc.stdout, args


# ---------------------------------------------------------------------------------------
# on a terminal: a dim note after the text (chat and the REPL)
# ---------------------------------------------------------------------------------------
def _spawn(args: list[str]) -> Any:
    pexpect = pytest.importorskip("pexpect")
    env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(REPO))
    env.pop("NO_COLOR", None)
    return pexpect.spawn(COMMAND[0], [*COMMAND[1:], *args], env=env, timeout=60, dimensions=(40, 120),
                         encoding="utf-8", codec_errors="replace")


def test_on_a_terminal_a_cut_reply_ends_with_a_dim_note(provider: Any) -> None:
    import pexpect

    provider.add_text("the start of it", finish_reason="length")
    child = _spawn(["chat", "-s", "tty", "tell me"])
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
    child = _spawn(["chat", "-s", "repl"])
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
    _next_turn_is_valid(chatflow, provider, "repl")
