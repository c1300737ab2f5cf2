"""Stores in a process that forks while they are open (gunicorn ``--preload``, the
``fork`` start method of :mod:`multiprocessing`).

A child inherits the parent's connections: the same sockets to a PostgreSQL server, the
same SQLite file handles and lock state. Used from two processes at once they mix up
protocol messages and locks; closed by the child they end the parent's server sessions
(libpq tells the server goodbye on the shared socket). So a store notices in the child
that the process id changed and opens connections of its own, and what it inherited is
kept referenced here for the child's lifetime -- never used, never closed, never garbage
collected (which could close it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["SharedPool", "after_fork_in_child", "fork_lock", "keep_inherited"]

_lock = threading.Lock()
_inherited: list[object] = []


def fork_lock() -> threading.Lock:
    """The lock under which a store replaces what it inherited (a new one in each child)."""
    return _lock


def keep_inherited(*things: object) -> None:
    """Keep ``things`` (a parent's connections, pools, executors) alive and untouched."""
    _inherited.append(things)


def after_fork_in_child(fn: Callable[[], None]) -> None:
    """Run ``fn`` in every child right after ``os.fork()`` (nothing where there is no fork)."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=fn)


def _reset() -> None:
    global _lock
    _lock = threading.Lock()


after_fork_in_child(_reset)


class SharedPool:
    """A thread pool shared by every store of a module, made on first use (a sync caller
    never imports :mod:`concurrent.futures`); a forked child, whose copy has no live
    threads, keeps the parent's untouched and makes its own."""

    def __init__(self, thread_name_prefix: str) -> None:
        self._prefix = thread_name_prefix
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        after_fork_in_child(self._forget)

    def get(self, workers: int) -> ThreadPoolExecutor:
        """The pool (``workers`` threads at most, as the first caller asked)."""
        with self._lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=self._prefix)
            return self._pool

    def _forget(self) -> None:
        if self._pool is not None:
            keep_inherited(self._pool)
        self._pool, self._lock = None, threading.Lock()
