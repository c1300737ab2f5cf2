"""Stored rows and Python values: a session row with its owner's lease verdict, an event, a
message, and the exact JSON text each value is kept as."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...events import Event, SessionStatus
from ...messages import Message, stored_message
from .._port import _SessionRow, Owner


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
