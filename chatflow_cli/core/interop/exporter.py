"""Export stored sessions: the ``chatflow``, ``md`` and ``openai`` formats from any store.

Only the store's public reads are used (``events``, ``load_turns``, ``session_endpoint``),
so every store exports the same way. The ``json`` format (the shape ``sessions show
--json`` prints) belongs to the command line, which draws it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import NonFiniteNumberError
from ..events import Event
from ..memory.binding import AGENT_TRAIL_EVENTS, AgentTrail
from ..messages import Message, Role
from ..stream import normalize_usage
from .chatflow_format import export_chatflow
from .markdown import export_markdown
from .openai_chat import export_openai
from .records import iso_time

if TYPE_CHECKING:  # pragma: no cover
    from ..memory.protocol import ListingStore

__all__ = ["export_lines", "session_header"]


def _active_agents(events: list[Event]) -> Iterator[tuple[Event, str | None]]:
    """Each event with the agent active once it happened: handoffs, failed turns and rollbacks
    move it (a rollback to the agent active at the end of the turn it rolls back to)."""
    agent: str | None = None
    trail = AgentTrail()
    for event in events:
        data = event.payload
        if event.type in AGENT_TRAIL_EVENTS:
            trail.replay(event.type, data)
        if event.type == "session.created":
            agent = data.get("agent")
        elif event.type == "handoff":
            agent = data.get("to_agent", agent)
        elif event.type == "turn.failed" and "active_agent" in data:
            agent = data["active_agent"]
        elif event.type == "rollback" and isinstance(data.get("to_turn"), int):
            recorded = data.get("active_agent")  # absent in logs written before rollbacks restored the agent
            found = recorded if isinstance(recorded, str) else trail.agent_at(data["to_turn"], data.get("system") is True)
            agent = found if found is not None else agent
        yield event, agent


def _state_of(events: list[Event]) -> dict[str, Any]:
    """Agent, metadata and max_turns as the log leaves them."""
    state: dict[str, Any] = {"agent": None, "metadata": {}, "max_turns": None, "status": "idle", "title": None,
                             "archived_at": None}
    for event, agent in _active_agents(events):
        data = event.payload
        state["agent"] = agent
        if event.type == "session.created":
            state.update(metadata=dict(data.get("metadata") or {}), max_turns=data.get("max_turns"))
        elif event.type == "metadata.updated" and isinstance(data.get("metadata"), dict):
            state["metadata"] = dict(data["metadata"])
        elif event.type == "status":
            state["status"] = data.get("status", state["status"])
        elif event.type == "session.titled":
            state["title"] = data.get("title") or None
        elif event.type in ("session.archived", "session.unarchived"):
            state["archived_at"] = event.created_at if event.type == "session.archived" else None
    return state


def session_header(store: ListingStore, session_id: str, events: list[Event] | None = None) -> dict[str, Any]:
    """The header of an export: ``session_id``, ``title`` (the title set, or None),
    ``agent``, ``status``, ``metadata``,
    ``settings`` (``max_turns``, ``model``, ``base_url``), ``created_at``/``updated_at`` (ISO
    8601 UTC: the session's creation and last activity, as ``sessions ls`` shows them, so an
    imported session passes its source's times on), ``turns`` (live turns) and ``events`` (the log's length).

    Raises:
        SessionNotFoundError: no such session.
    """
    if events is None:
        events = store.events(session_id)
    state = _state_of(events)
    endpoint = getattr(store, "session_endpoint", None)
    model, base_url = endpoint(session_id) if endpoint is not None else (None, None)
    live = [r for r in store.load_turns(session_id, first=1) if not (r.rolled_back or r.failed)]
    # the session's own times, as ``sessions ls`` shows them (an imported session keeps its
    # source's, which its events' times -- the import's -- are not); the log's for a store without them
    created, updated = (events[0].created_at, events[-1].created_at) if events else (None, None)
    summary = getattr(store, "session_summary", None)
    if summary is not None:
        found = summary(session_id)
        created, updated = found.created_at, found.updated_at
    return {
        "session_id": session_id,
        "title": state["title"],
        "agent": state["agent"],
        "status": state["status"],
        "metadata": state["metadata"],
        "settings": {"max_turns": state["max_turns"], "model": model, "base_url": base_url},
        "created_at": iso_time(created) if created is not None else None,
        "updated_at": iso_time(updated) if updated is not None else None,
        "turns": max((r.number for r in live), default=0),
        "events": len(events),
    }


def _turn_info(events: list[Event]) -> dict[int, dict[str, Any]]:
    info: dict[int, dict[str, Any]] = {}
    for event in events:
        turn = event.payload.get("turn")
        if not isinstance(turn, int):
            continue
        if event.type == "message.user":
            info[turn] = {"created_at": event.created_at}
        elif event.type == "turn.completed" and turn in info:
            info[turn]["usage"] = normalize_usage(event.payload.get("usage"))  # any stored shape; None: unknown
            for key in ("finish_reason", "model", "base_url"):  # the turn's own model and endpoint
                if event.payload.get(key):
                    info[turn][key] = event.payload[key]
    return info


def _turn_agents(events: list[Event]) -> dict[int, str | None]:
    """The agent active when each live turn began, by turn number (handoffs, failed turns and
    rollbacks move it; a turn number used again after a rollback takes the later one)."""
    return {event.payload["turn"]: agent for event, agent in _active_agents(events)
            if event.type == "message.user" and isinstance(event.payload.get("turn"), int)}


#: Import formats whose turns chatflow's Runner never ran: what the model was sent is the
#: source's own (its system prompt, stored as SYSTEM messages), never an agent's instructions.
_OWN_PROMPT_FORMATS = ("llm", "claude-code", "openai")


def _imported_turns(events: list[Event]) -> set[int]:
    """The live turns an import of a source chatflow's Runner never ran added (llm, Claude
    Code, an openai file): ``session.imported`` names them (``turns``: ``[first, last]``; a
    log written before it did: its ``counts`` turns, the last ones before it). A turn number
    used again later by a turn of chatflow's own is not one of them."""
    found: set[int] = set()
    last = 0
    for event in events:
        data = event.payload
        if event.type == "message.user" and isinstance(data.get("turn"), int):
            last = data["turn"]
            found.discard(last)
        elif event.type == "rollback" and isinstance(data.get("to_turn"), int):
            last = min(last, data["to_turn"])
        elif event.type == "turn.failed" and isinstance(data.get("turn"), int):
            last = min(last, data["turn"] - 1)
        elif event.type == "session.imported" and data.get("format") in _OWN_PROMPT_FORMATS:
            span = data.get("turns")
            counts = data["counts"] if isinstance(data.get("counts"), dict) else {}
            if isinstance(span, list) and len(span) == 2 and all(isinstance(n, int) for n in span):
                found.update(range(span[0], span[1] + 1))
            elif isinstance(counts.get("turns"), int):
                found.update(range(last - counts["turns"] + 1, last + 1))
    return found


