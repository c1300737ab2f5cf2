"""Write what a reader parsed into a store, through the normal store path, idempotently.

:func:`import_sessions` takes the :class:`ImportedSession` values of
:func:`~chatflow_cli.core.interop.sources.read_source` and, for each:

1. checks it whole first, by replaying it into a context with no store: a source that
   breaks chatflow's rules (a rollback past the last turn, a tool result with no call)
   is an :class:`ImportFormatError` naming its line or turn, and nothing of that session
   is written;
2. writes it in short transactions through :meth:`BaseSessionStore.edit`, so every message
   and event passes the same checks as a turn the Runner stores, and each edit carries an
   idempotency key derived from the source (``import:<source id>:<turn key>``): importing
   the same source again writes nothing, and an import stopped halfway (killed, a full
   disk) writes only the turns still missing when run again;
3. appends one ``session.imported`` event (``format``, ``source``, ``source_id`` and the
   ``counts`` this run added) when it added anything.

The first edit creates the session (agent, ``max_turns``, metadata, SYSTEM messages). A
session id that already exists and was not made by an earlier import of the same source is
refused (:class:`UsageError`) unless ``into`` names it on purpose: the turns are then
added after its own.

chatflow's own format is replayed event by event (messages, tool results, handoffs,
rollbacks, failed and interrupted turns, status, metadata changes, usage, agent versions
and their changes, custom events),
so exporting the imported session gives the same events in the same ``seq`` order, apart
from their times (the time of the import), the idempotency keys of custom events (not
carried) and the ``session.imported`` event at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ChatflowError, ImportFormatError, InvalidHistoryError, UsageError
from ..memory import BaseSessionStore, SessionContext
from ..messages import Message
from .records import ImportedSession, content_digest, iso_time

__all__ = ["ImportResult", "import_sessions"]

_RECORDED = ("turn.completed", "turn.interrupted", "tool.pending", "tool.result_submitted", "session.recovered",
             "session.imported")


@dataclass(slots=True)
class ImportResult:
    """What importing one session did (or, with ``dry_run``, would do).

    ``session_id``: the target session; ``created``: the session is new; ``counts``: what
    this run added (``turns``, ``messages``, ``tool_calls``, ``events``); ``skipped_turns``:
    turns already imported before (their keys are known); ``warnings``: what the reader
    skipped or repaired.
    """

    session_id: str
    format: str
    source: str
    source_id: str
    created: bool
    counts: dict[str, int]
    skipped_turns: int = 0
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "format": self.format, "source": self.source,
                "source_id": self.source_id, "created": self.created, "counts": dict(self.counts),
                "skipped_turns": self.skipped_turns, "warnings": list(self.warnings), "dry_run": self.dry_run}


@dataclass(slots=True)
class _Chunk:
    key: str
    change: Callable[[SessionContext], None]
    turns: int
    messages: int
    tool_calls: int


def _shift(payload: dict[str, Any], offset: int) -> dict[str, Any]:
    if offset and isinstance(payload.get("turn"), int) and payload["turn"] > 0:
        return {**payload, "turn": payload["turn"] + offset}
    return dict(payload)


def _replay_event(ctx: SessionContext, event: dict[str, Any], offset: int) -> None:
    """Apply one exported event to ``ctx`` through the context's own methods."""
    kind, data = event["type"], event["data"]
    if kind in ("message.user", "message.model", "message.system", "tool.result"):
        ctx.add_message(Message.from_dict(data["message"]))
    elif kind == "rollback":
        ctx.rollback_to(int(data["to_turn"]) + offset)
    elif kind == "turn.failed":
        error_type = str(data.get("error_type") or "Error")
        error = type(error_type, (Exception,), {})(str(data.get("error", "")))
        ctx.fail_turn(error, agent=data.get("active_agent"))
    elif kind == "handoff":
        version = data.get("to_agent_version")
        ctx.set_active_agent(str(data.get("to_agent")), tool_call_id=data.get("tool_call_id") or None,
                             agent_version=str(version) if version else None)
    elif kind == "agent.changed":
        ctx._journal_agent_change(_shift(data, offset))
    elif kind == "status":
        extra = {k: v for k, v in data.items() if k not in ("status", "reason")}
        ctx.set_status(str(data.get("status")), str(data.get("reason", "")), **extra)
    elif kind == "metadata.updated":
        for key in data.get("removed") or []:
            ctx.metadata.pop(key, None)
        ctx.update_metadata(data.get("changes") or {})
    elif kind in _RECORDED or not kind.startswith(("message.", "tool.", "turn.", "session.", "metadata.")):
        ctx.record_event(kind, _shift(data, offset))
    else:
        raise UsageError(f"an event of type {kind!r} cannot be imported")


