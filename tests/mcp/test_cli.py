"""MCP servers from the command line: the real ``chatflow`` process, the fake model server and
the test server (tests/mcp/toolbox.py) started by chatflow over stdio (issue 27)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from tests.mcp.test_servers import TOOLBOX, alive


def _server_toml(name: str = "toolbox", approval: str | None = None, timeout: float = 5, **env: str) -> str:
    lines = [f"[mcp_servers.{name}]", f"command = {json.dumps(sys.executable)}", f"args = [{json.dumps(TOOLBOX)}]",
             f"timeout = {timeout}"]
    if approval:
        lines.append(f'approval = "{approval}"')
    if env:
        lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }")
    return "\n".join(lines) + "\n"


def test_a_model_calls_a_server_tool_and_no_server_process_is_left(chatflow, provider, config_file, tmp_path):
    pidfile = tmp_path / "pids"
    config_file(_server_toml(approval="always", TOOLBOX_PIDFILE=str(pidfile)))
    provider.add_tool_calls([("call_1", "toolbox__echo", '{"text": "from the server"}')])
    provider.add_text("The server said it.")
    r = chatflow("chat", "-s", "m1", "--output", "jsonl", "say it")
    assert r.returncode == 0, r
    finished = [e for e in r.jsonl() if e["type"] == "tool.call_finished"]
    assert finished[0]["data"]["output"] == "from the server" and finished[0]["data"]["is_error"] is False
    assert provider.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1",
                                                     "content": "from the server"}
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 1 and not alive(pids[0])  # the one-shot chat stopped its server


def test_ask_ends_the_run_pending_and_approve_or_deny_continue_it(chatflow, provider, config_file):
    config_file(_server_toml())  # approval: "ask", the default
    provider.add_tool_calls([("call_1", "toolbox__echo", '{"text": "yes"}'),
                             ("call_2", "toolbox__fail", '{"reason": "no"}')])
    r = chatflow("chat", "-s", "m2", "please")
    assert r.returncode == 0, r
    assert "--approve call_1" in r.stderr and "--deny call_2" in r.stderr
    assert 'tool toolbox__echo (server toolbox) {"text": "yes"} waits for your approval' in r.stderr, r
    assert len(provider.requests) == 1
    early = chatflow("chat", "-s", "m2", "and another thing")  # a message while approvals are pending
    assert early.returncode != 0 and "waits for an approval of call_1, call_2 (--approve ID or --deny ID)" in \
        early.stderr and "tool results" not in early.stderr, early
    wrong = chatflow("chat", "-s", "m2", "--approve", "call_9")
    assert wrong.returncode == 2 and "no tool call call_9 waits" in wrong.stderr
    shown = chatflow("sessions", "show", "m2")
    assert "waiting for approval (--approve call_1 / --deny call_1)" in shown.stdout, shown
    assert "--tool-result" not in shown.stdout
    bypass = chatflow("chat", "-s", "m2", "--tool-result", "call_1", "made up")  # the tool never ran
    assert bypass.returncode == 2 and "--approve call_1" in bypass.stderr and "--deny call_1" in bypass.stderr
    provider.add_text("Thanks.")
    r2 = chatflow("chat", "-s", "m2", "--approve", "call_1", "--deny", "call_2")
    assert r2.returncode == 0, r2
    assert r2.stdout == "Thanks.\n"
    sent = provider.requests[-1]["messages"]
    assert sent[-2] == {"role": "tool", "tool_call_id": "call_1", "content": "yes"}
    assert "the user declined it" in sent[-1]["content"]


def test_a_misspelt_tool_in_tools_or_tool_approval_is_said_once(chatflow, provider, config_file):
    config_file(_server_toml(approval="always") + 'tools = ["echo", "ech0"]\ntool_approval = { fial = "never" }\n')
    listed = chatflow("mcp", "ls")
    assert listed.returncode == 0, listed
    warning = "MCP server 'toolbox' has no tool 'ech0' (in tools), 'fial' (in tool_approval)"
    assert listed.stderr.count(warning) == 1, listed
    provider.add_tool_calls([("call_1", "toolbox__echo", '{"text": "hi"}')])
    provider.add_text("Done.")
    r = chatflow("chat", "-s", "w1", "say hi")
    assert r.returncode == 0 and r.stdout == "Done.\n", r
    assert r.stderr.count(warning) == 1, r  # two requests in the turn, one warning


def test_a_pasted_mcpservers_file_secrets_from_a_vault_and_mcp_ls(chatflow, provider, config_file, tmp_path):
    secret = "tok-sup3r-s3cret-value"
    assert chatflow("vault", "create", "work").returncode == 0
    assert chatflow("vault", "set", "work", "toolbox_token", input=secret + "\n").returncode == 0
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {
        "toolbox": {"command": sys.executable, "args": [TOOLBOX], "env": {"TOOLBOX_TOKEN": "vault:work/toolbox_token"},
                    "approval": "always"},
        "broken": {"command": sys.executable, "args": [TOOLBOX], "env": {"TOOLBOX_BROKEN": "cannot open the db"}},
    }}))
    config_file(f'mcp_config = {json.dumps(str(tmp_path / "mcp.json"))}\n')
    listed = chatflow("mcp", "ls", "--json")
    assert listed.returncode == 0, listed
    rows = {row["name"]: row for row in listed.json()}
    assert rows["toolbox"]["starts"] is True and rows["toolbox"]["env"] == ["TOOLBOX_TOKEN"]
    assert {"name": "toolbox__echo", "server_name": "echo", "description": "Say the text back.",
            "approval": "always"} in rows["toolbox"]["tools"]
    assert rows["broken"]["starts"] is False and "cannot open the db" in rows["broken"]["error"]
    agents = chatflow("agents", "ls", "--json")
    assert {"name": "toolbox__token", "kind": "mcp", "server": "toolbox", "approval": "always"} in \
        agents.json()[0]["tools"]
    provider.add_tool_calls([("call_1", "toolbox__token", "{}")])
    provider.add_text("Done.")
    r = chatflow("chat", "-s", "m3", "--output", "jsonl", "--debug", "what is the token?")
    assert r.returncode == 0, r
    unavailable = [e["data"] for e in r.jsonl() if e["type"] == "mcp.unavailable"]  # said once, the turn went on
    assert len(unavailable) == 1 and unavailable[0]["server"] == "broken"
    assert "cannot open the db" in unavailable[0]["error"]
    assert provider.requests[-1]["messages"][-1]["content"] == "token is [redacted]"
    assert secret not in r.stdout + r.stderr
    exported = chatflow("sessions", "export", "m3")
    assert exported.returncode == 0 and secret not in exported.stdout
    written = [p for p in Path(os.environ["CHATFLOW_HOME"]).rglob("*")
               if p.is_file() and p.name != "vault-secrets.json"]  # the vault's own file holds it
    assert written and not [p for p in written if secret.encode() in p.read_bytes()]


def test_the_repl_asks_yes_no_always_and_leaves_no_server_behind(provider, config_file, pty_chatflow, tmp_path):
    from tests.helpers.pty_driver import leave

    pidfile = tmp_path / "pids"
    config_file(_server_toml(TOOLBOX_PIDFILE=str(pidfile)))
    provider.add_tool_calls([("call_1", "toolbox__echo", '{"text": "one"}')])
    provider.add_text("First.")
    provider.add_tool_calls([("call_2", "toolbox__echo", '{"text": "two"}')])
    provider.add_text("Second.")
    provider.add_tool_calls([("call_3", "toolbox__pid", "{}")])
    provider.add_text("Third.")
    repl = pty_chatflow("chat", "-s", "r1")
    repl.wait_prompt()
    repl.send("one\r")
    repl.wait_text("allow toolbox__echo (server toolbox)? [y/n/a]")
    repl.send("a\r")  # always: call_2 of the same tool is not asked about
    repl.wait_prompt_after("First.")
    repl.send("two\r")
    repl.wait_prompt_after("Second.")
    repl.send("three\r")
    repl.wait_text("allow toolbox__pid (server toolbox)? [y/n/a]")
    repl.send("n\r")
    repl.wait_prompt_after("Third.")
    assert "allow toolbox__echo" not in repl.raw.split("First.", 1)[1]  # "always" held for call_2
    screen = repl.screen()  # approved, run without asking, declined: each call shows as it ran
    approved, unasked, declined = screen.split("First.")[0], screen.split("First.")[1], screen.split("Second.")[1]
    assert 'called toolbox__echo {"text": "one"}' in approved and "↳ one" in approved, screen
    assert 'called toolbox__echo {"text": "two"}' in unasked and "↳ two" in unasked, screen
    assert "called toolbox__pid" in declined and "✗ error:" in declined and "the user declined it" in declined, screen
    leave(repl)
    tools = [m for m in provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tools[:2]] == ["one", "two"] and "the user declined it" in tools[2]["content"]
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 1 and not alive(pids[0])  # one server for the whole REPL, stopped on exit


def test_a_python_tool_configured_to_ask_waits_for_approve(chatflow, provider, config_file):
    path = config_file('[[agents]]\nname = "Calc"\ntools = ["calctools:add_numbers"]\n'
                       'tool_approval = { add_numbers = "ask" }\n')
    (path.parent / "calctools.py").write_text("def add_numbers(a: int, b: int) -> int:\n    return a + b\n")
    provider.add_tool_calls([("call_1", "add_numbers", '{"a": 2, "b": 3}')])
    r = chatflow("chat", "-s", "p1", "--json", "add")
    assert r.returncode == 0 and r.json()["awaiting_approval"] == ["call_1"], r
    provider.add_text("Five.")
    r2 = chatflow("chat", "-s", "p1", "--approve", "call_1")
    assert r2.returncode == 0 and r2.stdout == "Five.\n", r2
    assert provider.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}


def test_a_hung_up_repl_leaves_no_server_behind(provider, config_file, pty_chatflow, tmp_path):
    import signal

    pidfile = tmp_path / "pids"
    config_file(_server_toml(approval="always", TOOLBOX_PIDFILE=str(pidfile)))
    provider.add_tool_calls([("call_1", "toolbox__echo", '{"text": "one"}')])
    provider.add_text("First.")
    repl = pty_chatflow("chat", "-s", "h1")
    repl.wait_prompt()
    repl.send("one\r")
    repl.wait_prompt_after("First.")
    repl.child.kill(signal.SIGHUP)
    assert repl.wait_exit() == 129
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 1 and not alive(pids[0])


def _killed_during_a_call(provider, config_file, tmp_path, session: str) -> None:
    """``chat -s SESSION`` killed (SIGKILL) while an always-allowed server call runs: the call is
    left with no result and no tool.pending; the server, which the kill leaves to its keeper,
    is ended here too."""
    import signal

    from tests.hardening import harness as h

    log, pidfile = tmp_path / "log", tmp_path / "pids"
    config_file(_server_toml(approval="always", TOOLBOX_LOG=str(log), TOOLBOX_PIDFILE=str(pidfile)))
    provider.add_tool_calls([("call_1", "toolbox__hang", "{}")])
    proc = h.spawn("chat", "-s", session, "hang")
    try:
        h.wait_for(lambda: log.exists() and "hang started" in log.read_text(), proc=proc, what="the call")
        h.kill9(proc)
    finally:
        for pid in pidfile.read_text().split() if pidfile.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def test_a_server_call_left_open_by_a_crash_waits_for_no_approval(chatflow, provider, config_file, tmp_path):
    _killed_during_a_call(provider, config_file, tmp_path, "k1")
    shown = chatflow("sessions", "show", "k1")  # its policy was always: it waits for no approval
    assert "waiting for approval" not in shown.stdout and "--tool-result" not in shown.stdout, shown
    assert "no result: the run ended during this call" in shown.stdout, shown
    for answer in ("--approve", "--deny"):
        refused = chatflow("chat", "-s", "k1", answer, "call_1")
        assert refused.returncode == 2 and "waits for no approval" in refused.stderr, refused
    bypass = chatflow("chat", "-s", "k1", "--tool-result", "call_1", "made up")
    assert bypass.returncode == 2 and "takes no result" in bypass.stderr, bypass
    provider.add_text("Noted.")
    going_on = chatflow("chat", "-s", "k1", "go on")  # the next message records it as interrupted
    assert going_on.returncode == 0 and going_on.stdout == "Noted.\n", going_on
    assert provider.requests[-1]["messages"][-2]["tool_call_id"] == "call_1"
    assert "Interrupted" in provider.requests[-1]["messages"][-2]["content"]


def test_the_repl_does_not_ask_about_a_call_a_killed_run_left_open(provider, config_file, pty_chatflow, tmp_path):
    from tests.helpers.pty_driver import leave

    _killed_during_a_call(provider, config_file, tmp_path, "k2")
    provider.add_text("Noted.")
    repl = pty_chatflow("chat", "-s", "k2")
    repl.wait_prompt()
    assert "no result: the run ended during this call" in repl.screen() and "y/n/a" not in repl.screen()
    repl.send("go on\r")
    repl.wait_prompt_after("Noted.")
    assert "allow toolbox__hang" not in repl.screen() and "waiting for" not in repl.screen()
    leave(repl)
    assert "Interrupted" in provider.requests[-1]["messages"][-2]["content"]


_REFUSING = """
import http.server, sys
class Refuse(http.server.BaseHTTPRequestHandler):
    def refuse(self):
        self.send_response(401)
        self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Content-Length", "0")
        self.end_headers()
    do_GET = do_POST = do_DELETE = refuse
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Refuse)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_an_http_server_refusing_the_token_names_the_http_status(chatflow, config_file):
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", _REFUSING], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        config_file(f'[mcp_servers.web]\nurl = "http://127.0.0.1:{port}/mcp"\n'
                    'headers = { Authorization = "Bearer wrong" }\n')
        listed = chatflow("mcp", "ls", "--json")
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    error = {row["name"]: row for row in listed.json()}["web"]["error"]
    assert "(HTTP 401 Unauthorized)" in error, error