def _sdk_turn(messages: Iterable[Message]) -> bool:
    """The turn was added through the Agents SDK session (:mod:`chatflow_cli.core.sdk_session`):
    its messages carry the SDK's items. chatflow's own Runner never sets ``items``, and the
    SDK agent's instructions never reach the store, so such a turn has none to export."""
    return any(m.items for m in messages)


def session_blobs(store: object, session_id: str) -> dict[str, bytes]:
    """The bytes of every attachment the session's messages use (sha256 -> bytes); empty for
    a session without any (one read) or a store that keeps none."""
    hashes = getattr(store, "attachment_hashes", None)
    read = getattr(store, "attachment_data", None)
    if hashes is None or read is None:
        return {}
    used = hashes(session_id)
    return dict(read(used)) if used else {}


def export_lines(store: ListingStore, session_id: str, fmt: str, *, per_turn: bool = False,
                 instructions: Mapping[str, str] | None = None,
                 warn: Callable[[str], None] | None = None) -> Iterator[str]:
    """The text of one session in ``fmt`` (``chatflow``, ``md`` or ``openai``), in pieces.

    ``per_turn`` (``openai`` only): one line per turn window instead of one per session.
    ``instructions`` (``openai`` only): agent name -> instructions; the instructions of the
    agent active when a turn began are that turn's first ``system`` message, as the Runner
    sent them (the store keeps agents by name only). Only turns chatflow's own Runner ran
    get them: a turn added through the Agents SDK session (its messages carry SDK items)
    gets none, since chatflow never saw the SDK agent's instructions, and neither does a turn
    imported from a source chatflow's Runner never ran (llm, Claude Code, an openai file):
    its model was sent that source's own system prompt, which the session stores as its
    SYSTEM messages. The session's stored SYSTEM messages are written either way.

    What is written always imports back: a session with no live turn (none yet, or every
    turn failed or rolled back) has no conversation in the ``openai`` form, so nothing is
    written for it and ``warn`` (when given) is called with a sentence saying so.

    Everything written is strict JSON: a float NaN or Infinity (only a database written by an
    older chatflow holds one) stops the export of that session with an error naming it.

    Raises:
        SessionNotFoundError: no such session.
        StoreError: the session holds a float NaN or Infinity (:class:`NonFiniteNumberError`).
        ValueError: an unknown ``fmt``.
    """
    try:
        yield from _export_lines(store, session_id, fmt, per_turn=per_turn, instructions=instructions, warn=warn)
    except NonFiniteNumberError as exc:
        raise NonFiniteNumberError(f"session {session_id} cannot be exported: {exc}",
                                   session_id=session_id) from None


