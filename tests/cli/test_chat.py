"""``chatflow chat`` and friends, run as real processes against the fake provider (issues 2 and 5)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from pathlib import Path

import pytest

from tests.conftest import COMMAND, REPO
from tests.helpers.stored import session_running
from tests.helpers.wait import PipeReader, wait_until

ESC = b"\x1b"


def _db() -> Path:
    return Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db"


def test_chat_stores_the_turn_and_sessions_read_it_back(chatflow, provider):
    provider.add_text("Paris is the capital.")
    r = chatflow("chat", "-s", "s1", "What is the capital of France?")
    assert r.returncode == 0, r
    assert r.stdout == "Paris is the capital.\n"
    assert provider.requests[0]["messages"][-1] == {"role": "user", "content": "What is the capital of France?"}
    assert provider.requests[0]["stream"] is True

    ls = chatflow("sessions", "ls", "--json")
    assert ls.returncode == 0, ls
    [row] = ls.json()
    assert row["session_id"] == "s1" and row["turns"] == 1 and row["preview"] == "What is the capital of France?"

    show = chatflow("sessions", "show", "s1", "--json")
    assert show.returncode == 0, show
    data = show.json()
    assert data["session"]["session_id"] == "s1"
    [turn] = data["turns"]
    assert turn["number"] == 1
    assert [m["role"] for m in turn["messages"]] == ["user", "model"]
    assert turn["messages"][1]["content"] == "Paris is the capital."

    text = chatflow("sessions", "show", "s1")
    assert "Turn 1" in text.stdout and "You: What is the capital of France?" in text.stdout
    assert "Paris is the capital." in text.stdout
    assert ESC not in text.stdout_bytes


def test_new_session_id_is_generated_and_printed_to_stderr(chatflow, provider):
    r = chatflow("chat", "hi there")
    assert r.returncode == 0, r
    assert r.stdout == "ok: hi there\n"
    [line] = [ln for ln in r.stderr_lines if "new session" in ln]
    session_id = line.split("new session ")[1].split()[0]
    ids = [s["session_id"] for s in chatflow("sessions", "ls", "--json").json()]
    assert ids == [session_id]


def test_continue_uses_the_latest_session_and_sends_history(chatflow, provider):
    # each process takes far longer than the clock's resolution: "new" is written after "old"
    assert chatflow("chat", "-s", "old", "first").returncode == 0
    assert chatflow("chat", "-s", "new", "second").returncode == 0
    r = chatflow("chat", "-c", "third")
    assert r.returncode == 0, r
    sent = provider.requests[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"] == ["second", "third"]


def test_message_from_stdin_dash_and_pipe(chatflow, provider):
    r = chatflow("chat", "-s", "p", "-", input="from stdin\n")
    assert r.returncode == 0, r
    assert r.stdout == "ok: from stdin\n"
    r = chatflow("chat", "-s", "p", input="piped too\n")
    assert r.returncode == 0, r
    assert provider.requests[-1]["messages"][-1]["content"] == "piped too"


def test_system_prompt_and_metadata_are_stored(chatflow, provider):
    r = chatflow("chat", "-s", "sys", "--system", "Be terse.", "--metadata", "ticket=tk_1", "--metadata", "a=b", "hi")
    assert r.returncode == 0, r
    sent = provider.requests[0]["messages"]
    assert {"role": "system", "content": "Be terse."} in sent
    [row] = chatflow("sessions", "ls", "--json").json()
    assert row["metadata"] == {"ticket": "tk_1", "a": "b"}


def test_json_output_is_one_object(chatflow, provider):
    provider.add_text("Hello")
    r = chatflow("chat", "-s", "j", "--json", "hi")
    assert r.returncode == 0, r
    data = r.json()  # the whole stdout is one JSON document
    assert data["content"] == "Hello" and data["session_id"] == "j" and data["turn"] == 1
    assert data["agent"] == "Assistant" and data["is_error"] is False
    assert data["usage"]["total_tokens"] > 0


def test_jsonl_streams_events_and_ends_with_one_final_event(chatflow, provider):
    provider.add_text("Hello big world")
    r = chatflow("chat", "-s", "l", "--output", "jsonl", "hi")
    assert r.returncode == 0, r
    events = r.jsonl()
    assert all(e["schema"] == 1 and "type" in e and "turn" in e and "data" in e for e in events)
    # seq (and nothing else) tells stored events from runtime ones: text.delta has none
    assert all("seq" not in e for e in events if e["type"] in ("text.delta", "result"))
    finals = [e for e in events if e["type"] == "result"]
    assert len(finals) == 1 and events[-1] is finals[0]
    assert finals[0]["data"]["is_error"] is False and finals[0]["data"]["content"] == "Hello big world"
    assert "is_error" not in finals[0]
    deltas = "".join(e["data"]["text"] for e in events if e["type"] == "text.delta")
    assert deltas == "Hello big world"
    stored = [e["seq"] for e in events if "seq" in e]
    assert stored and all(isinstance(q, int) for q in stored)
    assert stored == sorted(stored) and len(stored) == len(set(stored))


def test_same_message_id_twice_one_model_request_one_turn(chatflow, provider):
    """Issue 5 case 3."""
    first = chatflow("chat", "-s", "wh", "--message-id", "wamid.HBgL1", "order status?")
    assert first.returncode == 0, first
    second = chatflow("chat", "-s", "wh", "--message-id", "wamid.HBgL1", "order status?")
    assert second.returncode == 0, second
    assert second.stdout == ""
    assert any("already processed" in ln for ln in second.stderr_lines)
    assert len(provider.requests) == 1
    assert len(chatflow("sessions", "show", "wh", "--json").json()["turns"]) == 1
    dup_json = chatflow("chat", "-s", "wh", "--message-id", "wamid.HBgL1", "--json", "order status?")
    assert dup_json.returncode == 0 and dup_json.json()["duplicate"] is True
    assert len(provider.requests) == 1


def test_idempotency_key_returns_the_stored_turn(chatflow, provider):
    provider.add_text("first answer")
    a = chatflow("chat", "-s", "idem", "--idempotency-key", "k1", "--json", "hello")
    b = chatflow("chat", "-s", "idem", "--idempotency-key", "k1", "--json", "hello")
    assert a.returncode == 0 and b.returncode == 0, (a, b)
    assert b.json()["content"] == "first answer" and b.json()["replayed"] is True
    assert len(provider.requests) == 1


def test_piped_output_has_no_escape_bytes(chatflow, provider):
    """Issue 5 case 2 (``chatflow chat -s S "hi" | od -c``), and hostile model text (issue 7)."""
    r = chatflow("chat", "-s", "S", "hi")
    assert r.returncode == 0 and r.stdout_bytes and ESC not in r.stdout_bytes, r
    hostile = "clear\x1b[2J title\x1b]0;pwned\x07 clip\x1b]52;c;cm0gLXJm\x07 link\x1b]8;;http://x\x1b\\y\x1b]8;;\x1b\\ c1\x9b31m"
    provider.add_text(hostile, chunks=[hostile[:9], hostile[9:]])
    r = chatflow("chat", "-s", "S", "show me")
    assert r.returncode == 0, r
    assert ESC not in r.stdout_bytes and b"\x07" not in r.stdout_bytes and "\x9b" not in r.stdout
    assert "␛[2J" in r.stdout
    show = chatflow("sessions", "show", "S")
    assert ESC not in show.stdout_bytes and "␛]52;c;" in show.stdout
    replay = chatflow("replay", "S")
    assert ESC not in replay.stdout_bytes
    # verbatim (JSON-escaped) only in JSON output
    data = chatflow("sessions", "show", "S", "--json")
    assert ESC not in data.stdout_bytes
    assert data.json()["turns"][1]["messages"][1]["content"] == hostile


def test_bare_chatflow_reads_a_piped_message(chatflow, provider):
    """Issue 5 case 2: ``printf 'hello\\n' | chatflow``."""
    started = time.monotonic()
    r = chatflow(input="hello\n", timeout=20)
    assert r.returncode == 0, r
    assert time.monotonic() - started < 15
    assert r.stdout == "ok: hello\n"
    assert "prompt_toolkit" not in r.stderr and "Warning" not in r.stderr and "not a terminal" not in r.stderr


def test_bare_chatflow_with_empty_stdin_exits_cleanly(chatflow):
    """``chatflow < /dev/null > /dev/null``: no model, no hang; nothing to send is a usage
    error (exit 2), as on every other path that gets empty input."""
    started = time.monotonic()
    r = chatflow(timeout=20)  # stdin is /dev/null
    assert r.returncode == 2, r
    assert time.monotonic() - started < 15
    assert r.stdout == ""
    assert len(r.stderr_lines) == 1 and "stdin was empty" in r.stderr
    assert "Warning" not in r.stderr and "Traceback" not in r.stderr


def test_input_jsonl_drives_several_turns(chatflow, provider):
    lines = "\n".join([
        json.dumps({"message": "one"}),
        "",
        json.dumps({"role": "user", "content": "two", "metadata": {"step": "2"}}),
    ]) + "\n"
    r = chatflow("chat", "-s", "multi", "--input", "jsonl", "--output", "jsonl", input=lines)
    assert r.returncode == 0, r
    events = r.jsonl()
    assert [e["data"]["content"] for e in events if e["type"] == "turn.result"] == ["ok: one", "ok: two"]
    finals = [e for e in events if e["type"] == "result"]
    assert len(finals) == 1 and events[-1] is finals[0] and finals[0]["data"]["turns"] == 2
    assert len(chatflow("sessions", "show", "multi", "--json").json()["turns"]) == 2


def test_input_jsonl_malformed_line_is_named(chatflow, provider):
    lines = json.dumps({"message": "one"}) + "\n{not json\n" + json.dumps({"message": "three"}) + "\n"
    r = chatflow("chat", "-s", "bad", "--input", "jsonl", "--output", "jsonl", input=lines)
    assert r.returncode == 2, r
    assert "line 2" in r.stderr and "Traceback" not in r.stderr
    events = r.jsonl()
    assert events[-1]["type"] == "result" and events[-1]["data"]["is_error"] is True
    assert sum(e["type"] == "result" for e in events) == 1
    # the first line's turn is kept, the third was never sent
    assert len(chatflow("sessions", "show", "bad", "--json").json()["turns"]) == 1
    assert len(provider.requests) == 1


def test_custom_tool_waits_for_tool_result_then_continues(chatflow, provider, config_file):
    config_file(
        """
