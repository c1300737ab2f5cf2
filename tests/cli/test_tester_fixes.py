"""Defects found by fresh testers of the command line (issue 5): each test failed before its fix."""

from __future__ import annotations

import os
import re
from typing import Callable

import pytest

from tests.cli.conftest import COMMAND, REPO

LONG_ID = "20261130-005223-8f3a9c1d2e4b"
LONG_PREVIEW = "please summarise the quarterly report for the board meeting on thursday " * 2


def _spawn_ls(columns: int):
    pexpect = pytest.importorskip("pexpect")
    env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(REPO), NO_COLOR="1")
    env.pop("COLUMNS", None)
    child = pexpect.spawn(COMMAND[0], [*COMMAND[1:], "sessions", "ls"], env=env, timeout=30,
                          dimensions=(40, columns))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return child.before.decode("utf-8", "replace").replace("\r\n", "\n")


@pytest.fixture
def long_session(chatflow, provider):
    for _ in range(2):
        r = chatflow("chat", "-s", LONG_ID, LONG_PREVIEW)
        assert r.returncode == 0, r
    return LONG_ID


def test_ls_piped_never_wraps_or_truncates(chatflow, long_session):
    out = chatflow("sessions", "ls").stdout
    header, row = out.splitlines()
    assert header.split() == ["SESSION", "AGENT", "STATUS", "TURNS", "UPDATED", "PREVIEW"]
    assert row.startswith(LONG_ID + " ")
    cells = re.split(r"\s{2,}", row)
    assert cells[:4] == [LONG_ID, "Assistant", "idle", "2"]
    assert cells[4].endswith("ago")
    [listed] = chatflow("sessions", "ls", "--json").json()
    assert cells[5] == listed["preview"].strip() and len(cells[5]) > 60
    assert "\u2026" not in out


def test_ls_on_a_narrow_terminal_shrinks_the_preview_then_the_agent_never_the_id(long_session):
    out = _spawn_ls(80)
    lines = [line for line in out.splitlines() if line.strip()]
    assert all(len(line) <= 80 for line in lines), lines
    header, row = lines
    assert header.split() == ["SESSION", "AGENT", "STATUS", "TURNS", "UPDATED", "PREVIEW"]
    cells = re.split(r"\s{2,}", row)
    assert cells[:4] == [LONG_ID, "Assistant", "idle", "2"] and cells[4].endswith("ago")
    assert cells[5].endswith("\u2026") and LONG_PREVIEW.startswith(cells[5][:-1])

    narrow = [line for line in _spawn_ls(60).splitlines() if line.strip()]
    assert all(len(line) <= 60 for line in narrow), narrow
    assert narrow[0].split() == ["SESSION", "AGENT", "STATUS", "TURNS", "UPDATED"]  # preview dropped
    cells = re.split(r"\s{2,}", narrow[1])
    assert cells[0] == LONG_ID and cells[1].endswith("\u2026") and "Assistant".startswith(cells[1][:-1])

    narrower = [line for line in _spawn_ls(55).splitlines() if line.strip()]
    assert all(len(line) <= 55 for line in narrower), narrower
    assert narrower[0].split() == ["SESSION", "STATUS", "TURNS", "UPDATED"]  # then the agent
    cells = re.split(r"\s{2,}", narrower[1])
    assert cells[:3] == [LONG_ID, "idle", "2"] and cells[3].endswith("ago")


def test_counts_agree_with_their_nouns(chatflow, provider):
    assert chatflow("chat", "-s", "one", "hi").returncode == 0
    shown = chatflow("sessions", "show", "one").stdout
    assert "· 1 turn ·" in shown and "1 turns" not in shown
    assert chatflow("chat", "-s", "one", "again").returncode == 0
    assert "· 2 turns ·" in chatflow("sessions", "show", "one").stdout
    r = chatflow("sessions", "rollback", "one", "--last", "1")
    assert r.returncode == 0 and "(1 turn removed)" in r.stderr, r
    r = chatflow("sessions", "delete", "one")
    assert r.returncode == 0
    assert chatflow("chat", "-s", "two", "hi").returncode == 0
    r = chatflow("sessions", "delete", "--all")
    assert "deleting ALL 1 session needs --yes" in r.stderr, r
    r = chatflow("sessions", "delete", "--all", "--yes")
    assert r.returncode == 0 and "deleted 1 session" in r.stderr and "(s)" not in r.stderr, r


def _interrupt(args: list[str], *, ready: Callable[[], bool], env: dict[str, str] | None = None) -> None:
    """Run chatflow, wait until ``ready()`` says the turn is where the test wants it, then Ctrl-C it."""
    import signal
    import subprocess
    import time

    full = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), (env or {}).get("PYTHONPATH")])))
    proc = subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=full)
    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the turn never got there"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)


