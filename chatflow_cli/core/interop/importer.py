"""Write what a reader parsed into a store, through the normal store path, idempotently.

:func:`import_sessions` takes the :class:`ImportedSession` values of
:func:`~chatflow_cli.core.interop.sources.read_source` and writes each target session in
one store transaction (:meth:`BaseSessionStore.edit`; with ``into``, every source session
goes into that one transaction; source sessions with the same id share one too):

1. every message and event passes the same checks as a turn the Runner stores, against the
   target session as it is; the first broken rule (a rollback past the last turn, a tool
   result with no call, a tool-call id the session already has) is an
   :class:`ImportFormatError` naming the file, the line or row, and the target session,
   and the transaction is rolled back: nothing of the import is stored in that session;
2. each turn's idempotency key, derived from the source (``import:<source id>:<turn key>``),
   is recorded in the same transaction: importing the same source again writes nothing, a
   source that grew adds only its new turns; a turn's key keeps its number in the target
   and a digest of its content, so a turn read while the source was still being written
   (a Claude Code file, an llm tool loop) and grown since is imported again whole when it
   is still the target's last turn (the short copy rolled back, with a warning), and kept
   as it was, with a warning, when the session went on from there;
3. one ``session.imported`` event (``format``, ``source``, ``source_id``, the ``counts``
   this run added and, for a reader's turns, ``turns``: ``[first, last]`` of the turns it
   added) closes the transaction when it added anything.

A newer export of a source imported before ends as a fresh import of it: a chatflow log
applies every event after the last ``seq`` earlier imports applied (kept under the
``import:<source id>:through`` key), so a rollback, failure or title that happened since on
a turn imported before is applied too; an ``md`` transcript (live turns only) that no longer
holds the last turns imported from it (``import:<source id>:last``) rolls the target back to
the last turn both share, while the target's last turn is still that one, and takes a
changed title. ``counts["rolled_back"]`` (present when any) counts the turns live before
the import that it rolled back.

A dry run is the same transaction, rolled back (``edit(..., dry_run=True)``): it fails
exactly where the import would, and reports the same counts.

Every event of an imported turn carries its message's time in the source (a turn's
``times``, else its ``created_at``; the log's own event times for chatflow's format), not
the time of the import, so message search ``--since`` and the ages it shows agree with
``sessions ls``; the SYSTEM messages of a session it creates carry the source session's
creation time, and the import's own ``session.imported`` event the import's time.

The transaction creates the session when it is new (agent, ``max_turns``, metadata, SYSTEM
messages, the source's title), and gives it the source's creation and last-activity times
(:func:`_source_times`), so ``sessions ls`` and ``--since`` place imported history when it
happened; a session the import did not make (``into`` an existing one) keeps its own. A
session id that already exists and was not made by an earlier import of the same source is
refused (:class:`UsageError`) unless ``into`` names it on purpose: the turns are then
added after its own. Importing a grown source into the session an earlier import of it made
(no ``into``) also gives that session what the grown source says of the whole session, as
importing it once would have: for an llm or Claude Code source, its metadata keys
(``metadata.updated``); for any source, its
model and base URL when the session has none yet (a Claude Code file first read while it
held only the prompt names no model).

chatflow's own format is replayed event by event (messages, tool results, handoffs,
rollbacks, failed and interrupted turns, interrupt requests, status, metadata changes,
usage, agent versions and their changes, compactions with their summaries, titles,
archiving and unarchiving, recoveries, earlier imports, custom events: every type the
store writes),
so exporting the imported session gives the same events in the same ``seq`` order and
times, apart from the idempotency keys of custom events (not
carried) and the ``session.imported`` event at the end. A compaction imported ``into`` a
session after its own turns is left out (its summary does not cover the target's turns).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..attachments import Attachment, file_name
from ..errors import ChatflowError, ImportFormatError, InvalidHistoryError, UsageError
from ..memory import EditStore, SessionContext, agent_name_of
from ..messages import Message, Role
from ..resources.mounts import Mount
from .records import ImportedSession, content_digest, iso_time

__all__ = ["ImportResult", "import_sessions"]

_RECORDED = ("turn.completed", "turn.interrupted", "turn.interrupt_requested", "tool.pending", "tool.result_submitted",
             "session.recovered", "session.imported")


@dataclass(slots=True)
class ImportResult:
    """What importing one session did (or, with ``dry_run``, would do).

    ``session_id``: the target session; ``created``: the session is new; ``counts``: what
    this run added (``turns``, ``messages``, ``tool_calls``, ``events``; ``rolled_back``: turns
    live before it that it rolled back; ``rolled_back_in_source`` and ``live_turns``, when
    some of the turns it added were rolled back in the source's log: how many, and the live
    turns the session holds after it); ``skipped_turns``:
    turns already imported before (their keys are known); ``warnings``: what the reader
    skipped or repaired; ``skipped``: the source's entries or rows the reader left out, by
    reason (reason -> count), the same on every import of the same source.
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
    skipped: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "format": self.format, "source": self.source,
                "source_id": self.source_id, "created": self.created, "counts": dict(self.counts),
                "skipped_turns": self.skipped_turns, "skipped": dict(self.skipped), "warnings": list(self.warnings),
                "dry_run": self.dry_run}


