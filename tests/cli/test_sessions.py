"""``sessions ls/show/rollback/delete`` and ``replay``, as real processes (issue 5)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from chatflow_cli.core.errors import ExitStatus


@pytest.fixture
def three_turns(chatflow, provider):
    for text in ("one", "two", "three"):
        r = chatflow("chat", "-s", "r", text)
        assert r.returncode == 0, r
    return "r"


def _turn_numbers(chatflow, session_id: str, *extra: str) -> list[int]:
    return [t["number"] for t in chatflow("sessions", "show", session_id, "--json", *extra).json()["turns"]]


def test_ls_filters_and_limit(chatflow, provider, config_file):
    for i in range(3):
        assert chatflow("chat", "-s", f"s{i}", f"hello {i}").returncode == 0
        time.sleep(0.01)
    listed = chatflow("sessions", "ls", "--json").json()
    assert [s["session_id"] for s in listed] == ["s2", "s1", "s0"]  # newest first
    assert {s["status"] for s in listed} == {"idle"}
    assert [s["session_id"] for s in chatflow("sessions", "ls", "--json", "--limit", "2").json()] == ["s2", "s1"]
    assert chatflow("sessions", "ls", "--json", "--agent", "Nobody").json() == []
    assert len(chatflow("sessions", "ls", "--json", "--agent", "Assistant").json()) == 3
    assert chatflow("sessions", "ls", "--json", "--status", "running").json() == []
    assert chatflow("sessions", "ls", "--status", "bogus").returncode == ExitStatus.USAGE
    table = chatflow("sessions", "ls")
    assert table.returncode == 0
    header = table.stdout.splitlines()[0].split()
    assert header == ["SESSION", "AGENT", "STATUS", "TURNS", "UPDATED", "PREVIEW"]
    assert "hello 2" in table.stdout and "\x1b" not in table.stdout


def test_rollback_to_and_last(chatflow, three_turns):
    r = chatflow("sessions", "rollback", "r", "--to", "5")
    assert r.returncode == ExitStatus.USAGE and "beyond the last turn" in r.stderr, r
    assert _turn_numbers(chatflow, "r") == [1, 2, 3]  # nothing changed

    r = chatflow("sessions", "rollback", "r", "--to", "1")  # not a terminal: no question asked
    assert r.returncode == 0, r
    assert "turn 2: two" in r.stderr and "turn 3: three" in r.stderr  # what goes is shown
    assert _turn_numbers(chatflow, "r") == [1]
    shown_all = chatflow("sessions", "show", "r", "--json", "--all").json()["turns"]
    assert [(t["number"], t["rolled_back"]) for t in shown_all] == [(1, False), (2, True), (3, True)]
    text_all = chatflow("sessions", "show", "r", "--all").stdout
    assert "Turn 2 · rolled back" in text_all
    assert "rolled back" not in chatflow("sessions", "show", "r").stdout

    assert chatflow("chat", "-s", "r", "again").returncode == 0
    assert _turn_numbers(chatflow, "r") == [1, 2]  # the next turn after rollback to 1 is turn 2
    r = chatflow("sessions", "rollback", "r", "--last", "1", "--yes")
    assert r.returncode == 0, r
    assert _turn_numbers(chatflow, "r") == [1]
    r = chatflow("sessions", "rollback", "r", "--last", "5")
    assert r.returncode == ExitStatus.USAGE, r
    assert chatflow("sessions", "rollback", "r", "--to", "1", "--last", "1").returncode == ExitStatus.USAGE


def test_delete_ids_older_than_and_all(chatflow, provider):
    for sid in ("a", "b", "c"):
        assert chatflow("chat", "-s", sid, "hi").returncode == 0
    r = chatflow("sessions", "delete", "a", "zzz")
    assert r.returncode == ExitStatus.NOT_FOUND and "zzz" in r.stderr, r
    # a failed command changes nothing: "a" is still there
    assert sorted(s["session_id"] for s in chatflow("sessions", "ls", "--json").json()) == ["a", "b", "c"]
    assert chatflow("sessions", "delete", "a").returncode == 0
    assert sorted(s["session_id"] for s in chatflow("sessions", "ls", "--json").json()) == ["b", "c"]
    r = chatflow("sessions", "delete", "--older-than", "1d", "--yes")
    assert r.returncode == 0 and len(chatflow("sessions", "ls", "--json").json()) == 2
    r = chatflow("sessions", "delete", "--all")  # not a terminal and no --yes: refused
    assert r.returncode == ExitStatus.USAGE and "--yes" in r.stderr, r
    assert len(chatflow("sessions", "ls", "--json").json()) == 2
    assert chatflow("sessions", "delete", "--older-than", "soon", "--yes").returncode == ExitStatus.USAGE
    r = chatflow("sessions", "delete", "--all", "--yes")
    assert r.returncode == 0, r
    assert chatflow("sessions", "ls", "--json").json() == []
    assert chatflow("replay", "b").returncode == ExitStatus.NOT_FOUND


def test_replay_json_since_and_text(chatflow, three_turns):
    events = chatflow("replay", "r", "--json").jsonl()
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert events[0]["type"] == "session.created"
    assert [e["data"]["message"]["content"] for e in events if e["type"] == "message.user"] == ["one", "two", "three"]
    later = chatflow("replay", "r", "--json", "--since", str(seqs[-3])).jsonl()
    assert [e["seq"] for e in later] == seqs[-2:]
    text = chatflow("replay", "r")
    assert text.returncode == 0 and "message.user" in text.stdout and "turn.completed" in text.stdout


def test_replay_follow_prints_new_events_until_ctrl_c(chatflow, three_turns):
    from tests.cli.conftest import COMMAND, REPO  # noqa: PLC0415

    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([*COMMAND, "replay", "r", "--follow", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        time.sleep(1.5)
        assert chatflow("chat", "-s", "r", "four").returncode == 0
        deadline = time.monotonic() + 30
        seen = b""
        os.set_blocking(proc.stdout.fileno(), False)
        while b'"four"' not in seen and time.monotonic() < deadline:
            chunk = proc.stdout.read()
            if chunk:
                seen += chunk
            time.sleep(0.1)
        assert b'"four"' in seen
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitStatus.INTERRUPTED
    assert b"Traceback" not in proc.stderr.read()


def test_rerun_into_a_new_session(chatflow, three_turns, provider):
    before = len(provider.requests)
    r = chatflow("replay", "r", "--rerun", "--into", "r2", "--model", "other-model")
    assert r.returncode == 0, r
    sent = provider.requests[before:]
    assert [req["model"] for req in sent] == ["other-model"] * 3
    assert [req["messages"][-1]["content"] for req in sent] == ["one", "two", "three"]
    assert _turn_numbers(chatflow, "r2") == [1, 2, 3]
    again = chatflow("replay", "r", "--rerun", "--into", "r2")
    assert again.returncode == ExitStatus.USAGE and "already exists" in again.stderr


def test_show_folds_long_tool_output_and_marks_window(chatflow, provider, config_file, tmp_path):
    (tmp_path / "bigtools.py").write_text(
        "from chatflow_cli import tool\n\n"
        "@tool\n"
        "def dump(n: int) -> str:\n"
        "    \"\"\"Print n lines.\"\"\"\n"
        "    return '\\n'.join(f'line {i}' for i in range(n))\n"
    )
    config_file('[[agents]]\nname = "A"\ntools = ["bigtools:dump"]\n')
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    provider.add_tool_calls([("c1", "dump", '{"n": 40}')])
    provider.add_text("done")
    assert chatflow("chat", "-s", "f", "--max-turns", "1", "dump please", env=env).returncode == 0
    assert chatflow("chat", "-s", "f", "next", env=env).returncode == 0
    shown = chatflow("sessions", "show", "f", env=env).stdout
    assert "A called dump" in shown and "line 3" in shown and "line 39" not in shown
    assert "more lines; --full shows all" in shown
    assert "Turn 1 · outside the context window" in shown
    full = chatflow("sessions", "show", "f", "--full", env=env).stdout
    assert "line 39" in full
    data = chatflow("sessions", "show", "f", "--json", env=env).json()
    assert [(t["number"], t["in_window"]) for t in data["turns"]] == [(1, False), (2, True)]
    tool_msg = data["turns"][0]["messages"][2]
    assert tool_msg["role"] == "tool" and tool_msg["content"].count("\n") == 39


def test_agents_ls_default_and_config_path(chatflow, isolated_home):
    agents = chatflow("agents", "ls", "--json").json()
    assert [a["name"] for a in agents] == ["Assistant"]
    r = chatflow("config", "path")
    assert r.returncode == 0 and r.stdout.strip() == os.environ["CHATFLOW_CONFIG"]
    assert not (isolated_home / "chatflow.db").exists()
