"""More replies that did not finish, and outputs that went away, through the real process.

A reader that closes stdout mid-reply, a stdout closed before chatflow starts, a stdout that
cannot be written (``/dev/full``), whitespace-only replies, finish reasons that are not a
normal end, and tool rounds cut after earlier rounds ran: each is run as ``chatflow`` against
the fake server over HTTP, then the stored session is checked and a next message is sent
(the fake refuses an invalid history, so a next turn that succeeds proves it is valid).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.errors import ExitStatus
from tests.cli.test_unfinished_replies import _events, _next_turn_is_valid, _one_error_line, _window
from tests.conftest import COMMAND, REPO
from tests.helpers.fakeserver import FakeServer


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def _spawn(*args: str, stdout: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*COMMAND, *args], stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.PIPE, env=_env())


def _gated_lines(provider: Any) -> threading.Event:
    """A reply of four lines whose third waits for the returned gate."""
    reply = FakeServer.make_text("line one\nline two\nline three\nline four\n",
                                 chunks=["line one\n", "line two\n", "line three\n", "line four\n"])
    reply.gate = threading.Event()
    reply.gate_at = 3  # event 0 is the role chunk
    provider.add(reply)
    return reply.gate


def _stderr_is_quiet(stderr: bytes) -> None:
    text = stderr.decode()
    assert "error" not in text and "Traceback" not in text, text


# ---------------------------------------------------------------------------------------
# 1. a reader that closes stdout mid-reply stops the turn, kept as interrupted
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("output", ["text", "jsonl"])
def test_a_reader_that_leaves_mid_reply_stops_the_turn_and_it_is_kept_as_interrupted(
        chatflow: Any, provider: Any, output: str) -> None:
    gate = _gated_lines(provider)
    proc = _spawn("chat", "-s", "H", "--output", output, "m", stdout=subprocess.PIPE)
    assert proc.stdout is not None
    seen = b""
    while b"line two" not in seen:  # like `head -2`: read until the second line, then leave
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else b""
        seen += line
    proc.stdout.close()
    gate.set()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == ExitStatus.SUCCESS, stderr
    _stderr_is_quiet(stderr)
    types = [t for t, _ in _events("H")]
    assert "turn.interrupted" in types and "turn.completed" not in types, types
    reply = _window("H")[-1]
    assert reply["role"] == "model" and reply.get("interrupted") is True, reply
    assert reply["content"].startswith("line one\nline two\n"), reply
    _next_turn_is_valid(chatflow, provider, "H")


def test_replay_rerun_whose_reader_leaves_keeps_the_rerun_turn_as_interrupted(chatflow: Any, provider: Any) -> None:
    assert chatflow("chat", "-s", "src", "first").returncode == 0
    gate = _gated_lines(provider)
    proc = _spawn("replay", "src", "--rerun", "--into", "dst", stdout=subprocess.PIPE)
    assert proc.stdout is not None
    seen = b""
    while b"line two" not in seen:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else b""
        seen += line
    proc.stdout.close()
    gate.set()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == ExitStatus.SUCCESS, stderr
    assert "Traceback" not in stderr.decode()
    assert "turn.interrupted" in [t for t, _ in _events("dst")]
    _next_turn_is_valid(chatflow, provider, "dst")


# ---------------------------------------------------------------------------------------
# 5. a stdout closed before the start, or that cannot be written
# ---------------------------------------------------------------------------------------
def _closed_stdout(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run chatflow with fd 1 closed (``chatflow … >&-``)."""
    return subprocess.run(["bash", "-c", 'exec "$@" >&-', "chatflow", *COMMAND, *args], stdin=subprocess.DEVNULL,
                          capture_output=True, env=_env(), timeout=60)


def test_a_stdout_closed_at_start_is_a_closed_pipe_for_every_command(chatflow: Any, provider: Any) -> None:
    assert chatflow("chat", "-s", "L", "hello").returncode == 0
    for args in (("sessions", "ls"), ("sessions", "show", "L"), ("--help",)):
        r = _closed_stdout(*args)
        assert r.returncode == ExitStatus.SUCCESS, r
        assert r.stderr == b"", r
    provider.add_text("a b c")
    r = _closed_stdout("chat", "-s", "z", "m1")
    assert r.returncode == ExitStatus.SUCCESS, r
    _stderr_is_quiet(r.stderr)
    assert "turn.interrupted" in [t for t, _ in _events("z")]
    _next_turn_is_valid(chatflow, provider, "z")
    missing = _closed_stdout("sessions", "show", "nope")
    assert missing.returncode == ExitStatus.NOT_FOUND and b"no session" in missing.stderr, missing


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_stdout_that_cannot_be_written_is_one_line_and_exit_1(chatflow: Any, provider: Any) -> None:
    assert chatflow("chat", "-s", "L", "hello").returncode == 0
    for args in (("sessions", "ls"), ("sessions", "show", "L"), ("chat", "-s", "L", "again")):
        with open("/dev/full", "wb") as full:
            r = subprocess.run([*COMMAND, *args], stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE,
                               env=_env(), timeout=60)
        lines = [line for line in r.stderr.decode().splitlines() if line.strip()]
        assert r.returncode == ExitStatus.ERROR, (args, lines)
        assert lines == ["chatflow: error: cannot write the output: No space left on device"], (args, lines)
    types = [t for t, _ in _events("L")]
    assert types.count("turn.interrupted") == 1, types  # the reply that could not be shown
    _next_turn_is_valid(chatflow, provider, "L")