@dataclass(slots=True)
class _Chunk:
    key: str
    #: (the context, the offset of the source's turn numbers) -> the lowest last turn its
    #: rollbacks left (None: no rollback)
    change: Callable[[SessionContext, int], int | None]
    turns: int
    messages: int
    tool_calls: int
    location: str
    digest: str = ""  # a turn's content (not for a log's events, which never change)
    opening: str | None = None  # a turn's user message
    events: int = 0  # a log's events in this chunk
    last_seq: int = 0  # the seq of a log's last event in this chunk


def _shift(payload: dict[str, Any], offset: int) -> dict[str, Any]:
    out = dict(payload)
    if offset and isinstance(payload.get("turn"), int) and payload["turn"] > 0:
        out["turn"] = payload["turn"] + offset
    span = payload.get("turns")  # an earlier import's span of turns
    if offset and isinstance(span, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in span):
        out["turns"] = [n + offset for n in span]
    return out


def _with_bytes(message: Message, blobs: dict[str, bytes], fmt: str = "chatflow") -> Message:
    """``message`` with the bytes of its attachments: from the file's ``attachment`` lines
    (``fmt`` ``chatflow``), or from the files read beside a Markdown transcript (``md``).

    Raises:
        ImportFormatError: an attachment whose bytes the source does not hold (said as fits
            the format: a missing line, or a missing file beside the transcript).
    """
    filled = []
    for attachment in message.attachments:
        data = attachment.data if attachment.data is not None else blobs.get(attachment.sha256)
        if data is None:
            label = f"the bytes of attachment {attachment.name or attachment.sha256} (sha256 {attachment.sha256})"
            if fmt == "md":
                raise ImportFormatError(f"{label} are not beside the transcript: a Markdown export keeps them in "
                                        f"attachments/{file_name(attachment)} next to it (export with -o FILE "
                                        "to write them)")
            raise ImportFormatError(f"{label} are not in the file: a .chatflow export holds each file as an "
                                    '{"attachment": ...} line (the file is cut or edited: export the session again)')
        filled.append(replace(attachment, data=data))
    return replace(message, attachments=tuple(filled))


def _event_files(data: dict[str, Any], blobs: dict[str, bytes]) -> tuple[Attachment, ...]:
    """The images a ``tool.result_submitted`` names (its tool returned them; the TOOL message
    stored when the turn goes on carries them), with their bytes from the file.

    Raises:
        ImportFormatError: an attachment that is not one, or whose bytes the file does not hold.
    """
    attached = data.get("attachments")
    if not isinstance(attached, list) or not attached:
        return ()
    try:
        made = Message.tool("", "", attachments=[Attachment.from_dict(a) for a in attached])
    except ValueError as exc:
        raise ImportFormatError(f"a tool.result_submitted event names an attachment that is not one ({exc})") from None
    return _with_bytes(made, blobs).attachments


def _replay_event(ctx: SessionContext, event: dict[str, Any], offset: int, blobs: dict[str, bytes] | None = None) -> None:
    """Apply one exported event to ``ctx`` through the context's own methods."""
    kind, data = event["type"], event["data"]
    if kind in ("message.user", "message.model", "message.system", "tool.result"):
        message = Message.from_dict(data["message"])
        if "tokens" in event:  # the stored count (a provider's) the export kept
            message = replace(message, tokens=event["tokens"])
        ctx.add_message(_with_bytes(message, blobs or {}) if message.attachments else message)
    elif kind == "rollback":
        ctx.rollback_to(int(data["to_turn"]) + offset, system=data.get("system") is True and not offset)
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
    elif kind == "session.titled":
        title = data.get("title")
        ctx.restore_title(title if isinstance(title, str) else None)
    elif kind in ("session.archived", "session.unarchived"):
        ctx.restore_archived(kind == "session.archived")
    elif kind == "resource.mounted":
        ctx.mount(Mount.from_dict(data))
    elif kind == "resource.unmounted":
        reason = data.get("reason")
        ctx.unmount(str(data.get("name")), str(data.get("kind")), reason=reason if isinstance(reason, str) else None)
    elif kind == "context.compacted":
        if not offset:  # after the target's own turns, the summary would not cover them: left out
            ctx.restore_compaction(data)
    elif kind in _RECORDED or not kind.startswith(("message.", "tool.", "turn.", "session.", "metadata.")):
        files = _event_files(data, blobs or {}) if kind == "tool.result_submitted" else ()
        ctx.record_event(kind, _shift(data, offset), attachments=files)
    else:
        raise UsageError(f"an event of type {kind!r} cannot be imported")