def _export_lines(store: ListingStore, session_id: str, fmt: str, *, per_turn: bool,
                  instructions: Mapping[str, str] | None,
                  warn: Callable[[str], None] | None) -> Iterator[str]:
    events = store.events(session_id)
    header = session_header(store, session_id, events)
    if fmt == "chatflow":
        counts = getattr(store, "message_tokens", None)
        yield from export_chatflow(header, events, session_blobs(store, session_id),
                                   counts(session_id) if counts is not None else None)
        return
    records = [r for r in store.load_turns(session_id, first=0) if not (r.rolled_back or r.failed)]
    system = [m for r in records if r.number == 0 for m in r.messages if m.role is Role.SYSTEM]
    turns = [r for r in records if r.number > 0]
    if fmt == "openai":
        if not turns:
            if warn is not None:
                warn(f"{session_id}: not written in the openai format: it has no live turn "
                     "(failed and rolled-back turns are not part of the conversation)")
            return
        by_turn = _turn_agents(events) if instructions else {}
        imported = _imported_turns(events) if instructions else set()
        texts = [None if _sdk_turn(r.messages) or r.number in imported
                 else (instructions or {}).get(by_turn.get(r.number) or header["agent"] or "") for r in turns]
        yield from export_openai(system, [list(r.messages) for r in turns], per_turn=per_turn,
                                 max_turns=header["settings"]["max_turns"], instructions=texts,
                                 blobs=session_blobs(store, session_id))
        return
    if fmt == "md":
        summary = getattr(store, "session_summary", None)  # the store's time when it keeps one; else the log's
        archived = summary(session_id).archived_at if summary is not None else _state_of(events)["archived_at"]
        header = {**header, "archived_at": iso_time(archived) if archived is not None else None}
        info = _turn_info(events)
        dicts = []
        for r in turns:  # each turn labelled with the model that answered it (none recorded: unknown)
            extra = info.get(r.number, {})
            dicts.append({"number": r.number, "messages": list(r.messages), "model": extra.get("model"),
                          "base_url": extra.get("base_url"),
                          "usage": extra.get("usage"), "finish_reason": extra.get("finish_reason"),
                          "created_at": extra.get("created_at")})
        yield from export_markdown(header, system, dicts)
        return
    raise ValueError(f"unknown export format {fmt!r}")

