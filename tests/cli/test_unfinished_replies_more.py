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
from tests.fakeserver import FakeServer


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
