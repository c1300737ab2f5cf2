"""What a new user tripped on in the command line, each case through the real ``chatflow`` process.

Repeatable options, stdin joined to a message, ``--tool-result`` in plain text, global options
after the command, ``-s``/``-c`` before it, completion of agents/shells/statuses, ``agents ls``
on a broken tool module and on 40 columns, ``sessions delete`` asking, the session's own model
and endpoint, ``--system``/``--max-turns`` on an existing session, one JSON event shape, and
the polish of messages and help.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.cli.conftest import COMMAND, REPO

CUSTOM_TOOLS = """
[[agents]]
name = "Support"
instructions = "Help."
tools = [
  { name = "approve_refund", description = "Ask a human.", parameters = { type = "object", properties = { order_id = { type = "string" } } } },
  { name = "notify", description = "Tell someone.", parameters = { type = "object", properties = {} } },
]
"""


def _pexpect():
    return pytest.importorskip("pexpect")


def _spawn(args: list[str], *, cols: int = 100, rows: int = 30, **env: str):
    pexpect = _pexpect()
    full = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(REPO))
    full.pop("NO_COLOR", None)
    full.update(env)
    return pexpect.spawn(COMMAND[0], [*COMMAND[1:], *args], env=full, timeout=30, dimensions=(rows, cols))


def _screen_lines(raw: bytes) -> list[str]:
    """The visible lines of a terminal transcript (no escapes, no CRs)."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode("utf-8", "replace"))
    return [line for line in text.replace("\r", "").split("\n")]


