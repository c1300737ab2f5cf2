"""MCP server processes end with chatflow, however chatflow ends (issue 27): the real ``chatflow``
process, the fake model server and tests/mcp/toolbox.py made stubborn (it ignores SIGTERM and
the end of its stdin, and starts a child as stubborn)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.mcp.test_cli import _server_toml
from tests.mcp.test_servers import alive


def _kill_all(pidfile: Path) -> None:
    for pid in pidfile.read_text().split() if pidfile.exists() else ():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_stubborn_server_and_its_child_end_when_chatflow_is_killed(provider, config_file, tmp_path):
    from tests.hardening import harness as h

    log, pidfile = tmp_path / "log", tmp_path / "pids"
    config_file(_server_toml(approval="always", TOOLBOX_LOG=str(log), TOOLBOX_PIDFILE=str(pidfile),
                             TOOLBOX_STUBBORN="1", TOOLBOX_CHILD="1"))
    provider.add_tool_calls([("call_1", "toolbox__hang", "{}")])
    proc = h.spawn("chat", "-s", "k9", "hang")
    try:
        h.wait_for(lambda: log.exists() and "hang started" in log.read_text(), proc=proc, what="the call")
        pids = [int(p) for p in pidfile.read_text().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)  # the server and its child
        h.kill9(proc)  # no clean-up of any kind runs in chatflow
        h.wait_for(lambda: not any(alive(p) for p in pids), timeout=15, what="the server and its child to end")
    finally:
        _kill_all(pidfile)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_an_idle_stubborn_server_ends_when_the_process_that_started_it_is_killed(tmp_path):
    """Between calls the server only gets its stdin's end, which it ignores, as it ignores SIGTERM."""
    import subprocess

    from tests.helpers.wait import wait_until
    from tests.mcp.test_servers import TOOLBOX

    pidfile = tmp_path / "pids"
    script = ("import os, signal, sys\n"
              "from chatflow_cli.core.mcp import MCPServerStdio\n"
              f"server = MCPServerStdio({{'command': sys.executable, 'args': [{TOOLBOX!r}], 'env': "
              f"{{'TOOLBOX_PIDFILE': {str(pidfile)!r}, 'TOOLBOX_STUBBORN': '1', 'TOOLBOX_CHILD': '1'}}}}, name='t')\n"
              "server.start()\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    try:
        proc = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True, text=True)
        assert proc.returncode == -signal.SIGKILL, proc
        pids = [int(p) for p in pidfile.read_text().split()]
        assert len(pids) == 2
        wait_until(lambda: not any(alive(p) for p in pids), 15, "the server and its child to end")
    finally:
        _kill_all(pidfile)


def test_stopping_a_stubborn_server_ends_it_and_its_child(tmp_path):
    import time

    from tests.helpers.wait import wait_until
    from tests.mcp.test_servers import stdio

    pidfile = tmp_path / "pids"
    server = stdio(env={"TOOLBOX_PIDFILE": str(pidfile), "TOOLBOX_STUBBORN": "1", "TOOLBOX_CHILD": "1"})
    try:
        server.start()
        pids = [int(p) for p in pidfile.read_text().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        began = time.monotonic()
        server.stop()  # its stdin's end and SIGTERM are ignored: SIGKILL to the group
        assert time.monotonic() - began < 8
        wait_until(lambda: not any(alive(p) for p in pids), 5, "the killed group to be gone")
    finally:
        _kill_all(pidfile)


def test_servers_are_stopped_all_at_once(tmp_path):
    """A server may take a while to exit once its stdin ends: a Runner closing, ``mcp ls`` and
    ``agents ls`` stop their servers together, not one after another."""
    import time

    from chatflow_cli.core.mcp import start_all
    from chatflow_cli.core.mcp.servers import stop_all
    from tests.helpers.wait import wait_until
    from tests.mcp.test_servers import stdio

    pidfile = tmp_path / "pids"
    servers = [stdio(f"slow{i}", env={"TOOLBOX_PIDFILE": str(pidfile), "TOOLBOX_EXIT_DELAY": "1.5"})
               for i in range(3)]
    try:
        assert start_all(servers) == {}
        began = time.monotonic()
        stop_all(servers)
        assert time.monotonic() - began < 4.0  # one after another: 4.5 s at least
        pids = [int(p) for p in pidfile.read_text().split()]
        assert len(pids) == 3
        wait_until(lambda: not any(alive(p) for p in pids), 5, "the servers to be gone")
    finally:
        _kill_all(pidfile)
