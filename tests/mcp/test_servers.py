"""MCP servers as tool sources, in the library: real servers (tests/mcp/toolbox.py, the SDK's
own server) over stdio and streamable HTTP, and a Runner whose agent uses one (issue 27)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.mcp import (
    MAX_RESULT_CHARS,
    MCPServerError,
    MCPServerStdio,
    MCPServerStreamableHttp,
    start_all,
    tool_name,
)
from chatflow_cli.core.memory.inmemory import SessionStore
from chatflow_cli.core.model import ModelClient
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.tools import ToolCallFailed

TOOLBOX = str(Path(__file__).with_name("toolbox.py"))


def stdio(name: str = "toolbox", env: dict[str, str] | None = None, **options: Any) -> MCPServerStdio:
    return MCPServerStdio({"command": sys.executable, "args": [TOOLBOX], "env": env or {}}, name=name, **options)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_tool_names_are_safe_unique_and_the_same_every_time():
    assert tool_name("time", "get_current_time") == "time__get_current_time"
    odd = tool_name("my.server", "do thing")
    assert re.match(r"^[A-Za-z0-9_-]{1,64}$", odd) and odd == tool_name("my.server", "do thing")
    assert tool_name("a", "x.y") != tool_name("a", "x_y")  # two tools whose names differ keep names that differ
    assert tool_name("a", "x") != tool_name("b", "x")  # two servers with a tool of the same name
    long = tool_name("s", "t" * 100)
    assert len(long) <= 64 and long != tool_name("s", "t" * 99)


def test_two_servers_whose_names_would_meet_keep_two_tools_each_on_its_own_server():
    # server "a" with a tool "x__echo" and server "a__x" with a tool "echo": both were "a__x__echo"
    first, second = stdio("a", env={"TOOLBOX_ALIASES": "x__echo"}), stdio("a__x")
    try:
        assert start_all([first, second]) == {}
        offered = [(name, tool) for server in (first, second) for name, tool in server.agent_tools().items()
                   if tool.remote_name in ("x__echo", "echo")]
        names = [name for name, _ in offered]
        assert len(names) == 3 and len(set(names)) == 3, names  # a__echo, a's x__echo, a__x's echo
        assert all(re.match(r"^[A-Za-z0-9_-]{1,64}$", n) for n in names) and "a__echo" in names
        said = {(t.server.name, t.remote_name): t.invoke({"text": "hi"}) for _, t in offered}
        assert said[("a", "x__echo")] == "x__echo: hi" and said[("a__x", "echo")] == "hi"
        assert tool_name("a", "x__echo") == tool_name("a", "x__echo") != tool_name("a__x", "echo")
        assert tool_name("a_", "_b") != tool_name("a", "__b")
    finally:
        first.stop()
        second.stop()


def test_a_stdio_server_gives_results_and_every_fault_is_a_tool_error(tmp_path):
    pidfile = tmp_path / "pids"
    server = stdio(env={"TOOLBOX_PIDFILE": str(pidfile)}, timeout=2)
    try:
        tools = server.agent_tools()
        assert {"toolbox__echo", "toolbox__crash", "toolbox__hang"} <= set(tools)
        assert tools["toolbox__echo"].description == "Say the text back."
        assert tools["toolbox__echo"].parameters["properties"]["text"]["type"] == "string"
        assert tools["toolbox__echo"].invoke('{"text": "hi"}') == "hi"
        assert json.loads(tools["toolbox__add"].invoke({"a": 2, "b": 3})) == {"sum": 5}  # structured content
        with pytest.raises(ToolCallFailed, match=r"fail \(MCP server 'toolbox'\) returned an error: .*boom"):
            tools["toolbox__fail"].invoke({"reason": "boom"})  # isError
        big = tools["toolbox__huge"].invoke({"size": MAX_RESULT_CHARS + 500})
        assert big.startswith("0123456789") and "[cut: the result has 20,500 characters" in big
        assert len(big.whole) == MAX_RESULT_CHARS + 500  # type: ignore[attr-defined]  # kept whole for the log
        assert tools["toolbox__picture"].invoke({}) == "[image image/png, 100 bytes: not shown to the model]"
        assert tools["toolbox__noise"].invoke({}) == "noisy but fine"  # a garbage line is survived
        with pytest.raises(MCPServerError, match=r"'toolbox' returned a malformed result for malformed"):
            tools["toolbox__malformed"].invoke({})
        began = time.monotonic()
        with pytest.raises(MCPServerError, match=r"'toolbox' did not answer the call to hang within 2 s"):
            tools["toolbox__hang"].invoke({})
        assert time.monotonic() - began < 10
        assert tools["toolbox__echo"].invoke({"text": "still here"}) == "still here"  # kept after a timeout
        first = tools["toolbox__pid"].invoke({})
        with pytest.raises(MCPServerError) as crashed:
            tools["toolbox__crash"].invoke({})
        assert "'toolbox' exited" in str(crashed.value) and "toolbox: crashing on purpose" in str(crashed.value)
        assert tools["toolbox__pid"].invoke({}) != first  # the next call started it again
    finally:
        server.stop()
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_a_real_server_from_the_package_index_mcp_server_time():
    server = MCPServerStdio({"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone=UTC"]},
                            name="time")
    try:
        tools = server.agent_tools()
        assert {"time__get_current_time", "time__convert_time"} <= set(tools)
        answer = json.loads(tools["time__get_current_time"].invoke({"timezone": "Asia/Tokyo"}))
        assert answer["timezone"] == "Asia/Tokyo" and answer["datetime"].endswith("+09:00")
        with pytest.raises(ToolCallFailed, match=r"get_current_time \(MCP server 'time'\) returned an error: .*Mars"):
            tools["time__get_current_time"].invoke({"timezone": "Mars/Olympus"})
    finally:
        server.stop()


def test_servers_that_do_not_start_say_why_and_others_start_beside_them():
    broken = stdio("broken", env={"TOOLBOX_BROKEN": "no database at /nowhere"})
    missing = MCPServerStdio({"command": "/nonexistent/mcp-server"}, name="missing")
    fine = stdio("fine")
    try:
        errors = start_all([broken, missing, fine])
        assert set(errors) == {"broken", "missing"}
        assert "'broken' did not start" in errors["broken"] and "no database at /nowhere" in errors["broken"]
        assert "'missing' did not start: its command was not found" in errors["missing"]
        assert fine.running and "fine__echo" in fine.agent_tools()
    finally:
        for server in (broken, missing, fine):
            server.stop()


def test_garbage_on_stdout_is_counted_apart_from_the_stderr_tail():
    script = ("import sys; print('garbage one'); print(); print('garbage two', flush=True); "
              "sys.stderr.write('real error line\\n')")
    server = MCPServerStdio({"command": sys.executable, "args": ["-c", script]}, name="g", start_timeout=10)
    try:
        error = start_all([server])["g"]
    finally:
        server.stop()  # a failed start keeps its stderr file open until stop()
    assert error == ("MCP server 'g' did not start: it exited, or closed the connection, before answering; it also "
                     "printed 2 lines of other text on stdout, which is for MCP messages only (the last: 'garbage "
                     "two'); its stderr ended with: real error line"), error


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_streamable_http_server_with_a_header_from_the_environment(monkeypatch):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, TOOLBOX, "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        url = "http://127.0.0.1:${TOOLBOX_PORT}/mcp"  # expanded when it starts, as in .mcp.json
        monkeypatch.setenv("TOOLBOX_HEADER", "header-value-123")
        monkeypatch.setenv("TOOLBOX_PORT", str(port))
        server = MCPServerStreamableHttp({"url": url, "headers": {"X-Token": "env:TOOLBOX_HEADER"}}, name="web")
        assert server.describe() == url
        unset = MCPServerStreamableHttp({"url": url, "headers": {"X-Token": "Bearer ${UNSET_TOOLBOX_VAR}"}},
                                        name="nokey")
        try:
            assert server.agent_tools()["web__echo"].invoke({"text": "over http"}) == "over http"
            with pytest.raises(MCPServerError, match=r"'nokey'.*UNSET_TOOLBOX_VAR is not set"):
                unset.start()
        finally:
            server.stop()
            unset.stop()
    finally:
        proc.terminate()
        proc.wait(10)


def test_an_agent_calls_a_server_tool_after_an_approval(fake_server):
    client = ModelClient(fake_server.url, "k", max_retries=0, timeout=20)
    server = stdio()
    agent = Agent("Clock", "Use the tools.", mcp_servers=[server])
    store = SessionStore()
    runner = Runner(agent, store, model_client=client, default_model="fake-model")
    try:
        fake_server.add_tool_calls([("call_1", "toolbox__echo", '{"text": "approved"}'),
                                    ("call_2", "toolbox__echo", '{"text": "denied"}')])
        result = runner.run("s1", "echo twice")
        assert result.content is None and [c.id for c in result.approval_tool_calls] == ["call_1", "call_2"]
        assert "toolbox__echo" in [t["function"]["name"] for t in fake_server.requests[0]["tools"]]
        assert runner.approve_tool_call("s1", "call_1") is None  # call_2 still waits
        fake_server.add_text("Done.")
        assert runner.deny_tool_call("s1", "call_2").content == "Done."  # type: ignore[union-attr]
        sent = fake_server.requests[-1]["messages"]
        assert sent[-2] == {"role": "tool", "tool_call_id": "call_1", "content": "approved"}
        assert sent[-1]["tool_call_id"] == "call_2" and "the user declined it" in sent[-1]["content"]
        # an approver (what the REPL asks with): "always" stops asking about that tool
        asked: list[str] = []
        runner.approver = lambda call, tool: asked.append(call.id) or "always"
        fake_server.add_tool_calls([("call_3", "toolbox__echo", '{"text": "a"}')])
        fake_server.add_tool_calls([("call_4", "toolbox__echo", '{"text": "b"}')])
        fake_server.add_text("Both.")
        assert runner.run("s1", "again").content == "Both." and asked == ["call_3"]
        # a result over the limit: cut for the model, stored whole beside the call
        fake_server.add_tool_calls([("call_5", "toolbox__huge", '{"size": 25000}')])
        fake_server.add_text("Big.")
        assert runner.run("s1", "big").content == "Big." and asked == ["call_3", "call_5"]
        assert "[cut: the result has 25,000 characters" in fake_server.requests[-1]["messages"][-1]["content"]
        whole = [e.payload for e in store.events("s1") if e.type == "mcp.output"]
        assert [(w["tool_use_id"], len(w["output"])) for w in whole] == [("call_5", 25000)]
        forked = store.fork("s1", into="s1-fork")  # the cut result's note says it is kept: in the fork too
        assert [e.payload for e in store.events(forked.session_id) if e.type == "mcp.output"] == whole
        assert not [e for e in store.events(store.fork("s1", 2, into="s1-early").session_id)
                    if e.type == "mcp.output"]  # not for turns left out
    finally:
        runner.close()
    assert not server.running


def test_an_interrupt_cancels_the_call_on_the_server_which_stays_usable(fake_server, tmp_path):
    import threading

    from chatflow_cli.core.errors import RunInterrupted

    log = tmp_path / "log"
    server = stdio(env={"TOOLBOX_LOG": str(log)}, approval="always")
    runner = Runner(Agent("A", "", mcp_servers=[server]), SessionStore(),
                    model_client=ModelClient(fake_server.url, "k", max_retries=0, timeout=20), default_model="m")
    try:
        server.start()
        fake_server.add_tool_calls([("call_h", "toolbox__hang", "{}")])
        cancel = threading.Event()

        def noted(text: str) -> bool:
            deadline = time.monotonic() + 30
            while not (log.exists() and text in log.read_text()) and time.monotonic() < deadline:
                time.sleep(0.02)
            return log.exists() and text in log.read_text()

        threading.Thread(target=lambda: noted("hang started") and cancel.set(), daemon=True).start()
        with pytest.raises(RunInterrupted):
            runner.run("s1", "hang", cancel=cancel)
        assert noted("hang cancelled")  # notifications/cancelled reached the server
        assert server.agent_tools()["toolbox__echo"].invoke({"text": "alive"}) == "alive"
        fake_server.add_text("ok")
        assert runner.run("s1", "again").content == "ok"  # the history stayed valid
    finally:
        runner.close()