# -- 3: repeatable options never drop a repeat ---------------------------------------------
def test_tool_result_given_twice_records_both_and_continues(chatflow, provider, config_file):
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_C", "approve_refund", '{"order_id": "1"}'), ("call_D", "notify", "{}")])
    r = chatflow("chat", "-s", "two", "refund 1")
    assert r.returncode == 0, r
    provider.add_text("Both answered.")
    r = chatflow("chat", "-s", "two", "--tool-result", "call_C", '"y"', "--tool-result", "call_D", '"n"')
    assert r.returncode == 0, r
    assert r.stdout == "Both answered.\n"
    assert "still waiting" not in r.stderr
    sent = [m for m in provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert sent == [{"role": "tool", "tool_call_id": "call_C", "content": '"y"'},
                    {"role": "tool", "tool_call_id": "call_D", "content": '"n"'}]


def test_tool_result_for_the_same_call_twice_is_refused(chatflow, provider, config_file):
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_C", "approve_refund", "{}")])
    assert chatflow("chat", "-s", "dup", "refund").returncode == 0
    r = chatflow("chat", "-s", "dup", "--tool-result", "call_C", "a", "--tool-result", "call_C", "b")
    assert r.returncode == 2 and "call_C is given twice" in r.stderr, r
    assert len(provider.requests) == 1
    shown = chatflow("sessions", "show", "dup", "--json").json()
    assert shown["session"]["status"] == "idle"


@pytest.mark.parametrize("args, option", [
    (["chat", "-s", "a", "-s", "b", "hi"], "--session/-s"),
    (["chat", "-m", "x", "--model", "y", "hi"], "--model/-m"),
    (["sessions", "ls", "--limit", "1", "-n", "2"], "--limit/-n"),
    (["replay", "x", "--since", "1", "--since", "2"], "--since"),
    (["sessions", "ls", "--db", "a.db", "--db", "b.db"], "--db"),
])
def test_a_single_value_option_given_twice_is_a_usage_error(chatflow, provider, args, option):
    r = chatflow(*args)
    assert r.returncode == 2, r
    assert f"{option} was given more than once" in r.stderr
    assert provider.requests == []


def test_metadata_repeats_are_all_kept(chatflow, provider):
    r = chatflow("chat", "-s", "m", "--metadata", "a=1", "--metadata", "b=2", "hi")
    assert r.returncode == 0, r
    [row] = chatflow("sessions", "ls", "--json").json()
    assert row["metadata"] == {"a": "1", "b": "2"}


# -- 16: --tool-result takes plain text, as the REPL does ----------------------------------
def test_tool_result_plain_text_is_sent_as_given(chatflow, provider, config_file):
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_A", "approve_refund", "{}")])
    assert chatflow("chat", "-s", "plain", "refund").returncode == 0
    provider.add_text("Done.")
    r = chatflow("chat", "-s", "plain", "--tool-result", "call_A", "yes")
    assert r.returncode == 0, r
    assert provider.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_A", "content": "yes"}


def test_tool_result_unknown_id_names_what_waits(chatflow, provider, config_file):
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_A", "approve_refund", "{}"), ("call_B", "notify", "{}")])
    assert chatflow("chat", "-s", "wait", "refund").returncode == 0
    r = chatflow("chat", "-s", "wait", "--tool-result", "call_A", "ok", "--tool-result", "call_X", "ok")
    assert r.returncode == 2, r
    assert "no pending tool call call_X" in r.stderr and "waiting for: call_A, call_B" in r.stderr
    assert "['" not in r.stderr
    # nothing was recorded: call_A can still be answered
    r = chatflow("chat", "-s", "wait", "--tool-result", "call_A", "ok")
    assert r.returncode == 0 and "still waiting for: call_B" in r.stderr, r


# -- 13: git diff | chatflow chat "review this" ---------------------------------------------
def test_message_and_piped_stdin_are_joined(chatflow, provider):
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-old\n+new\n"
    r = chatflow("chat", "-s", "rev", "review this", input=diff)
    assert r.returncode == 0, r
    assert provider.requests[0]["messages"][-1] == {"role": "user", "content": "review this\n\n" + diff.rstrip("\n")}


def test_message_with_empty_stdin_is_the_message_alone(chatflow, provider):
    r = chatflow("chat", "-s", "alone", "just this")  # stdin is /dev/null
    assert r.returncode == 0, r
    assert provider.requests[0]["messages"][-1]["content"] == "just this"


# -- 19: empty input exits 2 on every path ----------------------------------------------------
@pytest.mark.parametrize("args", [[], ["chat"], ["chat", "-"], ["chat", "-s", "e"], ["-s", "e"]])
def test_empty_input_is_one_usage_error_everywhere(chatflow, provider, args):
    r = chatflow(*args, input="  \n")
    assert r.returncode == 2, r
    assert "nothing to send: stdin was empty" in r.stderr
    assert provider.requests == []


# -- 11: global options after the command; -s/-c before it -------------------------------------
def test_global_options_are_accepted_after_the_command(chatflow, provider, tmp_path):
    db = tmp_path / "other.db"
    r = chatflow("chat", "--db", str(db), "-s", "g", "--no-color", "hi")
    assert r.returncode == 0, r
    assert db.exists()
    ls = chatflow("sessions", "ls", "--db", str(db), "--json")
    assert [s["session_id"] for s in ls.json()] == ["g"]
    assert chatflow("sessions", "ls", "--json").json() == []  # the default database was not used
    bad = chatflow("agents", "ls", "--config", str(tmp_path / "missing.toml"))
    assert bad.returncode == 9 and "missing.toml" in bad.stderr, bad
    debug = chatflow("sessions", "show", "nope", "--debug")
    assert debug.returncode == 3 and "Traceback" in debug.stderr, debug


def test_session_before_the_command_reads_a_piped_message(chatflow, provider):
    r = chatflow("-s", "work", input="hello work\n")
    assert r.returncode == 0, r
    assert r.stdout == "ok: hello work\n"
    assert "new session work" in r.stderr
    r = chatflow("--session", "work", input="again\n")
    assert r.returncode == 0 and "new session" not in r.stderr, r
    r = chatflow("-c", input="third\n")
    assert r.returncode == 0, r
    shown = chatflow("sessions", "show", "work", "--json").json()
    assert [t["messages"][0]["content"] for t in shown["turns"]] == ["hello work", "again", "third"]


def test_session_before_a_command_is_refused_with_a_hint(chatflow):
    r = chatflow("-s", "work", "sessions", "ls")
    assert r.returncode == 2 and "chatflow sessions --session" in r.stderr, r


def test_session_before_the_command_opens_the_repl_on_it(provider, chatflow):
    pexpect = _pexpect()
    assert chatflow("chat", "-s", "work", "first").returncode == 0
    child = _spawn(["--session", "work"])
    child.expect("\u203a".encode())
    time.sleep(0.5)  # as test_terminal does: the prompt is drawn before it reads keys
    child.send("second\r")
    child.expect("ok: second")
    time.sleep(0.3)  # as test_terminal does: Ctrl-D once the reply has ended
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    shown = chatflow("sessions", "show", "work", "--json").json()
    assert [t["messages"][0]["content"] for t in shown["turns"]] == ["first", "second"]


# -- 10: completion -------------------------------------------------------------------------------
def test_completion_of_agents_shells_and_statuses(chatflow, config_file):
    config_file('[[agents]]\nname = "Support"\ninstructions = "x"\n\n[[agents]]\nname = "Billing"\ninstructions = "y"\n')
    bash = {"_CHATFLOW_COMPLETE": "complete_bash"}
    r = chatflow(env={**bash, "COMP_WORDS": "chatflow chat -a ", "COMP_CWORD": "3"})
    assert r.stdout.split() == ["Support", "Billing"]
    r = chatflow(env={**bash, "COMP_WORDS": "chatflow completion ", "COMP_CWORD": "2"})
    assert r.stdout.split() == ["bash", "zsh", "fish"]
    r = chatflow(env={**bash, "COMP_WORDS": "chatflow sessions ls --status r", "COMP_CWORD": "4"})
    assert r.stdout.split() == ["running", "rescheduled"]
    zsh = chatflow(env={"_CHATFLOW_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "chatflow chat -a B"})
    assert '"Billing"' in zsh.stdout and "Support" not in zsh.stdout
    zsh = chatflow(env={"_CHATFLOW_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "chatflow completion z"})
    assert '"zsh"' in zsh.stdout and "bash" not in zsh.stdout
    fish = chatflow(env={"_CHATFLOW_COMPLETE": "complete_fish", "_TYPER_COMPLETE_ARGS": "chatflow sessions ls --status ",
                         "_TYPER_COMPLETE_FISH_ACTION": "get-args"})
    assert fish.stdout.split() == ["idle", "running", "rescheduled", "terminated"]
    fish = chatflow(env={"_CHATFLOW_COMPLETE": "complete_fish", "_TYPER_COMPLETE_ARGS": "chatflow chat -a S",
                         "_TYPER_COMPLETE_FISH_ACTION": "get-args"})
    assert fish.stdout.split() == ["Support"]


# -- 9: agents ls reports a tool module that does not import -----------------------------------
def test_agents_ls_reports_a_tool_module_that_does_not_import(chatflow, config_file, tmp_path):
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "brokentools.py").write_text("import no_such_module_anywhere\n")
    config_file('[[agents]]\nname = "Support"\ninstructions = "x"\ntools = ["brokentools:f"]\n')
    r = chatflow("agents", "ls")
    assert r.returncode == 9, r
    assert "cannot import tool module 'brokentools'" in r.stderr and "No module named" in r.stderr
    assert r.stdout == ""


# -- 19/20: agents ls --json is data; --output on listing commands -------------------------------
def test_agents_ls_json_keeps_display_text_out_of_data(chatflow, config_file, tmp_path):
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "goodtools.py").write_text(
        "from chatflow_cli import tool\n\n@tool\ndef check(order_id: str) -> str:\n    \"\"\"Check.\"\"\"\n    return 'ok'\n")
    config_file(CUSTOM_TOOLS.replace('tools = [', 'tools = [\n  "goodtools:check",'))
    [row] = chatflow("agents", "ls", "--json").json()
    assert row["tools"] == [{"name": "check", "kind": "python", "ref": "goodtools:check"},
                            {"name": "approve_refund", "kind": "custom"}, {"name": "notify", "kind": "custom"}]
    assert row["name"] == "Support" and row["start"] is True
    lines = chatflow("agents", "ls", "--output", "jsonl").jsonl()
    assert lines == [row]
    text = chatflow("agents", "ls")
    assert "approve_refund (custom)" in text.stdout and "Support *" in text.stdout


def test_sessions_ls_and_show_take_output_formats(chatflow, provider):
    assert chatflow("chat", "-s", "o1", "one").returncode == 0
    assert chatflow("chat", "-s", "o1", "two").returncode == 0
    rows = chatflow("sessions", "ls", "-o", "jsonl").jsonl()
    assert [r["session_id"] for r in rows] == ["o1"] and rows == chatflow("sessions", "ls", "--json").json()
    assert chatflow("sessions", "ls", "--output", "json").json() == rows
    lines = chatflow("sessions", "show", "o1", "--output", "jsonl").jsonl()
    assert lines[0]["session"]["session_id"] == "o1"
    assert [ln["turn"]["number"] for ln in lines[1:]] == [1, 2]
    whole = chatflow("sessions", "show", "o1", "--output", "json").json()
    assert whole == chatflow("sessions", "show", "o1", "--json").json()
    assert whole["turns"] == [ln["turn"] for ln in lines[1:]]
    clash = chatflow("sessions", "ls", "--json", "--output", "jsonl")
    assert clash.returncode == 2 and "--json" in clash.stderr


def test_json_error_for_a_missing_session(chatflow, provider):
    r = chatflow("sessions", "show", "nonexist", "--json")
    assert r.returncode == 3, r
    assert r.json() == {"error": "no session 'nonexist' (list them with: chatflow sessions ls)",
                        "error_type": "SessionNotFoundError", "exit_code": 3, "session_id": "nonexist",
                        "is_error": True}
    assert "chatflow: error: no session 'nonexist'" in r.stderr
    r = chatflow("replay", "nonexist", "--json")
    assert r.returncode == 3
    [event] = r.jsonl()
    assert event["schema"] == 1 and event["type"] == "error" and event["data"]["exit_code"] == 3


# -- 20: one event schema in chat --output jsonl and replay ---------------------------------------
def test_chat_jsonl_and_replay_share_one_event_shape(chatflow, provider):
    r = chatflow("chat", "-s", "ev", "--output", "jsonl", "hi")
    assert r.returncode == 0, r
    live = r.jsonl()
    replay = chatflow("replay", "ev", "--output", "jsonl").jsonl()
    assert chatflow("replay", "ev", "--json").jsonl() == replay
    assert chatflow("replay", "ev", "--output", "json").json() == replay
    keys = {"schema", "seq", "type", "session_id", "turn", "created_at", "data"}
    assert all(set(e) == keys for e in replay), replay[0]
    by_seq = {e["seq"]: e for e in replay}
    for e in live:
        assert e["schema"] == 1 and e["session_id"] == "ev" and "payload" not in e
        if "seq" in e:  # a stored event: the same type, turn and data as replay shows
            stored = by_seq[e["seq"]]
            assert (e["type"], e["turn"], e["data"]) == (stored["type"], stored["turn"], stored["data"])
    statuses = [e for e in replay if e["type"] == "status"]
    assert statuses and any("owner" in e["data"] for e in statuses)
    assert all('"token"' not in json.dumps(e["data"]) for e in live + replay)
    assert live[-1]["type"] == "result" and live[-1]["data"]["is_error"] is False


def test_chat_jsonl_error_result_keeps_is_error_in_data(chatflow, provider):
    provider.add_error(400, message="bad things")
    r = chatflow("chat", "-s", "err", "--output", "jsonl", "hi")
    assert r.returncode == 5, r
    final = r.jsonl()[-1]
    assert final["type"] == "result" and final["data"]["is_error"] is True and "is_error" not in final
    assert final["data"]["exit_code"] == 5


# -- 14: sessions delete asks on a terminal -------------------------------------------------------
def test_sessions_delete_asks_on_a_terminal(chatflow, provider):
    pexpect = _pexpect()
    assert chatflow("chat", "-s", "keep-me", "hi").returncode == 0
    child = _spawn(["sessions", "delete", "keep-me"])
    child.expect("Delete session keep-me")
    child.send("n\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert [s["session_id"] for s in chatflow("sessions", "ls", "--json").json()] == ["keep-me"]
    child = _spawn(["sessions", "delete", "keep-me"])
    child.expect("Delete session keep-me")
    child.send("y\r")
    child.expect("deleted 1 session")
    child.expect(pexpect.EOF)
    child.close()
    assert chatflow("sessions", "ls", "--json").json() == []
    assert chatflow("chat", "-s", "gone", "hi").returncode == 0
    child = _spawn(["sessions", "delete", "gone", "--yes"])
    child.expect("deleted 1 session")
    child.expect(pexpect.EOF)
    child.close()
    assert b"Delete session" not in child.before
    assert chatflow("sessions", "ls", "--json").json() == []


def test_sessions_delete_in_a_script_does_not_ask(chatflow, provider):
    assert chatflow("chat", "-s", "scripted", "hi").returncode == 0
    r = chatflow("sessions", "delete", "scripted")  # stdin is /dev/null
    assert r.returncode == 0 and "deleted 1 session" in r.stderr, r


# -- 17: 40 columns ------------------------------------------------------------------------------
def test_agents_and_sessions_ls_stay_readable_at_40_columns(chatflow, provider, config_file):
    pexpect = _pexpect()
    config_file(CUSTOM_TOOLS + '\n[[agents]]\nname = "Billing"\ninstructions = "You handle refunds and invoices '
                'for every customer of the shop, politely."\nhandoffs = ["Support"]\n')
    for sid in ("support-ticket-0042", "20261130-120000-abcdef"):
        assert chatflow("chat", "-s", sid, "Where is my order? It was due last week.").returncode == 0
    for args in (["agents", "ls"], ["sessions", "ls"]):
        child = _spawn(args, cols=40, NO_COLOR="1")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        lines = [ln for ln in _screen_lines(child.before) if ln.strip()]
        assert lines and all(len(ln) <= 40 for ln in lines), lines
        assert sum(len(ln.strip()) <= 2 for ln in lines) == 0, lines  # no one-character-per-line column
        text = "\n".join(lines)
        if args[0] == "agents":
            assert "Support" in text and "Billing" in text and "approve_refund" in text
        else:
            assert "support-ticket-0042" in text and "20261130-120000-abcdef" in text and "idle" in text


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


# -- 21: the model and endpoint belong to the session -------------------------------------------
def test_resume_uses_the_sessions_model_and_endpoint(chatflow, fake_server, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    r = chatflow("chat", "-s", "ep", "--base-url", fake_server.url, "-m", "fake-model", "first")
    assert r.returncode == 0, r
    r = chatflow("chat", "-s", "ep", "second")  # no flags, no environment: the session's own
    assert r.returncode == 0, r
    assert [q["model"] for q in fake_server.requests] == ["fake-model", "fake-model"]
    assert "switches" not in r.stderr
    r = chatflow("chat", "-s", "ep", "-m", "other-model", "third")
    assert r.returncode == 0, r
    assert "session ep used model fake-model; --model switches it to other-model" in r.stderr
    r = chatflow("chat", "-s", "ep", "fourth")
    assert fake_server.requests[-1]["model"] == "other-model"
    shown = chatflow("sessions", "show", "ep", "--json").json()["session"]
    assert shown["model"] == "other-model" and shown["base_url"] == fake_server.url
    db = Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db"
    assert b"sk-" not in db.read_bytes()


# -- 22: --message-id scope -------------------------------------------------------------------------
def test_message_ids_scoped_per_session(chatflow, provider):
    a = chatflow("chat", "-s", "chat-100", "--message-id", "250", "--message-id-scope", "session", "hi")
    b = chatflow("chat", "-s", "chat-200", "--message-id", "250", "--message-id-scope", "session", "hi")
    assert a.returncode == 0 and b.returncode == 0, (a, b)
    assert len(provider.requests) == 2 and "already processed" not in b.stderr
    again = chatflow("chat", "-s", "chat-200", "--message-id", "250", "--message-id-scope", "session", "hi")
    assert again.returncode == 0 and "already processed" in again.stderr
    assert len(provider.requests) == 2


def test_message_ids_are_global_by_default(chatflow, provider):
    assert chatflow("chat", "-s", "wa-1", "--message-id", "wamid.1", "hi").returncode == 0
    r = chatflow("chat", "-s", "wa-2", "--message-id", "wamid.1", "hi")
    assert r.returncode == 0 and "already processed" in r.stderr
    assert len(provider.requests) == 1


def test_message_id_scope_from_config(chatflow, provider, config_file):
    config_file('message_id_scope = "session"\n')
    assert chatflow("chat", "-s", "t-1", "--message-id", "7", "hi").returncode == 0
    r = chatflow("chat", "-s", "t-2", "--message-id", "7", "hi")
    assert r.returncode == 0 and "already processed" not in r.stderr, r
    assert len(provider.requests) == 2


# -- 19: polish -------------------------------------------------------------------------------------
def test_help_shows_no_python_types(chatflow):
    for args in (["sessions", "show", "--help"], ["sessions", "delete", "--help"], ["replay", "--help"],
                 ["completion", "--help"], ["chat", "--help"], ["--help"]):
        r = chatflow(*args)
        assert r.returncode == 0, r
        for bad in ("<str>", "<list[str]>", "{ID}", "[ID...]...", "<float>", "<int>"):
            assert bad not in r.stdout, (args, bad, r.stdout)
    assert "Usage: chatflow sessions show [OPTIONS] ID\n" in chatflow("sessions", "show", "--help").stdout
    assert "Usage: chatflow sessions delete [OPTIONS] [ID]...\n" in chatflow("sessions", "delete", "--help").stdout


def test_config_show_prints_the_model_requests_use(chatflow):
    r = chatflow("config", "show", env={"OPENAI_API_KEY": "sk-test-0123456789"})
    assert r.returncode == 0, r
    assert re.search(r"^model\s+gpt-4o-mini$", r.stdout, re.M), r.stdout
    assert re.search(r"^base_url\s+https://api.openai.com/v1$", r.stdout, re.M)
    assert "sk-test-0123456789" not in r.stdout


def test_provider_error_lines_say_things_once(chatflow, provider):
    provider.add_error(400, body="Error: the prompt is too long")
    r = chatflow("chat", "-s", "e1", "hi")
    assert r.returncode == 5, r
    [line] = [ln for ln in r.stderr_lines if "error" in ln]
    assert line.startswith("chatflow: error: the server at") and "(HTTP 400): the prompt is too long" in line
    assert "Error: " not in line and "Error code" not in line


def test_sessions_ls_status_with_no_match_says_so(chatflow, provider):
    assert chatflow("sessions", "ls", "--status", "running").stderr.strip() == \
        'chatflow: no sessions yet: start one with chatflow chat "hello"'
    assert chatflow("chat", "-s", "x", "hi").returncode == 0
    r = chatflow("sessions", "ls", "--status", "running")
    assert r.returncode == 0 and r.stderr.strip() == "chatflow: no sessions match --status running", r


def test_new_session_named_with_s_is_announced_once(chatflow, provider):
    r = chatflow("chat", "-s", "wrok", "hi")
    assert r.returncode == 0
    assert "chatflow: new session wrok" in r.stderr
    r = chatflow("chat", "-s", "wrok", "again")
    assert "new session" not in r.stderr


def test_busy_session_error_mentions_wait(chatflow, provider):
    import subprocess

    provider.add_text("slow answer", chunks=["slow", " answer"], delay=[0, 15, 0, 0])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    first = subprocess.Popen([*COMMAND, "chat", "-s", "busy", "first"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = chatflow("sessions", "ls", "--json").json()
            if rows and rows[0]["status"] == "running":
                break
            time.sleep(0.05)
        r = chatflow("chat", "-s", "busy", "second")
        assert r.returncode == 4, r
        assert "is busy" in r.stderr and "--wait SECONDS" in r.stderr
    finally:
        first.communicate(timeout=30)


def test_one_shot_ctrl_c_is_not_printed_as_an_error(provider, chatflow):
    import signal
    import subprocess

    provider.add_text("partial words then more", chunks=["partial", " words", " then", " more"], delay=[0, 0, 5, 5])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([*COMMAND, "chat", "-s", "int", "go"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)
    seen = b""
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + 30
    while b"partial" not in seen and time.monotonic() < deadline:
        chunk = proc.stdout.read()
        seen += chunk or b""
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    text = err.decode()
    assert "chatflow: error" not in text and "interrupted" in text, text


def test_counts_agree_with_their_nouns(chatflow, provider):
    assert chatflow("chat", "-s", "n1", "hi").returncode == 0
    r = chatflow("sessions", "show", "n1")
    assert "1 turn " in r.stdout or "1 turn\n" in r.stdout or "1 turn ·" in r.stdout
    assert "1 turns" not in r.stdout


# -- 7: the one-shot spinner moves and says what it waits for --------------------------------------
SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def test_one_shot_spinner_animates_and_names_a_rate_limit_retry(provider):
    pexpect = _pexpect()
    provider.add_error(429, headers={"Retry-After": "2"}, message="slow down")
    provider.add_text("finally here")
    child = _spawn(["chat", "-s", "rl", "hi"])
    child.expect("rate limited, retrying in [12] s \\(2/3\\)")
    child.expect("finally here")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert len(provider.requests) == 2  # the retry was made


def test_one_shot_spinner_frames_change_while_waiting(provider):
    pexpect = _pexpect()
    provider.add_text("late", chunks=["late"], delay=[1.5, 0, 0])
    child = _spawn(["chat", "-s", "spin", "hi"])
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    text = child.before.decode("utf-8", "replace")
    frames = {c for c in text if c in SPINNER_FRAMES}
    assert len(frames) >= 3, text  # the spinner advanced while nothing arrived
    assert "thinking" in text and "late" in text


def test_one_shot_wait_names_the_busy_session_and_its_pid(provider, chatflow):
    import subprocess

    pexpect = _pexpect()
    provider.add_text("slow answer", chunks=["slow", " answer"], delay=[0, 8, 0, 0])
    provider.add_text("second answer")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    first = subprocess.Popen([*COMMAND, "chat", "-s", "bw", "first"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = chatflow("sessions", "ls", "--json").json()
            if rows and rows[0]["status"] == "running":
                break
            time.sleep(0.05)
        child = _spawn(["chat", "-s", "bw", "--wait", "30", "second"])
        # a turn runs: its owner's pid is named, also when this run joins the turn queue
        child.expect(f"session busy \\(pid {first.pid}\\), waiting up to 30 s")
        child.expect("second answer")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
    finally:
        first.communicate(timeout=30)


def test_a_session_whose_first_turn_failed_keeps_its_model_and_endpoint(chatflow, fake_server, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    fake_server.add_error(401)
    r = chatflow("chat", "-s", "f1", "--base-url", fake_server.url, "-m", "fake-model", "first fails")
    assert r.returncode == 5, r
    shown = chatflow("sessions", "show", "f1", "--json").json()["session"]
    assert (shown["model"], shown["base_url"]) == ("fake-model", fake_server.url)
    r = chatflow("chat", "-s", "f1", "resume")  # no flags: the session's own server, never the default one
    assert r.returncode == 0, r
    assert [q["model"] for q in fake_server.requests] == ["fake-model", "fake-model"]
