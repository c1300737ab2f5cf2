"""The PostgreSQL transaction port: :class:`_PgTx`, the primitives of
:class:`~chatflow_cli.core.memory._port._Tx` over one connection inside one transaction
(advisory locks per session and per message id, the ``last_seq`` counter, batched inserts,
``NOTIFY`` of appended events); ``_Store``, what a transaction and the lease thread
(:class:`~.leases._Leases`) use of their store, so that neither imports it; the database's
clock as this host keeps it; and the stored rows as Python values: a session row with its
owner's lease verdict, an event, a message, and the exact JSON text each value is kept as."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...events import Event, SessionStatus
from ...messages import Message, Role, stored_message
from ...tokens import message_tokens
from .._checks import metadata_matches
from .._port import ListFilter, SearchFilter, title_of, _MessageRecord, _MessageRow, _SessionRow, _Tx, Owner
from ..search import Query, SearchHit, memory_snippet, searchable_texts, words_of
from .resources import PgMemoryStoreTx
from .vaults import PgVaultTx
from .attachments import PgAttachmentTx
from .schema import _NS_MESSAGE, _NS_SESSION, NOTIFY_CHANNEL, _channel_key
from .search import _search_vector, to_tsquery

if TYPE_CHECKING:
    import psycopg


class _Store(Protocol):
    """What a transaction (:class:`~.tx._PgTx`) and the lease thread (:class:`~.leases._Leases`)
    use of their :class:`~.store.PostgresSessionStore`, so that neither imports the store."""

    lease_s: float
    clock: Callable[[], float]
    _closed: bool
    _label: str

    def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...


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


@dataclass(frozen=True, slots=True)
class _LeasedOwner(Owner):
    """An owner read from the database with its lease verdict (``live``: the lease had not
    expired on the database clock when read)."""

    live: bool = True

    def alive(self) -> bool:
        """Alive while the lease holds; on this host name also only while the pid runs."""
        return self.live and Owner.alive(self)


def _owner(data: Any, live: Any) -> Owner | None:
    if not data:
        return None
    base = Owner.from_dict(data)
    return _LeasedOwner(base.pid, base.start_time, base.host, base.token, bool(live))


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _metadata_columns(data: Any) -> tuple[str | None, str]:
    """(``jsonb`` text, exact text) of a session's metadata. The exact JSON text is what is
    read back; the ``jsonb`` copy only serves ``--metadata`` filters (which keys a row has),
    and is None for JSON that ``jsonb`` cannot hold (``\\u0000``, NaN, Infinity)."""
    text = _dumps(data)
    try:
        strict = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return None, text
    return (None if "\\u0000" in strict else strict), text


def _joined(jsonb: Any, text: str | None) -> Any:
    """The stored value: the exact JSON text when there is one; else (rows written before
    schema version 6, with no text) the ``jsonb`` value."""
    return json.loads(text) if text is not None else jsonb


_ROW_COLUMNS = (
    "session_id, incarnation, active_agent_name, metadata, metadata_text, max_turns, turn_count, status, owner, "
    "lease_expires_at > clock_timestamp(), created_at_utc, updated_at_utc, last_seq, forked_from, title, "
    "archived_at_utc, agent_versions"
)


def _row(r: tuple[Any, ...]) -> _SessionRow:
    return _SessionRow(
        session_id=r[0],
        incarnation=r[1],
        active_agent_name=r[2],
        metadata=_joined(r[3], r[4]),
        max_turns=r[5],
        turn_count=r[6],
        status=SessionStatus(r[7]),
        owner=_owner(r[8], r[9]),
        created_at=r[10],
        updated_at=r[11],
        forked_from=json.loads(r[13]) if r[13] is not None else None,
        title=r[14],
        archived_at=r[15],
        agent_versions=json.loads(r[16]) if r[16] else {},
    )


_EVENT_COLUMNS = "seq, event_type, payload, payload_text, created_at_utc, idempotency_key"


def _event(session_id: str, r: tuple[Any, ...]) -> Event:
    return Event(session_id, int(r[0]), r[1], _joined(r[2], r[3]), r[4], r[5])


def _message(jsonb: Any, text: str | None, tokens: int | None = None) -> Message:
    """A stored message with its stored token count."""
    message = stored_message(jsonb if text is None else text)
    if tokens is not None:
        object.__setattr__(message, "tokens", tokens)
    return message



class _PgTx(PgMemoryStoreTx, PgVaultTx, PgAttachmentTx, _Tx):
    """Primitives over one connection inside one transaction."""

    @staticmethod
    def _vector(path: str, text: str) -> str | None:
        return _search_vector(Message(role=Role.USER, content=path + "\n" + text))

    @staticmethod
    def _tsquery(query: Query) -> str:
        return to_tsquery(query, False)

    def __init__(self, conn: psycopg.Connection[Any], store: _Store, writable: bool) -> None:
        self._conn = conn
        self._store = store
        self._writable = writable
        self._lease_s = store.lease_s
        self._locked: set[str] = set()
        self._messages_locked: set[str] = set()
        self._seq: dict[str, int] = {}
        self._seq_dirty: set[str] = set()
        self._events: list[tuple[Any, ...]] = []
        self._message_rows: list[tuple[Any, ...]] = []

    # -- plumbing ------------------------------------------------------------------------
    def _x(self, sql: str, params: Any = None) -> psycopg.Cursor[Any]:
        if self._events or self._message_rows:
            self.flush_inserts()
        return self._conn.execute(sql, params)

    def flush_inserts(self) -> None:
        if self._events:
            rows, self._events = self._events, []
            self._conn.cursor().executemany(
                "INSERT INTO chatflow_events (session_id, seq, event_type, turn, payload_text, "
                "idempotency_key, created_at_utc) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
        if self._message_rows:
            rows, self._message_rows = self._message_rows, []
            self._conn.cursor().executemany(
                "INSERT INTO chatflow_messages (session_id, turn, role, message_text, event_seq, tokens, "
                "summary_through, search_vector) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::tsvector)",
                rows,
            )

    def flush(self) -> None:
        """Before COMMIT: the batched inserts, then each session's seq counter that no
        update_row carried, with its NOTIFY."""
        self.flush_inserts()
        for session_id in list(self._seq_dirty):
            self._conn.execute(
                "UPDATE chatflow_sessions SET last_seq = %s WHERE session_id = %s",
                (self._seq[session_id], session_id),
            )
            self._notify(session_id)
        self._seq_dirty.clear()

    def _notify(self, session_id: str) -> None:
        self._conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, _channel_key(session_id)))

    def _lock_session(self, session_id: str) -> None:
        if self._writable and session_id not in self._locked and not self._locked:
            # one session per write transaction is locked (a second one is only read): no
            # two transactions can wait for each other's session locks
            self._x("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_NS_SESSION, session_id))
            self._locked.add(session_id)

    def _lock_message(self, message_id: str) -> None:
        if self._writable and message_id not in self._messages_locked and not self._messages_locked:
            self._x("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_NS_MESSAGE, message_id))
            self._messages_locked.add(message_id)

    # -- sessions --------------------------------------------------------------------------
    def get_row(self, session_id: str) -> _SessionRow | None:
        self._lock_session(session_id)
        r = self._x(
            f"SELECT {_ROW_COLUMNS} FROM chatflow_sessions WHERE session_id = %s"
            + (" FOR UPDATE" if session_id in self._locked else ""),
            (session_id,),
        ).fetchone()
        if r is None:
            return None
        self._seq.setdefault(session_id, int(r[12]))
        return _row(r)

    def insert_row(self, row: _SessionRow) -> None:
        self._lock_session(row.session_id)
        meta, meta_text = _metadata_columns(row.metadata)
        self._x(
            "INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, metadata, metadata_text, "
            "max_turns, turn_count, status, owner, owner_token, lease_expires_at, last_seq, created_at_utc, "
            "updated_at_utc, forked_from, title, archived_at_utc, agent_versions) VALUES (%s, %s, %s, %s::jsonb, %s, "
            "%s, %s, %s, %s::jsonb, %s, CASE WHEN %s::text IS NULL THEN NULL ELSE clock_timestamp() + %s * "
            "interval '1 second' END, 0, %s, %s, %s, %s, %s, %s)",
            (
                row.session_id, row.incarnation, row.active_agent_name, meta, meta_text, row.max_turns,
                row.turn_count, row.status.value, _dumps(row.owner.to_dict()) if row.owner else None,
                row.owner.token if row.owner else None, row.owner.token if row.owner else None, self._lease_s,
                row.created_at, row.updated_at, _dumps(row.forked_from) if row.forked_from is not None else None,
                row.title, row.archived_at, _dumps(row.agent_versions) if row.agent_versions else None,
            ),
        )
        self._seq[row.session_id] = 0

    def update_row(self, row: _SessionRow) -> None:
        meta, meta_text = _metadata_columns(row.metadata)
        token = row.owner.token if row.owner else None
        dirty = row.session_id in self._seq_dirty
        self._x(
            "UPDATE chatflow_sessions SET incarnation = %s, active_agent_name = %s, metadata = %s::jsonb, "
            "metadata_text = %s, max_turns = %s, turn_count = %s, status = %s, owner = %s::jsonb, "
            # a new owner gets a fresh lease; the same owner keeps its own (only it renews it)
            "lease_expires_at = CASE WHEN %s::text IS NULL THEN NULL "
            "WHEN owner_token IS NOT DISTINCT FROM %s THEN lease_expires_at "
            "ELSE clock_timestamp() + %s * interval '1 second' END, "
            "owner_token = %s, last_seq = %s, created_at_utc = %s, updated_at_utc = %s, forked_from = %s, "
            "title = %s, archived_at_utc = %s, agent_versions = %s "
            "WHERE session_id = %s" + (" RETURNING pg_notify(%s, %s)" if dirty else ""),
            (
                row.incarnation, row.active_agent_name, meta, meta_text, row.max_turns, row.turn_count,
                row.status.value, _dumps(row.owner.to_dict()) if row.owner else None, token, token, self._lease_s,
                token, self._seq.get(row.session_id, 0), row.created_at, row.updated_at,
                _dumps(row.forked_from) if row.forked_from is not None else None, row.title, row.archived_at,
                _dumps(row.agent_versions) if row.agent_versions else None, row.session_id,
                *((NOTIFY_CHANNEL, _channel_key(row.session_id)) if dirty else ()),
            ),
        )
        self._seq_dirty.discard(row.session_id)

    def delete_row(self, session_id: str) -> bool:
        self._lock_session(session_id)
        self.attachments_drop_session(session_id)
        # RETURNING, not rowcount: in pipeline mode a count is known only once results are read
        gone = self._x("DELETE FROM chatflow_sessions WHERE session_id = %s RETURNING 1", (session_id,)).fetchall()
        self._x("DELETE FROM chatflow_turn_queue WHERE session_id = %s", (session_id,))
        return bool(gone)

    def list_rows(self, agent: str | None) -> list[_SessionRow]:
        sql = f"SELECT {_ROW_COLUMNS} FROM chatflow_sessions"
        args: tuple[Any, ...] = ()
        if agent is not None:
            sql += " WHERE active_agent_name = %s"
            args = (agent,)
        sql += " ORDER BY updated_at_utc DESC, session_id"
        return [_row(r) for r in self._x(sql, args)]

    def list_summaries(self, where: ListFilter) -> list[tuple[_SessionRow, str, bool | None]]:
        # One statement: the rows with their previews (correlated subqueries on the
        # messages' indexes: the first live user message of turn 1, else the newest user
        # message of a failed turn) and whether the last turn failed, filtered and ordered
        # in SQL. A metadata value is matched exactly here (the stored string, or its compact
        # JSON, as every store does) after SQL kept only the rows holding the key.
        cols = ", ".join(f"s.{c}" if "(" not in c and ">" not in c else c.replace("lease_expires_at",
                         "s.lease_expires_at") for c in _ROW_COLUMNS.split(", "))
        preview = (
            "(SELECT p.message, p.message_text FROM chatflow_messages AS p WHERE p.session_id = s.session_id "
            "AND p.turn = 1 AND p.role = 'user' AND p.removed_at_seq IS NULL ORDER BY p.event_seq LIMIT 1)"
        )
        failed_preview = (
            "(SELECT p.message, p.message_text FROM chatflow_messages AS p WHERE p.session_id = s.session_id "
            "AND p.role = 'user' AND p.removed_reason = 'failed' ORDER BY p.message_id DESC LIMIT 1)"
        )
        last_end = (
            "(SELECT g.event_type FROM chatflow_events AS g WHERE g.session_id = s.session_id AND g.event_type IN "
            "('turn.failed', 'turn.completed', 'turn.interrupted', 'rollback') ORDER BY g.seq DESC LIMIT 1)"
        )
        conds = ["s.archived_at_utc IS NOT NULL" if where.archived else "s.archived_at_utc IS NULL"]
        args: list[Any] = []
        if where.agent is not None:
            conds.append("s.active_agent_name = %s")
            args.append(where.agent)
        for key, _value in where.metadata:
            conds.append("(s.metadata IS NULL OR jsonb_exists(s.metadata, %s))")
            args.append(key)
        if where.since is not None:
            conds.append("s.updated_at_utc >= %s")
            args.append(where.since)
        if where.until is not None:
            conds.append("s.updated_at_utc < %s")
            args.append(where.until)
        if where.after is not None:
            conds.append("(s.updated_at_utc < %s OR (s.updated_at_utc = %s AND s.session_id > %s))")
            args += [where.after[0], where.after[0], where.after[1]]
        sql = (
            f"SELECT {cols}, pv.message, pv.message_text, fp.message, fp.message_text, {last_end} "
            f"FROM chatflow_sessions AS s LEFT JOIN LATERAL {preview} AS pv ON true "
            f"LEFT JOIN LATERAL {failed_preview} AS fp ON pv.message IS NULL AND pv.message_text IS NULL "
            f"WHERE {' AND '.join(conds)} ORDER BY s.updated_at_utc DESC, s.session_id"
        )
        exact = where.title is None and not where.metadata
        if exact and where.limit is not None:
            sql += " LIMIT %s"
            args.append(where.limit)
        out: list[tuple[_SessionRow, str, bool | None]] = []
        needle = where.title.casefold() if where.title is not None else None
        for r in self._x(sql, args):
            row = _row(r)
            if not all(metadata_matches(row.metadata, k, v) for k, v in where.metadata):
                continue
            n = len(r)
            if r[n - 5] is not None or r[n - 4] is not None:
                text = _message(r[n - 5], r[n - 4]).content or ""
            elif r[n - 3] is not None or r[n - 2] is not None:
                text = _message(r[n - 3], r[n - 2]).content or ""
            else:
                text = ""
            if needle is not None and needle not in title_of(row.title, text).casefold():
                continue
            out.append((row, text, r[n - 1] == "turn.failed"))
            if where.limit is not None and len(out) >= where.limit:
                break
        return out

    def latest_session_id(self) -> str | None:
        r = self._x("SELECT session_id FROM chatflow_sessions ORDER BY updated_at_utc DESC, session_id LIMIT 1").fetchone()
        return None if r is None else str(r[0])

    # -- events ----------------------------------------------------------------------------
    def next_seq(self, session_id: str) -> int:
        seq = self._seq.get(session_id)
        if seq is None:
            r = self._x("SELECT last_seq FROM chatflow_sessions WHERE session_id = %s", (session_id,)).fetchone()
            seq = int(r[0]) if r is not None else 0
            self._seq[session_id] = seq
        return seq + 1

    def insert_event(self, event: Event, turn: int | None, payload_json: str | None = None) -> None:
        text = _dumps(event.payload) if payload_json is None else payload_json
        self._events.append(
            (event.session_id, event.seq, event.type, turn, text, event.idempotency_key, event.created_at)
        )
        self._seq[event.session_id] = event.seq
        self._seq_dirty.add(event.session_id)

    def events(self, session_id: str, after_seq: int, limit: int | None) -> list[Event]:
        sql = f"SELECT {_EVENT_COLUMNS} FROM chatflow_events WHERE session_id = %s AND seq > %s ORDER BY seq"
        args: tuple[Any, ...] = (session_id, after_seq)
        if limit is not None:
            sql += " LIMIT %s"
            args += (limit,)
        return [_event(session_id, r) for r in self._x(sql, args)]

    def last_event(self, session_id: str, type: str, turn: int | None = None, after_seq: int = 0) -> Event | None:
        sql = f"SELECT {_EVENT_COLUMNS} FROM chatflow_events WHERE session_id = %s AND event_type = %s AND seq > %s"
        args: tuple[Any, ...] = (session_id, type, after_seq)
        if turn is not None:
            sql += " AND turn = %s"
            args += (turn,)
        r = self._x(sql + " ORDER BY seq DESC LIMIT 1", args).fetchone()
        return None if r is None else _event(session_id, r)

    def events_of_type(self, session_id: str, type: str, after_seq: int) -> list[Event]:
        rows = self._x(
            f"SELECT {_EVENT_COLUMNS} FROM chatflow_events WHERE session_id = %s AND event_type = %s AND seq > %s "
            "ORDER BY seq",
            (session_id, type, after_seq),
        )
        return [_event(session_id, r) for r in rows]

    def turn_events(self, session_id: str, type: str, first: int, last: int | None) -> list[Event]:
        sql = f"SELECT {_EVENT_COLUMNS} FROM chatflow_events WHERE session_id = %s AND event_type = %s AND turn >= %s"
        args: tuple[Any, ...] = (session_id, type, first)
        if last is not None:
            sql += " AND turn <= %s"
            args += (last,)
        return [_event(session_id, r) for r in self._x(sql + " ORDER BY seq", args)]

    # -- messages --------------------------------------------------------------------------
    def insert_message(self, session_id: str, turn: int, message: Message, seq: int,
                       message_json: str | None = None) -> None:
        text = _dumps(message.to_dict()) if message_json is None else message_json
        self._message_rows.append(
            (session_id, turn, message.role.value, text, seq, message_tokens(message), message.summary_through,
             _search_vector(message))
        )
        if message.attachments:
            self.attachments_add(session_id, message.attachments)

    def remove_turns(self, session_id: str, first: int, last: int | None, reason: str, seq: int) -> None:
        self._x(
            "UPDATE chatflow_messages SET removed_at_seq = %s, removed_reason = %s "
            "WHERE session_id = %s AND removed_at_seq IS NULL AND turn >= %s AND turn <= %s",
            (seq, reason, session_id, max(0, first), last if last is not None else 2**31 - 1),
        )

    def latest_summary_through(self, session_id: str) -> int | None:
        r = self._x(
            "SELECT MAX(summary_through) FROM chatflow_messages WHERE session_id = %s "
            "AND summary_through IS NOT NULL AND removed_at_seq IS NULL",
            (session_id,),
        ).fetchone()
        return None if r is None or r[0] is None else int(r[0])

    def remove_summaries(self, session_id: str, after_turn: int, seq: int) -> None:
        self._x(
            "UPDATE chatflow_messages SET removed_at_seq = %s, removed_reason = 'rolled_back' "
            "WHERE session_id = %s AND summary_through > %s AND removed_at_seq IS NULL",
            (seq, session_id, after_turn),
        )

    def summaries(self, session_id: str, include_removed: bool) -> list[_MessageRow]:
        rows = self._x(
            "SELECT message, message_text, tokens, removed_reason, removed_at_seq FROM chatflow_messages "
            "WHERE session_id = %s AND summary_through IS NOT NULL"
            + ("" if include_removed else " AND removed_at_seq IS NULL") + " ORDER BY message_id",
            (session_id,),
        )
        return [_MessageRow(0, _message(m, x, n), reason, seq) for m, x, n, reason, seq in rows]

    def window(self, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        rows = self._x(
            # index ranges (an OR of them would scan the whole session's history): the real
            # system messages, the newest live summary, the live turns from first_turn
            "(SELECT 0 AS k, turn, message, message_text, tokens, event_seq, message_id FROM chatflow_messages "
            "WHERE session_id = %s AND removed_at_seq IS NULL AND turn = 0 AND role = 'system' "
            "AND summary_through IS NULL) UNION ALL "
            "(SELECT 1, turn, message, message_text, tokens, 0, 0 FROM chatflow_messages WHERE session_id = %s "
            "AND summary_through IS NOT NULL AND removed_at_seq IS NULL "
            "ORDER BY summary_through DESC, message_id DESC LIMIT 1) UNION ALL "
            "(SELECT 2, turn, message, message_text, tokens, event_seq, message_id FROM chatflow_messages "
            "WHERE session_id = %s AND removed_at_seq IS NULL AND turn >= %s) ORDER BY 1, 2, 6, 7",
            (session_id, session_id, session_id, max(1, first_turn)),
        ).fetchall()
        return [(t, _message(m, x, n)) for _k, t, m, x, n, _seq, _id in rows]

    def turn_messages(
        self, session_id: str, first: int, last: int | None, include_removed: bool
    ) -> list[_MessageRow]:
        sql = (
            "SELECT turn, message, message_text, removed_reason, removed_at_seq, role, tokens, event_seq "
            "FROM chatflow_messages WHERE session_id = %s AND turn >= %s AND turn <= %s AND summary_through IS NULL"
        )
        if not include_removed:
            sql += " AND removed_at_seq IS NULL"
        rows = self._x(
            sql + " ORDER BY turn, message_id", (session_id, first, last if last is not None else 2**31 - 1)
        )
        return [
            _MessageRow(t, _message(m, x, n), reason, seq, at)
            for t, m, x, reason, seq, role, n, at in rows
            if t > 0 or role == Role.SYSTEM.value
        ]

    def search(self, query: Query, where: SearchFilter) -> list[SearchHit]:
        # The GIN index finds the matching messages; ts_rank_cd ranks them (cover density:
        # more and closer matched words rank higher); DISTINCT ON keeps the best message of
        # each (session, turn, removal); the page is the best of those.
        conditions = ["m.search_vector @@ q.q", "m.turn > 0"]
        args: list[Any] = [to_tsquery(query, where.include_tools)]
        if not where.include_removed:
            conditions.append("m.removed_at_seq IS NULL")
        if where.session_id is not None:
            conditions.append("m.session_id = %s")
            args.append(where.session_id)
        if where.agent is not None:
            conditions.append("s.active_agent_name = %s")
            args.append(where.agent)
        if where.since is not None:
            conditions.append("e.created_at_utc >= %s")
            args.append(where.since)
        args.append(where.limit)
        rows = self._x(
            "SELECT session_id, turn, message, message_text, role, created_at_utc, agent, removed_reason, r FROM ("
            "SELECT DISTINCT ON (m.session_id, m.turn, m.removed_at_seq) m.session_id, m.turn, m.message, "
            "m.message_text, m.role, e.created_at_utc, s.active_agent_name AS agent, m.removed_reason, "
            "ts_rank_cd(m.search_vector, q.q) AS r, m.message_id "
            "FROM (SELECT %s::tsquery AS q) AS q, chatflow_messages AS m "
            "JOIN chatflow_sessions AS s ON s.session_id = m.session_id "
            "JOIN chatflow_events AS e ON e.session_id = m.session_id AND e.seq = m.event_seq "
            f"WHERE {' AND '.join(conditions)} "
            "ORDER BY m.session_id, m.turn, m.removed_at_seq, r DESC, e.created_at_utc DESC, m.message_id) AS best "
            "ORDER BY r DESC, created_at_utc DESC, session_id, turn LIMIT %s",
            args,
        ).fetchall()
        hits = []
        for sid, turn, m, x, role, created, agent, reason, rank in rows:
            texts = searchable_texts(_message(m, x), where.include_tools)
            text = max(texts, key=lambda t: query.score(words_of(t)), default="")
            hits.append(SearchHit(sid, turn, memory_snippet(query, text), role, float(created), -float(rank), agent,
                                  reason))
        return hits

    def preview(self, session_id: str) -> str:
        r = self._x(
            "SELECT message, message_text FROM chatflow_messages WHERE session_id = %s AND turn = 1 "
            "AND role = 'user' AND removed_at_seq IS NULL ORDER BY event_seq LIMIT 1",
            (session_id,),
        ).fetchone()
        if r is None:
            r = self._x(
                "SELECT message, message_text FROM chatflow_messages WHERE session_id = %s AND role = 'user' "
                "AND removed_reason = 'failed' ORDER BY message_id DESC LIMIT 1",
                (session_id,),
            ).fetchone()
        return "" if r is None else (_message(r[0], r[1]).content or "")

    # -- idempotency keys ------------------------------------------------------------------
    def idempotency_get(self, session_id: str, key: str) -> tuple[str, int | None, int] | None:
        r = self._x(
            "SELECT request_sha256, turn, event_seq FROM chatflow_idempotency_keys "
            "WHERE session_id = %s AND idempotency_key = %s",
            (session_id, key),
        ).fetchone()
        return None if r is None else (r[0], None if r[1] is None else int(r[1]), int(r[2]))

    def idempotency_put(self, session_id: str, key: str, digest: str, turn: int | None, seq: int, now: float) -> None:
        self._x(
            "INSERT INTO chatflow_idempotency_keys (session_id, idempotency_key, request_sha256, turn, event_seq, "
            "created_at_utc) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (session_id, idempotency_key) DO UPDATE "
            "SET request_sha256 = excluded.request_sha256, turn = excluded.turn, event_seq = excluded.event_seq, "
            "created_at_utc = excluded.created_at_utc",
            (session_id, key, digest, turn, seq, now),
        )

    def idempotency_turn_keyed(self, session_id: str, turn: int) -> bool:
        r = self._x(
            "SELECT 1 FROM chatflow_idempotency_keys WHERE session_id = %s AND turn = %s LIMIT 1", (session_id, turn)
        ).fetchone()
        return r is not None

    # -- inbound message ids ---------------------------------------------------------------
    def processed_get(self, message_id: str) -> _MessageRecord | None:
        self._lock_message(message_id)
        r = self._x(
            "SELECT state, processed_at_utc, holder, lease_expires_at > clock_timestamp(), session_id, turn "
            "FROM chatflow_processed_messages WHERE message_id = %s",
            (message_id,),
        ).fetchone()
        if r is None:
            return None
        return _MessageRecord(r[0], r[1], _owner(r[2], r[3]), r[4], None if r[5] is None else int(r[5]))

    def processed_put(self, message_id: str, record: _MessageRecord) -> None:
        token = record.holder.token if record.holder else None
        self._x(
            "INSERT INTO chatflow_processed_messages AS p (message_id, state, processed_at_utc, holder, holder_token, "
            "lease_expires_at, session_id, turn) VALUES (%s, %s, %s, %s::jsonb, %s, "
            "CASE WHEN %s::text IS NULL THEN NULL ELSE clock_timestamp() + %s * interval '1 second' END, %s, %s) "
            "ON CONFLICT (message_id) DO UPDATE SET state = excluded.state, processed_at_utc = "
            "excluded.processed_at_utc, holder = excluded.holder, holder_token = excluded.holder_token, "
            "lease_expires_at = CASE WHEN p.holder_token IS NOT DISTINCT FROM excluded.holder_token "
            "AND excluded.holder_token IS NOT NULL THEN p.lease_expires_at ELSE excluded.lease_expires_at END, "
            "session_id = excluded.session_id, turn = excluded.turn",
            (
                message_id, record.state, record.at, _dumps(record.holder.to_dict()) if record.holder else None,
                token, token, self._lease_s, record.session_id, record.turn,
            ),
        )

    def _db_clock(self) -> bool:
        """True when the store's clock is the database's own (not one a caller installed):
        then message records are judged on ``clock_timestamp()`` in the statement, never on
        this host's clock (a host whose clock stepped forward would re-claim processed ids)."""
        return isinstance(self._store.clock, _DatabaseClock)

    def claim(self, message_id: str, holder: Owner, now: float, ttl_s: float) -> tuple[bool, float]:
        """Claim ``message_id`` for ``holder`` in one statement when it is new, expired, or
        its holder's lease expired; (claimed, the time it was judged at -- the database's
        clock, or ``now`` under a clock the caller installed). Not claimed: the statement
        left it to another holder."""
        self._lock_message(message_id)
        r = self._x(
            "WITH t AS (SELECT COALESCE(%s::float8, extract(epoch FROM clock_timestamp())::float8) AS now), "
            "c AS (INSERT INTO chatflow_processed_messages AS p (message_id, state, processed_at_utc, holder, "
            "holder_token, lease_expires_at) SELECT %s, 'in_progress', t.now, %s::jsonb, %s, "
            "clock_timestamp() + %s * interval '1 second' FROM t "
            "ON CONFLICT (message_id) DO UPDATE SET state = 'in_progress', processed_at_utc = "
            "excluded.processed_at_utc, holder = excluded.holder, holder_token = excluded.holder_token, "
            "lease_expires_at = excluded.lease_expires_at, "
            # an attempt whose holder died keeps naming its turn, so recovery knows it is retried
            "session_id = CASE WHEN p.state = 'in_progress' THEN p.session_id END, "
            "turn = CASE WHEN p.state = 'in_progress' THEN p.turn END "
            "WHERE p.processed_at_utc + %s <= excluded.processed_at_utc "
            "OR (p.state = 'in_progress' AND (p.lease_expires_at IS NULL OR p.lease_expires_at <= clock_timestamp())) "
            "RETURNING 1) "
            "SELECT t.now, EXISTS (SELECT 1 FROM c) FROM t",
            (None if self._db_clock() else now, message_id, _dumps(holder.to_dict()), holder.token, self._lease_s,
             ttl_s),
        ).fetchone()
        assert r is not None
        return bool(r[1]), float(r[0])

    def processed_turn_claimed(self, session_id: str, turn: int) -> bool:
        r = self._x(
            "SELECT 1 FROM chatflow_processed_messages WHERE session_id = %s AND turn = %s "
            "AND state = 'in_progress' LIMIT 1",
            (session_id, turn),
        ).fetchone()
        return r is not None

    def processed_finish_turn(self, session_id: str, turn: int, holder: str | None, now: float) -> None:
        self._x(
            "UPDATE chatflow_processed_messages SET state = 'completed', processed_at_utc = %s, holder = NULL, "
            "holder_token = NULL, lease_expires_at = NULL WHERE session_id = %s AND turn = %s "
            "AND state = 'in_progress' AND (%s::text IS NULL OR holder_token = %s)",
            (now, session_id, turn, holder, holder),
        )

    def processed_drop_turn(self, session_id: str, turn: int, holder: str | None) -> None:
        self._x(
            "DELETE FROM chatflow_processed_messages WHERE session_id = %s AND turn = %s AND state = 'in_progress' "
            "AND (%s::text IS NULL OR holder_token = %s)",
            (session_id, turn, holder, holder),
        )

    def processed_purge(self, now: float, ttl_s: float) -> None:
        if self._db_clock():
            self._x("DELETE FROM chatflow_processed_messages WHERE processed_at_utc <= "
                    "extract(epoch FROM clock_timestamp())::float8 - %s", (ttl_s,))
        else:
            self._x("DELETE FROM chatflow_processed_messages WHERE processed_at_utc <= %s", (now - ttl_s,))

    def processed_release(self, message_id: str) -> bool:
        self._lock_message(message_id)
        gone = self._x("DELETE FROM chatflow_processed_messages WHERE message_id = %s RETURNING 1", (message_id,))
        return len(gone.fetchall()) == 1

    # -- endpoints -------------------------------------------------------------------------
    def endpoint_get(self, session_id: str) -> tuple[str | None, str | None] | None:
        r = self._x(
            "SELECT model, base_url FROM chatflow_session_endpoints WHERE session_id = %s", (session_id,)
        ).fetchone()
        return None if r is None else (r[0], r[1])

    def endpoint_put(self, session_id: str, model: str | None, base_url: str | None, now: float) -> None:
        self._x(
            "INSERT INTO chatflow_session_endpoints (session_id, model, base_url, updated_at_utc) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (session_id) DO UPDATE SET model = excluded.model, "
            "base_url = excluded.base_url, updated_at_utc = excluded.updated_at_utc",
            (session_id, model, base_url, now),
        )

    # -- the turn queue --------------------------------------------------------------------
    def queue_add(self, session_id: str, owner: Owner, now: float) -> int:
        r = self._x(
            "INSERT INTO chatflow_turn_queue (session_id, owner, lease_expires_at, enqueued_at_utc) "
            "VALUES (%s, %s::jsonb, clock_timestamp() + %s * interval '1 second', %s) RETURNING ticket",
            (session_id, _dumps(owner.to_dict()), self._lease_s, now),
        ).fetchone()
        assert r is not None
        return int(r[0])

    def queue_list(self, session_id: str) -> list[tuple[int, Owner]]:
        rows = self._x(
            "SELECT ticket, owner, lease_expires_at > clock_timestamp() FROM chatflow_turn_queue "
            "WHERE session_id = %s ORDER BY ticket",
            (session_id,),
        )
        out: list[tuple[int, Owner]] = []
        for ticket, owner, live in rows:
            leased = _owner(owner, live)
            assert leased is not None
            out.append((int(ticket), leased))
        return out

    def queue_remove(self, session_id: str, ticket: int) -> None:
        self._x("DELETE FROM chatflow_turn_queue WHERE session_id = %s AND ticket = %s", (session_id, ticket))