def _event_chunks(session: ImportedSession, offset: int) -> list[_Chunk]:
    events = [e for e in session.events or [] if e["type"] != "session.created"]
    groups: list[list[dict[str, Any]]] = []
    for event in events:
        if event["type"] == "message.user" or not groups:
            groups.append([])
        groups[-1].append(event)
    chunks = []
    for group in groups:
        def change(ctx: SessionContext, group: list[dict[str, Any]] = group) -> None:
            for event in group:
                try:
                    _replay_event(ctx, event, offset)
                except (ChatflowError, ValueError, TypeError, KeyError) as exc:
                    exc.import_location = f"line {event['line']}" if event.get("line") else f"event {event['seq']}"  # type: ignore[union-attr]
                    raise
        messages = [Message.from_dict(e["data"]["message"]) for e in group
                    if e["type"] in ("message.user", "message.model", "message.system", "tool.result")]
        chunks.append(_Chunk(key=f"seq{group[0]['seq']}", change=change,
                             turns=sum(1 for e in group if e["type"] == "message.user"),
                             messages=len(messages), tool_calls=sum(len(m.tool_calls) for m in messages)))
    return chunks


def _turn_chunks(session: ImportedSession) -> list[_Chunk]:
    chunks = []
    for turn in session.turns:
        def change(ctx: SessionContext, turn: Any = turn) -> None:
            for msg in turn.messages:
                ctx.add_message(msg)
            if turn.outcome == "failed":
                ctx.fail_turn(turn.error or "failed in the source")
            elif turn.outcome == "interrupted":
                ctx.interrupt_turn("interrupted in the source")
            else:
                ctx.complete_turn(turn.content, usage=turn.usage or None, finish_reason=turn.finish_reason)
        chunks.append(_Chunk(key=f"turn:{turn.key}", change=change, turns=1, messages=len(turn.messages),
                             tool_calls=sum(len(m.tool_calls) for m in turn.messages)))
    return chunks


def _where(session: ImportedSession, chunk: _Chunk) -> str:
    if session.events is not None:
        seq = int(chunk.key.removeprefix("seq"))
        line = next((e.get("line") for e in session.events if e["seq"] == seq), None)
        return f"line {line}" if line else f"event {seq}"
    return f"turn {chunk.key.removeprefix('turn:')}"


def _check(session: ImportedSession, chunks: Sequence[_Chunk], start: Callable[[SessionContext], None],
           source: str) -> None:
    """Replay the whole session into a context with no store; the first broken rule is an
    ImportFormatError naming where it is."""
    ctx = SessionContext(session.session_id, session.agent or "Assistant")
    start(ctx)
    for chunk in chunks:
        try:
            chunk.change(ctx)
        except (ChatflowError, ValueError, TypeError, KeyError) as exc:
            where = getattr(exc, "import_location", None) or _where(session, chunk)
            detail = exc.problems[0] if isinstance(exc, InvalidHistoryError) and exc.problems else str(exc)
            raise ImportFormatError(f"{source}: {where}: cannot be imported: {detail}", source=source,
                                    location=where, session_id=session.session_id) from None


