"""PostgresSessionStore: sessions, their messages and their event log in PostgreSQL.

``PostgresSessionStore("postgresql://user@host/db")`` is the store for a fleet: many worker
processes on many hosts share one database with every guarantee of the SQLite store. The
session rules are those of :class:`~chatflow_cli.core.memory.base.BaseSessionStore`; this package
supplies transactions over PostgreSQL, with patterns that hold when writers really run at
the same time (SQLite serialises every writer, PostgreSQL does not):

* every write transaction that touches a session takes a transaction-scoped advisory lock
  on the session id first (``pg_advisory_xact_lock``), then the row ``FOR UPDATE``: writers
  of one session queue, writers of different sessions run in parallel, and creating a new
  session cannot race another creator;
* event ``seq`` is a counter on the session row (``last_seq``), advanced under that lock in
  the transaction that inserts the events: gap-free, never read-max-plus-one;
* ``claim_message`` is one ``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE <free> RETURNING``
  under an advisory lock on the message id; the 192-hour TTL and claim leases are evaluated
  on the database's clock;
* the owner of a running turn holds a *lease*: ``lease_expires_at`` on the database clock,
  renewed every ``lease_s / 3`` seconds by a thread of the owning process while its turn
  runs (until the Runner ends the turn, by whatever path, and never past the life of the
  turn's context; a turn that ended with its ending unwritten has its lease expired as soon
  as the database answers). An owner counts as alive while its lease
  has not expired -- and, on the same host name, while its pid lives (a dead local worker is
  recovered at once). A worker that died on another host is recovered once its lease
  expired; a running turn is never taken over before. Claims of message ids and places in
  the turn queue hold leases the same way;
* the store's ``clock`` is the database server's clock (its offset from this host's steady
  clock is measured when the store opens: a step of this host's wall clock does not move
  it), so TTLs and timestamps agree across hosts; a message claim and the purge of expired
  message ids judge the 192-hour TTL on ``clock_timestamp()`` in the statement itself;
* versioned migrations, each in one transaction, serialised by an advisory lock so many
  workers starting at once migrate once; a database written by a newer chatflow is refused
  (:class:`SchemaTooNewError`) before anything is written;
* messages, event payloads, metadata, fork origins and agent versions are kept as the exact
  JSON text they were written as (``jsonb`` would reorder object keys and rewrite numbers:
  ``1e16``, ``-0.0``), so every value comes back as it was given; metadata also has a ``jsonb`` copy, which only
  the ``--metadata`` filter reads;
* every commit that appends events sends ``NOTIFY chatflow_events`` (payload: the md5 of the
  session id): :meth:`PostgresSessionStore.wait_for_events` is how ``replay --follow``
  is pushed new events instead of polling.

Connections come from a ``psycopg_pool.ConnectionPool`` (``pool_size`` connections at most,
one kept open; a process forked with the store open gets a pool of its own on first use,
and the parent's connections are left to the parent) with server-side prepared statements
off (``prepare_threshold=None``) and no
session state between transactions, so the store works behind PgBouncer in transaction
mode. Async twins run the same SQL on a private thread pool (as the SQLite store does for
files). Passwords come from the URL, ``PGPASSWORD`` or ``~/.pgpass`` as libpq reads them;
the store never prints, logs or stores them (:func:`redact_dsn` is what error messages and
``repr`` show).

Every ``psycopg`` error surfaces as :class:`StoreError` with one line: the server refused
the connection, bad credentials, the connection was lost (the transaction rolled back:
nothing of it was written; or, lost once the COMMIT was sent, the write may have been
committed: ``StoreError.written`` is None), and so on. A transaction PostgreSQL rolls back
as a serialization failure or a deadlock is run again (``begin_turn``, ``save``, the
claim writes: 4 attempts in all); lease renewals lock rows one table at a time, in key
order, so they never deadlock with a turn start.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from ...dsn import redact_dsn
from ...errors import SchemaTooNewError, SessionNotFoundError, StoreError
from ...events import Event
from ...typevars import T
from .._checks import DEFAULT_MAX_TURNS
from .._process_fork import SharedPool, fork_lock, keep_inherited
from .._port import _Tx, Owner
from ..base import BaseSessionStore
from ..values import MessageState, TurnStart
from .errors import _WRITE_ATTEMPTS, _lost, _store_error
from .leases import DEFAULT_LEASE_S, _Leases
from .schema import (
    _LOCK_MIGRATE,
    _MIGRATION_STEPS,
    _MIGRATIONS,
    _MIGRATIONS_TABLE,
    NOTIFY_CHANNEL,
    SCHEMA_VERSION,
    _channel_key,
)
from .tx import _DatabaseClock, _PgTx, _steady

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    import psycopg

    from ..context import SessionContext

__all__ = ["PostgresSessionStore"]

logger = logging.getLogger("chatflow_cli.core.memory.postgres")

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


def _label(dsn: str) -> str:
    """How the database is named in messages: the DSN without its password."""
    return f"PostgreSQL database {redact_dsn(dsn)}"


class PostgresSessionStore(BaseSessionStore):
    """Sessions in a PostgreSQL database, shared by many processes on many hosts.

    ``dsn``: a ``postgresql://`` (or ``postgres://``) URL or a libpq key=value string; the
    password may be in it, in ``PGPASSWORD`` or in ``~/.pgpass``. ``default_max_turns``: int
    > 0. ``lease_s``: seconds a running turn's owner stays alive without renewing its lease
    (default :data:`DEFAULT_LEASE_S`; a worker that died on another host is recovered after
    this long). ``pool_size``: connections this store opens at most (default 8).

    The schema is created (or migrated) on first use. Raises :class:`StoreError` when the
    server cannot be reached or refuses the credentials (the message never holds the
    password), and :class:`SchemaTooNewError` when a newer chatflow wrote the database.
    """

    _ephemeral = False

    def __init__(
        self,
        dsn: str,
        default_max_turns: int = DEFAULT_MAX_TURNS,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        pool_size: int = 8,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise TypeError("dsn must be a non-empty str (a postgresql:// URL or a libpq key=value string)")
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not lease_s > 0:
            raise ValueError(f"lease_s must be a number of seconds > 0, got {lease_s!r}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
        super().__init__(default_max_turns)
        self.dsn = dsn
        self.lease_s = float(lease_s)
        self.pool_size = pool_size
        self._label = _label(dsn)
        self._closed = False
        self._pool: Any = None
        self._listen_conn: psycopg.Connection[Any] | None = None
        self._leases = _Leases(self)
        self._pid = os.getpid()  # the process whose connections the pool holds
        try:
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError as exc:
            raise StoreError(
                f"a PostgreSQL store needs psycopg 3 and psycopg_pool: pip install 'chatflow-cli[postgres]' ({exc})"
            ) from None
        offset = self._migrate()
        self.clock = _DatabaseClock(offset)
        self._open_pool()

    # -- connections -------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        try:
            return psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None,
                                   connect_timeout=_CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise _store_error(exc, self._label) from None

    def _open_pool(self) -> None:
        from psycopg_pool import ConnectionPool

        self._pool = ConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self.pool_size,
            kwargs={"autocommit": True, "prepare_threshold": None, "connect_timeout": _CONNECT_TIMEOUT_S},
            open=False,
            timeout=_POOL_TIMEOUT_S,
            name="chatflow",
        )
        self._pool.open(wait=False)

    def _own_connections(self) -> None:
        """In a process forked since the pool opened: leave the parent's connections alone
        (kept, never used nor closed here: closing would end the parent's sessions) and
        open a pool of this process's own; the parent's leases stay the parent's."""
        if self._pid == os.getpid():
            return
        with fork_lock():
            if self._pid == os.getpid():
                return
            keep_inherited(self._pool, self._listen_conn, self._leases)
            self._pool, self._listen_conn = None, None
            self._leases = _Leases(self)
            self._pid = os.getpid()
            if not self._closed:
                self._open_pool()

    def close(self) -> None:
        """Close the pool and stop renewing leases. Idempotent. In a forked child, the
        connections inherited from the parent are left to the parent."""
        self._closed = True
        self._own_connections()  # a child: set the parent's aside, open none
        self._leases.stop()
        self._drop_listener()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                pool.close(timeout=5)
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:  # noqa: BLE001
            pass

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        import psycopg
        from psycopg_pool import PoolTimeout

        self._own_connections()
        pool = self._pool
        if self._closed or pool is None:
            raise StoreError(f"the store for {self._label} is closed")
        try:
            try:
                conn = pool.getconn(timeout=_POOL_QUICK_S)
            except PoolTimeout:
                # None idle and none made at once: a server that is down or refuses us is
                # said now, with libpq's reason; a reachable one only has every connection busy
                probe = self._connect()
                probe.close()
                conn = pool.getconn(timeout=_POOL_TIMEOUT_S)
        except PoolTimeout:
            raise StoreError(
                f"no free connection to {self._label} after {_POOL_TIMEOUT_S:.0f} s ({self.pool_size} in use)"
            ) from None
        except psycopg.Error as exc:
            raise _store_error(exc, self._label) from None
        try:
            yield conn
        finally:
            pool.putconn(conn)

    # -- migrations --------------------------------------------------------------------
    def _migrate(self) -> float:
        """Create or migrate the schema (serialised by an advisory lock); the database clock's
        offset from this host, in seconds."""
        import psycopg

        conn = self._connect()
        try:
            before = _steady()
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
            assert row is not None
            db_now = float(row[0])
            offset = db_now - (before + _steady()) / 2
            version = self._schema_version(conn)  # a read first: refuses a newer schema before writing
            if version > SCHEMA_VERSION:
                raise self._too_new(version)
            if version == SCHEMA_VERSION:
                return offset
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", _LOCK_MIGRATE)
                conn.execute(_MIGRATIONS_TABLE)
                version = self._schema_version(conn)
                if version > SCHEMA_VERSION:
                    raise self._too_new(version)
                for number, name, statements in _MIGRATIONS:
                    if number <= version:
                        continue
                    try:
                        self._apply_migration(conn, number, name, statements)
                    except psycopg.Error as exc:
                        raise self._migration_failed(exc, number, name, version) from None
            return offset
        except psycopg.Error as exc:
            raise _store_error(exc, self._label) from None
        finally:
            conn.close()

    @staticmethod
    def _apply_migration(conn: psycopg.Connection[Any], number: int, name: str, statements: list[str]) -> None:
        """One migration and its version row, in a savepoint (committed with the lock held).
        Every statement is idempotent (``IF NOT EXISTS``, updates of what is not done yet), so
        a schema that got a migration's changes but not its version row is finished here."""
        with conn.transaction():
            for statement in statements:
                step = _MIGRATION_STEPS.get(statement)
                if step is not None:
                    step(conn)
                else:
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO chatflow_schema_migrations (version, name, applied_at_utc) "
                "VALUES (%s, %s, extract(epoch FROM clock_timestamp()))",
                (number, name),
            )

    def _migration_failed(self, exc: BaseException, number: int, name: str, version: int) -> StoreError:
        reason = redact_dsn(" ".join(str(exc).split())).rstrip(" .")  # its own full stop is ours
        return StoreError(
            f"schema migration {number} ({name}) of {self._label} failed: {reason}. It was rolled back: the "
            f"database stays at schema version {version}. Fix the cause and start chatflow again (a migration "
            "is applied whole and skips what already exists)"
        )

    @staticmethod
    def _schema_version(conn: psycopg.Connection[Any]) -> int:
        exists = conn.execute("SELECT to_regclass('chatflow_schema_migrations')").fetchone()
        if exists is None or exists[0] is None:
            return 0
        r = conn.execute("SELECT COALESCE(MAX(version), 0) FROM chatflow_schema_migrations").fetchone()
        return int(r[0]) if r else 0

    def _too_new(self, version: int) -> SchemaTooNewError:
        return SchemaTooNewError(
            f"{self._label} has schema version {version}, newer than this chatflow's {SCHEMA_VERSION}: "
            "upgrade chatflow (the database was not changed)"
        )

    # -- transactions ------------------------------------------------------------------
    @contextmanager
    def _tx(self, write: bool) -> Iterator[_PgTx]:
        import psycopg

        begin = "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        for attempt in range(3):
            with self._connection() as conn:
                try:
                    conn.execute(begin)
                except psycopg.OperationalError as exc:
                    # a connection the server closed while it sat in the pool (a restart):
                    # nothing was sent yet, so another connection may try again
                    if attempt < 2 and conn.broken:
                        self._pool.check()
                        continue
                    raise _store_error(exc, self._label, broken=_lost(conn)) from None
                committing = False
                try:
                    # pipeline mode: statements whose results are not read yet (the writes, the
                    # COMMIT) travel together with the next read, one round trip
                    with conn.pipeline():
                        tx = _PgTx(conn, self, write)
                        yield tx
                        tx.flush()
                        committing = write  # from here a lost connection leaves the outcome unknown
                        conn.execute("COMMIT")
                except BaseException as exc:
                    if not conn.broken:
                        try:
                            conn.execute("ROLLBACK")
                        except psycopg.Error:
                            pass
                    if isinstance(exc, psycopg.Error):
                        # judged once the ROLLBACK was tried: a connection the server ended
                        # may say so only then (the error itself can be psycopg's own, as
                        # "cannot exit pipeline mode while busy")
                        raise _store_error(exc, self._label, committing=committing, broken=_lost(conn)) from None
                    raise
                return
        raise StoreError(f"cannot reach {self._label}")  # pragma: no cover - the loop returns or raises

    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        with self._tx(write=False) as tx:
            yield tx

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        with self._tx(write=True) as tx:
            yield tx

    async def _run_blocking(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on a private thread pool (as many threads as connections)."""
        import asyncio

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_blocking_executor(max(4, self.pool_size)), partial(fn, *args, **kwargs))

    # -- leases ------------------------------------------------------------------------
    def _retrying(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` -- one write transaction -- run again, at most
        ``_WRITE_ATTEMPTS`` times in all, while PostgreSQL rolls it back as retryable (a
        serialization failure or a deadlock), after a short random pause; then its error."""
        for attempt in range(1, _WRITE_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except StoreError as exc:
                if not exc.retryable or attempt == _WRITE_ATTEMPTS:
                    raise
                logger.info("retrying a write to %s rolled back as retryable (%s)", self._label, exc)
                time.sleep(random.uniform(0.01, 0.05) * attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def save(self, session: SessionContext) -> list[Event]:
        """:meth:`BaseSessionStore.save`, run again when PostgreSQL rolls it back as retryable."""
        return self._retrying(super().save, session)

    def end_lease(self, owner_token: str, *, stored: bool) -> None:
        """:meth:`BaseSessionStore.end_lease`: the lease is no longer renewed; when ``stored``
        is False it is also expired on the database clock by the next renewal that reaches
        the database, so other hosts recover the turn (or take the claim) without waiting
        for it to run out."""
        self._leases.end(owner_token, expire=not stored)
        super().end_lease(owner_token, stored=stored)

    def begin_turn(self, session_id: str, **kwargs: Any) -> TurnStart:
        """:meth:`BaseSessionStore.begin_turn`; the started turn's owner lease (or the queued
        waiter's ticket) is then renewed by this process while the turn runs (until
        :meth:`end_lease`). Run again when PostgreSQL rolls it back as retryable."""
        start = self._retrying(super().begin_turn, session_id, **kwargs)
        owner = kwargs.get("owner")
        ticket = kwargs.get("ticket")
        if start.queued is not None:
            self._leases.hold_ticket(start.queued)
        elif start.replayed is None and owner is not None:
            self._leases.hold_turn(owner.token, start.session)
            if ticket is not None:
                self._leases.drop_ticket(ticket)
            claim = kwargs.get("message_claim")
            if claim is not None:
                self._leases.drop_claim(claim)
        return start

    def leave_turn_queue(self, session_id: str, ticket: int) -> None:
        self._leases.drop_ticket(ticket)
        super().leave_turn_queue(session_id, ticket)

    def _claim(self, message_id: str, owner: Owner | None) -> str | None:
        """claim_message's transaction: one ``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE
        <new, expired or lease run out> RETURNING``; when it leaves the id to a holder on this
        host whose pid died, the shared rules free it (as on SQLite)."""
        self._check_message_id(message_id)
        holder = owner if owner is not None else Owner.current()
        return self._retrying(self._claim_once, message_id, holder)

    def _claim_once(self, message_id: str, holder: Owner) -> str | None:
        now = self.clock()
        with self._tx(write=True) as tx:
            # the message's lock first, then the purge's rows, as begin_turn takes them
            claimed, now = tx.claim(message_id, holder, now, self._dedup_ttl_s)
            tx.processed_purge(now, self._dedup_ttl_s)
            if not claimed:
                old = tx.processed_get(message_id)
                if self._state_of(old, now) is MessageState.NEW:
                    tx.processed_put(message_id, self._new_claim(old, holder, now))
                    claimed = True
        if claimed:
            self._leases.hold_claim(holder.token)
        return holder.token if claimed else None

    def _release_held(self, message_id: str, token: str) -> bool:
        released = self._retrying(super()._release_held, message_id, token)
        self._leases.drop_claim(token)
        return released

    def _mark(self, message_id: str) -> str:
        token = self._retrying(super()._mark, message_id)
        self._leases.hold_claim(token)
        return token

    def renew_leases(self) -> None:
        """Renew now every lease this process holds (the lease thread does it every
        ``lease_s / 3`` seconds)."""
        self._leases.renew(self)

    # -- notifications -----------------------------------------------------------------
    def wait_for_events(self, session_id: str, after_seq: int, timeout: float) -> bool:
        """Block until the session has an event with ``seq > after_seq`` or ``timeout``
        seconds passed; True when there is one. Pushed by ``LISTEN chatflow_events`` on a
        connection of its own (behind PgBouncer in transaction mode, where notifications
        do not arrive, this still answers within ``timeout``, by reading the log)."""
        import psycopg

        deadline = time.monotonic() + max(0.0, timeout)
        key = _channel_key(session_id)
        conn: psycopg.Connection[Any] | None = None

        def arrived() -> bool:
            try:
                return self.last_seq(session_id) > after_seq
            except SessionNotFoundError:  # deleted: the caller's next read says so
                return True

        try:
            conn = self._listener()
            if arrived():
                return True
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return arrived()
                for note in conn.notifies(timeout=min(remaining, 1.0), stop_after=1):
                    if note.payload == key:
                        break
                if arrived():
                    return True
        except psycopg.Error as exc:
            broken = conn is None or _lost(conn)  # None: LISTEN failed on a new connection
            self._drop_listener()
            raise _store_error(exc, self._label, broken=broken) from None

    def _listener(self) -> psycopg.Connection[Any]:
        self._own_connections()
        conn = self._listen_conn
        if conn is None or conn.closed:
            conn = self._connect()
            try:
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            except BaseException:
                conn.close()
                raise
            self._listen_conn = conn
        return conn

    def _drop_listener(self) -> None:
        conn, self._listen_conn = self._listen_conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def __repr__(self) -> str:
        return f"PostgresSessionStore(dsn={redact_dsn(self.dsn)!r}, default_max_turns={self.default_max_turns})"