[[agents]]
name = "Support"
instructions = "Help."
tools = [{ name = "approve_refund", description = "Ask a human.", parameters = { type = "object", properties = { order_id = { type = "string" } } } }]
"""
    )
    provider.add_tool_calls([("call_1", "approve_refund", '{"order_id": "42"}')])
    r = chatflow("chat", "-s", "ct", "--json", "refund 42 please")
    assert r.returncode == 0, r
    data = r.json()
    assert data["content"] is None
    assert [c["id"] for c in data["pending_tool_calls"]] == ["call_1"]
    provider.add_text("Refund approved.")
    r2 = chatflow("chat", "-s", "ct", "--tool-result", "call_1", '{"approved": true}')
    assert r2.returncode == 0, r2
    assert r2.stdout == "Refund approved.\n"
    sent = provider.requests[-1]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_1", "content": '{"approved": true}'}
    again = chatflow("chat", "-s", "ct", "--tool-result", "call_1", "not json")  # plain text is fine...
    assert again.returncode == 2 and "no pending tool call call_1" in again.stderr  # ...but call_1 is answered


def test_tools_and_handoffs_from_config(chatflow, provider, config_file, tmp_path):
    (tmp_path / "mytools.py").write_text(
        "from chatflow_cli import tool\n\n"
        "@tool\n"
        "def check_order_status(order_id: str) -> dict:\n"
        "    \"\"\"Check shipment tracking for an order ID.\"\"\"\n"
        "    return {'order_id': order_id, 'status': 'IN_TRANSIT'}\n"
    )
    config_file(
        """
