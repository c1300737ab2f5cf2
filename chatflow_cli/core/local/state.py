"""The files a warm server is known by, in ``<data dir>/local/``, and its health check.

``server-<key>.json`` (mode 0600) records the running server (pid, port, token, instance
id, chatflow version, model file identity, keep-alive, options); ``server-<key>.lock`` is
the ``flock`` under which exactly one process starts it; ``server-<key>.json.exit`` is its
supervisor's record of how it ended. A server is trusted only after ``GET
/chatflow/health`` with its token answered with the recorded instance.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ._process import get_json
from .options import HEALTH_PATH, SERVER_MODULE

__all__ = ["RESERVATION", "Flock", "chatflow_version", "exit_record", "file_id", "health", "is_healthy", "is_server",
           "local_dir", "read_state", "server_pid", "state_files", "write_private"]


def chatflow_version() -> str:
    from ... import __version__

    return __version__


def file_id(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def is_server(pid: int, instance: str) -> bool:
    """``pid`` runs the warm server ``instance`` (its command line names it). Where
    ``/proc`` is missing nothing can be told: ``False``, so nothing is signalled."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return SERVER_MODULE.encode() in argv and instance.encode() in argv


class Flock:
    """An exclusive ``flock`` on ``path`` for a ``with`` block (POSIX)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> "Flock":
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_private(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def local_dir(data_dir: str | os.PathLike[str]) -> Path:
    path = Path(data_dir) / "local"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.chmod(Path(data_dir), 0o700)
        os.chmod(path, 0o700)
    except OSError:
        pass
    return path


#: Seconds a process that found or started a warm server reserves it for its first request:
#: the server's idle clock does not run out meanwhile (the reservation ends at that request).
RESERVATION = 30.0


def health(state: dict[str, Any], timeout: float = 2.0, *, reserve: str | None = None) -> dict[str, Any] | None:
    """The ``/chatflow/health`` answer of the server of ``state`` (asked with its token), or
    ``None`` when it does not answer as that instance. ``reserve``: a reservation id; also
    reserve the server for :data:`RESERVATION` seconds or until the next completion request,
    so it does not idle out before this process's request (asking again with the same id
    renews that reservation)."""
    query = f"?lease={RESERVATION:g}&id={reserve}" if reserve else ""
    try:
        url = f"http://127.0.0.1:{int(state['port'])}{HEALTH_PATH}{query}"
        token, instance = str(state["token"]), str(state["instance"])
    except (KeyError, TypeError, ValueError):
        return None
    status, data = get_json(url, token, timeout)
    return data if status == 200 and isinstance(data, dict) and data.get("instance") == instance else None


def is_healthy(state: dict[str, Any], timeout: float = 2.0, *, reserve: str | None = None) -> bool:
    """The server of ``state`` answers ``/chatflow/health`` with the token, as that instance
    (``reserve``: as :func:`health`)."""
    return health(state, timeout, reserve=reserve) is not None


def exit_record(state_path: Path, instance: str, *, wait: float) -> dict[str, Any] | None:
    """The supervisor's record of how server ``instance`` ended, waiting up to ``wait`` s for it."""
    deadline = time.monotonic() + wait
    exit_path = state_path.with_name(state_path.name + ".exit")
    while True:
        record = read_state(exit_path)
        if record is not None and record.get("instance") == instance:
            return record
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def state_files(data_dir: str | os.PathLike[str]) -> list[Path]:
    folder = Path(data_dir) / "local"
    return sorted(folder.glob("server-*.json")) if folder.is_dir() else []


def server_pid(state: dict[str, Any]) -> int | None:
    """The pid the server of ``state`` reports at ``/chatflow/health`` (asked with its token)."""
    try:
        url = f"http://127.0.0.1:{int(state['port'])}{HEALTH_PATH}"
    except (KeyError, TypeError, ValueError):
        return None
    status, data = get_json(url, str(state.get("token", "")), 2.0)
    if status == 200 and isinstance(data, dict) and data.get("instance") == state.get("instance"):
        pid = data.get("pid")
        return pid if isinstance(pid, int) else None
    return None