# ---------------------------------------------------------------------------------------
# 6. a reader that has gone never hides the outcome
# ---------------------------------------------------------------------------------------
def _run_into_gone_reader(*args: str) -> tuple[int, str]:
    """Run chatflow with a stdout pipe whose reader closed before the start (``| true``)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = _spawn(*args, stdout=write)
    finally:
        os.close(write)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr.decode()


@pytest.mark.parametrize("output", ["text", "json"])
def test_a_gone_reader_does_not_hide_a_provider_error(provider: Any, output: str) -> None:
    """(With ``--output jsonl`` the first event line meets the gone reader, which stops the
    turn before the request, as in the tests above.)"""
    provider.add_error(400, message="bad things")
    code, stderr = _run_into_gone_reader("chat", "--output", output, "m")
    lines = [line for line in stderr.splitlines() if line.startswith("chatflow: error: ")]
    assert code == ExitStatus.PROVIDER and len(lines) == 1 and "bad things" in lines[0], (code, stderr)
    assert "Traceback" not in stderr


def test_a_gone_reader_keeps_exit_10_for_a_cut_reply(provider: Any) -> None:
    provider.add_text("cut", finish_reason="length")
    code, stderr = _run_into_gone_reader("chat", "--output", "json", "m")
    assert code == ExitStatus.INCOMPLETE, (code, stderr)
    assert "Traceback" not in stderr


# ---------------------------------------------------------------------------------------
# 2. a reply of only whitespace is an empty reply
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
    sent = _next_turn_is_valid(chatflow, provider, "ws")
    assert [m for m in sent["messages"] if m["role"] == "assistant"] == [], sent["messages"]
    provider.add_chunks(chunks)
    as_json = chatflow("chat", "-s", "ws", "--output", "json", "again")
    assert as_json.returncode == 0 and as_json.json()["is_error"] is False, as_json
    _next_turn_is_valid(chatflow, provider, "ws")


def test_a_broken_whitespace_reply_kept_as_interrupted_is_never_sent_back(chatflow: Any, provider: Any) -> None:
    provider.add_text("\n\n", chunks=["\n\n"], finish_reason=None)
    r = chatflow("chat", "-s", "wb", "hello")
    _one_error_line(r, ExitStatus.NETWORK, "did not finish", "kept as interrupted turn 1")
    _next_turn_is_valid(chatflow, provider, "wb")


# ---------------------------------------------------------------------------------------
# 3. finish reasons that are not a normal end
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("finish", ["error", "abort"])
def test_a_server_that_ends_the_reply_with_error_or_abort_did_not_finish(chatflow: Any, provider: Any,
                                                                         finish: str) -> None:
    provider.add_text("Half an ans", chunks=["Half ", "an ans"], finish_reason=finish)
    r = chatflow("chat", "-s", "fe", "hello")
    _one_error_line(r, ExitStatus.NETWORK, f"the server ended it with finish_reason {finish}",
                    "kept as interrupted turn 1")
    reply = _window("fe")[-1]
    assert reply["role"] == "model" and reply["content"] == "Half an ans" and reply.get("interrupted"), reply
    assert "turn.interrupted" in [t for t, _ in _events("fe")]
    provider.add_text("Half", finish_reason=finish)
    as_json = chatflow("chat", "-s", "fe", "--output", "json", "again")
    assert as_json.returncode == ExitStatus.NETWORK and as_json.json()["error_type"] == "StreamBrokenError"
    _next_turn_is_valid(chatflow, provider, "fe")


def test_the_string_null_is_no_finish_reason(chatflow: Any, provider: Any) -> None:
    provider.add_text("Hel", chunks=["Hel"], finish_reason="null")
    r = chatflow("chat", "-s", "fn", "hello")
    _one_error_line(r, ExitStatus.NETWORK, "without a finish reason", "kept as interrupted turn 1")
    _next_turn_is_valid(chatflow, provider, "fn")


def test_an_unknown_finish_reason_is_marked_and_shown_like_a_cut(chatflow: Any, provider: Any) -> None:
    provider.add_text("whole?", finish_reason="recitation")
    r = chatflow("chat", "-s", "fu", "hello")
    assert r.returncode == ExitStatus.INCOMPLETE, r
    assert r.stdout == "whole?\n"
    assert any("ended with an unknown finish reason (finish_reason recitation)" in line for line in r.stderr_lines), r
    reply = _window("fu")[-1]
    assert (reply["content"], reply["finish_reason"]) == ("whole?", "recitation")
    show = chatflow("sessions", "show", "fu")
    assert "Turn 1 · cut (recitation)" in show.stdout, show
    provider.add_text("again?", finish_reason="recitation")
    as_json = chatflow("chat", "-s", "fu", "--output", "json", "again")
    assert as_json.returncode == ExitStatus.INCOMPLETE and as_json.json()["finish_reason"] == "recitation"
    _next_turn_is_valid(chatflow, provider, "fu")


# ---------------------------------------------------------------------------------------
# 4. an invalid tool call after earlier rounds ran tools
# ---------------------------------------------------------------------------------------
@pytest.fixture
def tools_env(tmp_path: Path, config_file: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    from tests.cli.test_unfinished_replies import AGENT, TOOLS_MODULE

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "unfinished_tools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    config_file(AGENT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(tmp_path / "mods")]))
    marks = tmp_path / "marks"
    monkeypatch.setenv("MARKS", str(marks))
    return marks


@pytest.mark.parametrize("finish", ["length", "tool_calls"])
def test_an_invalid_call_in_a_later_round_keeps_the_rounds_that_ran(chatflow: Any, provider: Any, tools_env: Path,
                                                                    finish: str) -> None:
    provider.add_tool_calls([("call_1", "get_weather", '{"city": "Oslo"}')])
    provider.add_tool_calls([("call_2", "get_weather", '{"city": "Par')], finish_reason=finish)
    r = chatflow("chat", "-s", "lr", "weather?")
    line = _one_error_line(r, ExitStatus.PROVIDER, "call_2", "earlier rounds ran get_weather",
                           "turn 1 is kept as interrupted")
    assert "nothing ran" not in line and ("raise the token limit" in line) == (finish == "length"), line
    assert (tools_env / "get_weather.log").read_text() == "Oslo\n"
    window = _window("lr")
    assert [m["role"] for m in window] == ["user", "model", "tool"], window
    assert window[2]["content"] == "sunny in Oslo"
    show = chatflow("sessions", "show", "lr")
    assert "Turn 1" in show.stdout and "interrupted" in show.stdout, show
    sent = _next_turn_is_valid(chatflow, provider, "lr")
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool", "user"], sent["messages"]
    assert (tools_env / "get_weather.log").read_text() == "Oslo\n", "the tool ran again"


@pytest.mark.parametrize("finish", ["length", "tool_calls"])
def test_the_token_limit_hint_only_when_the_limit_cut_it(chatflow: Any, provider: Any, tools_env: Path,
                                                         finish: str) -> None:
    provider.add_tool_calls([("call_cut", "get_weather", '{"city": "Par')], finish_reason=finish)
    r = chatflow("chat", "-s", "th", "weather?")
    line = _one_error_line(r, ExitStatus.PROVIDER, "nothing ran")
    assert ("raise the token limit" in line) == (finish == "length"), line


# ---------------------------------------------------------------------------------------
# 7. arguments that are no JSON object, said plainly; reasoning of a broken reply kept
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
    line = _one_error_line(r, ExitStatus.PROVIDER, said, "nothing ran")
    assert "NoneType" not in line
    assert not tools_env.exists(), "the tool ran"
    _next_turn_is_valid(chatflow, provider, "nn")


def test_a_broken_reply_of_only_reasoning_keeps_the_reasoning(chatflow: Any, provider: Any) -> None:
    provider.add_chunks([{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
                         {"choices": [{"index": 0, "delta": {"reasoning_content": "Step one, step two"}}]}],
                        done=False)
    r = chatflow("chat", "-s", "rb", "hello")
    _one_error_line(r, ExitStatus.NETWORK, "did not finish", "kept as interrupted turn 1")
    reply = _window("rb")[-1]
    assert reply["role"] == "model" and reply["reasoning"] == "Step one, step two" and reply.get("interrupted"), reply
    assert "Step one, step two" in chatflow("sessions", "show", "rb", "--full").stdout
    sent = _next_turn_is_valid(chatflow, provider, "rb")
    assert [m for m in sent["messages"] if m["role"] == "assistant"] == []


def test_the_public_errors_are_exported() -> None:
    import chatflow_cli
    from chatflow_cli.core.errors import InvalidToolCallError, StreamBrokenError

    assert chatflow_cli.StreamBrokenError is StreamBrokenError
    assert chatflow_cli.InvalidToolCallError is InvalidToolCallError