def _event_chunks(session: ImportedSession, through: int = 0) -> list[_Chunk]:
    """The events after seq ``through`` (what earlier imports of this source applied), one
    chunk per group that starts at a ``message.user`` (the log's turns, live, rolled back or
    failed alike) or at the first event after ``through`` (the rest of a turn imported
    before: its rollback, failure, title...). A chunk's change takes the offset: the target's
    turns before the first import of this source; turn numbers of ``rollback`` targets and
    of recorded events follow them."""
    events = [e for e in session.events or [] if e["type"] != "session.created" and e["seq"] > through]
    groups: list[list[dict[str, Any]]] = []
    for event in events:
        if event["type"] == "message.user" or not groups:
            groups.append([])
        groups[-1].append(event)
    chunks = []
    for group in groups:
        def change(ctx: SessionContext, offset: int, group: list[dict[str, Any]] = group) -> int | None:
            low = None
            for event in group:
                try:
                    at = event.get("created_at")  # the log's own time of the event
                    ctx.set_event_time(at if isinstance(at, (int, float)) and not isinstance(at, bool)
                                       and math.isfinite(at) else None)
                    _replay_event(ctx, event, offset, session.blobs)
                    if event["type"] == "rollback":
                        low = ctx.turn_count if low is None else min(low, ctx.turn_count)
                except (ChatflowError, ValueError, TypeError, KeyError) as exc:
                    exc.import_location = _event_where(event)  # type: ignore[union-attr]
                    raise
                finally:
                    ctx.set_event_time(None)
            return low
        messages = [Message.from_dict(e["data"]["message"]) for e in group
                    if e["type"] in ("message.user", "message.model", "message.system", "tool.result")]
        chunks.append(_Chunk(key=f"seq{group[0]['seq']}", change=change,
                             turns=sum(1 for e in group if e["type"] == "message.user"),
                             messages=len(messages), tool_calls=sum(len(m.tool_calls) for m in messages),
                             location=_event_where(group[0]), events=len(group), last_seq=group[-1]["seq"]))
    return chunks


def _event_where(event: dict[str, Any]) -> str:
    return f"line {event['line']}" if event.get("line") else f"event {event['seq']}"


def _labelled(msg: Message, ctx: SessionContext) -> Message:
    """A MODEL message the source gives no agent: labelled with the session's active agent,
    as the Runner labels the replies it stores (``sessions show`` names who answered)."""
    if msg.role is Role.MODEL and msg.agent is None:
        return replace(msg, agent=agent_name_of(ctx.active_agent) or None)
    return msg


def _turn_chunks(session: ImportedSession) -> list[_Chunk]:
    chunks = []
    for turn in session.turns:
        def change(ctx: SessionContext, offset: int, turn: Any = turn) -> int | None:
            at = turn.created_at  # each event keeps its message's time in the source, when known
            for k, msg in enumerate(turn.messages):
                at = turn.times[k] if k < len(turn.times) and turn.times[k] is not None else at
                ctx.set_event_time(at)
                if msg.attachments and any(a.data is None for a in msg.attachments):
                    msg = _with_bytes(msg, session.blobs, session.source)  # md: the files read beside it
                ctx.add_message(_labelled(msg, ctx))
            if turn.outcome == "failed":
                ctx.fail_turn(turn.error or "failed in the source")
            elif turn.outcome == "interrupted":
                ctx.interrupt_turn("interrupted in the source")
            elif ctx.pending_tool_calls:  # the source's last turn waits for custom tool results
                ctx.record_event("tool.pending", {"turn": ctx.turn_count,
                                                  "tool_use_ids": [c.id for c in ctx.pending_tool_calls]})
            else:
                ctx.complete_turn(turn.content, usage=turn.usage or None, finish_reason=turn.finish_reason,
                                  model=turn.model, base_url=turn.base_url)
            ctx.set_event_time(None)
            return None
        answered = {m.tool_call_id for m in turn.messages if m.role is Role.TOOL}
        # an interrupted turn's waiting calls get their synthetic results from interrupt_turn
        synthetic = sum(1 for m in turn.messages for c in m.tool_calls if c.id not in answered) \
            if turn.outcome == "interrupted" else 0
        chunks.append(_Chunk(key=f"turn:{turn.key}", change=change, turns=1,
                             messages=len(turn.messages) + synthetic, tool_calls=sum(len(m.tool_calls) for m in turn.messages),
                             location=turn.location or f"turn {turn.key}",
                             digest=content_digest([[m.to_dict() for m in turn.messages], turn.outcome, turn.error]),
                             opening=turn.messages[0].content if turn.messages else None))
    return chunks