default_agent = "Support"
[[agents]]
name = "Support"
instructions = "Support desk."
handoffs = ["Billing"]
tools = ["mytools:check_order_status"]

[[agents]]
name = "Billing"
instructions = "Billing desk."
"""
    )
    provider.add_tool_calls([("call_a", "check_order_status", '{"order_id": "404"}')])
    provider.add_tool_calls([("call_b", "transfer_to_billing", "{}")])
    provider.add_text("Billing here: it is in transit.")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = chatflow("chat", "-s", "h", "where is order 404?", env=env)
    assert r.returncode == 0, r
    assert r.stdout == "Billing here: it is in transit.\n"
    assert [t["function"]["name"] for t in provider.requests[0]["tools"]] == ["check_order_status", "transfer_to_billing"]
    show = chatflow("sessions", "show", "h", env=env)
    assert "check_order_status" in show.stdout and "IN_TRANSIT" in show.stdout
    assert "handoff: Support -> Billing" in show.stdout
    data = chatflow("sessions", "show", "h", "--json", env=env).json()
    assert data["session"]["agent"] == "Billing"
    assert data["turns"][0]["handoffs"][0]["to_agent"] == "Billing"
    agents = chatflow("agents", "ls", "--json", env=env).json()
    assert [(a["name"], a["start"]) for a in agents] == [("Support", True), ("Billing", False)]


@pytest.mark.slow
@pytest.mark.ci_long
def test_sixteen_parallel_chats_and_ls_loop(chatflow, provider):
    """Issue 5 case 1: ``seq 1 16 | xargs -P 16 -I{} chatflow chat --session p{} "ping {}"``
    (a load run, in CI's ci_long pass; tests/hardening/test_concurrency.py's 16 processes on
    one message id stay in the default run)."""
    import subprocess
    import threading


    env = dict(os.environ, PYTHONPATH=str(REPO))
    ls_results: list[subprocess.CompletedProcess[bytes]] = []
    stop = threading.Event()

    def ls_loop() -> None:
        while not stop.is_set():
            ls_results.append(subprocess.run([*COMMAND, "sessions", "ls"], capture_output=True, env=env, timeout=300))
            stop.wait(0.1)

    looper = threading.Thread(target=ls_loop)
    looper.start()
    try:
        procs = [
            subprocess.Popen([*COMMAND, "chat", "--session", f"p{i}", f"ping {i}"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
            for i in range(1, 17)
        ]
        outs = [(p, *p.communicate(timeout=300)) for p in procs]
    finally:
        stop.set()
        looper.join(timeout=300)
    for i, (p, out, err) in enumerate(outs, 1):
        assert p.returncode == 0, (i, out, err)
        assert out.decode() == f"ok: ping {i}\n"
        assert b"database is locked" not in out + err
    assert ls_results, "sessions ls never ran"
    for res in ls_results:
        assert res.returncode == 0, res
        assert b"database is locked" not in res.stdout + res.stderr
    listed = chatflow("sessions", "ls", "--json").json()
    assert sorted(s["session_id"] for s in listed) == sorted(f"p{i}" for i in range(1, 17))
    with sqlite3.connect(_db()) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_busy_session_exit_4_then_wait(chatflow, provider):
    import subprocess

    provider.add_text("slow answer here", chunks=["slow", " answer", " here"], delay=1.0)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    first = subprocess.Popen([*COMMAND, "chat", "-s", "busy", "first"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        wait_until(lambda: session_running(chatflow, "busy"), 60, "the first turn to show as running")
        busy = chatflow("chat", "-s", "busy", "second")
        assert busy.returncode == 4, busy
        assert busy.stderr_lines == [
            f"chatflow: error: session 'busy' is busy: a turn is running in pid {first.pid} on {socket.gethostname()}; "
            "wait for it with --wait SECONDS, e.g. --wait 60"], busy
        waited = chatflow("chat", "-s", "busy", "--wait", "60", "third", timeout=120)
        assert waited.returncode == 0, waited
        assert waited.stdout == "ok: third\n"
    finally:
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0 and out == b"slow answer here\n", err
    turns = chatflow("sessions", "show", "busy", "--json").json()["turns"]
    assert [t["messages"][0]["content"] for t in turns] == ["first", "third"]


def test_agent_flag_starts_with_that_agent(chatflow, provider, config_file):
    config_file('[[agents]]\nname = "Support"\ninstructions = "S"\n[[agents]]\nname = "Billing"\ninstructions = "B"\n')
    r = chatflow("chat", "-s", "ag", "-a", "Billing", "--json", "hi")
    assert r.returncode == 0 and r.json()["agent"] == "Billing", r
    assert provider.requests[0]["messages"][0] == {"role": "system", "content": "B"}
    r = chatflow("chat", "-s", "ag2", "-a", "Nobody", "hi")
    assert r.returncode == 3 and "Nobody" in r.stderr, r


def test_ctrl_c_mid_reply_exits_130_and_keeps_the_partial_turn(chatflow, provider):
    import signal
    import subprocess


    provider.add_text("partial words then more", chunks=["partial", " words", " then", " more"], delay=[0, 0, 5, 5])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([*COMMAND, "chat", "-s", "int", "go"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)
    out = PipeReader(proc.stdout)
    out.wait_for(b"words", timeout=60)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, (out.finish(), err)
    # an interrupt is not an error: one notice, no "error:" line
    assert b"Traceback" not in err and err.count(b"chatflow: error:") == 0 and b"interrupted" in err
    [turn] = chatflow("sessions", "show", "int", "--json").json()["turns"]
    model = turn["messages"][-1]
    assert model["interrupted"] is True and model["content"].startswith("partial words")
    assert chatflow("chat", "-s", "int", "next").returncode == 0  # the session is usable again


def test_agent_flag_on_an_existing_session_switches_to_that_agent(chatflow, provider, config_file):
    config_file(
        """