def import_sessions(
    store: BaseSessionStore,
    sessions: Sequence[ImportedSession],
    *,
    fmt: str,
    source: str,
    into: str | None = None,
    dry_run: bool = False,
    agent_name: str = "Assistant",
) -> list[ImportResult]:
    """Import ``sessions`` (read from ``source`` in format ``fmt``) into ``store``.

    ``into``: the id of the session to import into (created when absent; its own turns
    are kept and the imported ones follow); by default each session keeps the id its
    source gives it. ``dry_run``: check everything and report what would be added,
    writing nothing. ``agent_name``: the agent of a created session when the source names
    none.

    Every session is checked whole before the first of its edits (see the module
    docstring); a session that fails the check raises before anything of it is written
    (sessions before it in ``sessions`` are imported).

    Raises:
        ImportFormatError: the source breaks chatflow's rules (naming the line or turn).
        UsageError: a session id that exists and was not imported from this source
            (without ``into``).
        SessionBusyError: a turn is running on the target session.
        SessionTerminatedError: the target session is terminated.
    """
    results = []
    for session in sessions:
        target = into or session.session_id
        exists = store.active_agent_name(target) is not None
        prefix = f"import:{session.source_id}:"
        start_key = prefix + "start"
        started = store.idempotency_digests(target, [start_key]) if exists else {}
        if exists and into is None and start_key not in started:
            raise UsageError(
                f"session {target!r} already exists and was not imported from this source: "
                f"use --into {target} to add the turns to it, or --into NEW_ID for a copy",
                session_id=target,
            )
        # turn numbers of the source follow the target's own turns (kept with the start key)
        offset = int(started[start_key] or 0) if start_key in started else (store.turn_count(target) if exists else 0)
        chunks = _event_chunks(session, offset) if session.events is not None else _turn_chunks(session)
        systems = [] if session.events is not None else list(session.system)  # a log replays its own

        def start(ctx: SessionContext, systems: list[str] = systems) -> None:
            for text in systems:
                ctx.add_message(Message.system(text))

        _check(session, chunks, start, source)
        known = set(store.idempotency_digests(target, [prefix + c.key for c in chunks])) if exists else set()
        todo = [c for c in chunks if prefix + c.key not in known]
        counts = {"turns": sum(c.turns for c in todo),
                  "messages": sum(c.messages for c in todo) + (len(systems) if start_key not in started else 0),
                  "tool_calls": sum(c.tool_calls for c in todo)}
        if session.events is not None:
            counts["events"] = sum(len(_group_events(session, c)) for c in todo)
        result = ImportResult(target, fmt, source, session.source_id, created=not exists, counts=counts,
                              skipped_turns=sum(c.turns for c in chunks) - counts["turns"],
                              warnings=list(session.warnings), dry_run=dry_run)
        results.append(result)
        if dry_run or (not todo and start_key in started):
            continue
        agent, max_turns, metadata = session.agent or agent_name, session.max_turns, session.metadata
        created = (session.events or [{}])[0]
        if created.get("type") == "session.created":  # the log's own beginning, not its end state
            data = created["data"]
            agent = str(data.get("agent") or agent)
            max_turns = data["max_turns"] if isinstance(data.get("max_turns"), int) else max_turns
            metadata = data["metadata"] if isinstance(data.get("metadata"), dict) else metadata
        store.edit(target, start, create_agent=agent, max_turns=max_turns, metadata=metadata,
                   idempotency_key=start_key, digest=str(offset))
        if not exists and (session.model or session.base_url):
            store.set_session_endpoint(target, session.model, session.base_url)
        for chunk in todo:
            store.edit(target, chunk.change, idempotency_key=prefix + chunk.key)
        payload: dict[str, Any] = {"format": fmt, "source": source, "source_id": session.source_id,
                                   "counts": counts}
        if session.created_at is not None:
            payload["source_created_at"] = iso_time(session.created_at)

        def record(ctx: SessionContext, payload: dict[str, Any] = payload) -> None:
            ctx.record_event("session.imported", payload)

        store.edit(target, record, idempotency_key=prefix + "imported:" + content_digest([c.key for c in todo]))
    return results


def _group_events(session: ImportedSession, chunk: _Chunk) -> list[dict[str, Any]]:
    seq = int(chunk.key.removeprefix("seq"))
    events = session.events or []
    start = next(k for k, e in enumerate(events) if e["seq"] == seq)
    end = next((k for k in range(start + 1, len(events)) if events[k]["type"] == "message.user"), len(events))
    return events[start:end]