@dataclass(slots=True)
class _Plan:
    """One source session's import into ``target``: what is known before the transaction.

    ``todo``: the chunks to apply, in order; ``keys``: the idempotency keys (key -> digest)
    the plan records besides the turns' own; ``rollback``: ``(to_turn, expected last
    turn)`` when the source no longer holds turns an earlier import of it added (an ``md``
    transcript exported after a rollback), so the target is rolled back to the last turn
    both share before the rest is added; ``turn_count``: the target's last turn when
    planned (the transaction checks it is still so)."""

    session: ImportedSession
    target: str
    prefix: str
    start_key: str
    started: str | None  # the digest kept with the start key (the offset), None: first import
    todo: list[_Chunk]
    result: ImportResult
    grown: tuple[str, int] | None = None  # the key of a turn that grew since its import, and its number
    rollback: tuple[int, int] | None = None
    turn_count: int = 0
    retitle: bool = False  # the title an earlier import of this source set is not the file's any more
    older: bool = False  # an md/openai export older than one imported before: adds nothing
    #: metadata the source gives that the session an earlier import of it made does not
    #: hold yet (a Claude Code file read before its last entries: their branch, version...)
    settings: dict[str, Any] = field(default_factory=dict)

    def apply(self, ctx: SessionContext, fmt: str, source: str, recorded: dict[str, str]) -> dict[str, str]:
        """Write this session's missing turns into ``ctx`` (inside the edit's transaction) and
        return the idempotency keys to record. ``recorded``: the keys earlier source sessions
        of this transaction record (the same session twice in one file: its second copy adds
        nothing). Any broken rule is an ImportFormatError naming ``source``, the line or row,
        and the target session.

        Raises:
            _Stale: the target is not as it was when the plan was made (another import or
                turn committed in between): the caller plans again.
        """
        session = self.session
        if not recorded and ctx.turn_count != self.turn_count:
            raise _Stale()
        started = self.started if self.started is not None else recorded.get(self.start_key)
        offset = int(started or 0) if started is not None else ctx.turn_count
        keys = {self.prefix + c.key: "" for c in self.todo}
        live = before = ctx.turn_count  # the turns live before the import: those it rolls back are counted
        if started is None:
            keys[self.start_key] = str(offset)
            ctx.set_event_time(session.created_at)  # the SYSTEM messages were there from the start
            for text in ([] if session.events is not None else session.system):  # a log replays its own
                ctx.add_message(text if isinstance(text, Message) else Message.system(text))
            ctx.set_event_time(None)
            if session.events is None and self.result.created:  # the title is the source's
                if session.title:
                    ctx.restore_title(session.title)
                keys[self.prefix + "title"] = content_digest(session.title or "")
        elif self.retitle:  # the source was renamed since an earlier import set its title
            ctx.restore_title(session.title)
            keys[self.prefix + "title"] = content_digest(session.title or "")
        if self.settings:  # the source's metadata as the grown source gives it
            ctx.set_event_time(session.updated_at)
            ctx.update_metadata(self.settings)
            ctx.set_event_time(None)
        if session.events is None and session.updated_at is not None and not self.older:
            keys[self.prefix + "updated"] = repr(session.updated_at)  # the newest export imported so far
        if self.rollback is not None:
            if ctx.turn_count != self.rollback[1]:
                raise _Stale()
            ctx.rollback_to(self.rollback[0])  # turns the source no longer holds
            live = ctx.turn_count
        first: int | None = None  # the first turn this import adds
        for chunk in self.todo:
            try:
                if self.grown is not None and self.prefix + chunk.key == self.grown[0]:
                    if ctx.turn_count != self.grown[1]:
                        raise _Stale()
                    ctx.rollback_to(self.grown[1] - 1)  # the copy imported before, cut short, is rolled back
                    live = min(live, ctx.turn_count)
                if first is None and chunk.turns and session.events is None:
                    first = ctx.turn_count + 1
                low = chunk.change(ctx, offset)  # the source's own rollbacks (a log)
                live = min(live, ctx.turn_count if low is None else low)
                if chunk.digest:  # the turn's number in the target and its content, to tell if it grows
                    keys[self.prefix + chunk.key] = f"{ctx.turn_count}:{chunk.digest}"
                    keys[self.prefix + "last"] = f"{ctx.turn_count}:{content_digest(chunk.opening)}"
                if chunk.last_seq:  # a log: how far this source's events are applied
                    keys[self.prefix + "through"] = str(chunk.last_seq)
            except (ChatflowError, ValueError, TypeError, KeyError) as exc:
                where = getattr(exc, "import_location", None) or chunk.location
                detail = exc.problems[0] if isinstance(exc, InvalidHistoryError) and exc.problems else str(exc)
                raise ImportFormatError(f"{source}: {where}: cannot be imported into session {self.target}: "
                                        f"{detail}", source=source, location=where, session_id=self.target) from None
        if live < before:  # turns live before this import that it rolled back
            self.result.counts["rolled_back"] = before - live
        # turns this import added that the source's own log had rolled back: kept in the log,
        # not live, so the counts say it and how many turns the session holds
        gone = self.result.counts["turns"] - max(0, ctx.turn_count - min(live, before))
        if gone > 0:
            self.result.counts["rolled_back_in_source"] = gone
            self.result.counts["live_turns"] = ctx.turn_count
        if session.events is None and started is None and self.result.created and session.archived_at is not None:
            ctx.restore_archived(True)  # an archived session (md front matter) imports archived
        if self.todo or started is None or self.rollback is not None or self.retitle or self.settings:
            payload: dict[str, Any] = {"format": fmt, "source": source, "source_id": session.source_id,
                                       "counts": self.result.counts}
            if session.created_at is not None:
                payload["source_created_at"] = iso_time(session.created_at)
            if first is not None and ctx.turn_count >= first:
                payload["turns"] = [first, ctx.turn_count]  # the turns it added (exports name their source)
            ctx.record_event("session.imported", payload)
        return keys


