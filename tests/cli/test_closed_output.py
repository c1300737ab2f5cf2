"""Outputs that went away: a reader that closes stdout mid-reply, a stdout closed before
chatflow starts, one that cannot be written (``/dev/full``), a pipe whose reader already left,
``| head``. Each runs the real ``chatflow`` against the fake server over HTTP; the turn that
could not be shown is kept as interrupted, the outcome (exit code, error line) is never hidden,
and a next message on the session succeeds (the fake refuses an invalid history).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from typing import Any

import pytest

from chatflow_cli.core.errors import ExitStatus
from tests.conftest import COMMAND, REPO
from tests.helpers.fakeserver import FakeServer
from tests.helpers.stored import next_turn_is_valid, stored_events, stored_window


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
# a reader that closes stdout mid-reply stops the turn, kept as interrupted
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
    types = [t for t, _ in stored_events("H")]
    assert "turn.interrupted" in types and "turn.completed" not in types, types
    reply = stored_window("H")[-1]
    assert reply["role"] == "model" and reply.get("interrupted") is True, reply
    assert reply["content"].startswith("line one\nline two\n"), reply
    next_turn_is_valid(chatflow, provider, "H")


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
    assert "turn.interrupted" in [t for t, _ in stored_events("dst")]
    next_turn_is_valid(chatflow, provider, "dst")


# ---------------------------------------------------------------------------------------
# a stdout closed before the start, or that cannot be written
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
    assert "turn.interrupted" in [t for t, _ in stored_events("z")]
    next_turn_is_valid(chatflow, provider, "z")
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
    types = [t for t, _ in stored_events("L")]
    assert types.count("turn.interrupted") == 1, types  # the reply that could not be shown
    next_turn_is_valid(chatflow, provider, "L")


# ---------------------------------------------------------------------------------------
# a reader that has gone never hides the outcome
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
# a reader that closes the pipe
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
    next_turn_is_valid(chatflow, provider, "p1")



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
