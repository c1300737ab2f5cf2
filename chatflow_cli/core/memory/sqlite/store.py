"""The SQLite store: :class:`SQLiteSessionStore`, sessions with their messages and event log in one file.

``SQLiteSessionStore(db_path, default_max_turns=40)`` takes these two parameters only (any
other keyword, such as ``busy_timeout=``, is a ``TypeError``). The session rules are those
of :class:`~chatflow_cli.core.memory.base.BaseSessionStore`; this module supplies
transactions over SQLite (:class:`~.tx._SQLiteTx`), the schema lives in
:mod:`chatflow_cli.core.memory.sqlite.schema`.

Several processes may share one file:

* WAL journal, a 30 s busy timeout, foreign keys on, ``BEGIN IMMEDIATE`` for every write
  (so two writers queue instead of failing on lock upgrade), short transactions with no
  network I/O inside (the Runner calls the model between transactions);
* ``synchronous=NORMAL`` in WAL mode: a commit survives a crash of the process at once,
  and survives power loss once the WAL is checkpointed -- the usual choice for WAL, which
  keeps a 4-message turn append well under a millisecond. The database can never be
  corrupted by it; at worst the last transactions before a power cut roll back;
* event ``seq`` is ``MAX(seq) + 1`` read inside the write transaction that inserts the
  event, with ``UNIQUE(session_id, seq)`` as backstop (never a counter in process memory);
* versioned migrations, each in one transaction with its version record; a file written
  by a newer chatflow is refused (:class:`SchemaTooNewError`) before anything is written;
  16 processes opening a fresh file at once is safe;
* new files are created 0600 and new directories 0700.

Connections for an on-disk file: one for each thread running a transaction, taken from
the store's idle ones (or opened) when its outermost transaction begins and put back when it
ends (the writer thread keeps its own); one connection behind a lock for an ephemeral
database (``:memory:``, ``file::memory:?cache=shared``, any URI with ``mode=memory``).
Async twins run on-disk reads on a private pool of ``_BLOCKING_IO_WORKERS = 4`` threads
through :meth:`SQLiteSessionStore._run_blocking`, and on-disk writes in turn on the store's
own writer thread (:meth:`SQLiteSessionStore._run_writing`); ephemeral databases stay on the
event loop.

Every ``sqlite3`` error surfaces as :class:`StoreError` with one clear line (not a
database, corrupt, read-only, disk full, locked).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import SchemaTooNewError, StoreError
from ...typevars import T
from .._checks import DEFAULT_MAX_TURNS
from .._process_fork import SharedPool, fork_lock, keep_inherited
from .._port import _Tx
from ..base import BaseSessionStore
from .errors import _BUSY_TIMEOUT_S, _store_error
from .schema import FTS_HIGH_WATER, INDEX_BATCH, SCHEMA_VERSION, MigrationFailed, apply_migrations, schema_version
from .tx import _SQLiteTx, _dumps

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["SCHEMA_VERSION", "SQLiteSessionStore"]

#: Threads of the private pool that runs on-disk SQLite work for async callers.
_BLOCKING_IO_WORKERS = 4

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


class SQLiteSessionStore(BaseSessionStore):
    """Sessions in a SQLite file, shared safely by threads and processes.

    ``db_path``: a file path (created with its directory when missing), ``":memory:"``, or
    a ``file:`` URI -- a ``str`` or ``os.PathLike[str]`` (bytes: TypeError). ``default_max_turns``: int > 0 (ValueError otherwise). Raises
    :class:`StoreError` when the file cannot be opened or is not a SQLite database, and
    :class:`SchemaTooNewError` when a newer chatflow wrote it.
    """

    def __init__(self, db_path: str | os.PathLike[str], default_max_turns: int = DEFAULT_MAX_TURNS) -> None:
        path = os.fspath(db_path)  # TypeError for anything that is not a path
        if not isinstance(path, str):
            raise TypeError(f"db_path must be a str or os.PathLike[str], got {type(db_path).__name__}")
        super().__init__(default_max_turns)
        self.db_path = path
        self._ephemeral = _is_ephemeral(self.db_path)
        self._uri = self.db_path.startswith("file:")
        self._label = self.db_path if not self._ephemeral else "in-memory database"
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        # Connections no transaction uses now: a thread's first transaction takes the last
        # one put back (a short-lived thread, such as a tool call's, gets an open connection
        # with its schema read and its statements prepared, not a new one each time), and
        # its outermost transaction puts it back. So the store holds as many connections as
        # threads ran transactions at once, not one per thread that ever ran one.
        self._idle_conns: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._shared_lock = threading.RLock()
        self._writer: ThreadPoolExecutor | None = None  # the store's writer thread, made on first use
        # Transactions running now, in every thread: close() waits for them (closing a
        # connection while another thread runs a statement on it crashes the process).
        self._active = 0
        self._idle = threading.Condition(self._connections_lock)
        self._closed = False
        self._pid = os.getpid()  # the process that opened the connections
        if not self._ephemeral and not self._uri:
            self._create_file()
        conn = self._connection()
        try:
            self._migrate(conn)
        except BaseException:
            self.close()
            raise

    # -- connections -------------------------------------------------------------------
    def _create_file(self) -> None:
        path = Path(self.db_path)
        try:
            missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
            for directory in reversed(missing):  # every directory we create is private, not only the last
                directory.mkdir(mode=0o700, exist_ok=True)
            if not path.exists():
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                os.close(fd)
        except OSError as exc:
            raise _store_error(exc, self._label) from exc

    def _own_connections(self) -> None:
        """In a process forked since the store opened: set aside the parent's connections
        (SQLite forbids carrying one across fork: its locks belong to the parent; kept,
        never used nor closed here), its writer thread (which does not exist here) and
        locks another thread may have held at the fork; connections of this process's own
        are opened on use. An in-memory database is the child's own copy: it is kept."""
        if self._pid == os.getpid():
            return
        with fork_lock():
            if self._pid == os.getpid():
                return
            keep_inherited(self._connections, self._writer, self._local)
            if not self._ephemeral:
                self._connections = []
                self._idle_conns = []
            self._local = threading.local()
            self._writer = None
            self._connections_lock = threading.Lock()
            self._idle = threading.Condition(self._connections_lock)
            self._shared_lock = threading.RLock()
            self._active = 0
            self._pid = os.getpid()

    def _connection(self) -> sqlite3.Connection:
        self._own_connections()
        if self._closed:
            raise StoreError(f"the store for {self._label} is closed")
        if self._ephemeral:
            conn: sqlite3.Connection | None = getattr(self, "_shared", None)
        else:
            conn = getattr(self._local, "conn", None)
            if conn is None:
                try:
                    conn = self._idle_conns.pop()  # atomic: no two threads take one connection
                except IndexError:
                    pass
                else:
                    self._local.conn = conn
        if conn is not None:
            return conn
        try:
            conn = sqlite3.connect(
                self.db_path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False, uri=self._uri
            )
            conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise _store_error(exc, self._label) from exc
        except UnicodeEncodeError:
            raise StoreError(f"cannot open {self._label!r}: the path is not valid UTF-8 text") from None
        with self._connections_lock:
            self._connections.append(conn)
        if self._ephemeral:
            self._shared = conn
        else:
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close every connection this store opened (any thread's). Idempotent.

        New transactions are refused at once (:class:`StoreError`); the ones other threads
        are running finish first (up to the busy timeout, 30 s, after which their
        connections are left to the interpreter rather than closed under them).
        """
        self._own_connections()  # a child closes only its own connections
        own = getattr(self._local, "depth", 0)  # close() called inside this thread's own transaction
        with self._idle:
            self._closed = True
            idle = self._idle.wait_for(lambda: self._active <= own, timeout=_BUSY_TIMEOUT_S + 5)
            conns, self._connections = self._connections, []
            self._idle_conns = []
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=False)
        if not idle:
            return
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    # -- migrations --------------------------------------------------------------------
    def _migrate(self, conn: sqlite3.Connection) -> None:
        try:
            version = schema_version(conn)  # a read: refuses a non-database before writing anything
            if version > SCHEMA_VERSION:
                raise SchemaTooNewError(
                    f"{self._label} has schema version {version}, newer than this chatflow's {SCHEMA_VERSION}: "
                    "upgrade chatflow (the file was not changed)"
                )
            if not self._ephemeral:
                self._enable_wal(conn)
            if version == SCHEMA_VERSION:
                return
            apply_migrations(conn)
        except MigrationFailed as exc:
            raise StoreError(
                f"{_store_error(exc.cause, self._label)}: schema migration {exc.number} ({exc.name}) failed and was "
                f"rolled back, the file stays at schema version {exc.number - 1}. Fix the cause and open it again "
                "(a migration is applied whole and skips what already exists)"
            ) from exc.cause
        except sqlite3.Error as exc:
            raise _store_error(exc, self._label) from exc

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        # Switching to WAL needs a moment of exclusive access; when many processes open a
        # fresh file together the switch may report "locked" without waiting: retry.
        deadline = time.monotonic() + _BUSY_TIMEOUT_S
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() == "wal":
                    return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc).lower() and "busy" not in str(exc).lower():
                    raise
            if time.monotonic() > deadline:
                raise StoreError(f"{self._label}: could not switch to WAL mode (locked by another process)")
            time.sleep(0.01)

    # -- transactions ------------------------------------------------------------------
    @contextmanager
    def _tx(self, begin: str) -> Iterator[_Tx]:
        self._own_connections()
        with self._idle:
            if self._closed:
                raise StoreError(f"the store for {self._label} is closed")
            self._active += 1
        local = self._local
        local.depth = getattr(local, "depth", 0) + 1
        lock = self._shared_lock if self._ephemeral else None
        if lock is not None:
            lock.acquire()
        try:
            conn = self._connection()
            try:
                conn.execute(begin)
            except sqlite3.Error as exc:
                raise _store_error(exc, self._label) from exc
            try:
                tx = _SQLiteTx(conn, write=begin != "BEGIN")
                yield tx
                tx.flush()
                conn.execute("COMMIT")
            except BaseException as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                if isinstance(exc, sqlite3.Error):
                    raise _store_error(exc, self._label) from exc
                raise
        finally:
            if lock is not None:
                lock.release()
            local.depth -= 1
            if local.depth == 0 and not self._ephemeral:
                self._put_back(local)
            with self._idle:
                self._active -= 1
                if self._active == 0:
                    self._idle.notify_all()

    def _put_back(self, local: threading.local) -> None:
        """Hand the thread's connection to the next transaction of any thread (its outermost
        transaction ended). One left inside a transaction (a failed ROLLBACK) stays the thread's,
        and the writer thread keeps its own (see :meth:`_run_writing`)."""
        conn = getattr(local, "conn", None)
        if conn is None or conn.in_transaction or getattr(local, "keep", False):
            return
        local.conn = None
        self._idle_conns.append(conn)

    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        with self._tx("BEGIN") as tx:  # deferred: one consistent snapshot for the reads
            yield tx

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        with self._tx("BEGIN IMMEDIATE") as tx:
            yield tx

    def index_pending(self) -> int:
        """Add the messages written since the last search to the full-text index; return how many.

        A write does not index its messages: FTS5 writes a segment in every transaction that
        indexes a row, most of the cost of a small write. The index holds every message up
        to its highest rowid (message ids only grow); :meth:`search` calls this first, so a
        search sees every message. The rest are read, split into words outside any write,
        and indexed :data:`~.schema.INDEX_BATCH` at a time, each batch in one short write
        transaction (a batch another process indexed meanwhile is skipped).
        """
        from .search import _fts_columns

        count = 0
        while True:
            with self._read():
                conn = self._connection()
                mark = conn.execute(FTS_HIGH_WATER).fetchone()[0]
                rows = conn.execute(
                    "SELECT message_id, message_json FROM chatflow_messages WHERE message_id > ? "
                    "ORDER BY message_id LIMIT ?",
                    (mark, INDEX_BATCH),
                ).fetchall()
            if not rows:
                return count
            batch = [(mid, *_fts_columns(text)) for mid, text in rows]
            with self._write():
                conn = self._connection()
                mark = conn.execute(FTS_HIGH_WATER).fetchone()[0]  # again, under the write lock
                live = {mid for (mid,) in conn.execute(
                    "SELECT message_id FROM chatflow_messages WHERE message_id IN (SELECT value FROM json_each(?))",
                    (_dumps([mid for mid, _b, _t in batch if mid > mark]),),
                )}
                todo = [row for row in batch if row[0] in live]
                conn.executemany("INSERT INTO chatflow_messages_fts (rowid, body, tools) VALUES (?, ?, ?)", todo)
            count += len(todo)
            if len(rows) < INDEX_BATCH:
                return count

    def _before_search(self) -> None:
        self.index_pending()

    async def _run_blocking(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the private 4-thread pool for on-disk files; on the loop for ephemeral ones."""
        if self._ephemeral:
            return fn(*args, **kwargs)
        import asyncio  # lazily: see _blocking_executor

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_blocking_executor(), partial(fn, *args, **kwargs))

    async def _run_writing(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a write for an async twin on the store's writer thread (on the loop for ephemeral files).

        One thread, so one connection, takes every async write of this store in turn: the
        writes queue here instead of in SQLite's busy handler (which sleeps between tries),
        and the writer's page cache stays current (a connection drops its cache whenever
        another connection wrote). Only writes that never wait for another write of the
        store come here (not :meth:`begin_turn`, which may wait for a turn to end).

        A cancelled caller never sees ``CancelledError`` while its write may still land: a
        write still queued is dropped (it never runs); one already running is waited for.

        Raises:
            StoreError: the store is closed.
        """
        if self._ephemeral:
            return fn(*args, **kwargs)
        import asyncio  # lazily: see _blocking_executor

        self._own_connections()
        with self._connections_lock:
            if self._closed:
                raise StoreError(f"the store for {self._label} is closed")
            if self._writer is None:
                from concurrent.futures import ThreadPoolExecutor

                local = self._local
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatflow-sqlite-writer",
                                                  initializer=lambda: setattr(local, "keep", True))
            write = self._writer.submit(partial(fn, *args, **kwargs))
        done = asyncio.wrap_future(write)
        done.add_done_callback(lambda f: f.cancelled() or f.exception())  # an error nobody awaits is not logged
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            if write.cancel():  # still queued: it never runs
                raise
            while not write.done():  # running: the caller learns of the cancellation once it landed
                try:
                    await asyncio.shield(done)
                except asyncio.CancelledError:
                    continue
                except BaseException:
                    break
            raise

    def __repr__(self) -> str:
        return f"SQLiteSessionStore(db_path={self.db_path!r}, default_max_turns={self.default_max_turns})"