class _Stale(Exception):
    """The target changed between planning an import and its transaction."""


def _through(chunks: list[_Chunk], prefix: str, stored: dict[str, str], pending: dict[str, str]) -> int:
    """The last seq of a log's events earlier imports of it applied (0: none). Before this
    was recorded (``through``), the end of the last turn imported. ``chunks``: the log's
    whole :func:`_event_chunks`."""
    value = pending.get(prefix + "through") or stored.get(prefix + "through")
    if value:
        return int(value)
    through = 0
    for chunk in chunks:
        if prefix + chunk.key in stored or prefix + chunk.key in pending:
            through = chunk.last_seq
    return through


def _plan(store: EditStore, session: ImportedSession, target: str, *, into: str | None, fmt: str,
          source: str, dry_run: bool, exists: bool, pending: dict[str, str], added_before: int) -> _Plan:
    """``pending``: the idempotency keys the source sessions before this one in the same
    transaction record (empty for the first), with their digests: the plan counts as if
    they were stored; ``added_before``: the turns they add (after the target's last one)."""
    prefix = f"import:{session.source_id}:"
    start_key = prefix + "start"
    made = exists or bool(pending)  # an earlier source session of this transaction creates it
    started = store.idempotency_digests(target, [start_key]) if exists else {}
    if made and into is None and start_key not in started and start_key not in pending:
        raise UsageError(
            f"session {target!r} already exists and was not imported from this source: "
            f"use --into {target} to add the turns to it, or --into NEW_ID for a copy",
            session_id=target,
        )
    warnings = list(session.warnings)
    turn_count = store.turn_count(target) if exists else 0
    rollback = None
    grown = None
    older = False
    if session.events is not None:  # a log: every event after the last seq imported before, in order
        everything = _event_chunks(session)
        stored = store.idempotency_digests(target, [prefix + c.key for c in everything]
                                           + [prefix + "through"]) if exists else {}
        todo = _event_chunks(session, _through(everything, prefix, stored, pending))
        todo = [c for c in todo if prefix + c.key not in pending]
        all_turns = sum(c.turns for c in everything)
    else:
        chunks = _turn_chunks(session)
        stored = store.idempotency_digests(target, [prefix + c.key for c in chunks]
                                           + [prefix + "last", prefix + "title", prefix + "updated"]) if exists else {}
        window = store.window_turns(target) if exists and not added_before and stored else ()
        last = (window[-1].number, window[-1].messages[0].content) if window else (-1, None)
        grown = _grown(chunks, prefix, stored, last, warnings)
        known = (set(stored) - {grown[0] if grown else ""}) | set(pending)
        todo = [c for c in chunks if prefix + c.key not in known]
        all_turns = len(chunks)
        if fmt in _LIVE_ONLY and not added_before and prefix + "last" in stored:
            # a turn that grew (imported again whole below) is still one both share
            shared = known | ({grown[0]} if grown else set())
            todo, rollback = _diverged(chunks, prefix, stored, shared, window, turn_count, todo, warnings,
                                       int(started.get(start_key) or 0))
        newest = pending.get(prefix + "updated") or stored.get(prefix + "updated")
        if fmt in _LIVE_ONLY and session.updated_at is not None and newest and session.updated_at < float(newest):
            # an older export than one imported before: never rolls the newer turns back
            if todo or rollback is not None or grown is not None:
                warnings.append(f"an older export of session {session.session_id} (updated "
                                f"{iso_time(session.updated_at)}) than the one imported before (updated "
                                f"{iso_time(float(newest))}): nothing of it is added")
            todo, rollback, grown, older = [], None, None, True
    systems = 0 if session.events is not None or start_key in started or start_key in pending else len(session.system)
    counts = {"turns": sum(c.turns for c in todo), "messages": sum(c.messages for c in todo) + systems,
              "tool_calls": sum(c.tool_calls for c in todo)}
    if session.events is not None:
        counts["events"] = sum(c.events for c in todo)
    result = ImportResult(target, fmt, source, session.source_id, created=not made, counts=counts,
                          skipped_turns=max(0, all_turns - counts["turns"]), warnings=warnings, dry_run=dry_run,
                          skipped=dict(session.skipped))
    title = stored.get(prefix + "title")
    retitle = (session.events is None and not older and title is not None
               and title != content_digest(session.title or ""))
    settings: dict[str, Any] = {}
    if fmt in _GROWING and into is None and start_key in started:
        # a session an earlier import of this live source made: it takes the metadata the
        # source gives now (as importing the grown source once would have made it)
        held = store.session_summary(target).metadata
        settings = {k: v for k, v in session.metadata.items() if held.get(k, _ABSENT) != v}
    return _Plan(session, target, prefix, start_key, started.get(start_key), todo, result, grown, rollback,
                 turn_count, retitle, older, settings)


