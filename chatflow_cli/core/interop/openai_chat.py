"""Chat Completions message lists, one ``{"messages": [...]}`` a line (eval and fine-tuning data).

Export: a session is one line holding its system messages and its live turns as the wire
sends them (``assistant`` for chatflow's model role, ``tool_calls`` and ``tool`` results;
replies with neither text nor tool calls are left out, as in requests). The system messages
come first, as the Runner sends them: the instructions of the agent active when the turn
began (when the exporter is given them: ``instructions``; none for a turn added through the
Agents SDK session), then the session's stored SYSTEM messages. ``per_turn=True`` writes one line per turn instead: the context window the model
saw for that turn (the system messages and the newest ``max_turns`` turns up to it), ending
with its reply.

Import: each line is a conversation and becomes a session (``openai-<digest of the line>``).
``content`` may be a string or a list of parts (their ``text`` is joined by a blank line; a user message's
``image_url`` parts holding base64 ``data:`` URLs become its attachments; other parts, an
image at a web address too, are kept as ``[<type>]``); ``developer`` counts as ``system``; a legacy ``function`` message is
a tool result. A line whose messages break chatflow's history rules (an assistant message
before any user message, a tool result that answers no call, a call unanswered before the
next message) is an error naming the line; tool calls left unanswered at the very end (a
session waiting for custom tool results) are imported as waiting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..attachments import Attachment, attachment_from_bytes
from ..errors import AttachmentError, ImportFormatError
from ..messages import Message, Role, ToolCall, history_problems
from .records import json_line, ImportedSession, ImportedTurn, content_digest, strict_loads

__all__ = ["export_openai", "read_openai"]


def _wire(messages: Iterable[Message], blobs: Mapping[str, bytes] | None = None) -> list[dict[str, Any]]:
    return [m.to_wire(blobs) if m.attachments else m.to_wire() for m in messages if not m.says_nothing]


def export_openai(system: Sequence[Message], turns: Sequence[Sequence[Message]], *, per_turn: bool = False,
                  max_turns: int | None = None, instructions: Sequence[str | None] = (),
                  blobs: Mapping[str, bytes] | None = None) -> Iterator[str]:
    """The lines (each ending in ``\\n``) for one session; see the module docstring.

    ``blobs``: the bytes of the attachments (sha256 -> bytes): a message with attachments is
    written as the wire sends it, content parts with images as base64 ``data:`` URLs.

    ``instructions``: for each turn, the instructions of the agent active when it began (None
    or "" for none), sent first as a ``system`` message: the whole-session line takes the first
    turn's, a ``per_turn`` line its own turn's.
    """
    def head(k: int) -> list[Message]:
        text = instructions[k] if k < len(instructions) else None
        if not text or (system and system[0].content == text):  # an imported export holds them already
            return list(system)
        return [Message.system(text), *system]

    if not per_turn:
        messages = head(0) + [m for turn in turns for m in turn]
        yield json_line({"messages": _wire(messages, blobs)}) + "\n"
        return
    for k in range(len(turns)):
        first = 0 if max_turns is None else max(0, k + 1 - max_turns)
        window = head(k) + [m for turn in turns[first:k + 1] for m in turn]
        yield json_line({"messages": _wire(window, blobs)}) + "\n"


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type") in ("text", "input_text", "output_text"):
                    parts.append(str(part.get("text") or ""))
                else:
                    parts.append(f"[{part.get('type') or 'part'}]")
            elif isinstance(part, str):
                parts.append(part)
        return "\n\n".join(p for p in parts if p)  # parts are blocks: "moreFile a.py" would be one word
    raise TypeError(f"content is a {type(content).__name__}")


def _data_image(part: Any) -> bool:
    image = part.get("image_url") if isinstance(part, dict) and part.get("type") == "image_url" else None
    return isinstance(image, dict) and str(image.get("url") or "").startswith("data:")


def _images(content: list[Any]) -> tuple[Attachment, ...]:
    """The ``image_url`` parts of a user message that hold base64 ``data:`` URLs, as
    attachments (an image at a web address is kept as the ``[image_url]`` line)."""
    import base64
    import binascii

    found = []
    for part in content:
        url = (part.get("image_url") or {}).get("url") if isinstance(part, dict) and \
            part.get("type") == "image_url" and isinstance(part.get("image_url"), dict) else None
        head, comma, payload = url.partition(",") if isinstance(url, str) else ("", "", "")
        if not comma or not head.startswith("data:") or not head.endswith(";base64"):
            continue  # an image at a web address: kept as the [image_url] line
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise TypeError("an image_url part whose data: URL is not base64") from None
        try:
            found.append(attachment_from_bytes(data, None))
        except AttachmentError as exc:
            raise TypeError(exc.message) from None
    return tuple(found)


def _message(data: Any, where: str, source: str) -> Message | None:
    if not isinstance(data, dict):
        raise ImportFormatError(f"{source}: {where}: a message is not a JSON object", source=source, location=where)
    role = data.get("role")
    try:
        if role in ("system", "developer"):
            return Message.system(_text(data.get("content")))
        if role == "user":
            content = data.get("content")
            images: tuple[Attachment, ...] = ()
            if isinstance(content, list):
                images = _images(content)
                content = [p for p in content if not _data_image(p)] if images else content
            return Message.user(_text(content), images)
        if role == "assistant":
            calls = []
            for call in data.get("tool_calls") or []:
                fn = call.get("function") or {}
                args = fn.get("arguments", "{}")
                calls.append(ToolCall(str(call["id"]), str(fn["name"]),
                                      args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
            content = data.get("content")
            return Message.model(_text(content) if content is not None else None, calls)
        if role == "tool":
            return Message.tool(str(data["tool_call_id"]), _text(data.get("content")), name=data.get("name"))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ImportFormatError(f"{source}: {where}: a {role} message of the wrong shape ({exc})",
                                source=source, location=where) from None
    raise ImportFormatError(f"{source}: {where}: unknown role {role!r}", source=source, location=where)


_WIRE_ROLES = {"SYSTEM": "system", "USER": "user", "MODEL": "assistant", "TOOL": "tool"}


def _in_user_terms(problem: str) -> str:
    """A broken history rule (:func:`history_problems`' ``"<check>: <detail>"``, message
    indexes from 0) said in the terms of the file: Chat Completions roles, messages counted
    from 1. An unknown check is returned as it is."""
    check, _, detail = problem.partition(": ")
    numbers = [int(n) for n in re.findall(r"message (\d+)", detail)]
    nth = f"message {numbers[0] + 1}" if numbers else "a message"
    if check == "first_after_system_is_user":
        role = _WIRE_ROLES.get(detail.rsplit(" ", 1)[-1], detail.rsplit(" ", 1)[-1].lower())
        return f"the first message after the system messages must be a user message, not {role} ({nth})"
    if check == "system_leading":
        return f"{nth} is a system message after the conversation began: system messages come first"
    if check == "tool_result_follows_call":
        ids = re.findall(r"answers ('[^']*'|\"[^\"]*\")", detail)
        call = f" {ids[0]}" if ids else ""
        return (f"{nth} is a tool result for call{call}, which the assistant message just before it did not make "
                "(or another tool message answered already)")
    if check == "tool_call_answered_once":
        return f"the assistant's tool calls {detail.split('calls ', 1)[-1].split(' unanswered')[0]} get no tool " \
               f"message before {nth}: each call is answered right after it"
    if check == "tool_call_id_unique":
        ids = re.findall(r"^('[^']*'|\"[^\"]*\")", detail)
        return f"tool call id {ids[0] if ids else ''} is used again in {nth}: each call has its own id"
    return problem


def read_openai(lines: Iterable[str], *, source: str = "-") -> list[ImportedSession]:
    """Parse ``{"messages": [...]}`` lines, one session each.

    Raises:
        ImportFormatError: a line that is not JSON, has no ``messages`` list, holds a message
            of an unknown role or shape, or breaks the history rules (naming the line).
    """
    sessions = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            data = strict_loads(line)
        except json.JSONDecodeError as exc:
            raise ImportFormatError(f"{source}: {where}: not JSON ({exc.msg})", source=source, location=where) from None
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise ImportFormatError(f"{source}: {where}: not a {{\"messages\": [...]}} object", source=source,
                                    location=where)
        messages = [m for m in (_message(d, where, source) for d in data["messages"]) if m is not None]
        problems = history_problems(messages, pending_ok=True)  # a line may end with tool calls
        if problems:
            raise ImportFormatError(f"{source}: {where}: {_in_user_terms(problems[0])}", source=source,
                                    location=where)
        digest = content_digest(data["messages"], 12)
        session = ImportedSession(source="openai", source_id=f"openai:{digest}", session_id=f"openai-{digest}")
        for msg in messages:
            if msg.role is Role.SYSTEM:
                session.system.append(msg.content or "")
            elif msg.role is Role.USER:
                session.turns.append(ImportedTurn(key=f"{len(session.turns) + 1}:{content_digest(msg.to_dict(), 12)}",
                                                  location=where,
                                                  messages=[msg]))
            else:
                session.turns[-1].messages.append(msg)
        if not session.turns:
            raise ImportFormatError(f"{source}: {where}: no user message", source=source, location=where)
        sessions.append(session)
    return sessions
