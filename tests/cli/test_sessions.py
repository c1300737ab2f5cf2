"""``sessions ls/show/rollback/delete`` and ``replay``, as real processes (issue 5)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from typing import Callable

import pytest

from chatflow_cli.core.errors import ExitStatus
from tests.conftest import COMMAND, REPO
from tests.helpers.terminal import pexpect_module, spawn_chatflow
from tests.helpers.wait import PipeReader, wait_until


@pytest.fixture
def fake_server(shared_fake_server):
    """The module's server, as fresh as a new one: ``three_turns``' session keeps its endpoint."""
    return shared_fake_server


@pytest.fixture
def three_turns(chatflow, provider, home_snapshot):
    """Session ``r`` with three turns, written by chatflow once per module's server (copied per test)."""
    def build():
        for text in ("one", "two", "three"):
            r = chatflow("chat", "-s", "r", text)
            assert r.returncode == 0, r

    home_snapshot.restore(f"sessions-three-turns-{provider.port}", build)
    provider.reset()
    return "r"


def _turn_numbers(chatflow, session_id: str, *extra: str) -> list[int]:
    return [t["number"] for t in chatflow("sessions", "show", session_id, "--json", *extra).json()["turns"]]


def test_ls_filters_and_limit(chatflow, provider, config_file):
    for i in range(3):  # one process after the other: each session is written later than the one before
        assert chatflow("chat", "-s", f"s{i}", f"hello {i}").returncode == 0
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
    assert header == ["SESSION", "AGENT", "STATUS", "TURNS", "UPDATED", "TITLE"]
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

    env = dict(os.environ, PYTHONPATH=str(REPO))
    with subprocess.Popen([*COMMAND, "replay", "r", "--follow", "--json"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env) as proc:
        out = PipeReader(proc.stdout)
        err = PipeReader(proc.stderr)
        try:
            out.wait_for(b'"three"')  # the stored events are out: --follow now waits for new ones
            assert chatflow("chat", "-s", "r", "four").returncode == 0
            out.wait_for(b'"four"')
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.finish()
            err.finish()
    assert proc.returncode == ExitStatus.INTERRUPTED
    assert b"Traceback" not in err.data


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_that_stops_a_command_is_said_with_its_exit_code(chatflow, three_turns, signum):
    """A command with nothing of its own to say about a stop (here ``replay --follow``) still
    ends as ``chat`` does: ``chatflow: terminated (SIGTERM)`` and 143, or ``chatflow:
    interrupted`` and 130 -- never a silent 130 after SIGTERM."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([*COMMAND, "replay", "r", "--follow"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    out = PipeReader(proc.stdout)
    try:
        out.wait_for(b"three")  # the stored events are out: --follow now waits for new ones
        proc.send_signal(signum)
        err = proc.communicate(timeout=20)[1].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    if signum == signal.SIGTERM:
        assert proc.returncode == ExitStatus.TERMINATED and err.strip() == "chatflow: terminated (SIGTERM)", err
    else:
        assert proc.returncode == ExitStatus.INTERRUPTED and err.strip() == "chatflow: interrupted", err


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


def test_delete_with_an_unknown_id_deletes_nothing(chatflow, provider):
    assert chatflow("chat", "-s", "md1", "hello").returncode == 0
    result = chatflow("sessions", "delete", "md1", "nosuch")
    assert result.returncode == 3
    assert "nosuch" in result.stderr and result.stderr.count("\n") == 1
    listed = json.loads(chatflow("sessions", "ls", "--json").stdout)
    assert [s["session_id"] for s in listed] == ["md1"]
    assert chatflow("sessions", "delete", "md1").returncode == 0


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
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), (env or {}).get("PYTHONPATH")])))
    proc = subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=full)
    try:
        wait_until(lambda: ready() or proc.poll() is not None, 60, what="the turn to get there")
        assert proc.poll() is None, proc.communicate()
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


# -- 14: sessions delete asks on a terminal -------------------------------------------------------
def test_sessions_delete_asks_on_a_terminal(chatflow, provider):
    pexpect = pexpect_module()
    assert chatflow("chat", "-s", "keep-me", "hi").returncode == 0
    child = spawn_chatflow(["sessions", "delete", "keep-me"])
    child.expect("Delete session keep-me")
    child.send("n\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert [s["session_id"] for s in chatflow("sessions", "ls", "--json").json()] == ["keep-me"]
    child = spawn_chatflow(["sessions", "delete", "keep-me"])
    child.expect("Delete session keep-me")
    child.send("y\r")
    child.expect("deleted 1 session")
    child.expect(pexpect.EOF)
    child.close()
    assert chatflow("sessions", "ls", "--json").json() == []
    assert chatflow("chat", "-s", "gone", "hi").returncode == 0
    child = spawn_chatflow(["sessions", "delete", "gone", "--yes"])
    child.expect("deleted 1 session")
    child.expect(pexpect.EOF)
    child.close()
    assert b"Delete session" not in child.before
    assert chatflow("sessions", "ls", "--json").json() == []



def test_sessions_delete_in_a_script_does_not_ask(chatflow, provider):
    assert chatflow("chat", "-s", "scripted", "hi").returncode == 0
    r = chatflow("sessions", "delete", "scripted")  # stdin is /dev/null
    assert r.returncode == 0 and "deleted 1 session" in r.stderr, r



# -- 8: a failed first turn ------------------------------------------------------------------------
def test_failed_first_turn_shows_its_message_in_ls_and_show(chatflow, provider):
    provider.add_error(401, message="bad key")
    r = chatflow("chat", "-s", "wrong-key", "What is the capital of France?")
    assert r.returncode == 5, r
    [row] = chatflow("sessions", "ls", "--json").json()
    assert row["session_id"] == "wrong-key" and row["turns"] == 0
    assert row["preview"] == "What is the capital of France?"
    ls = chatflow("sessions", "ls")
    assert "(failed) What is the capital of France?" in ls.stdout
    show = chatflow("sessions", "show", "wrong-key")
    assert "What is the capital of France?" in show.stdout and "failed" in show.stdout
    assert "(no turns yet)" not in show.stdout


def test_a_rollback_after_a_failure_ends_the_failed_mark(chatflow, provider):
    """A message that failed, then a turn that completed, then a rollback to 0: the session
    is not marked failed (the failure was followed by a completed turn and a rollback)."""
    provider.add_error(400, message="bad request")
    assert chatflow("chat", "-s", "p19", "y").returncode == 5
    assert chatflow("chat", "-s", "p19", "z").returncode == 0
    assert chatflow("sessions", "rollback", "p19", "--to", "0").returncode == 0
    [row] = chatflow("sessions", "ls", "--json").json()
    assert (row["turns"], row["failed"]) == (0, False)
    [line] = [line for line in chatflow("sessions", "ls").stdout.splitlines() if line.startswith("p19")]
    assert "(failed)" not in line


def test_sessions_ls_on_a_40_column_terminal_keeps_each_title_and_failed_mark(chatflow, provider, pty_chatflow):
    """Too narrow for the table, each session is a block: id and status, its title, then
    turns, age and agent; the title is what tells sessions apart."""
    assert chatflow("chat", "-s", "lb1", "--title", "Quarterly budget review", "hi").returncode == 0
    provider.add_error(401, message="bad key")
    assert chatflow("chat", "-s", "lb2", "What is the capital of France?").returncode == 5
    ls = pty_chatflow("sessions", "ls", width=40)
    assert ls.wait_exit() == 0
    rows = [row.rstrip() for row in ls.rows() if row.strip()]
    assert rows[0] == "lb2  idle" and rows[3] == "lb1  idle"
    assert rows[1] == "  (failed) What is the capital of Franc…"  # clipped to the 40 columns
    assert rows[4] == "  Quarterly budget review"
    assert rows[2].startswith("  0 turns · ") and rows[5].startswith("  1 turn · ")
    assert all(len(row) <= 40 for row in rows)
    long_id = "this-is-a-very-long-session-identifier-over-40"
    assert chatflow("chat", "-s", long_id, "long id session").returncode == 0
    ls = pty_chatflow("sessions", "ls", width=40)
    assert ls.wait_exit() == 0
    rows = [row.rstrip() for row in ls.rows() if row.strip()]
    at = next(i for i, row in enumerate(rows) if "  long id session" == row)
    assert rows[at + 1].startswith("  idle · 1 turn · ")  # no room beside the id: the status leads here



def test_sessions_ls_status_with_no_match_says_so(chatflow, provider):
    assert chatflow("sessions", "ls", "--status", "running").stderr.strip() == \
        'chatflow: no sessions yet: start one with chatflow chat "hello"'
    assert chatflow("chat", "-s", "x", "hi").returncode == 0
    r = chatflow("sessions", "ls", "--status", "running")
    assert r.returncode == 0 and r.stderr.strip() == "chatflow: no sessions match --status running", r


def test_sessions_ls_json_flags_a_session_whose_last_turn_failed(chatflow, provider):
    assert chatflow("chat", "-s", "ok", "hi").returncode == 0
    assert chatflow("chat", "-s", "later", "hi").returncode == 0
    provider.add_error(400, message="bad request")
    assert chatflow("chat", "-s", "later", "again").returncode != 0
    provider.add_error(401, message="bad key")
    assert chatflow("chat", "-s", "first", "hello").returncode == 5
    rows = {row["session_id"]: row for row in chatflow("sessions", "ls", "--json").json()}
    assert rows["ok"]["failed"] is False
    assert rows["later"]["failed"] is True and rows["later"]["turns"] == 1
    assert rows["first"]["failed"] is True and rows["first"]["turns"] == 0
    # a turn that completes afterwards clears the flag
    assert chatflow("chat", "-s", "later", "once more").returncode == 0
    rows = {row["session_id"]: row for row in chatflow("sessions", "ls", "--json").json()}
    assert rows["later"]["failed"] is False and rows["later"]["turns"] == 2


def test_rerun_uses_the_source_sessions_model_and_endpoint_unless_flags_override(chatflow, provider):
    assert chatflow("chat", "-s", "src", "-m", "fake-src", "--base-url", provider.url, "one").returncode == 0
    elsewhere = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "CHATFLOW_MODEL": "fake-default"}
    before = len(provider.requests)
    r = chatflow("replay", "src", "--rerun", "--into", "copy", env=elsewhere)
    assert r.returncode == 0, r
    assert [req["model"] for req in provider.requests[before:]] == ["fake-src"]
    assert "re-running with src's model fake-src" in r.stderr
    assert f"re-running with src's endpoint {provider.url}" in r.stderr
    head = chatflow("sessions", "show", "copy", "--json").json()["session"]
    assert (head["model"], head["base_url"]) == ("fake-src", provider.url)
    before = len(provider.requests)
    r = chatflow("replay", "src", "--rerun", "--into", "copy2", "-m", "fake-flag", env=elsewhere)
    assert r.returncode == 0, r
    assert [req["model"] for req in provider.requests[before:]] == ["fake-flag"]
    assert "src used model fake-src; --model re-runs it with fake-flag" in r.stderr


def test_a_rollback_brings_back_the_agent_of_that_turn(chatflow):
    """A handoff to Billing in turn 2, then ``sessions rollback --to 1``: ``sessions show``
    says ``agent Assistant`` again (the agent active at the end of turn 1)."""
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.messages import Message
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore
    from tests.conftest import db_path

    db_path().parent.mkdir(parents=True, exist_ok=True)
    with SQLiteSessionStore(db_path()) as store:
        for n, handoff_to in ((1, None), (2, "Billing")):
            ctx = store.get_or_create("hb", Agent("Assistant", ""))
            ctx.add_message(Message.user(f"question {n}"))
            if handoff_to:
                ctx.set_active_agent(Agent(handoff_to, ""))
            ctx.add_message(Message.model(f"answer {n}"))
            ctx.complete_turn(f"answer {n}")
            store.save(ctx)
    assert "agent Billing" in chatflow("sessions", "show", "hb").stdout
    r = chatflow("sessions", "rollback", "hb", "--to", "1", "--yes")
    assert r.returncode == 0, r
    shown = chatflow("sessions", "show", "hb")
    assert shown.returncode == 0, shown
    header = shown.stdout.split("Turn 1")[0]
    assert "agent Assistant" in header and "Billing" not in header
    assert chatflow("sessions", "show", "hb", "--json").json()["session"]["agent"] == "Assistant"
    assert [s["agent"] for s in chatflow("sessions", "ls", "--json").json()] == ["Assistant"]