_ABSENT = object()


#: Formats that carry a session's live turns only (no log): a re-import makes the target's
#: turns from this source the file's, rolling back those the file no longer holds (a
#: Claude Code file rewound or edited since: its main line left the turns imported before).
_LIVE_ONLY = ("md", "openai", "claude-code")
#: Formats read from another tool's own file, which that tool keeps writing (not a snapshot
#: chatflow exported): a re-import takes the metadata the grown file gives.
_GROWING = ("llm", "claude-code")


def _diverged(chunks: list[_Chunk], prefix: str, stored: dict[str, str], known: set[str], window: Sequence[Any],
              turn_count: int, todo: list[_Chunk], warnings: list[str],
              offset: int) -> tuple[list[_Chunk], tuple[int, int] | None]:
    """For a format that carries live turns only: when the file no longer holds the last
    turns an earlier import of it added (the source was rolled back since), the target is
    rolled back to the last turn both share, and every turn of the file after it is added.
    Only while the target's last turn is still the one this source imported last; once the
    session went on from there, its turns are kept (with a warning) and the new ones follow."""
    shared = 0
    number = offset  # the target's turns before this source's first import
    for chunk in chunks:
        if prefix + chunk.key not in known:
            break
        shared += 1
        number = int(stored.get(prefix + chunk.key, "0:").partition(":")[0] or 0)
    last_number, _, opening = stored[prefix + "last"].partition(":")
    if not last_number.isdigit() or int(last_number) <= number:
        return todo, None  # nothing imported after the turns the file shares
    if not (window and window[-1].number == int(last_number) == turn_count
            and content_digest(window[-1].messages[0].content) == opening):
        warnings.append(f"turns after turn {number} are no longer in the source, but the session went on "
                        "from there: kept as they are")
        return todo, None
    return chunks[shared:], (number, turn_count)


def _grown(chunks: list[_Chunk], prefix: str, stored: dict[str, str], last: tuple[int, str | None],
           warnings: list[str]) -> tuple[str, int] | None:
    """The key and turn number of a turn imported before whose content the source has since
    changed (a Claude Code file or llm conversation read while it was being written: the
    turn has grown). It is imported again, whole, when it is still the target's last live
    turn (``last``: its number and user message; the copy imported before is rolled back);
    a changed turn the session has gone on from (turns after it, or rolled back and
    replaced) is kept as it was imported, with a warning in ``warnings``."""
    found = None
    for chunk in chunks:
        number, _, digest = stored.get(prefix + chunk.key, "").partition(":")
        if not (chunk.digest and digest and digest != chunk.digest):
            continue
        if number == str(last[0]) and chunk.opening == last[1] and found is None:
            found = (prefix + chunk.key, last[0])
            warnings.append(f"{chunk.location}: grew in the source since it was imported as turn {last[0]}: "
                            "that copy is rolled back and the whole turn imported again")
        else:
            warnings.append(f"{chunk.location}: changed in the source since it was imported as turn {number}, "
                            "but the session went on from there: kept as it was imported")
    return found


