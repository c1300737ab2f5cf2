"""What ``chatflow chat`` sends: the message, ``--tool-result`` outputs, ``--input jsonl`` lines.

``MESSAGE``; ``-`` or no message with a piped stdin reads all of stdin (UTF-8, at most
:data:`MAX_MESSAGE_BYTES`); a MESSAGE with a piped stdin sends the message, a blank line, then
stdin (``git diff | chatflow chat "review this"``). Nothing to send is a usage error (exit 2)
on every path. ``--tool-result ID OUTPUT`` (repeatable) answers pending custom tool calls,
OUTPUT sent as given (JSON or plain text); ``--input jsonl`` reads one JSON object a line
(see :func:`parse_input_line`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from ..context import read_stdin_text
from ..core.errors import UsageError
from ..render import safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State

__all__ = ["MAX_MESSAGE_BYTES", "ChatOptions", "InputItem", "input_items", "message_from", "parse_input_line",
           "tool_output_text"]

#: The largest message chatflow sends (2 MiB of UTF-8). Bigger input is refused with exit 2
#: before anything is stored, rather than stored and then refused by the provider.
MAX_MESSAGE_BYTES = 2 * 1024 * 1024


@dataclass
class ChatOptions:
    message: str | None = None
    session: str | None = None
    continue_: bool = False
    system: str | None = None
    model: str | None = None
    base_url: str | None = None
    agent: str | None = None
    max_turns: int | None = None
    max_context_tokens: int | None = None
    metadata: dict[str, str] | None = None
    message_id: str | None = None
    message_id_scope: str | None = None
    idempotency_key: str | None = None
    tool_results: list[tuple[str, str]] | None = None
    wait: float = 0.0
    output: str = "text"
    input: str = "text"
    timeout: float = 60.0
    title: str | None = None
    memory: list[str] | None = None  #: --memory NAME[:ro], repeatable
    vaults: tuple[str, ...] = ()  # --vault NAME (repeatable): vaults mounted for tools' secrets
    attachments: tuple[str, ...] = ()  # --attach FILE (repeatable; '-': stdin): see commands/attach.py
    #: --approve ID / --deny ID (repeatable): (tool-call id, approved) of calls waiting for an approval
    approvals: list[tuple[str, bool]] | None = None


@dataclass
class InputItem:
    """One line of ``--input jsonl``: a user message or a tool result."""

    line: int
    message: str | None = None
    tool_use_id: str | None = None
    output: str | None = None
    session: str | None = None
    metadata: dict[str, Any] | None = None
    message_id: str | None = None
    idempotency_key: str | None = None


def _check_message(text: str) -> str:
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise UsageError("the message is not valid UTF-8 (it holds a lone surrogate)") from None
    if size > MAX_MESSAGE_BYTES:
        raise UsageError(
            f"the message is too long ({size / 1048576:.1f} MiB; chatflow sends at most {MAX_MESSAGE_BYTES // 1048576} MiB)"
        )
    if not text.strip():
        raise UsageError("the message is empty")
    return text


def message_from(state: State, opts: ChatOptions) -> str:
    """The message to send: ``MESSAGE``; all of stdin for ``-`` or no message; or, when a
    MESSAGE is given and stdin is piped (``git diff | chatflow chat "review this"``), the
    message, a blank line, then stdin. Nothing to send is a :class:`UsageError` (exit 2) on
    every path."""
    if opts.message is not None and opts.message != "-":
        text = opts.message
        if not state.env.stdin_isatty:
            piped = read_stdin_text(state).strip("\n")
            if piped.strip():
                text = f"{text.rstrip()}\n\n{piped}"
        return _check_message(text)
    if opts.message is None and state.env.stdin_isatty:
        raise UsageError('no message: pass one (chatflow chat "hello"), or pipe it: echo hello | chatflow chat')
    text = read_stdin_text(state).strip()
    if not text:
        raise UsageError('nothing to send: stdin was empty (chatflow chat MESSAGE, or chatflow on a terminal for the REPL)')
    return _check_message(text)


def tool_output_text(tool_use_id: str, raw: str) -> str:
    """A ``--tool-result`` output, sent as given, as the REPL does: JSON (``'{"ok": true}'``)
    or plain text (``yes``) alike. Empty or non-UTF-8 text is a :class:`UsageError`."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"--tool-result {safe_text(tool_use_id)}: the output is not valid UTF-8 (a lone surrogate)") from None
    if not raw.strip():
        raise UsageError(f"--tool-result {safe_text(tool_use_id)}: the output is empty (give JSON or text, e.g. '\"yes\"')")
    return raw


def parse_input_line(number: int, line: str) -> InputItem | None:
    """One ``--input jsonl`` line -> :class:`InputItem` (``None`` for a blank line).

    Accepted objects::

        {"message": "text"}                       also {"content": ...} or {"role": "user", "content": ...}
        {"tool_use_id": "call_1", "output": ...}  also {"tool_result": {"tool_use_id": ..., "output": ...}}

    plus, on a message, optional ``"session"``, ``"metadata"`` (object), ``"message_id"`` and
    ``"idempotency_key"``. A non-string ``output`` is sent as its JSON text. Anything else
    raises :class:`UsageError` naming the line.
    """
    if not line.strip():
        return None

    def bad(problem: str) -> UsageError:
        return UsageError(f"--input jsonl line {number}: {problem}")

    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise bad(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise bad(f"expected a JSON object, got {type(obj).__name__}")
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad("not valid UTF-8 (a lone surrogate such as \\ud800)") from None
    if isinstance(obj.get("tool_result"), dict):
        obj = {**obj, **obj.pop("tool_result")}
    item = InputItem(line=number)
    for key in ("session", "session_id"):
        if key in obj:
            if not isinstance(obj[key], str):
                raise bad(f"{key} must be a string")
            item.session = obj[key]
    if "tool_use_id" in obj:
        if not isinstance(obj["tool_use_id"], str) or not obj["tool_use_id"]:
            raise bad("tool_use_id must be a non-empty string")
        if "output" not in obj:
            raise bad("a tool result needs an output")
        out = obj["output"]
        item.tool_use_id = obj["tool_use_id"]
        item.output = out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)
        return item
    if "role" in obj and obj["role"] != "user":
        raise bad(f"role must be 'user', got {obj['role']!r}")
    text = obj.get("message", obj.get("content"))
    if not isinstance(text, str):
        raise bad('expected {"message": "..."} or {"tool_use_id": "...", "output": ...}')
    try:
        item.message = _check_message(text)
    except UsageError as exc:
        raise bad(exc.message) from None
    if "metadata" in obj:
        if not isinstance(obj["metadata"], dict):
            raise bad("metadata must be an object")
        item.metadata = obj["metadata"]
    for key in ("message_id", "idempotency_key"):
        if key in obj:
            if not isinstance(obj[key], str) or not obj[key]:
                raise bad(f"{key} must be a non-empty string")
            setattr(item, key, obj[key])
    return item


def input_items(state: State) -> Iterator[InputItem]:
    stream = state.env.stdin
    buffer = getattr(stream, "buffer", None)
    source = buffer if buffer is not None else stream
    for number, raw in enumerate(iter(source.readline, b"" if buffer is not None else ""), 1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(f"--input jsonl line {number}: not valid UTF-8 (byte {exc.start})") from None
        item = parse_input_line(number, raw)
        if item is not None:
            yield item
