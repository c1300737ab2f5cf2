"""Stored rows and Python values: a session row, an event, a message with its token count,
and the statements that insert events and messages."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ...events import Event, SessionStatus
from ...messages import Message, compact_json, stored_message
from .._port import _SessionRow, Owner


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
