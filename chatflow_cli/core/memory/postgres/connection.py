"""Reaching the database: connect and pool timeouts, the thread pool of async calls, the
database's clock as this host keeps it, and how the database is named in messages (never
with its password)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ...dsn import redact_dsn
from .._process_fork import SharedPool

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    import psycopg

# psycopg_pool logs each connection it drops and each failed reconnection as a warning
# ("error connecting in 'pool-1'..."), many while a server restarts. With no logging set up
# Python would print them on stderr, between the application's own lines; a handler that
# drops them keeps them in logging only (an application that configures logging, or
# ``chatflow --debug``, still gets them). What matters reaches the caller as a StoreError.
if not any(isinstance(h, logging.NullHandler) for h in logging.getLogger("psycopg").handlers):
    logging.getLogger("psycopg").addHandler(logging.NullHandler())

_CONNECT_TIMEOUT_S = 10
_POOL_TIMEOUT_S = 30.0
_POOL_QUICK_S = 1.0


_pool = SharedPool("chatflow-pg")


def _blocking_executor(workers: int) -> ThreadPoolExecutor:
    return _pool.get(workers)


def _steady() -> float:
    """Seconds of a clock that is never stepped: Linux's ``CLOCK_BOOTTIME`` (counts time
    suspended too), else ``time.monotonic()``."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if _BOOTTIME else time.monotonic()


_BOOTTIME = hasattr(time, "CLOCK_BOOTTIME")


class _DatabaseClock:
    """UTC epoch seconds on the database server's clock: this host's steady clock
    (:func:`_steady`) plus the offset measured when the store opened. A step of this host's
    wall clock (a wrong time set, a jump back) does not move it."""

    def __init__(self, offset: float) -> None:
        self.offset = offset  # database epoch seconds minus _steady()

    def __call__(self) -> float:
        return _steady() + self.offset


class _Store(Protocol):
    """What a transaction (:class:`~.tx._PgTx`) and the lease thread (:class:`~.leases._Leases`)
    use of their :class:`~.store.PostgresSessionStore`, so that neither imports the store."""

    lease_s: float
    clock: Callable[[], float]
    _closed: bool
    _label: str

    def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...


def _label(dsn: str) -> str:
    """How the database is named in messages: the DSN without its password."""
    return f"PostgreSQL database {redact_dsn(dsn)}"
