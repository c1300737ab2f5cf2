"""The SQLite store: :class:`SQLiteSessionStore`, sessions with their messages and event log in one file.

``SQLiteSessionStore(db_path, default_max_turns=40)`` takes these two parameters only (any
other keyword, such as ``busy_timeout=``, is a ``TypeError``). The session rules are those
of :class:`~chatflow_cli.core.memory.base.BaseSessionStore`; this module supplies
transactions over SQLite (:class:`_SQLiteTx`), the schema lives in
:mod:`chatflow_cli.core.memory.schema`.

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

Connections: one per thread for an on-disk file; one connection behind a lock for an
ephemeral database (``:memory:``, ``file::memory:?cache=shared``, any URI with
``mode=memory``). Async twins run on-disk reads on a private pool of
``_BLOCKING_IO_WORKERS = 4`` threads through :meth:`SQLiteSessionStore._run_blocking`, and
on-disk writes in turn on the store's own writer thread (:meth:`SQLiteSessionStore._run_writing`);
ephemeral databases stay on the event loop.

Every ``sqlite3`` error surfaces as :class:`StoreError` with one clear line (not a
database, corrupt, read-only, disk full, locked).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..errors import SchemaTooNewError, StoreError
from ..events import Event, SessionStatus
from ..messages import Message, Role, compact_json
from ..tokens import message_tokens
from ._checks import DEFAULT_MAX_TURNS
from ._fork import SharedPool, fork_lock, keep_inherited
from ._port import ListFilter, SearchFilter, title_of, _MessageRecord, _SessionRow, _StoredMessage, _Tx
from .base import BaseSessionStore
from .sqlite_vaults import SQLiteVaultTx
from .search import Query, SearchHit, memory_snippet, searchable_texts, to_fts5, words_of
from .owner import Owner
from .schema import FTS_HIGH_WATER, INDEX_BATCH, SCHEMA_VERSION, MigrationFailed, apply_migrations, schema_version

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["SCHEMA_VERSION", "SQLiteSessionStore"]

_T = TypeVar("_T")

#: Threads of the private pool that runs on-disk SQLite work for async callers.
_BLOCKING_IO_WORKERS = 4
_BUSY_TIMEOUT_S = 30.0

_pool = SharedPool("chatflow-sqlite")


def _blocking_executor() -> ThreadPoolExecutor:
    """The private pool, made on first use. ``asyncio`` and ``concurrent.futures`` are
    imported only here and in ``_run_blocking``: a sync caller (``chatflow sessions ls``)
    never pays their ~10-40 ms import."""
    return _pool.get(_BLOCKING_IO_WORKERS)


# ----------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------


def _store_error(exc: BaseException, where: str) -> StoreError:
    """One clear line for a sqlite3 / OS error on database ``where``."""
    text = str(exc)
    low = text.lower()
    if "file is not a database" in low or "file is encrypted" in low:
        message = f"{where} is not a SQLite database"
    elif "malformed json" in low:  # SQLite's JSON functions on one stored value, not the file
        message = (f"{where}: a stored value is not strict JSON ({text}; e.g. a NaN or Infinity written by "
                   "an older chatflow): the file itself is not corrupt")
    elif "malformed" in low or "corrupt" in low:
        message = f"{where} is corrupt or truncated ({text})"
    elif "readonly" in low or "read-only" in low or isinstance(exc, PermissionError):
        message = f"{where} cannot be written: read-only file or directory ({text})"
    elif "disk is full" in low or "database or disk is full" in low:
        message = f"{where} cannot be written: the disk is full"
    elif "unable to open" in low:
        message = f"cannot open {where}: missing directory, permissions, or read-only location ({text})"
    elif "locked" in low or "busy" in low:
        message = f"{where} is locked by another process (waited {_BUSY_TIMEOUT_S:.0f} s)"
    elif isinstance(exc, OSError):
        message = f"cannot open {where}: {exc.strerror or text}"
    else:
        message = f"database error on {where}: {text}"
    return StoreError(message)


# ----------------------------------------------------------------------------------------
# Transactions
# ----------------------------------------------------------------------------------------


def _row(r: sqlite3.Row | tuple[Any, ...]) -> _SessionRow:
    owner = json.loads(r[7]) if r[7] else None
    return _SessionRow(
        session_id=r[0],
        incarnation=r[1],
        active_agent_name=r[2],
        metadata=json.loads(r[3]),
        max_turns=r[4],
        turn_count=r[5],
        status=SessionStatus(r[6]),
        owner=Owner.from_dict(owner) if owner else None,
        created_at=r[8],
        updated_at=r[9],
        forked_from=json.loads(r[10]) if r[10] else None,
        title=r[11],
        archived_at=r[12],
        agent_versions=json.loads(r[13]) if r[13] else {},
    )


_ROW_COLUMNS = (
    "session_id, incarnation, active_agent_name, metadata_json, max_turns, turn_count, status, owner_json, "
    "created_at_utc, updated_at_utc, forked_from_json, title, archived_at_utc, agent_versions_json"
)


_INSERT_EVENT = (
    "INSERT INTO chatflow_events (session_id, seq, event_type, turn, payload_json, idempotency_key, "
    "created_at_utc) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_MESSAGE = (
    "INSERT INTO chatflow_messages (session_id, turn, position, role, message_json, event_seq, tokens, "
    "summary_through) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _message(message_json: str, tokens: int | None) -> Message:
    """A stored message with its stored token count."""
    message = Message.from_json(message_json)
    if tokens is not None:
        object.__setattr__(message, "tokens", tokens)
    return message


def _row_params(row: _SessionRow) -> tuple[Any, ...]:
    """The row's values in ``_ROW_COLUMNS`` order."""
    return (
        row.session_id,
        row.incarnation,
        row.active_agent_name,
        _dumps(row.metadata),
        row.max_turns,
        row.turn_count,
        row.status.value,
        _dumps(row.owner.to_dict()) if row.owner else None,
        row.created_at,
        row.updated_at,
        _dumps(row.forked_from) if row.forked_from else None,
        row.title,
        row.archived_at,
        _dumps(row.agent_versions) if row.agent_versions else None,
    )