def _creation(session: ImportedSession, agent_name: str) -> tuple[str, int | None, dict[str, Any]]:
    """Agent, max_turns and metadata a session created by this import starts with."""
    agent, max_turns, metadata = session.agent or agent_name, session.max_turns, session.metadata
    created = (session.events or [{}])[0]
    if created.get("type") == "session.created":  # the log's own beginning, not its end state
        data = created["data"]
        agent = str(data.get("agent") or agent)
        max_turns = data["max_turns"] if isinstance(data.get("max_turns"), int) else max_turns
        metadata = data["metadata"] if isinstance(data.get("metadata"), dict) else metadata
    return agent, max_turns, metadata


def import_sessions(
    store: EditStore,
    sessions: Sequence[ImportedSession],
    *,
    fmt: str,
    source: str,
    into: str | None = None,
    dry_run: bool = False,
    agent_name: str = "Assistant",
    progress: Callable[[str, bool], None] | None = None,
) -> list[ImportResult]:
    """Import ``sessions`` (read from ``source`` in format ``fmt``) into ``store``.

    ``into``: the id of the session to import into (created when absent; its own turns
    are kept and the imported ones follow, every source session in turn); by default each
    session keeps the id its source gives it. ``agent_name``: the agent of a created
    session when the source names none. ``progress(target, stored)``, when given, is called
    with ``False`` before the transaction of each target session that has something to add
    and with ``True`` once it is committed (a caller stopped by Ctrl-C can then say what
    was stored).

    Each target session is written in one store transaction (:meth:`BaseSessionStore.edit`):
    with ``into``, every source session goes into that one transaction; without it, one
    transaction per session id (a session the file holds twice, as two exports of it
    concatenated, is one transaction: its second copy adds only what the first did not). A source that breaks a rule in it fails that transaction, so
    nothing of the import is stored in that session (sessions before it, in other targets,
    are imported). ``dry_run`` runs exactly the same edits -- same checks against the
    target's real state -- and rolls each transaction back: it reports what would be added,
    or fails where the real import would.

    Raises:
        ImportFormatError: the source breaks chatflow's rules (naming the file, the line or
            row, and the target session).
        UsageError: a session id that exists and was not imported from this source
            (without ``into``).
        SessionBusyError: a turn is running on the target session.
        SessionTerminatedError: the target session is terminated.
    """
    # one transaction per target session: a session that appears twice in the file (two
    # exports of it concatenated) is one transaction too, so a dry run sees what the real run does
    by_target: dict[str, list[int]] = {}
    for k, s in enumerate(sessions):
        by_target.setdefault(into or s.session_id, []).append(k)
    results: list[ImportResult | None] = [None] * len(sessions)
    for target, indexes in by_target.items():
        if fmt in _LIVE_ONLY:
            indexes = _newest_copies(sessions, indexes)
        group = [sessions[k] for k in indexes]
        for _attempt in range(_ATTEMPTS):
            try:
                done = _import_target(store, target, group, fmt=fmt, source=source, into=into, dry_run=dry_run,
                                      agent_name=agent_name, progress=progress)
            except _Stale:
                continue  # another import (or a turn) committed between the plan and the transaction
            if done is not None:
                break
        else:
            raise UsageError(f"session {target!r} kept changing during the import: run it again", session_id=target)
        for k, result in zip(indexes, done, strict=True):
            results[k] = result
    return [r for r in results if r is not None]


def _newest_copies(sessions: Sequence[ImportedSession], indexes: list[int]) -> list[int]:
    """``indexes`` with only the newest copy of each source session (an ``md`` or ``openai``
    file holding several exports of one session, concatenated): the one with the latest
    ``updated_at``, the later in the file on a tie or when they have none. Each export holds
    the session's live turns as they were then, so the newest one is where importing them
    one after the other ends (an older one adds nothing after a newer one). The copy kept
    gets a warning naming how many were left out."""
    newest: dict[str, int] = {}
    for k in indexes:
        source_id = sessions[k].source_id
        if source_id in newest:
            kept = sessions[newest[source_id]].updated_at
            mine = sessions[k].updated_at
            if kept is not None and mine is not None and mine < kept:
                continue
        newest[source_id] = k
    chosen = sorted(newest.values())
    for k in chosen:
        left = sum(1 for j in indexes if j != k and sessions[j].source_id == sessions[k].source_id)
        note = (f"the file holds {left + 1} exports of session {sessions[k].session_id}: "
                "only the newest is imported (the older ones add nothing after it)")
        if left and note not in sessions[k].warnings:
            sessions[k].warnings.append(note)
    return chosen


#: How many times an import plans again when the target changed under it.
_ATTEMPTS = 5


