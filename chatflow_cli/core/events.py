"""The append-only event log of a session and the events a running turn streams.

Stored events (:class:`Event`) have a per-session ``seq``: 1, 2, 3… strictly increasing,
with no gaps, never reused, allocated by the store inside the write transaction that
inserts the event. ``seq`` is the consumer's cursor: ``store.events(session_id,
after_seq=N)`` returns what came after N (the basis of ``chatflow replay``).

Stored event types and their payloads (``turn`` is the user-visible turn number):

=========================  ==============================================================
type                       payload
=========================  ==============================================================
``session.created``        ``{"agent": str, "max_turns": int, "metadata": {...}}``
``message.user``           ``{"turn": int, "message": Message.to_dict()}``
``message.model``          ``{"turn": int, "message": ...}`` (tool calls inside the message)
``message.system``         ``{"turn": 0, "message": ...}``
``tool.result``            ``{"turn": int, "message": ...}`` (a TOOL message)
``tool.pending``           ``{"turn": int, "tool_use_ids": [str, ...]}`` custom tools wait
``tool.result_submitted``  ``{"turn": int, "tool_use_id": str, "output": str}`` (+ ``"is_error": true``)
``handoff``                ``{"turn": int, "from_agent": str, "to_agent": str, "tool_call_id": str}``
                           (+ ``to_agent_version`` when the target's version is known)
``agent.changed``          ``{"turn": int, "agent": str, "version": str, "previous_version": str,
                           "since_turn": int}`` the agent running in ``turn`` is another
                           version than the one it last ran, in ``since_turn`` (once per change)
``status``                 ``{"status": "idle"|"running"|"rescheduled"|"terminated", "reason": str, ...}``
``turn.completed``         ``{"turn": int, "agent": str, "content": str, "usage": {...} | null, "finish_reason": str}``
                           (+ ``agent_version``: the answering agent's version, when known)
                           (+ ``model``, ``base_url``: what answered the turn, never a key; logs
                           written before they were recorded lack them: unknown)
                           (``usage``: :func:`~chatflow_cli.core.stream.normalize_usage`'s shape; null: not reported)
                           (``finish_reason`` ``"length"``/``"content_filter"``: the reply was cut)
``turn.failed``            ``{"turn": int, "error": str, "error_type": str}`` the turn left the window
                           (+ ``active_agent``, ``reverted_from_agent`` when a handoff was undone)
``turn.interrupted``       ``{"turn": int, "tool_use_ids": [...], "reason": str}``
``rollback``               ``{"to_turn": int, "removed_turns": [int, ...], "active_agent": str}``
                           (+ ``"system": true``: the SYSTEM messages went too); ``active_agent``:
                           the agent active at the end of ``to_turn``, the session's again (logs
                           written before it was recorded lack it)
``metadata.updated``       ``{"metadata": {...} (stored result), "changes": {...}, "removed": [...]}``
``session.recovered``      ``{"turn": int, "owner": {...}}`` a dead owner's run was closed
                           (+ ``"lease_expired": true``: the owner was cut off past its lease)
``context.compacted``      ``{"through": K, "model": str, "tokens_before": int, "tokens_after": int,
                           "instructions": str | None, "summary": str}`` turns 1..K summarised
``turn.interrupt_requested``  ``{"turn": int, "owner": str}`` another process asked the running
                           turn (its owner's token) to stop; it stops at its next chunk or tool
                           boundary and records ``turn.interrupted``
``session.imported``       ``{"format": str, "source": str, "source_id": str, "counts": {...}, "turns": [int, int]}``
                           an import added turns (``sessions import``; counts of what it added;
                           ``turns``: the first and last turn it added from a reader's turns)
``session.titled``         ``{"title": str | None}`` the user set (or, None, cleared) the title
``session.archived``       ``{}`` the session was archived (no new turns until unarchived)
``session.unarchived``     ``{}`` it was brought back
``resource.mounted``       ``{"kind": "memory_store"|"vault", "name": str, "mode": "read-only"|"read-write"}``
                           a resource is mounted on the session from here on (a mount of a
                           resource already mounted changes its mode); see
                           :mod:`chatflow_cli.core.resources.mounts`
``resource.unmounted``     ``{"kind": ..., "name": str, "mode": ...}`` it is mounted no more
                           (+ ``reason``: why, when chatflow unmounted it itself: the memory
                           store or vault was deleted since)
=========================  ==============================================================

These types are *reserved* (:data:`RESERVED_EVENT_TYPES`, :data:`RESERVED_EVENT_PREFIXES`):
they change derived state, so only the store writes them. ``store.append_event`` refuses them (and any type starting with ``message.``, ``tool.``,
``turn.``, ``session.``, ``metadata.`` or ``resource.``); business events (``note``, ``billing.refund``…)
may be appended freely, with an optional idempotency key.

A session id deleted and created again is a new incarnation whose ``seq`` starts at 1:
a consumer's cursor must be reset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "RECORDABLE_EVENT_TYPES",
    "RESERVED_EVENT_PREFIXES",
    "RESERVED_EVENT_TYPES",
    "Event",
    "EventType",
    "SessionStatus",
    "event_type_name",
    "is_reserved_event_type",
    "use_instead",
]


class SessionStatus(str, Enum):
    """A session's status: ``idle``, ``running``, ``rescheduled`` (retry at ``retry_at``) or
    ``terminated`` (final); derived from the latest ``status`` event."""

    IDLE = "idle"
    RUNNING = "running"
    RESCHEDULED = "rescheduled"
    TERMINATED = "terminated"


class EventType(str, Enum):
    SESSION_CREATED = "session.created"
    MESSAGE_USER = "message.user"
    MESSAGE_MODEL = "message.model"
    MESSAGE_SYSTEM = "message.system"
    TOOL_RESULT = "tool.result"
    TOOL_PENDING = "tool.pending"
    TOOL_RESULT_SUBMITTED = "tool.result_submitted"
    HANDOFF = "handoff"
    STATUS = "status"
    TURN_COMPLETED = "turn.completed"
    TURN_FAILED = "turn.failed"
    TURN_INTERRUPTED = "turn.interrupted"
    ROLLBACK = "rollback"
    METADATA_UPDATED = "metadata.updated"
    SESSION_RECOVERED = "session.recovered"
    SESSION_TITLED = "session.titled"
    SESSION_ARCHIVED = "session.archived"
    SESSION_UNARCHIVED = "session.unarchived"
    CONTEXT_COMPACTED = "context.compacted"
    TURN_INTERRUPT_REQUESTED = "turn.interrupt_requested"
    SESSION_IMPORTED = "session.imported"
    AGENT_CHANGED = "agent.changed"
    RESOURCE_MOUNTED = "resource.mounted"
    RESOURCE_UNMOUNTED = "resource.unmounted"


@dataclass(frozen=True, slots=True)
class Event:
    """One stored event. ``created_at`` is UTC epoch seconds."""

    session_id: str
    seq: int
    type: str
    payload: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    idempotency_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "session_id": self.session_id,
            "seq": self.seq,
            "type": self.type,
            "created_at": self.created_at,
            "payload": self.payload,
        }
        if self.idempotency_key is not None:
            data["idempotency_key"] = self.idempotency_key
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        return cls(
            session_id=data["session_id"],
            seq=int(data["seq"]),
            type=data["type"],
            payload=dict(data.get("payload") or {}),
            created_at=float(data.get("created_at", 0.0)),
            idempotency_key=data.get("idempotency_key"),
        )

    def to_json(self) -> str:
        """Compact strict JSON. Raises ``ValueError`` for a float NaN or Infinity (the stores
        refuse such payloads, so only a hand-made event can hold one)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


