"""Child processes of the local model: ports, reaping, signals, and what a server says over HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["PortInUse", "file_tail", "first_model", "free_port", "get_json", "pdeathsig_setter", "pid_alive",
           "reap_when_done", "terminate"]

_PR_SET_PDEATHSIG = 1


class PortInUse(Exception):
    """The server could not bind its port (another process took it first): try another."""


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def pdeathsig_setter() -> Any:
    """A ``preexec_fn`` that sets PR_SET_PDEATHSIG=SIGKILL, or ``None`` where not possible.

    The libc function is looked up here, before the fork, so the child only calls it.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    sigkill = int(signal.SIGKILL)

    def set_pdeathsig() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)

    return set_pdeathsig


def reap_when_done(proc: "subprocess.Popen[bytes]") -> None:
    """Reap ``proc`` as soon as it exits, so a dead child never lingers as a zombie.

    A daemon thread waits with ``waitid(WNOWAIT)`` (which leaves the child to be reaped)
    and then calls ``proc.poll()``, so ``Popen`` records the exit status itself and its
    own ``poll``/``wait`` in other threads keep working. Nothing blocks the caller, and no
    SIGCHLD handler is installed (it would belong to the main thread and to every child).
    """
    waitid = getattr(os, "waitid", None)

    def reap() -> None:
        if waitid is not None:
            try:
                waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass  # reaped elsewhere already
            except OSError:
                return
            proc.poll()
        else:  # pragma: no cover - POSIX without waitid
            proc.wait()

    threading.Thread(target=reap, name=f"chatflow-reap-{proc.pid}", daemon=True).start()


def get_json(url: str, token: str | None, timeout: float) -> tuple[int, Any]:
    """``GET url`` -> (status, parsed JSON or ``None``); status 0 when nothing answered."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def first_model(data: Any, alias: str) -> str:
    models = [m.get("id") for m in (data or {}).get("data", []) if isinstance(m, dict)] if isinstance(data, dict) else []
    if alias in models:
        return alias
    return models[0] if models and isinstance(models[0], str) else alias


def pid_alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def file_tail(path: Path, max_bytes: int = 4000) -> str:
    """The last ``max_bytes`` of the file at ``path``, decoded (``""`` when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def terminate(pid: int, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` s; returns once ``pid`` is gone (or not ours to wait)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + timeout
        time.sleep(0.05)
