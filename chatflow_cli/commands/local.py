"""``local status`` and ``local stop``: the embedded model's warm llama.cpp server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..context import notice
from ..render import dumps, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State

__all__ = ["local_status", "local_stop"]


def local_status(state: State, *, as_json: bool) -> None:
    """Print the warm local model servers of the data directory (pid, URL, health, uptime).

    Each server found is health-checked with its token; one that does not answer is shown
    as stale (the next call replaces it).

    Args:
        state: The run.
        as_json: One JSON array of the servers instead of lines.
    """
    from ..core.local import local_servers

    settings = state.settings()
    servers = local_servers(settings.data_dir)
    if as_json:
        state.env.stdout.write(dumps([s.to_dict() for s in servers], indent=2) + "\n")
        return
    if not servers:
        notice(state, f"no warm local model server (keep-alive {settings.local_keep_alive:g} s)")
        return
    for s in servers:
        age = max(0, int(time.time() - s.started_at))
        health = "running" if s.healthy else "not answering (stale: replaced on next use)"
        state.env.stdout.write(safe_text(
            f"pid {s.pid}  {s.base_url}  {health}  up {age} s  keep-alive {s.keep_alive:g} s  "
            f"chatflow {s.version}  {Path(s.model).name}") + "\n")


def local_stop(state: State, *, as_json: bool) -> None:
    """Stop the warm local model server now (SIGTERM, then SIGKILL after 5 s).

    Only processes that are verifiably chatflow's servers are signalled.

    Args:
        state: The run.
        as_json: Print ``{"stopped": [pids]}`` instead of a notice.
    """
    from ..core.local import stop_local_servers

    stopped = stop_local_servers(state.settings().data_dir)
    if as_json:
        state.env.stdout.write(dumps({"stopped": stopped}) + "\n")
    elif stopped:
        notice(state, "stopped the local model server (pid " + ", ".join(map(str, stopped)) + ")")
    else:
        notice(state, "no warm local model server was running")
