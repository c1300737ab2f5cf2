"""``chatflow local status`` and ``chatflow local stop``: the warm servers of a data directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._process import pid_alive, terminate
from .state import Flock, is_healthy, is_server, read_state, server_pid, state_files

__all__ = ["WarmServerInfo", "local_servers", "stop_local_servers"]


@dataclass(frozen=True)
class WarmServerInfo:
    """One warm server of a data directory, as :func:`local_servers` reports it."""

    pid: int
    port: int
    base_url: str
    model: str
    version: str
    keep_alive: float
    started_at: float
    healthy: bool
    state_file: str
    log: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def local_servers(data_dir: str | os.PathLike[str]) -> list[WarmServerInfo]:
    """The warm servers recorded in ``data_dir`` that are alive (each health-checked with
    its token). Stale state files (a dead pid, a port answered by someone else, a wrong
    token) are reported with ``healthy=False``; nothing is changed."""
    found = []
    for path in state_files(data_dir):
        state = read_state(path)
        if state is None:
            continue
        try:
            pid, port = int(state["pid"]), int(state["port"])
        except (KeyError, TypeError, ValueError):
            continue
        healthy = pid_alive(pid) and is_healthy(state)
        found.append(WarmServerInfo(
            pid=pid, port=port, base_url=f"http://127.0.0.1:{port}/v1", model=str(state.get("model", "")),
            version=str(state.get("version", "")), keep_alive=float(state.get("keep_alive") or 0),
            started_at=float(state.get("started_at") or 0), healthy=healthy, state_file=str(path),
            log=str(state.get("log", "")),
        ))
    return found


def stop_local_servers(data_dir: str | os.PathLike[str]) -> list[int]:
    """Stop every warm server of ``data_dir`` (SIGTERM, then SIGKILL after 5 s) and remove
    their state files. Only processes that are verifiably those servers are signalled
    (their command line names the recorded instance). Returns the pids stopped."""
    stopped = []
    for path in state_files(data_dir):
        with Flock(path.with_suffix(".lock")):  # not while waiting: the supervisor takes it to finish
            state = read_state(path)
            if state is None:
                continue
            try:
                path.unlink()
            except OSError:
                pass
        pid, instance = state.get("pid"), str(state.get("instance", ""))
        if not Path("/proc/self").is_dir():  # no command lines to check: the server, asked with its token,
            pid = server_pid(state)         # names its own pid; its supervisor follows it out
        elif not (isinstance(pid, int) and instance and is_server(pid, instance)):
            pid = None
        if isinstance(pid, int) and pid_alive(pid):
            terminate(pid)
            stopped.append(pid)
    return stopped
