"""A server's tools are known between runs (issue 27: "a one-shot chat that uses no MCP tool pays
nothing for configured servers"): the real ``chatflow`` process, the fake model server and
tests/mcp/toolbox.py; a server starts when the model calls one of its tools, and its tools
listed then replace those kept."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from chatflow_cli.core.mcp import MCPServerStdio
from tests.mcp.test_cli import _server_toml
from tests.mcp.test_servers import TOOLBOX, alive


def _offered(request: dict) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or ()}


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_a_chat_that_calls_no_server_tool_starts_no_server_once_their_tools_are_known(chatflow, provider, config_file,
                                                                                        tmp_path):
    first, second = tmp_path / "first-pids", tmp_path / "second-pids"
    config_file(_server_toml("toolbox", approval="always", TOOLBOX_PIDFILE=str(first))
                + _server_toml("other", approval="always", TOOLBOX_PIDFILE=str(second)))
    provider.add_text("One.")
    r = chatflow("chat", "-s", "c1", "hi")  # the first time: started, to list their tools
    assert r.returncode == 0 and r.stdout == "One.\n", r
    assert len(_pids(first)) == 1 and len(_pids(second)) == 1
    assert {"toolbox__echo", "other__echo"} <= _offered(provider.requests[-1])
    provider.add_text("Two.")
    r = chatflow("chat", "-s", "c1", "again")
    assert r.returncode == 0 and r.stdout == "Two.\n", r
    assert len(_pids(first)) == 1 and len(_pids(second)) == 1  # nothing started
    assert _offered(provider.requests[-1]) == _offered(provider.requests[-2])  # the same tools, kept
    assert not any(alive(p) for p in _pids(first) + _pids(second))
    kept = list((Path(os.environ["CHATFLOW_HOME"]) / "cache" / "mcp-tools").glob("*.json"))
    assert len(kept) == 1  # the two servers have the same definition but for the values of their env
    text = kept[0].read_text()
    assert '"echo"' in text and str(first) not in text and str(second) not in text and TOOLBOX not in text
    assert oct(kept[0].stat().st_mode & 0o777) == oct(0o600)


def test_a_kept_tool_starts_its_server_when_called_and_one_gone_since_is_a_clear_tool_error(chatflow, provider,
                                                                                            config_file, tmp_path):
    pidfile = tmp_path / "pids"
    config_file(_server_toml(approval="always", TOOLBOX_PIDFILE=str(pidfile), TOOLBOX_ALIASES="gone"))
    listed = chatflow("mcp", "ls")  # lists (and keeps) its tools, "gone" among them
    assert listed.returncode == 0 and "toolbox__gone" in listed.stdout, listed
    config_file(_server_toml(approval="always", TOOLBOX_PIDFILE=str(pidfile), TOOLBOX_ALIASES=""))
    provider.add_tool_calls([("call_1", "toolbox__gone", '{"text": "x"}'), ("call_2", "toolbox__echo", '{"text": "y"}')])
    provider.add_text("Done.")
    r = chatflow("chat", "-s", "g1", "--output", "jsonl", "go")
    assert r.returncode == 0, r
    assert {"toolbox__gone", "toolbox__echo"} <= _offered(provider.requests[-2])  # the kept tools
    results = {m["tool_call_id"]: m["content"] for m in provider.requests[-1]["messages"] if m["role"] == "tool"}
    assert results["call_2"] == "y"
    assert results["call_1"].startswith("Error: MCP server 'toolbox' has no tool 'gone' any more"), results
    assert "toolbox__gone" not in _offered(provider.requests[-1])  # the tools it listed when it started
    pids = _pids(pidfile)
    assert len(pids) == 2 and not any(alive(p) for p in pids)  # mcp ls, then the call: stopped at the end
    provider.add_text("Again.")
    r = chatflow("chat", "-s", "g1", "again")
    assert r.returncode == 0, r
    assert "toolbox__gone" not in _offered(provider.requests[-1]) and "toolbox__echo" in _offered(provider.requests[-1])
    assert len(_pids(pidfile)) == 2


def test_a_library_server_with_a_tools_cache_offers_its_tools_before_it_starts(tmp_path):
    def made() -> MCPServerStdio:
        return MCPServerStdio({"command": sys.executable, "args": [TOOLBOX]}, name="box", tools_cache=tmp_path)

    first = made()
    assert first.known_tools() is None
    try:
        first.start()
    finally:
        first.stop()
    second = made()
    try:
        tools = second.agent_tools()
        assert "box__echo" in tools and not second.running  # known, not started
        assert tools["box__echo"].invoke({"text": "hi"}) == "hi" and second.running
    finally:
        second.stop()


def test_a_kept_server_that_does_not_start_at_a_call_says_why_and_is_then_started_before_a_request(tmp_path):
    from chatflow_cli.core.mcp import MCPServerError, start_all

    def made(broken: str) -> MCPServerStdio:  # the same definition: the env's names, not its values
        return MCPServerStdio({"command": sys.executable, "args": [TOOLBOX], "env": {"TOOLBOX_BROKEN": broken}},
                              name="box", tools_cache=tmp_path)

    first = made("")
    try:
        first.start()
    finally:
        first.stop()
    second = made("the database is gone")
    try:
        echo = second.agent_tools()["box__echo"]  # kept, not started
        with pytest.raises(MCPServerError, match=r"'box' did not start: .*the database is gone"):
            echo.invoke({"text": "hi"})
        assert second.known_tools() is None  # no longer offered as kept
        assert "the database is gone" in start_all([second])["box"]
    finally:
        second.stop()