def test_show_marks_turns_interrupted_while_thinking_or_in_a_tool(chatflow, provider, config_file, tmp_path):
    (tmp_path / "slowtools.py").write_text(
        "import time\nfrom chatflow_cli import tool\n\n"
        "@tool\n"
        "def slow(seconds: int) -> str:\n"
        "    \"\"\"Sleep.\"\"\"\n"
        f"    open({str(tmp_path / 'tool-started')!r}, 'w').close()\n"
        "    time.sleep(seconds)\n"
        "    return 'done'\n"
    )
    config_file('default_agent = "Slow"\n[[agents]]\nname = "Slow"\ninstructions = "x"\ntools = ["slowtools:slow"]\n')
    env = {"PYTHONPATH": str(tmp_path)}
    assert chatflow("chat", "-s", "i", "first", env=env).returncode == 0
    provider.add_text("late", delay=30)  # turn 2: Ctrl-C while the model thinks
    asked = len(provider.requests)
    _interrupt(["chat", "-s", "i", "think hard"], env=env, ready=lambda: len(provider.requests) > asked)
    provider.add_tool_calls([("call_s", "slow", '{"seconds": 30}')])  # turn 3: Ctrl-C inside the tool
    _interrupt(["chat", "-s", "i", "run slow"], env=env, ready=(tmp_path / "tool-started").exists)
    provider.add_text("fine")
    assert chatflow("chat", "-s", "i", "last", env=env).returncode == 0

    data = chatflow("sessions", "show", "i", "--json", env=env).json()
    marks = {t["number"]: t["interrupted"] for t in data["turns"]}
    assert marks[2] is True and marks[3] is True and marks[4] is False
    assert marks[1] is False
    text = chatflow("sessions", "show", "i", env=env).stdout
    turns = re.split(r"(?m)^── Turn ", text)[1:]
    by_number = {int(t.split()[0]): t for t in turns}
    for n in (2, 3):
        assert by_number[n].splitlines()[0].startswith(f"{n} · interrupted"), by_number[n]
        assert "(interrupted)" in by_number[n], by_number[n]
    assert "interrupted" not in by_number[4] and "interrupted" not in by_number[1]

    replay = chatflow("replay", "i", env=env).stdout
    interrupted_lines = [line for line in replay.splitlines() if "turn.interrupted" in line]
    assert len(interrupted_lines) == 2
    assert '{"turn"' not in replay and '"reason"' not in replay, replay  # no raw JSON payloads
    assert "turn 2: cancelled" in interrupted_lines[0] and "call_s" in interrupted_lines[1]
    assert "side effects unknown." in replay  # piped: no wrapping


def test_tool_modules_are_found_next_to_the_config_file_then_in_the_current_directory(
        chatflow, provider, config_file, tmp_path):
    cfg = config_file(
        'default_agent = "Desk"\n[[agents]]\nname = "Desk"\ninstructions = "x"\n'
        'tools = ["neartools:near", "cwdtools:here"]\n'
    )
    body = ("from chatflow_cli import tool\n\n@tool\ndef {name}() -> str:\n"
            "    \"\"\"Say where.\"\"\"\n    return '{name} from {where}'\n")
    (cfg.parent / "neartools.py").write_text(body.format(name="near", where="the config dir"))
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "cwdtools.py").write_text(body.format(name="here", where="the cwd"))
    # the config directory wins over the current directory for the same name
    (workdir / "neartools.py").write_text(body.format(name="near", where="the WRONG place"))
    assert "PYTHONPATH" not in os.environ or str(cfg.parent) not in os.environ["PYTHONPATH"]
    provider.add_tool_calls([("c1", "near", "{}"), ("c2", "here", "{}")])
    provider.add_text("done")
    r = chatflow("chat", "-s", "t", "where?", cwd=workdir)
    assert r.returncode == 0, r
    results = [m["content"] for m in provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert results == ["near from the config dir", "here from the cwd"]
    elsewhere = chatflow("chat", "-s", "t2", "where?", cwd=tmp_path)  # cwdtools is not found from here
    assert elsewhere.returncode != 0 and "cannot import tool module 'cwdtools'" in elsewhere.stderr, elsewhere


def test_new_session_notice_only_once_the_session_is_stored(chatflow, provider, config_file):
    config_file('default_agent = "Desk"\n[[agents]]\nname = "Desk"\ninstructions = "x"\n'
                'tools = ["no_such_module_here:fn"]\n')
    r = chatflow("chat", "hello")
    assert r.returncode != 0 and "cannot import tool module" in r.stderr, r
    assert "new session" not in r.stderr, r
    assert chatflow("sessions", "ls", "--json").json() == []

    config_file('default_agent = "Desk"\n[[agents]]\nname = "Desk"\ninstructions = "x"\n')
    ok = chatflow("chat", "hello")
    assert ok.returncode == 0, ok
    [line] = [ln for ln in ok.stderr_lines if "new session" in ln]
    [stored] = chatflow("sessions", "ls", "--json").json()
    assert f"new session {stored['session_id']} " in line
