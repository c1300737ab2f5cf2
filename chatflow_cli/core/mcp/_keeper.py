"""The keeper of a local (stdio) MCP server on Linux: the server ends with chatflow, however
chatflow ends.

The SDK starts a stdio server in a process group of its own (so a Ctrl-C at the terminal
does not reach it) and stops it itself: its stdin's end, then SIGTERM, then SIGKILL to the
group. When chatflow is killed (SIGKILL, the OOM killer), nothing of that runs: the server
only gets the end of its stdin, and one that ignores it (or a child it started) is left
running. So on Linux chatflow starts the server through this script, run by the same Python
with no site and no chatflow import::

    python -I -S _keeper.py PARENT_PID COMMAND [ARG]...

It asks the kernel for SIGUSR1 when its parent dies (``prctl(PR_SET_PDEATHSIG)``, which
SIGKILL does not escape), starts COMMAND as its child in the same process group, with the
same stdin, stdout, stderr, environment and directory, and leaves the pipes to it. When the
server exits, the keeper SIGKILLs what is left of the group (what the server started and left
running), itself with it. SIGTERM, SIGINT and SIGHUP leave the keeper
waiting for the server (the SDK sends them to the whole group: the server decides). When
chatflow dies, the keeper does what the SDK would have done: it gives the server 2 s to end on
its stdin's end, SIGTERMs the group, and SIGKILLs it 2 s later.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
#: Seconds the server gets to end on its stdin's end, then after SIGTERM (the SDK's grace periods).
GRACE_S = 2.0


class _Orphaned(Exception):
    """The keeper's parent (chatflow) died."""


_parent = 0
_told = False


def _orphaned(signum: int, frame: object) -> None:
    """The parent-death signal. The kernel sends it when the thread that started the keeper
    ends (the keeper then belongs to another thread of chatflow, which still runs), again as
    each later one ends, and when a subreaper the keeper is then given to ends: chatflow is
    gone once the keeper's parent is another process, and that is acted on once."""
    global _told
    if not _told and os.getppid() != _parent:
        _told = True
        raise _Orphaned


def _ignored(signum: int, frame: object) -> None:
    """A signal the keeper lets the server answer (a handler, not SIG_IGN: a child would inherit SIG_IGN)."""


def _exited(pid: int, deadline: float) -> bool:
    """Whether the child ``pid`` ends before ``deadline`` (it is reaped)."""
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _take_down(pid: int) -> None:
    """chatflow died: the spec's shutdown, for the whole group (the keeper included, last)."""
    try:
        if not _exited(pid, time.monotonic() + GRACE_S):
            os.killpg(0, signal.SIGTERM)
            _exited(pid, time.monotonic() + GRACE_S)
    finally:
        os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    global _parent
    _parent, command = int(argv[1]), argv[2:]
    signal.signal(signal.SIGUSR1, _orphaned)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignored)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0) != 0:  # pragma: no cover - not Linux
        os.write(2, f"chatflow's keeper: prctl failed ({os.strerror(ctypes.get_errno())})\n".encode())
    pid = 0
    try:
        if os.getppid() != _parent:  # chatflow died before the signal was asked for
            return 1
        pid = os.fork()
        if pid == 0:  # the server: its signal handlers go back to the defaults with exec
            try:
                os.execvp(command[0], command)
            except OSError as exc:
                os.write(2, f"cannot run {command[0]}: {exc.strerror}\n".encode(errors="replace"))
            os._exit(127)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)  # the server holds the pipes alone: its exit closes them
        os.dup2(devnull, 1)
        os.close(devnull)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # pragma: no cover - reaped already
            pass
        # the server ended (on its own, or as chatflow stopped it, or because chatflow died and
        # its pipes broke, which may come before the parent-death signal): nothing it left in
        # its group outlives it, and the keeper goes with them
        os.killpg(0, signal.SIGKILL)
        return 1  # pragma: no cover - killed above
    except _Orphaned:
        if pid:
            _take_down(pid)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