#: Event types chatflow itself writes and derives state from (the session row, the window,
#: pending tool results). :meth:`BaseSessionStore.append_event` refuses them, so the log
#: never says something the derived state does not show. Any other type (``"note"``,
#: ``"billing.invoice_sent"``…) is a custom/business event and is accepted.
RESERVED_EVENT_PREFIXES = ("message.", "tool.", "turn.", "session.", "metadata.", "resource.")
RESERVED_EVENT_TYPES = frozenset({"status", "rollback", "handoff"} | {t.value for t in EventType})

_USE_INSTEAD = {
    "message.": "session.add_message() then store.save()",
    "tool.result_submitted": "store.submit_tool_result()",
    "tool.": "session.add_message() (tool results) or a Runner (pending custom tools)",
    "turn.": "session.complete_turn(), fail_turn() or interrupt_turn() then store.save()",
    "session.": "store.get_or_create(), store.begin_turn() or store.delete()",
    "metadata.": "session.update_metadata() then store.save()",
    "status": "session.set_status() then store.save(), or store.release()",
    "rollback": "store.rollback() or session.rollback_to()",
    "handoff": "session.set_active_agent() then store.save()",
    "context.compacted": "chatflow_cli.core.compaction.compact_session()",
    "agent.changed": "session.note_agent_version() (a Runner does it when an agent starts in a turn)",
    "resource.": "SessionContext(..., resources=[...]), session.mount() / session.unmount() then store.save()",
}

#: Reserved types :meth:`SessionContext.record_event
#: <chatflow_cli.core.memory.context.SessionContext.record_event>` may still journal: they
#: change no stored row or window.
RECORDABLE_EVENT_TYPES = frozenset(
    {
        EventType.TOOL_PENDING.value,
        EventType.TOOL_RESULT_SUBMITTED.value,
        EventType.TURN_COMPLETED.value,
        EventType.TURN_INTERRUPTED.value,
        EventType.SESSION_RECOVERED.value,
        EventType.SESSION_IMPORTED.value,
        EventType.TURN_INTERRUPT_REQUESTED.value,
    }
)


def is_reserved_event_type(kind: str) -> bool:
    """Whether ``kind`` is one of chatflow's own event types (:data:`RESERVED_EVENT_TYPES`,
    or a type under one of :data:`RESERVED_EVENT_PREFIXES`), which only the method that makes
    its change may write."""
    return kind in RESERVED_EVENT_TYPES or kind.startswith(RESERVED_EVENT_PREFIXES)


def use_instead(kind: str) -> str:
    """The method to call instead of writing the reserved event type ``kind`` directly, as
    text for an error message (``"store.rollback() or session.rollback_to()"``); a generic
    hint for a reserved type with no entry of its own."""
    for prefix, method in _USE_INSTEAD.items():
        if kind == prefix or (prefix.endswith(".") and kind.startswith(prefix)):
            return method
    return "the SessionContext method that makes this change"


def event_type_name(type: Any) -> str:
    """The type name of an :class:`EventType` member or a string (returned as it is).

    Raises:
        TypeError: ``type`` is neither, or is the empty string.
    """
    kind = type.value if isinstance(type, EventType) else type
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"event type must be a non-empty str, got {kind!r}")
    return kind