[[agents]]
name = "Support"
instructions = "You answer customer questions."

[[agents]]
name = "Billing"
instructions = "You handle refunds."
"""
    )
    assert chatflow("chat", "-s", "agx", "one").returncode == 0
    switched = chatflow("chat", "-s", "agx", "-a", "Billing", "two")
    assert switched.returncode == 0, switched
    sent = provider.requests[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "You handle refunds."}
    listed = json.loads(chatflow("sessions", "ls", "--json").stdout)
    assert [s["agent"] for s in listed if s["session_id"] == "agx"] == ["Billing"]
    # the next turn, with no flag, stays with the agent the session now has
    assert chatflow("chat", "-s", "agx", "three").returncode == 0
    assert provider.requests[-1]["messages"][0] == {"role": "system", "content": "You handle refunds."}


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


# -- 12: --system and --max-turns on an existing session ----------------------------------------
def test_system_and_max_turns_on_an_existing_session_are_announced(chatflow, provider):
    assert chatflow("chat", "-s", "ex", "--system", "Be terse.", "--max-turns", "5", "hi").returncode == 0
    r = chatflow("chat", "-s", "ex", "--system", "Be verbose.", "--max-turns", "9", "again")
    assert r.returncode == 0, r
    assert "--max-turns 9 not applied" in r.stderr and "window of 5 turns" in r.stderr
    assert "--system not applied" in r.stderr
    sent = provider.requests[-1]["messages"]
    systems = [m["content"] for m in sent if m["role"] == "system"]  # the agent's instructions, then the session's
    assert "Be terse." in systems and "Be verbose." not in systems
    same = chatflow("chat", "-s", "ex", "--system", "Be terse.", "--max-turns", "5", "third")
    assert same.returncode == 0 and "not applied" not in same.stderr, same



def test_new_session_named_with_s_is_announced_once(chatflow, provider):
    r = chatflow("chat", "-s", "wrok", "hi")
    assert r.returncode == 0
    assert "chatflow: new session wrok" in r.stderr
    r = chatflow("chat", "-s", "wrok", "again")
    assert "new session" not in r.stderr



def test_one_shot_ctrl_c_is_not_printed_as_an_error(provider, chatflow):
    import signal
    import subprocess

    provider.add_text("partial words then more", chunks=["partial", " words", " then", " more"], delay=[0, 0, 5, 5])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([*COMMAND, "chat", "-s", "int", "go"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)
    PipeReader(proc.stdout).wait_for(b"partial")
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 130
    text = err.decode()
    assert "chatflow: error" not in text and "interrupted" in text, text


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_mid_reply_keeps_the_partial_turn_says_so_and_exits_143(chatflow, provider, sigint):
    """``timeout 30 chatflow chat ...`` sends SIGTERM: taken as Ctrl-C (the partial reply is
    kept as an interrupted turn), said on stderr, exit 143 (128 + 15); also in a background
    job, which starts with SIGINT ignored."""
    import signal
    import subprocess

    provider.add_text("partial words then more", chunks=["partial", " words", " then", " more"], delay=[0, 0, 5, 5])
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([*COMMAND, "chat", "-s", "term", "go"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env,
                            preexec_fn=ignore_sigint if sigint == "ignored" else None)
    out = PipeReader(proc.stdout)
    out.wait_for(b"words", timeout=60)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 143, (out.finish(), err)
    assert "Traceback" not in err and "chatflow: error:" not in err
    assert "chatflow: terminated (SIGTERM): turn 1 was interrupted" in err, err
    [turn] = chatflow("sessions", "show", "term", "--json").json()["turns"]
    model = turn["messages"][-1]
    assert model["interrupted"] is True and model["content"].startswith("partial words")
    assert chatflow("chat", "-s", "term", "next").returncode == 0  # the session is usable again


def test_sighup_mid_reply_is_taken_as_sigterm_and_exits_129(chatflow, provider):
    """The terminal of a ``chat`` closed (an ssh session dropped): the partial reply is kept as
    an interrupted turn, as after SIGTERM, and the exit is 129 (128 + 1), as the REPL's."""
    import signal
    import subprocess

    provider.add_text("partial words then more", chunks=["partial", " words", " then", " more"], delay=[0, 0, 5, 5])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([*COMMAND, "chat", "-s", "hup", "go"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)
    out = PipeReader(proc.stdout)
    out.wait_for(b"words", timeout=60)
    proc.send_signal(signal.SIGHUP)
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 129, (out.finish(), err)
    assert "Traceback" not in err and "chatflow: error:" not in err
    assert "chatflow: hung up (SIGHUP): turn 1 was interrupted" in err, err
    [turn] = chatflow("sessions", "show", "hup", "--json").json()["turns"]
    model = turn["messages"][-1]
    assert model["interrupted"] is True and model["content"].startswith("partial words")


def test_sigterm_with_json_output_reports_exit_143(chatflow, provider):
    import signal
    import subprocess

    provider.add_text("partial words then more", chunks=["partial", " words", " then", " more"], delay=[0, 0, 5, 5])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with subprocess.Popen([*COMMAND, "chat", "-s", "tj", "-o", "jsonl", "go"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env) as proc:
        out = PipeReader(proc.stdout)
        out.wait_for(b"words", timeout=60)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        lines = [json.loads(line) for line in out.finish().decode().splitlines() if line.strip()]
    assert proc.returncode == 143
    assert lines[-1]["type"] == "result" and lines[-1]["data"]["exit_code"] == 143
