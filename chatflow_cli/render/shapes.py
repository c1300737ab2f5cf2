"""JSON shapes of chatflow's output, and what a stored turn holds.

Events (``chat --output jsonl``, ``replay --json``) share one shape, :func:`event_json`;
``sessions ls --json`` rows are :func:`summary_dict`; ``sessions show --json`` turns are
:func:`turn_dict`. Handoffs and interruptions are read from a turn's messages
(:func:`turn_handoffs`, :func:`turn_interrupted`), with no scan of the event log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Container, Sequence

from ..core.events import SessionStatus

if TYPE_CHECKING:  # pragma: no cover
    from ..core.events import Event
    from ..core.memory import SessionSummary, TurnRecord
    from ..core.messages import Message

__all__ = ["EVENT_SCHEMA", "event_json", "stored_event_json", "summary_dict", "turn_dict", "turn_handoffs", "turn_interrupted"]


# ---------------------------------------------------------------------------------------
# the JSON event shape (chat --output jsonl, replay --output json/jsonl)
# ---------------------------------------------------------------------------------------
#: The version of the JSON event shape, in every event's ``"schema"`` field. It changes
#: only when a field is removed or changes meaning; new fields may appear within a version.
EVENT_SCHEMA = 1


def _without_tokens(data: Any) -> Any:
    """``data`` without the lock tokens of the owners it names (a ``status`` or
    ``session.recovered`` payload's ``owner``): the token is the running turn's credential."""
    if isinstance(data, dict) and isinstance(data.get("owner"), dict) and "token" in data["owner"]:
        data = {**data, "owner": {k: v for k, v in data["owner"].items() if k != "token"}}
    return data


def event_json(type: str, session_id: str | None, data: Any = None, *, seq: int | None = None,
               turn: int | None = None, created_at: float | None = None,
               idempotency_key: str | None = None) -> dict[str, Any]:
    """One event in chatflow's JSON shape (README, "JSON output")::

        {"schema": 1, "seq": 7, "type": "message.model", "session_id": "s1", "turn": 2,
         "created_at": 1764547200.5, "data": {...}}

    ``seq`` (the event-log position) and ``created_at`` (epoch seconds, UTC) are present only
    on events stored in the log; runtime events (``text.delta``, ``tool.call_started``...)
    and ``result`` have neither. ``turn`` is always present (``null`` when none applies).
    ``data`` is the event's payload; a ``result``/``error`` event's ``data`` holds
    ``is_error``. Owners' lock tokens are never included.
    """
    out: dict[str, Any] = {"schema": EVENT_SCHEMA}
    if seq is not None:
        out["seq"] = seq
    out["type"] = type
    out["session_id"] = session_id
    out["turn"] = turn
    if created_at is not None:
        out["created_at"] = created_at
    if idempotency_key is not None:
        out["idempotency_key"] = idempotency_key
    out["data"] = _without_tokens(data if data is not None else {})
    return out


def stored_event_json(event: Event) -> dict[str, Any]:
    """A stored :class:`~chatflow_cli.core.events.Event` in the JSON event shape."""
    payload = event.payload or {}
    turn = payload.get("turn") if isinstance(payload, dict) else None
    return event_json(event.type, event.session_id, payload, seq=event.seq,
                      turn=turn if isinstance(turn, int) else None, created_at=event.created_at,
                      idempotency_key=event.idempotency_key)


def summary_dict(s: SessionSummary) -> dict[str, Any]:
    """A session summary as JSON-ready data (``sessions ls --json``)."""
    return {
        "session_id": s.session_id,
        "agent": s.active_agent_name,
        "status": status_name(s.status),
        "turns": s.turn_count,
        "max_turns": s.max_turns,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "preview": s.preview,
        "failed": s.failed,
        "metadata": s.metadata,
        "title": s.title,
        "title_set": s.title_set,
        "archived_at": s.archived_at,
        "forked_from": s.forked_from,
        "cursor": s.cursor,
    }


# ---------------------------------------------------------------------------------------
# sessions show
# ---------------------------------------------------------------------------------------
def status_name(status: SessionStatus | str) -> str:
    """A session status as its plain name (``idle``, ``running``, ``rescheduled``, ``terminated``)."""
    return status.value if isinstance(status, SessionStatus) else status


def _role(msg: Message) -> str:
    return msg.role.value


def turn_handoffs(record: TurnRecord) -> list[dict[str, Any]]:
    """The handoffs of one turn, from its messages: each ``transfer_to_*`` call, with the
    agent that made it and the agent that spoke next (``from_agent``, ``to_agent``,
    ``tool_call_id``). No event-log scan is needed, so ``sessions show`` stays fast."""
    out: list[dict[str, Any]] = []
    msgs = record.messages
    for index, msg in enumerate(msgs):
        if _role(msg) != "model":
            continue
        for call in msg.tool_calls:
            if call.name.startswith("transfer_to_"):
                out.append({
                    "from_agent": msg.agent,
                    "to_agent": _next_agent(msgs, index, msg.agent) or call.name[len("transfer_to_"):],
                    "tool_call_id": call.id,
                })
    return out


def turn_interrupted(record: TurnRecord, interrupted_turns: Container[int] = ()) -> bool:
    """Whether a stored turn was stopped by Ctrl-C or cancellation.

    True when a message carries the ``interrupted`` flag (partial model text, synthetic
    tool results), or when the turn ends with its user message (stopped while the model
    was thinking: nothing else was stored) or with a tool result (stopped after a complete
    tool round) and its number is in ``interrupted_turns`` (the
    turn numbers of the session's ``turn.interrupted`` events; any container, queried
    only in that second case).
    """
    msgs = record.messages
    if any(m.interrupted for m in msgs):
        return True
    return bool(msgs) and _role(msgs[-1]) in ("user", "tool") and record.number in interrupted_turns


def turn_dict(record: TurnRecord, *, interrupted: bool = False,
              changed: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One turn as JSON-ready data (``sessions show --json``): ``agent_versions`` is
    ``{agent: version}`` of the agents that replied in it (known versions only),
    ``agent_changed`` ``[{"agent", "from", "to"}]`` the agents whose version changed in it,
    ``model``/``base_url`` what answered it (None: unknown, see :class:`TurnRecord`),
    ``resources`` ``[{"kind", "name", "mode"}]`` the resources it ran with (the mounts in
    force when it ended, from the event log)."""
    versions: dict[str, str] = {}
    for msg in record.messages:
        version = getattr(msg, "agent_version", None)
        if _role(msg) == "model" and msg.agent and version:
            versions[msg.agent] = str(version)
    return {
        "number": record.number,
        "in_window": record.in_window,
        "rolled_back": record.rolled_back,
        "failed": record.failed,
        "interrupted": interrupted,
        "messages": [m.to_dict() for m in record.messages],
        "handoffs": turn_handoffs(record),
        "agent_versions": versions,
        "agent_changed": list(changed or ()),
        "model": getattr(record, "model", None),
        "base_url": getattr(record, "base_url", None),
        "resources": [m.to_dict() for m in getattr(record, "resources", ())],
    }


#: Characters and line shapes that make Markdown differ from the text as written:
#: emphasis, code, headings, quotes, links, images, tables, strikethrough, HTML and


def _next_agent(msgs: Sequence[Message], index: int, current: str | None = None) -> str | None:
    for msg in msgs[index + 1 :]:
        if _role(msg) == "model" and msg.agent and msg.agent != current:
            return msg.agent
    return None
