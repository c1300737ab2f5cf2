"""The SQLite transaction port: :class:`_SQLiteTx`, the primitives of
:class:`~chatflow_cli.core.memory._port._Tx` over one connection inside one transaction
(inserts of events and messages batched and flushed before any other statement), and the
stored rows as Python values and back: a session row, an event, a message with its token
count, and the statements that insert events and messages."""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING, Any, cast

from ...events import Event, SessionStatus
from ...messages import Message, Role, compact_json, stored_message
from ...tokens import message_tokens
from .._port import ListFilter, SearchFilter, title_of, _MessageRecord, _MessageRow, _SessionRow, _Tx, Owner
from .resources import SQLiteMemoryStoreTx
from .vaults import SQLiteVaultTx
from .attachments import SQLiteAttachmentTx

if TYPE_CHECKING:  # pragma: no cover
    from ..search import Query, SearchHit


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
    message = stored_message(message_json)
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
    return "" if message_json is None else (stored_message(message_json).content or "")


def _dumps(data: Any) -> str:
    return compact_json(data)


def _event(session_id: str, r: tuple[Any, ...]) -> Event:
    return Event(session_id, r[0], r[1], json.loads(r[2]), r[3], r[4])



class _SQLiteTx(SQLiteMemoryStoreTx, SQLiteVaultTx, SQLiteAttachmentTx, _Tx):
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
        self.attachments_drop_session(session_id)
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
        if message.attachments:
            self.attachments_add(session_id, message.attachments)

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

    def summaries(self, session_id: str, include_removed: bool) -> list[_MessageRow]:
        rows = self.c.execute(
            "SELECT message_json, tokens, removed_reason, removed_at_seq FROM chatflow_messages "
            "WHERE session_id = ? AND summary_through IS NOT NULL"
            + ("" if include_removed else " AND removed_at_seq IS NULL") + " ORDER BY message_id",
            (session_id,),
        )
        return [_MessageRow(0, _message(j, n), reason, seq) for j, n, reason, seq in rows]

    def window_dicts(self, session_id: str, first_turn: int) -> list[tuple[int, dict[str, Any]]]:
        rows = self._live_window_rows(session_id, first_turn)
        # one parse for the whole window: a call per message costs more than the parsing
        parsed = json.loads("[" + ",".join(text for _, text, _ in rows) + "]")
        return [(row[0], data) for row, data in zip(rows, parsed)]

    def turn_messages(
        self, session_id: str, first: int, last: int | None, include_removed: bool
    ) -> list[_MessageRow]:
        sql = (
            "SELECT turn, message_json, removed_reason, removed_at_seq, role, tokens, event_seq FROM chatflow_messages "
            "WHERE session_id = ? AND turn >= ? AND turn <= ?"
        )
        if not include_removed:
            sql += " AND removed_at_seq IS NULL"
        sql += " AND summary_through IS NULL"
        rows = self.c.execute(
            sql + " ORDER BY turn, message_id", (session_id, first, last if last is not None else 2**62)
        )
        return [
            _MessageRow(t, _message(j, n), reason, seq, at)
            for t, j, reason, seq, role, n, at in rows
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
        return "" if r is None else (stored_message(r[0]).content or "")

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
        from ..search import to_fts5
        from .search import _best_per_turn

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
        from ..search import SearchHit
        from .search import _snippet

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
