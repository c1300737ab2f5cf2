"""A Markdown transcript a person reads (on GitHub, in an editor) and chatflow imports back.

The file starts with front matter (``session``, ``title``, ``agent``, ``model``,
``base_url``, ``max_turns``, ``created``, ``updated``, ``archived`` (when it was archived,
or null), ``turns``, ``metadata``; each value
JSON, which YAML reads too; all but ``turns`` are read back), then a
``## Turn N`` heading per turn with the user's message and the replies as Markdown; tool
calls and their results are folded into ``<details>`` blocks, their arguments and output in
code fences. Every message is preceded by an HTML comment GitHub does not show::

    <!-- chatflow:message {"role":"model","agent":"Support","lines":3} -->

which holds the message's fields and the number of lines of its text, so the text itself
is written as it is (whatever Markdown, fences or headings it holds) and read back exactly.
``<!-- chatflow:turn {...} -->`` before each turn keeps its number, the model that answered
it and where (``model``, ``base_url``: the turn's own, as its ``turn.completed`` records
them; left out when unknown), usage and finish reason. A file edited by hand imports as long as those comments still count right;
a line that starts like one (``<!-- chatflow:``) but is not exactly one, a text that does
not end where its count says, or a fenced text whose fence does not close there, is an
error naming the line: a comment is never skipped, since what it describes would be lost.
A message's fields come back exactly as its comment holds them, Agents SDK ``items`` too
(a SYSTEM message carrying a ``developer`` item stays that message).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..inert import one_line
from ..attachments import FILES_FOLDER, attachment_line, file_name
from ..errors import ImportFormatError
from ..messages import Message, Role, ToolCall
from ..stream import normalize_usage
from .records import ImportedSession, ImportedTurn, content_digest, parse_time, strict_dumps, strict_loads

__all__ = ["MD_MARK", "export_markdown", "read_markdown"]

#: The first front-matter key of a chatflow Markdown transcript.
MD_MARK = "chatflow"
_MARKER = re.compile(r"^<!-- chatflow:(message|tool_call|turn) (\{.*\}) -->$")
#: Any line that starts like a control comment: it must then be one exactly.
_CONTROL = re.compile(r"^\s*<!--\s*chatflow:")
_FENCE = re.compile(r"^(`{3,})")
#: What a Markdown link text escapes with a backslash.
_LINK_TEXT = re.compile(r"[\\\[\]]")


def _comment_json(data: Mapping[str, Any]) -> str:
    # "-->" would end the comment: JSON may spell '>' as \u003e.
    return strict_dumps(data, ensure_ascii=False, separators=(",", ":")).replace("-->", "--\\u003e")


def _fence(text: str, info: str = "") -> tuple[str, str]:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return ticks + info, ticks


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _summary_usage(turn: Mapping[str, Any]) -> str:
    bits = []
    if turn.get("model"):
        bits.append(f"`{turn['model']}`")
    usage = normalize_usage(turn.get("usage")) or {}  # any stored shape; unknown shows nothing, never a 0
    tokens_in = usage.get("prompt_tokens")
    tokens_out = usage.get("completion_tokens")
    if tokens_in is not None or tokens_out is not None:
        bits.append(f"{tokens_in if tokens_in is not None else '?'} tokens in, {tokens_out if tokens_out is not None else '?'} out")
    if turn.get("finish_reason") and turn["finish_reason"] != "stop":
        bits.append(f"cut ({turn['finish_reason']})")
    return " · ".join(bits)


def _message_block(msg: Message) -> Iterator[str]:
    fields = msg.to_dict()
    content = fields.pop("content", None)
    calls = fields.pop("tool_calls", [])
    fields.pop("role")
    head: dict[str, Any] = {"role": msg.role.value, **fields}
    if msg.role is Role.TOOL:
        text = content if content is not None else ""
        opener, closer = _fence(text, "text")
        label = "Tool error" if msg.is_error else "Tool result"
        yield f"<details><summary>{label} <code>{msg.name or ''}</code> <code>{msg.tool_call_id}</code></summary>\n\n"
        yield f"<!-- chatflow:message {_comment_json({**head, 'lines': len(_lines(text)), 'fenced': True})} -->\n"
        yield f"{opener}\n{text}\n{closer}\n\n</details>\n\n"
        return
    if content is None:
        yield f"<!-- chatflow:message {_comment_json({**head, 'lines': None})} -->\n\n"
    else:
        yield f"<!-- chatflow:message {_comment_json({**head, 'lines': len(_lines(content))})} -->\n"
        yield content + "\n\n"
    for attachment in msg.attachments:  # the file itself lies beside the transcript (FILES_FOLDER)
        link = f"{FILES_FOLDER}/{file_name(attachment)}"
        # the link text on one inert line, its brackets and backslashes escaped: the name comes
        # back from the message's comment, so the link text is for the reader only
        label = _LINK_TEXT.sub(r"\\\g<0>", one_line(attachment.name) or attachment.sha256[:12])
        shown = f"![{label}]({link})" if attachment.is_image else f"[{label}]({link})"
        yield f"Attached: {shown} {attachment_line(attachment)}\n\n"
    for call in calls:
        args = call["arguments"]
        opener, closer = _fence(args, "json")
        yield f"<details><summary>Tool call <code>{call['name']}</code> <code>{call['id']}</code></summary>\n\n"
        meta = {"id": call["id"], "name": call["name"], "lines": len(_lines(args)), "fenced": True}
        yield f"<!-- chatflow:tool_call {_comment_json(meta)} -->\n"
        yield f"{opener}\n{args}\n{closer}\n\n</details>\n\n"


def export_markdown(header: Mapping[str, Any], system: Sequence[Message],
                    turns: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """The Markdown transcript of one session, in pieces.

    ``header``: the session header (as in the chatflow format, plus ``archived_at``: ISO
    8601 UTC when the session is archived, else None); ``system``: the SYSTEM
    messages; ``turns``: ``{"number", "messages", "model", "base_url", "usage", "finish_reason",
    "created_at"}`` dicts, oldest first.
    """
    settings = header.get("settings") or {}
    front = {
        MD_MARK: "md 1",
        "session": header.get("session_id"),
        "title": header.get("title"),
        "agent": header.get("agent"),
        "model": settings.get("model"),
        "base_url": settings.get("base_url"),
        "max_turns": settings.get("max_turns"),
        "created": header.get("created_at"),
        "updated": header.get("updated_at"),
        "archived": header.get("archived_at"),
        "turns": header.get("turns"),
        "metadata": header.get("metadata") or {},
    }
    yield "---\n"
    for key, value in front.items():
        yield f"{key}: {strict_dumps(value, ensure_ascii=False)}\n"
    yield "---\n\n"
    yield f"# {header.get('session_id')}\n\n"
    if system:
        yield "## System\n\n"
        for msg in system:
            yield from _message_block(msg)
    for turn in turns:
        messages: Sequence[Message] = turn["messages"]
        meta = {k: turn[k] for k in ("number", "model", "base_url", "usage", "finish_reason", "created_at")
                if turn.get(k)}
        yield f"## Turn {turn['number']}\n\n"
        yield f"<!-- chatflow:turn {_comment_json(meta)} -->\n\n"
        for msg in messages:
            if msg.role is Role.USER:
                yield "**User**\n\n"
            elif msg.role is Role.MODEL:
                note = _summary_usage(turn) if msg is messages[-1] else ""
                who = f"**{msg.agent or 'Assistant'}**" + (" *(interrupted)*" if msg.interrupted else "")
                yield who + (f" · {note}" if note else "") + "\n\n"
            yield from _message_block(msg)


#: What the writer puts after a message's text and the blank line that ends it: a speaker
#: line, a folded tool call or result, a turn heading, a control comment, the next transcript.
_AFTER_TEXT = ("**", "<details>", "## ", "<!-- chatflow:", "---", "Attached: ")


def _check_text_end(lines: list[str], i: int, source: str, number: int, count: int) -> None:
    """The text of the message whose comment is on line ``number`` ended at line index ``i``
    (``count`` lines): the writer follows it with a blank line, then a line of its own (or the
    end of the file). Anything else means the text was edited and no longer has ``count``
    lines: an ImportFormatError naming the line, since the rest would be dropped or misread."""
    for at, ok in ((i, i >= len(lines) or lines[i] == ""),
                   (i + 1, i + 1 >= len(lines) or lines[i + 1] == "" or lines[i + 1].startswith(_AFTER_TEXT))):
        if not ok:
            raise _fail(source, at + 1, f"the text of the message on line {number} does not end where its "
                                        f"comment's 'lines' ({count}) says: count its lines again")


def _fail(source: str, number: int, what: str) -> ImportFormatError:
    return ImportFormatError(f"{source}: line {number}: {what}", source=source, location=f"line {number}")


def read_markdown(text: str, *, source: str = "-") -> list[ImportedSession]:
    """Parse transcripts :func:`export_markdown` wrote (one after the other: several sessions)
    into :class:`ImportedSession` values.

    Raises:
        ImportFormatError: no chatflow front matter, a malformed control comment (one
            whose JSON does not parse, or a line starting ``<!-- chatflow:`` that is not
            one), a message whose text runs past the end of the file, does not end where
            its count says (the writer's blank line and a line of its own must follow) or
            whose fence does not close there, a tool call outside a model message (naming
            the line), or a transcript with fewer turns than its front matter's ``turns``
            (cut short: naming the ``turns:`` line).
    """
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        raise _fail(source, 1, "no front matter: not a chatflow Markdown transcript")
    sessions: list[ImportedSession] = []
    start: int | None = 0
    while start is not None:
        session, start = _read_one(lines, start, source)
        _files_beside(session, source)
        sessions.append(session)
    return sessions


def _files_beside(session: ImportedSession, source: str) -> None:
    """The bytes of the session's attachments from the folder beside the transcript
    (``attachments/`` next to ``source``; the current directory for stdin), each checked
    against its hash; a file missing there is named by the import's error.

    Raises:
        ImportFormatError: a file there whose bytes do not have the hash its name says.
    """
    import hashlib
    from pathlib import Path

    folder = (Path(source).parent if source != "-" else Path(".")) / FILES_FOLDER
    for turn in session.turns:
        for message in turn.messages:
            for attachment in message.attachments:
                if attachment.sha256 in session.blobs:
                    continue
                try:
                    data = (folder / file_name(attachment)).read_bytes()
                except OSError:
                    continue
                digest = hashlib.sha256(data).hexdigest()
                if digest != attachment.sha256:
                    raise ImportFormatError(
                        f"{FILES_FOLDER}/{file_name(attachment)} beside {source} is not the file attached as "
                        f"{attachment.name or attachment.sha256[:12]}: its bytes have the sha256 {digest}, not "
                        f"{attachment.sha256} (it was changed since the export: export the session again)")
                session.blobs[attachment.sha256] = data


def _read_one(lines: list[str], first: int, source: str) -> tuple[ImportedSession, int | None]:
    """One transcript from line index ``first`` (its ``---``); and where the next one starts."""
    front: dict[str, Any] = {}
    turns_line = first + 1
    i = first + 1
    while i < len(lines) and lines[i].strip() != "---":
        key, sep, value = lines[i].partition(":")
        if not sep:
            raise _fail(source, i + 1, "a front-matter line with no 'key: value'")
        if key.strip() == "turns":
            turns_line = i + 1
        try:
            front[key.strip()] = strict_loads(value.strip()) if value.strip() else None
        except json.JSONDecodeError:
            front[key.strip()] = value.strip()
        i += 1
    if i >= len(lines):
        raise _fail(source, len(lines), "the front matter never ends")
    if not str(front.get(MD_MARK, "")).startswith("md"):
        raise _fail(source, first + 1,
                    "the front matter has no 'chatflow: md' line: not a chatflow Markdown transcript")
    session_id = front.get("session")
    if not isinstance(session_id, str) or not session_id:
        raise _fail(source, first + 2, "the front matter has no session id")
    metadata: dict[str, Any] = front["metadata"] if isinstance(front.get("metadata"), dict) else {}
    max_turns = front.get("max_turns")
    session = ImportedSession(
        source="md",
        source_id=f"md:{session_id}:{front.get('created') or ''}",
        session_id=session_id,
        agent=front.get("agent") if isinstance(front.get("agent"), str) else None,
        metadata=dict(metadata),
        model=front.get("model") if isinstance(front.get("model"), str) else None,
        base_url=front.get("base_url") if isinstance(front.get("base_url"), str) else None,
        max_turns=max_turns if isinstance(max_turns, int) and not isinstance(max_turns, bool) else None,
        created_at=parse_time(front.get("created"), source=source, location="front matter"),
        updated_at=parse_time(front.get("updated"), source=source, location="front matter"),
        title=front.get("title") if isinstance(front.get("title"), str) and front.get("title") else None,
        archived_at=parse_time(front.get("archived"), source=source, location="front matter"),
    )
    turn: ImportedTurn | None = None
    turn_meta: dict[str, Any] = {}
    i += 1
    while i < len(lines):
        if lines[i] == "---" and i + 1 < len(lines) and lines[i + 1].startswith(f"{MD_MARK}: "):
            return _complete(session, front.get("turns"), source, turns_line), i  # the next transcript
        match = _MARKER.match(lines[i])
        if not match:
            if _CONTROL.match(lines[i]):  # a control comment broken by hand: never skipped
                raise _fail(source, i + 1, "a malformed chatflow comment (expected '<!-- chatflow:message "
                                           "{...} -->', 'chatflow:tool_call' or 'chatflow:turn' with a JSON object)")
            i += 1
            continue
        number = i + 1
        try:
            data = strict_loads(match.group(2))
        except json.JSONDecodeError as exc:
            raise _fail(source, number, f"the chatflow:{match.group(1)} comment is not JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise _fail(source, number, "the marker's JSON is not an object")
        kind = match.group(1)
        i += 1
        if kind == "turn":
            turn_meta = data
            continue
        count = data.pop("lines", None)
        fenced = bool(data.pop("fenced", False))
        body: str | None = None
        if count is not None:
            if not isinstance(count, int) or count < 0:
                raise _fail(source, number, f"'lines' is {count!r}, not a count")
            if fenced:
                if i >= len(lines) or not _FENCE.match(lines[i]):
                    raise _fail(source, i + 1, "a code fence was expected here")
                i += 1
            if i + count > len(lines):
                raise _fail(source, number, f"the text of {count} lines runs past the end of the file")
            body = "\n".join(lines[i:i + count])
            i += count
            if not fenced:
                _check_text_end(lines, i, source, number, count)
            if fenced:
                if i >= len(lines) or not _FENCE.match(lines[i]):
                    raise _fail(source, i + 1, f"the code fence of the text that starts on line {number + 2} "
                                               f"should close here ('lines' is {count})")
                i += 1
        if kind == "tool_call":
            if turn is None or not turn.messages or turn.messages[-1].role is not Role.MODEL:
                raise _fail(source, number, "a tool call that follows no model message")
            last = turn.messages[-1]
            call = ToolCall(str(data.get("id") or ""), str(data.get("name") or ""), body if body is not None else "{}")
            turn.messages[-1] = replace(last, tool_calls=(*last.tool_calls, call))  # every other field kept
            continue
        try:
            msg = Message.from_dict({**data, **({"content": body} if body is not None else {})})
        except (TypeError, ValueError) as exc:
            raise _fail(source, number, f"not a chatflow message ({exc})") from None
        if msg.role is Role.SYSTEM:
            session.system.append(msg if msg.items else msg.content or "")  # an SDK item kept as it is
        elif msg.role is Role.USER:
            key = f"{turn_meta.get('number', len(session.turns) + 1)}:{content_digest(msg.to_dict(), 12)}"
            usage = turn_meta.get("usage")
            turn = ImportedTurn(key=key, messages=[msg], usage=dict(usage) if isinstance(usage, dict) else {},
                                model=turn_meta.get("model") if isinstance(turn_meta.get("model"), str) else None,
                                base_url=turn_meta.get("base_url") if isinstance(turn_meta.get("base_url"), str) else None,
                                finish_reason=turn_meta.get("finish_reason"),
                                created_at=turn_meta.get("created_at") if isinstance(turn_meta.get("created_at"), (int, float)) else None,
                                location=f"line {number}")
            session.turns.append(turn)
            turn_meta = {}
        elif turn is None:
            raise _fail(source, number, f"a {msg.role.value} message before the first user message")
        else:
            turn.messages.append(msg)
    return _complete(session, front.get("turns"), source, turns_line), None


def _complete(session: ImportedSession, announced: Any, source: str, line: int) -> ImportedSession:
    """``session``, unless it holds fewer turns than its front matter's ``turns`` announces
    (a file cut short at a message boundary would otherwise import as a shorter,
    valid-looking session): an ImportFormatError naming ``line`` (the ``turns:`` line)."""
    got = len(session.turns)
    if isinstance(announced, int) and not isinstance(announced, bool) and got < announced:
        raise _fail(source, line, f"session {session.session_id} ends after {got} of the {announced} turns "
                                  "its front matter announces: the file is cut short")
    return session
