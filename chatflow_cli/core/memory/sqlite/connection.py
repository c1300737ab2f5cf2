"""Opening a SQLite database: the busy timeout every connection waits, which paths are
ephemeral (one shared connection, on the event loop) and the private thread pool that runs
on-disk work for async callers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._process_fork import SharedPool

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

#: Threads of the private pool that runs on-disk SQLite work for async callers.
_BLOCKING_IO_WORKERS = 4
_BUSY_TIMEOUT_S = 30.0

_pool = SharedPool("chatflow-sqlite")


def _blocking_executor() -> ThreadPoolExecutor:
    """The private pool, made on first use. ``asyncio`` and ``concurrent.futures`` are
    imported only here and in ``_run_blocking``: a sync caller (``chatflow sessions ls``)
    never pays their ~10-40 ms import."""
    return _pool.get(_BLOCKING_IO_WORKERS)


def _is_ephemeral(path: str) -> bool:
    if path in ("", ":memory:"):
        return True
    if path.startswith("file:"):
        rest = path[5:]
        name, _, query = rest.partition("?")
        return name == ":memory:" or "mode=memory" in query.split("&")
    return False