def _preview_text(message_json: str | None) -> str:
    return "" if message_json is None else (Message.from_json(message_json).content or "")


def _dumps(data: Any) -> str:
    return compact_json(data)


def _fts_columns(message_json: str) -> tuple[str | None, str | None]:
    """The full-text index's ``(body, tools)`` of a stored message: the words of its user
    and model text, and of its tool results and tool calls ("name arguments"), as
    :func:`~.search.words_of` gives them, one space between words. Read by Python, which
    accepts the bare ``NaN``/``Infinity`` an older chatflow wrote; text Python cannot read
    is indexed as nothing, so one bad row never fails a search."""
    try:
        message = Message.from_json(message_json)
    except (ValueError, TypeError, KeyError):
        return None, None
    body = message.content if message.role in (Role.USER, Role.MODEL) else None
    tools = None
    if message.role is Role.TOOL:
        tools = message.content
    elif message.role is Role.MODEL and message.tool_calls:
        tools = " ".join(f"{call.name} {call.arguments}" for call in message.tool_calls)
    return (" ".join(words_of(body)) or None if body else None), (" ".join(words_of(tools)) or None if tools else None)


def _event(session_id: str, r: tuple[Any, ...]) -> Event:
    return Event(session_id, r[0], r[1], json.loads(r[2]), r[3], r[4])


