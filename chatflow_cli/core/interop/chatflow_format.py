"""chatflow's own export format: lossless JSON Lines, one stream per session.

A stream is a header line, then every event of the session's log in ``seq`` order::

    {"format": "chatflow", "version": 1, "session": {"session_id": "work", "agent": "Assistant",
     "metadata": {...}, "settings": {"max_turns": 40, "model": "gpt-4o-mini", "base_url": null},
     "created_at": "2026-12-01T02:54:57.839Z", "turns": 3, "events": 14}}
    {"seq": 1, "type": "session.created", "created_at": 1796093697.8, "data": {...}}
    {"seq": 2, "type": "message.user", "created_at": ..., "data": {"turn": 1, "message": {...}}}
    ...

``data`` is the event's payload exactly as stored (the shape ``replay --json`` prints), and
``idempotency_key`` is present when the event was appended under one, and ``tokens`` on a
message's event when its stored token count is not chatflow's estimate (the provider's count
of a reply: an import keeps it, so the context is counted the same), so rolled-back and
failed turns, tool calls and results, handoffs, status changes, usage and custom events all
survive. Several sessions are several streams, one after the other in one file. The
files a session's messages carry (their metadata is in each message) follow the header
once each, as ``{"attachment": {"sha256": ..., "data": <base64>}}`` lines (version 2).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import ImportFormatError
from ..events import Event
from ..messages import Message
from .records import json_line, ImportedSession, ImportedTurn, iso_time, parse_time, strict_loads

__all__ = ["FORMAT_VERSION", "export_chatflow", "read_chatflow"]

#: The version of this format; a reader refuses a newer one. Version 2 adds ``attachment``
#: lines (``{"attachment": {"sha256": ..., "data": <base64>}}``) between the header and the
#: events: the bytes of the files the session's messages carry, once each.
FORMAT_VERSION = 2


def export_chatflow(header: Mapping[str, Any], events: Iterable[Event],
                    blobs: Mapping[str, bytes] | None = None, tokens: Mapping[int, int] | None = None) -> Iterator[str]:
    """The lines (each ending in ``\\n``) of one session's stream.

    ``header``: the ``session`` object of the header line (see the module docstring).
    ``blobs``: the bytes of the attachments the session's messages use (sha256 -> bytes),
    written as ``attachment`` lines after the header (version 2; a stream without them is
    version 1, as before). ``tokens``: the stored token count of each message by the seq of
    its event; a count that is not the estimate chatflow makes of the message (the provider's
    count of a reply) is written beside the event's data, as ``tokens``.
    """
    version = FORMAT_VERSION if blobs else 1
    yield json_line({"format": "chatflow", "version": version, "session": dict(header)}) + "\n"
    if blobs:
        import base64

        for digest in sorted(blobs):
            yield json_line({"attachment": {"sha256": digest,
                                            "data": base64.b64encode(blobs[digest]).decode("ascii")}}) + "\n"
    for event in events:
        line: dict[str, Any] = {"seq": event.seq, "type": event.type, "created_at": event.created_at,
                                "data": _without_lock_token(event.payload)}
        if event.idempotency_key is not None:
            line["idempotency_key"] = event.idempotency_key
        count = tokens.get(event.seq) if tokens else None
        if count is not None and count != _estimate(event.payload):
            line["tokens"] = count
        yield json_line(line) + "\n"


def _estimate(payload: Mapping[str, Any]) -> int | None:
    """The estimate chatflow makes of the tokens of the message an event records (None: none)."""
    from ..tokens import estimate_tokens

    try:
        return estimate_tokens(Message.from_dict(payload.get("message")))  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def _without_lock_token(payload: Mapping[str, Any]) -> Any:
    """``payload`` without the lock token of an ``owner`` it names (a running turn's credential
    is never exported; the owner's pid, host and start time are kept). A
    ``turn.interrupt_requested`` names its owner by the token alone: that ``owner`` is left
    out (the request can never match a run again)."""
    owner = payload.get("owner") if isinstance(payload, Mapping) else None
    if isinstance(owner, Mapping) and "token" in owner:
        return {**payload, "owner": {k: v for k, v in owner.items() if k != "token"}}
    if isinstance(owner, str):
        return {k: v for k, v in payload.items() if k != "owner"}
    return payload


def _check_complete(session: ImportedSession, expected: Any, source: str, line: int) -> None:
    """Refuse a stream that ends before the number of events its header announced (a file
    cut short, at a line boundary, would otherwise import as a smaller, valid-looking session)."""
    got = len(session.events or [])
    if isinstance(expected, int) and not isinstance(expected, bool) and got < expected:
        raise _fail(source, line, f"session {session.session_id} ends after {got} of the {expected} events "
                                  "its header announces: the file is cut short")


def _fail(source: str, number: int, what: str) -> ImportFormatError:
    return ImportFormatError(f"{source}: line {number}: {what}", source=source, location=f"line {number}")


def read_chatflow(lines: Iterable[str], *, source: str = "-") -> list[ImportedSession]:
    """Parse one or more chatflow streams.

    Raises:
        ImportFormatError: a line that is not a JSON object, an event before any header, a
            header of another format or a newer version, an event with no ``type`` or a
            ``data`` that is not an object, a ``seq`` that does not follow the one before
            (naming the line).
    """
    sessions: list[ImportedSession] = []
    current: ImportedSession | None = None
    announced: Any = None  # the current header's event count
    header_line = 0
    last_seq = 0
    number = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = strict_loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(source, number, f"not JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise _fail(source, number, "not a JSON object")
        if "format" in data:
            if data.get("format") != "chatflow":
                raise _fail(source, number, f"a header of format {data.get('format')!r}, not chatflow")
            version = data.get("version")
            if not isinstance(version, int) or version > FORMAT_VERSION:
                raise _fail(source, number, f"format version {version!r}: this chatflow reads up to {FORMAT_VERSION}")
            head = data.get("session")
            if not isinstance(head, dict) or not isinstance(head.get("session_id"), str) or not head["session_id"]:
                raise _fail(source, number, "the header has no session.session_id")
            settings: dict[str, Any] = head["settings"] if isinstance(head.get("settings"), dict) else {}
            metadata: dict[str, Any] = head["metadata"] if isinstance(head.get("metadata"), dict) else {}
            max_turns = settings.get("max_turns")
            if current is not None:
                _check_complete(current, announced, source, header_line)
            announced, header_line = head.get("events"), number
            current = ImportedSession(
                source="chatflow",
                source_id=f"chatflow:{head['session_id']}:{head.get('created_at') or ''}",
                session_id=head["session_id"],
                agent=head.get("agent") if isinstance(head.get("agent"), str) else None,
                metadata=dict(metadata),
                model=settings.get("model") if isinstance(settings.get("model"), str) else None,
                base_url=settings.get("base_url") if isinstance(settings.get("base_url"), str) else None,
                max_turns=max_turns if isinstance(max_turns, int) and not isinstance(max_turns, bool) else None,
                created_at=parse_time(head.get("created_at"), source=source, location=f"line {number}"),
                updated_at=parse_time(head.get("updated_at"), source=source, location=f"line {number}"),
                title=head["title"] if isinstance(head.get("title"), str) and head["title"] else None,
                events=[],
            )
            sessions.append(current)
            last_seq = 0
            continue
        if current is None or current.events is None:
            raise _fail(source, number, "an event before any chatflow header line")
        if "attachment" in data:
            _read_blob(current, data["attachment"], source, number)
            continue
        kind = data.get("type")
        if not isinstance(kind, str) or not kind:
            raise _fail(source, number, "an event with no type")
        payload = data.get("data", {})
        if not isinstance(payload, dict):
            raise _fail(source, number, "the event's data is not a JSON object")
        seq = data.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq != last_seq + 1:
            raise _fail(source, number, f"seq {seq!r} does not follow {last_seq}")
        last_seq = seq
        if kind.startswith(("message.", "tool.result")) and kind != "tool.result_submitted":
            message = payload.get("message")
            try:
                Message.from_dict(message)  # type: ignore[arg-type]
            except (TypeError, ValueError, KeyError) as exc:
                raise _fail(source, number, f"the {kind} event's message is not a chatflow message ({exc})") from None
        if seq == 1 and kind != "session.created":
            raise _fail(source, number, f"the log starts with {kind}, not session.created")
        event = {"seq": seq, "type": kind, "data": payload, "created_at": data.get("created_at"),
                 "line": number}
        if isinstance(data.get("idempotency_key"), str):
            event["idempotency_key"] = data["idempotency_key"]
        if type(data.get("tokens")) is int and data["tokens"] >= 0:
            event["tokens"] = data["tokens"]
        current.events.append(event)
    if current is not None:
        _check_complete(current, announced, source, header_line)
    for session in sessions:
        session.turns = turns_of_events(session.events or [])
    return sessions


def _read_blob(session: ImportedSession, item: Any, source: str, number: int) -> None:
    """An ``attachment`` line: its bytes, checked against the hash it names."""
    import base64
    import binascii
    import hashlib

    digest = item.get("sha256") if isinstance(item, dict) else None
    data = item.get("data") if isinstance(item, dict) else None
    if not isinstance(digest, str) or not isinstance(data, str):
        raise _fail(source, number, "an attachment line needs sha256 and data (base64)")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _fail(source, number, "the attachment's data is not base64") from None
    if hashlib.sha256(raw).hexdigest() != digest.lower():
        raise _fail(source, number, f"the attachment's bytes do not have the sha256 {digest} it names")
    session.blobs[digest.lower()] = raw


def turns_of_events(events: Sequence[Mapping[str, Any]]) -> list[ImportedTurn]:
    """The turns a replayed log adds, one per ``message.user`` event (counts and dry runs)."""
    turns: list[ImportedTurn] = []
    for event in events:
        kind = event["type"]
        if kind == "message.user":
            turns.append(ImportedTurn(key=str(event["seq"]), messages=[Message.from_dict(event["data"]["message"])]))
        elif kind in ("message.model", "tool.result") and turns:
            turns[-1].messages.append(Message.from_dict(event["data"]["message"]))
        elif kind == "turn.completed" and turns:
            usage = event["data"].get("usage")
            if isinstance(usage, dict):
                turns[-1].usage = dict(usage)
    return turns


def header_time(epoch: float | None) -> str | None:
    """The header's time format (ISO 8601, UTC, milliseconds)."""
    return iso_time(epoch)
