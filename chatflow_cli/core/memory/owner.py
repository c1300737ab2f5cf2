"""The owner of a running turn: the lease record a ``running`` session carries.

An :class:`Owner` names a process (pid, its start time read from ``/proc/<pid>/stat``, the
host) and one run of it (a random token). :meth:`Owner.alive` tells a live owner from a
dead one, or from a new process that reuses a dead owner's pid, so a store can recover a
turn whose process died. Claims on inbound message ids record their holder the same way.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Owner"]

#: Owner tokens of this process whose run is over although the store may still name them
#: (the turn's ending could not be written: the database was down). Oldest dropped first.
_ENDED_KEPT = 65536
_ended: dict[str, None] = {}
_ended_lock = threading.Lock()


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) from ``/proc/<pid>/stat``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # "pid (comm) state ppid ..." — comm may hold spaces and parentheses: split after the last ")".
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])  # field 3 (state) and field 22 (starttime)
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Owner:
    """Who runs a session's current turn: the lease record of a ``running`` session.

    ``pid`` plus ``start_time`` (the process start time in clock ticks since boot, field 22
    of ``/proc/<pid>/stat``; 0 where there is no ``/proc``) tell a live owner from a new
    process that reuses a dead owner's pid. ``host`` is the machine; ``token`` is random
    per run, so two runs of one process are told apart.
    """

    pid: int
    start_time: int
    host: str
    token: str

    @classmethod
    def current(cls) -> Owner:
        """This process, with a fresh token."""
        pid = os.getpid()
        stat = _proc_stat(pid)
        return cls(pid=pid, start_time=stat[1] if stat else 0, host=socket.gethostname(), token=secrets.token_hex(8))

    @classmethod
    def of_process(cls, pid: int) -> Owner:
        """Another local process ``pid`` as an owner (used by tests and recovery tools)."""
        stat = _proc_stat(pid)
        return cls(pid=pid, start_time=stat[1] if stat else 0, host=socket.gethostname(), token=secrets.token_hex(8))

    @staticmethod
    def end_run(token: str) -> None:
        """Mark the run ``token`` names as over in this process: from now :meth:`alive` is
        False for every owner record with this token, so a turn or claim it left behind (its
        ending could not be stored) is recovered, or free again, at once instead of looking
        held by a live process."""
        with _ended_lock:
            _ended[token] = None
            while len(_ended) > _ENDED_KEPT:
                del _ended[next(iter(_ended))]

    def alive(self) -> bool:
        """True while the owning process runs and the run has not ended.

        Owners on another host cannot be checked and count as alive. A zombie (exited,
        not yet reaped) counts as dead; so does a process whose start time differs from
        the recorded one (the pid was reused), and a run of this process that
        :meth:`end_run` marked as over.
        """
        if self.token in _ended:
            return False
        if self.host != socket.gethostname():
            return True
        if self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        stat = _proc_stat(self.pid)
        if stat is None:
            return not os.path.isdir("/proc")
        state, start = stat
        if state in ("Z", "X"):
            return False
        return not (self.start_time and start != self.start_time)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time, "host": self.host, "token": self.token}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Owner:
        return cls(int(data["pid"]), int(data.get("start_time", 0)), str(data.get("host", "")), str(data["token"]))