class _SQLiteTx(_Tx, SQLiteVaultTx):
    """Primitives over one connection inside one transaction."""

    def __init__(self, conn: sqlite3.Connection, write: bool = False) -> None:
        self._conn = conn
        self._write = write
        self._seq: dict[str, int] = {}
        # The next position of a turn's live messages, per (session, turn); _known_from[s] = t:
        # every live row of s from turn t on was read in this transaction (live_window), so a
        # turn from t on missing from _positions has none.
        self._positions: dict[tuple[str, int], int] = {}
        self._known_from: dict[str, int] = {}
        # Inserts of events and messages are batched (one executemany each) and flushed
        # before any other statement of the transaction and before COMMIT.
        self._events: list[tuple[Any, ...]] = []
        self._messages: list[tuple[Any, ...]] = []

    @property
    def c(self) -> sqlite3.Connection:
        """The connection, after the batched inserts were written."""
        self.flush()
        return self._conn

    def flush(self) -> None:
        for sql, rows in ((_INSERT_EVENT, self._events), (_INSERT_MESSAGE, self._messages)):
            if rows:
                self._conn.executemany(sql, rows)
                rows.clear()

    def get_row(self, session_id: str) -> _SessionRow | None:
        if not self._write or session_id in self._seq:
            r = self.c.execute(
                f"SELECT {_ROW_COLUMNS} FROM chatflow_sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
            return None if r is None else _row(r)
        # a write reads the log's last seq with the row: next_seq needs no statement of its own
        r = self.c.execute(
            f"SELECT {_ROW_COLUMNS}, (SELECT COALESCE(MAX(seq), 0) FROM chatflow_events WHERE session_id = ?) "
            "FROM chatflow_sessions WHERE session_id = ?", (session_id, session_id)
        ).fetchone()
        if r is None:
            return None
        self._seq[session_id] = r[14]
        return _row(r)

    def window_marks(self, session_id: str, first: int, last: int) -> object | None:
        known = self._known_from.get(session_id)
        if known is None or known > first:
            return None
        positions = self._positions
        turns = (0, *range(max(1, first), last + 1))
        return first, {turn: positions[(session_id, turn)] for turn in turns if (session_id, turn) in positions}

    def assume_window(self, session_id: str, marks: object | None) -> None:
        if marks is None:
            return
        known, positions = cast("tuple[int, dict[int, int]]", marks)
        self._known_from[session_id] = known
        self._positions.update({(session_id, turn): pos for turn, pos in positions.items()})

    def insert_row(self, row: _SessionRow) -> None:
        self.c.execute(
            f"INSERT INTO chatflow_sessions ({_ROW_COLUMNS}) VALUES ({', '.join('?' * 14)})", _row_params(row)
        )

    def update_row(self, row: _SessionRow) -> None:
        # every column but the key, in _ROW_COLUMNS order (a row-value SET)
        self.c.execute(
            f"UPDATE chatflow_sessions SET ({_ROW_COLUMNS.split(', ', 1)[1]}) = ({', '.join('?' * 13)}) "
            "WHERE session_id = ?",
            (*_row_params(row)[1:], row.session_id),
        )

    def delete_row(self, session_id: str) -> bool:
        self._seq.pop(session_id, None)
        self._known_from.pop(session_id, None)
        self._positions = {k: v for k, v in self._positions.items() if k[0] != session_id}
        return self.c.execute("DELETE FROM chatflow_sessions WHERE session_id = ?", (session_id,)).rowcount > 0

    def list_rows(self, agent: str | None) -> list[_SessionRow]:
        sql = f"SELECT {_ROW_COLUMNS} FROM chatflow_sessions"
        args: tuple[Any, ...] = ()
        if agent is not None:
            sql += " WHERE active_agent_name = ?"
            args = (agent,)
        sql += " ORDER BY updated_at_utc DESC, session_id"
        return [_row(r) for r in self.c.execute(sql, args)]

    def list_summaries(self, where: ListFilter) -> list[tuple[_SessionRow, str, bool | None]]:
        # One statement: the rows with their previews (correlated subqueries on the
        # messages' indexes: the first live user message of turn 1, else the newest user
        # message of a failed turn), filtered, ordered and limited in SQL.
        cols = ", ".join(f"s.{c}" for c in _ROW_COLUMNS.split(", "))
        preview = (
            "COALESCE((SELECT m.message_json FROM chatflow_messages AS m WHERE m.session_id = s.session_id "
            "AND m.turn = 1 AND m.role = 'user' AND m.removed_at_seq IS NULL ORDER BY m.position LIMIT 1), "
            "(SELECT m.message_json FROM chatflow_messages AS m WHERE m.session_id = s.session_id "
            "AND m.role = 'user' AND m.removed_reason = 'failed' ORDER BY m.message_id DESC LIMIT 1))"
        )
        # the last turn failed: turn.failed is the newest of the events that end a turn
        failed = (
            "(SELECT g.event_type FROM chatflow_events AS g WHERE g.session_id = s.session_id AND g.event_type IN "
            "('turn.failed', 'turn.completed', 'turn.interrupted', 'rollback') ORDER BY g.seq DESC LIMIT 1)"
        )
        sql = f"SELECT {cols}, {preview}, {failed} FROM chatflow_sessions AS s WHERE "
        conds = ["s.archived_at_utc IS NOT NULL" if where.archived else "s.archived_at_utc IS NULL"]
        args: list[Any] = []
        if where.agent is not None:
            conds.append("s.active_agent_name = ?")
            args.append(where.agent)
        for key, value in where.metadata:
            path = '$."' + key.replace('"', '""') + '"'
            conds.append("((json_type(s.metadata_json, ?) = 'text' AND json_extract(s.metadata_json, ?) = ?) "
                         "OR (json_type(s.metadata_json, ?) <> 'text' AND s.metadata_json -> ? = ?))")
            args += [path, path, value, path, path, value]
        if where.since is not None:
            conds.append("s.updated_at_utc >= ?")
            args.append(where.since)
        if where.until is not None:
            conds.append("s.updated_at_utc < ?")
            args.append(where.until)
        if where.after is not None:
            conds.append("(s.updated_at_utc < ? OR (s.updated_at_utc = ? AND s.session_id > ?))")
            args += [where.after[0], where.after[0], where.after[1]]
        sql += " AND ".join(conds) + " ORDER BY s.updated_at_utc DESC, s.session_id"
        if where.title is None:
            if where.limit is not None:
                sql += " LIMIT ?"
                args.append(where.limit)
            rows = self.c.execute(sql, args).fetchall()
        else:  # the title may be derived from the preview: matched here, on the same rows
            needle = where.title.casefold()
            rows = []
            for r in self.c.execute(sql, args):
                if needle in title_of(r[11], _preview_text(r[14])).casefold():
                    rows.append(r)
                    if where.limit is not None and len(rows) >= where.limit:
                        break
        return [(_row(r), _preview_text(r[14]), r[15] == "turn.failed") for r in rows]

    def latest_session_id(self) -> str | None:
        r = self.c.execute(
            "SELECT session_id FROM chatflow_sessions ORDER BY updated_at_utc DESC, session_id LIMIT 1"
        ).fetchone()
        return None if r is None else r[0]

    def next_seq(self, session_id: str) -> int:
        # Read once per transaction under the write lock, then counted on inside it.
        seq = self._seq.get(session_id)
        if seq is None:
            seq = self.c.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM chatflow_events WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
            self._seq[session_id] = seq
        return seq + 1

    def insert_event(self, event: Event, turn: int | None, payload_json: str | None = None) -> None:
        self._events.append(
            (
                event.session_id,
                event.seq,
                event.type,
                turn,
                _dumps(event.payload) if payload_json is None else payload_json,
                event.idempotency_key,
                event.created_at,
            )
        )
        self._seq[event.session_id] = event.seq

    def events(self, session_id: str, after_seq: int, limit: int | None) -> list[Event]:
        rows = self.c.execute(
            "SELECT seq, event_type, payload_json, created_at_utc, idempotency_key FROM chatflow_events "
            "WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (session_id, after_seq, -1 if limit is None else limit),
        )
        return [_event(session_id, r) for r in rows]

    def last_event(self, session_id: str, type: str, turn: int | None = None, after_seq: int = 0) -> Event | None:
        sql = (
            "SELECT seq, event_type, payload_json, created_at_utc, idempotency_key FROM chatflow_events "
            "WHERE session_id = ? AND event_type = ? AND seq > ?"
        )
        args: tuple[Any, ...] = (session_id, type, after_seq)
        if turn is not None:
            sql += " AND turn = ?"
            args += (turn,)
        r = self.c.execute(sql + " ORDER BY seq DESC LIMIT 1", args).fetchone()
        return None if r is None else _event(session_id, r)

    def events_of_type(self, session_id: str, type: str, after_seq: int) -> list[Event]:
        rows = self.c.execute(
            "SELECT seq, event_type, payload_json, created_at_utc, idempotency_key FROM chatflow_events "
            "WHERE session_id = ? AND event_type = ? AND seq > ? ORDER BY seq",
            (session_id, type, after_seq),
        )
        return [_event(session_id, r) for r in rows]

    def turn_events(self, session_id: str, type: str, first: int, last: int | None) -> list[Event]:
        sql = ("SELECT seq, event_type, payload_json, created_at_utc, idempotency_key FROM chatflow_events "
               "WHERE session_id = ? AND event_type = ? AND turn >= ?")
        args: tuple[Any, ...] = (session_id, type, first)
        if last is not None:
            sql += " AND turn <= ?"
            args += (last,)
        return [_event(session_id, r) for r in self.c.execute(sql + " ORDER BY seq", args)]

    def insert_message(self, session_id: str, turn: int, message: Message, seq: int,
                       message_json: str | None = None) -> None:
        key = (session_id, turn)
        position = self._positions.get(key)
        if position is None and turn >= self._known_from.get(session_id, 2**62):
            position = 0
        elif position is None:  # pending rows of this turn would be in _positions: no flush needed
            position = self._conn.execute(
                "SELECT COALESCE(MAX(position), -1) + 1 FROM chatflow_messages "
                "WHERE session_id = ? AND turn = ? AND removed_at_seq IS NULL",
                key,
            ).fetchone()[0]
        self._messages.append(
            (session_id, turn, position, message.role.value,
             message.to_json() if message_json is None else message_json, seq, message_tokens(message),
             message.summary_through)
        )
        self._positions[key] = position + 1

    def remove_turns(self, session_id: str, first: int, last: int | None, reason: str, seq: int) -> None:
        self.c.execute(
            "UPDATE chatflow_messages SET removed_at_seq = ?, removed_reason = ? "
            "WHERE session_id = ? AND removed_at_seq IS NULL AND turn >= ? AND turn <= ?",
            (seq, reason, session_id, max(0, first), last if last is not None else 2**62),
        )
        top = last if last is not None else 2**62
        # the turns first..last have no live rows now (position 0 again); the others keep theirs
        self._positions = {k: v for k, v in self._positions.items() if k[0] != session_id or not first <= k[1] <= top}

    def window(self, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        system = self.c.execute(
            "SELECT message_json, tokens FROM chatflow_messages WHERE session_id = ? AND turn = 0 "
            "AND removed_at_seq IS NULL AND role = 'system' AND summary_through IS NULL ORDER BY turn, position",
            (session_id,),
        ).fetchall()
        system += self.c.execute(
            "SELECT message_json, tokens FROM chatflow_messages WHERE session_id = ? AND summary_through IS NOT NULL "
            "AND removed_at_seq IS NULL ORDER BY summary_through DESC, message_id DESC LIMIT 1",
            (session_id,),
        ).fetchall()
        rows = self.c.execute(
            "SELECT turn, message_json, tokens FROM chatflow_messages WHERE session_id = ? AND turn >= ? "
            "AND removed_at_seq IS NULL ORDER BY turn, position",
            (session_id, max(1, first_turn)),
        ).fetchall()
        return [(0, _message(j, n)) for j, n in system] + [(t, _message(j, n)) for t, j, n in rows]

    def _live_window_rows(self, session_id: str, newest_first: int) -> list[tuple[int, str, int | None]]:
        """``(turn, message_json, tokens)`` of :meth:`live_window`'s messages, in its order.

        One statement reads the live rows of turn 0 (SYSTEM messages and summaries) and of
        the turns from ``newest_first`` on; the cut after the newest summary is made here.
        Every live row of those turns is read, so their next positions are known without a
        statement of their own (see ``_known_from``)."""
        first_read = max(1, newest_first)
        rows = self.c.execute(
            "SELECT turn, position, role, message_json, tokens, summary_through, message_id FROM chatflow_messages "
            "WHERE session_id = ? AND turn = 0 AND removed_at_seq IS NULL "
            "UNION ALL SELECT turn, position, role, message_json, tokens, summary_through, message_id "
            "FROM chatflow_messages WHERE session_id = ? AND turn >= ? AND removed_at_seq IS NULL "
            "ORDER BY 1, 2",
            (session_id, session_id, first_read),
        ).fetchall()
        positions = self._positions
        if self._known_from.get(session_id, 2**62) > first_read:
            self._known_from[session_id] = first_read
        positions.setdefault((session_id, 0), 0)
        newest: tuple[int, int, str, int | None] | None = None  # (K, message_id, json, tokens)
        system: list[tuple[int, str, int | None]] = []
        turns: list[tuple[int, str, int | None]] = []
        for turn, position, role, text, tokens, through, message_id in rows:
            key = (session_id, turn)
            if positions.get(key, 0) <= position:
                positions[key] = position + 1
            if turn != 0:
                turns.append((turn, text, tokens))
            elif through is not None:
                if newest is None or (through, message_id) > newest[:2]:
                    newest = (through, message_id, text, tokens)
            elif role == "system":
                system.append((0, text, tokens))
        if newest is None:
            return system + turns
        system.append((0, newest[2], newest[3]))
        return system + [row for row in turns if row[0] > newest[0]]

    def live_window(self, session_id: str, newest_first: int) -> list[tuple[int, Message]]:
        return [(turn, _message(text, tokens)) for turn, text, tokens in self._live_window_rows(session_id, newest_first)]

    def latest_summary_through(self, session_id: str) -> int | None:
        r = self.c.execute(
            "SELECT MAX(summary_through) FROM chatflow_messages WHERE session_id = ? AND summary_through IS NOT NULL "
            "AND removed_at_seq IS NULL",
            (session_id,),
        ).fetchone()
        return None if r is None or r[0] is None else int(r[0])

    def remove_summaries(self, session_id: str, after_turn: int, seq: int) -> None:
        self.c.execute(
            "UPDATE chatflow_messages SET removed_at_seq = ?, removed_reason = 'rolled_back' "
            "WHERE session_id = ? AND summary_through > ? AND removed_at_seq IS NULL",
            (seq, session_id, after_turn),
        )

    def summaries(self, session_id: str, include_removed: bool) -> list[_StoredMessage]:
        rows = self.c.execute(
            "SELECT message_json, tokens, removed_reason, removed_at_seq FROM chatflow_messages "
            "WHERE session_id = ? AND summary_through IS NOT NULL"
            + ("" if include_removed else " AND removed_at_seq IS NULL") + " ORDER BY message_id",
            (session_id,),
        )
        return [_StoredMessage(0, _message(j, n), reason, seq) for j, n, reason, seq in rows]

    def window_dicts(self, session_id: str, first_turn: int) -> list[tuple[int, dict[str, Any]]]:
        rows = self._live_window_rows(session_id, first_turn)
        # one parse for the whole window: a call per message costs more than the parsing
        parsed = json.loads("[" + ",".join(text for _, text, _ in rows) + "]")
        return [(row[0], data) for row, data in zip(rows, parsed)]

    def turn_messages(
        self, session_id: str, first: int, last: int | None, include_removed: bool
    ) -> list[_StoredMessage]:
        sql = (
            "SELECT turn, message_json, removed_reason, removed_at_seq, role, tokens FROM chatflow_messages "
            "WHERE session_id = ? AND turn >= ? AND turn <= ?"
        )
        if not include_removed:
            sql += " AND removed_at_seq IS NULL"
        sql += " AND summary_through IS NULL"
        rows = self.c.execute(
            sql + " ORDER BY turn, message_id", (session_id, first, last if last is not None else 2**62)
        )
        return [
            _StoredMessage(t, _message(j, n), reason, seq)
            for t, j, reason, seq, role, n in rows
            if t > 0 or role == Role.SYSTEM.value
        ]

    def preview(self, session_id: str) -> str:
        r = self.c.execute(
            "SELECT message_json FROM chatflow_messages WHERE session_id = ? AND turn = 1 AND role = 'user' "
            "AND removed_at_seq IS NULL ORDER BY position LIMIT 1",
            (session_id,),
        ).fetchone()
        if r is None:
            r = self.c.execute(
                "SELECT message_json FROM chatflow_messages WHERE session_id = ? AND role = 'user' "
                "AND removed_reason = 'failed' ORDER BY message_id DESC LIMIT 1",
                (session_id,),
            ).fetchone()
        return "" if r is None else (Message.from_json(r[0]).content or "")

    def idempotency_get(self, session_id: str, key: str) -> tuple[str, int | None, int] | None:
        r = self.c.execute(
            "SELECT request_sha256, turn, event_seq FROM chatflow_idempotency_keys "
            "WHERE session_id = ? AND idempotency_key = ?",
            (session_id, key),
        ).fetchone()
        return None if r is None else (r[0], r[1], r[2])

    def idempotency_put(self, session_id: str, key: str, digest: str, turn: int | None, seq: int, now: float) -> None:
        self.c.execute(
            "INSERT INTO chatflow_idempotency_keys (session_id, idempotency_key, request_sha256, turn, event_seq, "
            "created_at_utc) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, idempotency_key) DO UPDATE SET "
            "request_sha256 = excluded.request_sha256, turn = excluded.turn, event_seq = excluded.event_seq, "
            "created_at_utc = excluded.created_at_utc",  # a retry of a turn that gave no result
            (session_id, key, digest, turn, seq, now),
        )

    def idempotency_turn_keyed(self, session_id: str, turn: int) -> bool:
        r = self.c.execute(
            "SELECT 1 FROM chatflow_idempotency_keys WHERE session_id = ? AND turn = ? LIMIT 1", (session_id, turn)
        ).fetchone()
        return r is not None

    def processed_get(self, message_id: str) -> _MessageRecord | None:
        r = self.c.execute(
            "SELECT state, processed_at_utc, holder_json, session_id, turn FROM chatflow_processed_messages "
            "WHERE message_id = ?",
            (message_id,),
        ).fetchone()
        if r is None:
            return None
        return _MessageRecord(r[0], r[1], Owner.from_dict(json.loads(r[2])) if r[2] else None, r[3], r[4])

    def processed_put(self, message_id: str, record: _MessageRecord) -> None:
        self.c.execute(
            "INSERT OR REPLACE INTO chatflow_processed_messages (message_id, processed_at_utc, state, holder_json, "
            "session_id, turn) VALUES (?, ?, ?, ?, ?, ?)",
            (
                message_id,
                record.at,
                record.state,
                _dumps(record.holder.to_dict()) if record.holder else None,
                record.session_id,
                record.turn,
            ),
        )

    def processed_turn_claimed(self, session_id: str, turn: int) -> bool:
        r = self.c.execute(
            "SELECT 1 FROM chatflow_processed_messages WHERE session_id = ? AND turn = ? AND state = 'in_progress' "
            "LIMIT 1",
            (session_id, turn),
        ).fetchone()
        return r is not None

    def processed_finish_turn(self, session_id: str, turn: int, holder: str | None, now: float) -> None:
        self.c.execute(
            "UPDATE chatflow_processed_messages SET state = 'completed', processed_at_utc = ?, holder_json = NULL "
            "WHERE session_id = ? AND turn = ? AND state = 'in_progress' "
            "AND (? IS NULL OR json_extract(holder_json, '$.token') = ?)",
            (now, session_id, turn, holder, holder),
        )

    def processed_drop_turn(self, session_id: str, turn: int, holder: str | None) -> None:
        self.c.execute(
            "DELETE FROM chatflow_processed_messages WHERE session_id = ? AND turn = ? AND state = 'in_progress' "
            "AND (? IS NULL OR json_extract(holder_json, '$.token') = ?)",
            (session_id, turn, holder, holder),
        )

    def processed_purge(self, now: float, ttl_s: float) -> None:
        self.c.execute("DELETE FROM chatflow_processed_messages WHERE processed_at_utc <= ?", (now - ttl_s,))

    def endpoint_get(self, session_id: str) -> tuple[str | None, str | None] | None:
        r = self.c.execute(
            "SELECT model, base_url FROM chatflow_session_endpoints WHERE session_id = ?", (session_id,)
        ).fetchone()
        return None if r is None else (r[0], r[1])

    def endpoint_put(self, session_id: str, model: str | None, base_url: str | None, now: float) -> None:
        self.c.execute(
            "INSERT INTO chatflow_session_endpoints (session_id, model, base_url, updated_at_utc) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (session_id) DO UPDATE SET model = excluded.model, base_url = excluded.base_url, "
            "updated_at_utc = excluded.updated_at_utc",
            (session_id, model, base_url, now),
        )

    def processed_release(self, message_id: str) -> bool:
        cur = self.c.execute("DELETE FROM chatflow_processed_messages WHERE message_id = ?", (message_id,))
        return cur.rowcount == 1

    def queue_add(self, session_id: str, owner: Owner, now: float) -> int:
        cur = self.c.execute(
            "INSERT INTO chatflow_turn_queue (session_id, owner_json, enqueued_at_utc) VALUES (?, ?, ?)",
            (session_id, _dumps(owner.to_dict()), now),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def queue_list(self, session_id: str) -> list[tuple[int, Owner]]:
        rows = self.c.execute(
            "SELECT ticket, owner_json FROM chatflow_turn_queue WHERE session_id = ? ORDER BY ticket", (session_id,)
        )
        return [(t, Owner.from_dict(json.loads(o))) for t, o in rows]

    def queue_remove(self, session_id: str, ticket: int) -> None:
        self.c.execute("DELETE FROM chatflow_turn_queue WHERE session_id = ? AND ticket = ?", (session_id, ticket))

    def search(self, query: Query, where: SearchFilter) -> list[SearchHit]:
        # FTS5 ranks its own matches fastest alone ("ORDER BY rank LIMIT n" on the index):
        # take the best n, join them to their messages for the filters and the grouping by
        # turn, and widen n until a page is full or every match was seen. A filter that
        # keeps few of many matches ends in one query that joins every match.
        match = to_fts5(query, None if where.include_tools else ("body",))
        n = max(64, where.limit * 4)
        while True:
            best = self.c.execute(
                "SELECT rowid, rank FROM chatflow_messages_fts WHERE chatflow_messages_fts MATCH ? "
                "ORDER BY rank LIMIT ?",
                (match, n),
            ).fetchall()
            if not best:
                return []
            if len(best) < n or n >= 16_384:
                break
            rank = dict(best)
            rows = self._hit_rows("m.message_id IN (SELECT value FROM json_each(?))", [_dumps(list(rank))], where)
            page = _best_per_turn([(rank[r[3]], r) for r in rows], where.limit)
            if len(page) >= where.limit:
                return self._hits(page, query, where.include_tools)
            n *= 8
        if len(best) < n:  # every match was seen
            rank = dict(best)
            rows = self._hit_rows("m.message_id IN (SELECT value FROM json_each(?))", [_dumps(list(rank))], where)
            return self._hits(_best_per_turn([(rank[r[3]], r) for r in rows], where.limit), query, where.include_tools)
        rows = self._hit_rows(
            "m.message_id IN (SELECT rowid FROM chatflow_messages_fts WHERE chatflow_messages_fts MATCH ?)",
            [match],
            where,
        )
        ranked = dict(
            self.c.execute(
                "SELECT rowid, rank FROM chatflow_messages_fts WHERE chatflow_messages_fts MATCH ? "
                "AND rowid IN (SELECT value FROM json_each(?))",
                (match, _dumps([r[3] for r in rows])),
            ).fetchall()
        )
        return self._hits(_best_per_turn([(ranked[r[3]], r) for r in rows if r[3] in ranked], where.limit), query,
                          where.include_tools)

    def _hit_rows(self, condition: str, args: list[Any], where: SearchFilter) -> list[tuple[Any, ...]]:
        """(session id, turn, removed_at_seq, message id, role, created, agent, removed reason) of
        the messages under ``condition`` that pass the filters."""
        sql = (
            "SELECT m.session_id, m.turn, m.removed_at_seq, m.message_id, m.role, e.created_at_utc, "
            "s.active_agent_name, m.removed_reason FROM chatflow_messages AS m "
            "JOIN chatflow_sessions AS s ON s.session_id = m.session_id "
            "JOIN chatflow_events AS e ON e.session_id = m.session_id AND e.seq = m.event_seq "
            f"WHERE {condition} AND m.turn > 0"
        )
        if not where.include_removed:
            sql += " AND m.removed_at_seq IS NULL"
        if where.session_id is not None:
            sql += " AND m.session_id = ?"
            args.append(where.session_id)
        if where.agent is not None:
            sql += " AND s.active_agent_name = ?"
            args.append(where.agent)
        if where.since is not None:
            sql += " AND e.created_at_utc >= ?"
            args.append(where.since)
        return self.c.execute(sql, args).fetchall()

    def _hits(self, page: list[tuple[float, tuple[Any, ...]]], query: Query,
              include_tools: bool) -> list[SearchHit]:
        if not page:
            return []
        ids = [r[3] for _rank, r in page]
        texts = dict(self.c.execute(
            "SELECT message_id, message_json FROM chatflow_messages "
            "WHERE message_id IN (SELECT value FROM json_each(?))",
            (_dumps(ids),),
        ).fetchall())
        return [
            SearchHit(sid, turn, _snippet(query, texts.get(mid), include_tools), role, created, float(rank), agent,
                      reason)
            for rank, (sid, turn, _removed_seq, mid, role, created, agent, reason) in page
        ]


def _snippet(query: Query, message_json: str | None, include_tools: bool) -> str:
    """The snippet of the searched text of ``message_json`` that matches ``query`` best (as
    the other stores make it)."""
    try:
        message = Message.from_json(message_json or "")
    except (ValueError, TypeError, KeyError):
        return ""
    texts = searchable_texts(message, include_tools)
    text = max(texts, key=lambda t: query.score(words_of(t)), default="")
    return memory_snippet(query, text)


def _best_per_turn(ranked: list[tuple[float, tuple[Any, ...]]], limit: int) -> list[tuple[float, tuple[Any, ...]]]:
    """The best-ranked row of each (session, turn, removal), best first (ties: newest first)."""
    ranked.sort(key=lambda item: (item[0], -item[1][5], item[1][0], item[1][1], item[1][3]))
    seen: set[tuple[Any, ...]] = set()
    out = []
    for rank, row in ranked:
        key = (row[0], row[1], row[2])
        if key not in seen:
            seen.add(key)
            out.append((rank, row))
            if len(out) >= limit:
                break
    return out


# ----------------------------------------------------------------------------------------
# Store
# ----------------------------------------------------------------------------------------


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
            with self._idle:
                self._active -= 1
                if self._active == 0:
                    self._idle.notify_all()

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

    async def _run_blocking(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
        """Run ``fn`` on the private 4-thread pool for on-disk files; on the loop for ephemeral ones."""
        if self._ephemeral:
            return fn(*args, **kwargs)
        import asyncio  # lazily: see _blocking_executor

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_blocking_executor(), partial(fn, *args, **kwargs))

    async def _run_writing(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
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

                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatflow-sqlite-writer")
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