def _import_target(store: EditStore, target: str, group: list[ImportedSession], *, fmt: str, source: str,
                   into: str | None, dry_run: bool, agent_name: str,
                   progress: Callable[[str, bool], None] | None = None) -> list[ImportResult] | None:
    """Plan and run the one transaction that imports ``group`` into ``target``; the results
    say what that transaction did. None: the same import committed in another process
    after this one planned (its batch key was there): the caller plans again, and then
    finds everything there. ``progress``: as :func:`import_sessions` says.

    Raises:
        _Stale: the target changed between the plan and the transaction.
    """
    position = store.log_position(target)
    exists = position is not None and store.active_agent_name(target) is not None
    plans: list[_Plan] = []
    pending: dict[str, str] = {}
    for s in group:
        plan = _plan(store, s, target, into=into, fmt=fmt, source=source, dry_run=dry_run, exists=exists,
                     pending=pending, added_before=sum(p.result.counts["turns"] for p in plans))
        plans.append(plan)
        pending |= {plan.prefix + c.key: "" for c in plan.todo} | {plan.start_key: plan.started or ""}
        through = [c.last_seq for c in plan.todo if c.last_seq]
        if through:
            pending[plan.prefix + "through"] = str(through[-1])
    results = [p.result for p in plans]
    if all(p.started is not None and not p.todo and p.rollback is None and not p.retitle and not p.settings
           for p in plans):
        if exists and into is None and not dry_run:
            _fill_endpoint(store, target, group)
        return results  # everything is there already
    recorded: dict[str, str] = {}

    def change(ctx: SessionContext) -> None:
        for plan in plans:
            recorded.update(plan.apply(ctx, fmt, source, recorded))

    agent, max_turns, metadata = _creation(group[0], agent_name)
    # the source's own times, for a session that is the source's (not another one, --into)
    created_at, updated_at = _source_times(group) if into is None or not exists else (None, None)
    # one key for the whole batch, planned at this log position: a second run of the same
    # import racing this one finds it and does nothing
    batch = f"import:{group[0].source_id}:batch:" + content_digest(
        [p.prefix + c.key for p in plans for c in p.todo]
        + [p.start_key for p in plans if p.started is None]
        + [f"rollback:{p.rollback}" for p in plans if p.rollback is not None]
        + [f"title:{p.session.title}" for p in plans if p.retitle] + [str(position)])
    if progress is not None:
        progress(target, False)
    committed = False
    try:
        edited = store.edit(target, change, create_agent=agent, max_turns=max_turns, metadata=metadata,
                            idempotency_key=batch, idempotency_keys=recorded, dry_run=dry_run,
                            created_at=created_at, updated_at=updated_at)
        committed = True
    except KeyboardInterrupt:
        # Ctrl-C may land after the commit, before edit returns: the store says which
        committed = not dry_run and bool(store.idempotency_digests(target, [batch]))
        raise
    finally:
        if committed and progress is not None:
            progress(target, True)
    if edited.replayed:
        return None
    created = any(e.type == "session.created" for e in edited.events)
    for result in results:  # what the transaction did: the session is new only if it made it (its first copy)
        result.created = result.created and created
    if created and not dry_run:
        first = group[0]
        if first.model or first.base_url:
            store.set_session_endpoint(target, first.model, first.base_url)
    elif exists and into is None and not dry_run:
        _fill_endpoint(store, target, group)
    return results


def _fill_endpoint(store: EditStore, target: str, group: Sequence[ImportedSession]) -> None:
    """Give ``target``, a session an earlier import of this source made, the model and base
    URL the source names when it has none yet: a source read before its first reply (a
    Claude Code file holding only the prompt) named none then, and the grown source imported
    once would have set them. A model the session has (set by that import, or chosen in
    chatflow since) is kept."""
    model = next((s.model for s in group if s.model), None)
    base_url = next((s.base_url for s in group if s.base_url), None)
    if (model or base_url) and store.session_endpoint(target) == (None, None):
        store.set_session_endpoint(target, model, base_url)


def _source_times(sessions: Sequence[ImportedSession]) -> tuple[float | None, float | None]:
    """When the conversation began and was last active in its source (UTC epoch seconds):
    each session's own times (a chatflow header, md front matter) when it has them, else
    its turns' and messages' times
    (llm's ``datetime_utc``, Claude Code's entry timestamps): the first turn's start and the
    last message's time; None when the source has none."""
    starts: list[float] = []
    ends: list[float] = []
    for s in sessions:
        # a session's own times win over its turns' (an md transcript's turn comments carry
        # the times its turns were stored, which for an imported session is the import's)
        turn_times = [t.created_at for t in s.turns if t.created_at is not None]
        # the last activity is the last message's time (a tool loop's reply comes after the
        # turn's first model call), not the last turn's start
        message_times = turn_times + [at for t in s.turns for at in t.times if at is not None]
        starts += [s.created_at] if s.created_at is not None else turn_times
        ends += [s.updated_at] if s.updated_at is not None else message_times
    created = min(starts) if starts else None
    updated = max(ends) if ends else created
    if created is not None and updated is not None and updated < created:
        updated = created
    return created, updated