def test_an_error_quotes_only_the_stderr_and_stdout_noise_of_its_own_call_once(chatflow, provider, config_file):
    config_file(_server_toml(approval="always", timeout=2))
    for number, (tool, args) in enumerate([("grumble", "{}"), ("noise", "{}"), ("hang", "{}"),
                                           ("grumble", '{"exit": true}'), ("crash", "{}")]):
        provider.add_tool_calls([(f"call_{number}", f"toolbox__{tool}", args)])
    provider.add_text("Done.")
    r = chatflow("chat", "-s", "e1", "--output", "jsonl", "go")
    assert r.returncode == 0, r
    out = [e["data"]["output"] for e in r.jsonl() if e["type"] == "tool.call_finished"]
    assert out[:2] == ["grumbled", "noisy but fine"], out
    timeout = out[2]  # the earlier call's stderr is not this call's: not quoted
    assert "did not answer the call to hang within 2 s" in timeout and "stderr" not in timeout, timeout
    assert "it also printed 1 line of other text on stdout, which is for MCP messages only (the last: " \
        "'this is not JSON-RPC')" in timeout, timeout
    exited = out[3]  # its traceback said by its exception line, no box, and the stdout noise not again
    assert exited.endswith("; its stderr ended with: ValueError: disk full"), exited
    assert "stdout" not in exited and "│" not in exited and "╰" not in exited, exited
    assert out[4].endswith("; its stderr ended with: toolbox: crashing on purpose"), out[4]
