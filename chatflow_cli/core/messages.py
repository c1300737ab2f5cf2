"""Messages of a conversation: :class:`Role`, :class:`ToolCall`, :class:`Message`.

A message is immutable and round-trips through JSON exactly:
``Message.from_dict(m.to_dict()) == m`` and ``Message.from_json(m.to_json()) == m``.

``Role.MODEL`` is what the Chat Completions wire calls ``assistant`` (``to_wire`` writes
``assistant``). Tool-call arguments are kept as the JSON *text* the model produced, since a
model may stop mid-JSON; :meth:`ToolCall.parsed_arguments` parses them.

:func:`history_problems` implements the validity checks that every message list sent
to a model must pass:

* ``first_after_system_is_user``: after the leading SYSTEM messages the first message is USER;
* ``tool_result_follows_call``: every TOOL message answers an id of the nearest preceding
  MODEL message's tool calls, with only TOOL messages in between;
* ``tool_call_answered_once``: every tool call is answered exactly once, right after its call;
* ``tool_call_id_unique``: each tool-call id appears once in the list;
* ``system_leading``: SYSTEM messages stand only at the start.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .attachments import Attachment
from .errors import InvalidHistoryError, NonFiniteNumberError

__all__ = ["Attachment", "Message", "Role", "ToolCall", "check_history", "history_problems", "wire_messages"]


class Role(str, Enum):
    """Who speaks. ``MODEL`` is the wire's ``assistant``."""

    SYSTEM = "system"
    USER = "user"
    MODEL = "model"
    TOOL = "tool"

    @property
    def wire(self) -> str:
        return "assistant" if self is Role.MODEL else self.value


_ROLES: dict[str, Role] = {role.value: role for role in Role}

#: ``json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)`` without
#: building an encoder per call: the stores encode every message and event they write with it.
#: Strict JSON: a float NaN or Infinity raises ``ValueError`` (SQLite's JSON functions and
#: strict JSON readers refuse the bare ``NaN`` Python would write); a value of another type
#: raises ``TypeError``.
compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def is_non_finite_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the ``ValueError`` strict JSON encoding raises for a float NaN or Infinity."""
    return isinstance(exc, ValueError) and "out of range float" in str(exc).lower()


def strict_dumps(data: Any, **options: Any) -> str:
    """``json.dumps(data, allow_nan=False, **options)``: for what chatflow writes out of
    stored data (exports, ``--json``), so a strict JSON reader can read it.

    Raises:
        NonFiniteNumberError: ``data`` holds a float NaN or Infinity (a database written by an
            older chatflow may).
    """
    try:
        return json.dumps(data, allow_nan=False, **options)
    except ValueError as exc:
        if not is_non_finite_error(exc):
            raise
        raise NonFiniteNumberError(
            "a float NaN or Infinity (stored by an older chatflow) cannot be written as strict JSON"
        ) from None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a MODEL message: ``id``, function ``name``, ``arguments`` as JSON text."""

    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> Any:
        """The arguments as Python data. Raises ``ValueError`` when they are not valid JSON."""
        return json.loads(self.arguments or "{}")

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(id=str(data["id"]), name=str(data["name"]), arguments=str(data.get("arguments", "{}")))

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a session.

    Fields:
        role: who speaks.
        content: the text; ``None`` for a MODEL message that only calls tools.
        tool_calls: the MODEL message's tool calls, in call order.
        tool_call_id: for a TOOL message, the id of the call it answers.
        name: for a TOOL message, the tool's name.
        agent: for a MODEL message, the name of the agent that spoke.
        agent_version: for a MODEL message, the version of that agent when it spoke
            (:attr:`~chatflow_cli.core.agents.Agent.version`); ``None``: unknown (a message
            stored before versions were recorded, or not made by a Runner).
        interrupted: the text was cut short by Ctrl-C or cancellation (MODEL), or the
            result is synthetic because the call was interrupted (TOOL).
        is_error: a TOOL result that reports an error (the tool raised, was unknown,
            or got arguments that are not JSON).
        reasoning: for a MODEL message, the model's reasoning text when the server sent
            one (kept for people and JSON output; never sent back to a model).
        finish_reason: for a MODEL message cut short by the server, why: ``"length"``
            (the token limit) or ``"content_filter"``; ``None`` for a reply that finished.
        tokens: the message's token count as stored (the provider's count for a reply
            when it reported usage, else an estimate: :mod:`chatflow_cli.core.tokens`);
            ``None`` until counted. Not part of equality or of :meth:`to_dict` (stores
            keep it beside the message).
        summary_through: for a SYSTEM message that summarises turns 1..K of its session
            (a compaction), K; ``None`` for every other message.
        items: the OpenAI Agents SDK items (Responses API input items, JSON objects) this
            message was made from, exactly as they were added through
            :class:`~chatflow_cli.core.sdk_session.ChatflowSession`; several when one MODEL
            message holds parallel function calls. Empty for chatflow's own messages.
            Stored with the message, never sent to a model by chatflow.
        attachments: for a USER message, the files it carries (:class:`Attachment`), in
            the order given; sent after the text as content parts (:meth:`to_wire`). For a
            TOOL message, the images the tool returned (an MCP server's image content): a
            Chat Completions tool message takes text only, so :func:`wire_messages` sends
            them in a USER message after the tool results (or not at all to a model that
            takes no images); its text names them.
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = field(default_factory=tuple)
    tool_call_id: str | None = None
    name: str | None = None
    agent: str | None = None
    interrupted: bool = False
    is_error: bool = False
    reasoning: str | None = None
    finish_reason: str | None = None
    tokens: int | None = field(default=None, compare=False, repr=False)
    summary_through: int | None = None
    items: tuple[dict[str, Any], ...] = ()
    agent_version: str | None = None
    attachments: tuple[Attachment, ...] = ()

    def __post_init__(self) -> None:
        # Cheap shape checks, so a bad message fails where it is made, not deep in a store.
        if type(self.role) is not Role:
            if not isinstance(self.role, str) or self.role not in _ROLES:
                raise ValueError(f"unknown role {self.role!r}: one of {', '.join(_ROLES)}")
            object.__setattr__(self, "role", _ROLES[self.role])
        if self.content is not None and type(self.content) is not str:
            raise TypeError(f"message content must be str or None, got {type(self.content).__name__}")
        if type(self.tool_calls) is not tuple:
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        for call in self.tool_calls:
            if not isinstance(call, ToolCall):
                raise TypeError(f"tool_calls must hold ToolCall objects, got {type(call).__name__}")
        if self.items:
            if type(self.items) is not tuple:
                object.__setattr__(self, "items", tuple(self.items))
            for item in self.items:
                if not isinstance(item, dict):
                    raise TypeError(f"items must hold dicts, got {type(item).__name__}")
        if self.attachments:
            if type(self.attachments) is not tuple:
                object.__setattr__(self, "attachments", tuple(self.attachments))
            for attachment in self.attachments:
                if type(attachment) is not Attachment and not isinstance(attachment, Attachment):
                    raise TypeError(f"attachments must hold Attachment objects, got {type(attachment).__name__}")

    def __hash__(self) -> int:
        # items hold dicts: hash what identifies the message without them
        return hash((self.role, self.content, self.tool_calls, self.tool_call_id, self.name, self.agent))

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def system(cls, content: str) -> Message:
        return cls(Role.SYSTEM, content)

    @classmethod
    def summary(cls, content: str, through: int) -> Message:
        """A SYSTEM message summarising turns 1..``through`` (a compaction)."""
        return cls(Role.SYSTEM, content, summary_through=through)

    @classmethod
    def user(cls, content: str | None, attachments: Iterable[Attachment] = ()) -> Message:
        return cls(Role.USER, content, attachments=tuple(attachments))

    @classmethod
    def model(
        cls,
        content: str | None = None,
        tool_calls: Iterable[ToolCall] = (),
        *,
        agent: str | None = None,
        interrupted: bool = False,
        reasoning: str | None = None,
        finish_reason: str | None = None,
        tokens: int | None = None,
        agent_version: str | None = None,
    ) -> Message:
        return cls(Role.MODEL, content, tuple(tool_calls), agent=agent, interrupted=interrupted,
                   reasoning=reasoning, finish_reason=finish_reason, tokens=tokens, agent_version=agent_version)

    @classmethod
    def tool(
        cls,
        tool_call_id: str,
        content: str,
        *,
        name: str | None = None,
        is_error: bool = False,
        interrupted: bool = False,
        attachments: Iterable[Attachment] = (),
    ) -> Message:
        return cls(
            Role.TOOL, content, tool_call_id=tool_call_id, name=name, is_error=is_error, interrupted=interrupted,
            attachments=tuple(attachments),
        )

    # -- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; fields at their default are left out."""
        data: dict[str, Any] = {"role": self.role.value}
        if self.content is not None:
            data["content"] = self.content
        if self.tool_calls:
            data["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        if self.agent is not None:
            data["agent"] = self.agent
        if self.agent_version is not None:
            data["agent_version"] = self.agent_version
        if self.interrupted:
            data["interrupted"] = True
        if self.is_error:
            data["is_error"] = True
        if self.reasoning is not None:
            data["reasoning"] = self.reasoning
        if self.finish_reason is not None:
            data["finish_reason"] = self.finish_reason
        if self.summary_through is not None:
            data["summary_through"] = self.summary_through
        if self.items:
            data["items"] = list(self.items)
        if self.attachments:  # last: from_json(lazy_attachments=True) stops before them
            data["attachments"] = [attachment.to_dict() for attachment in self.attachments]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        """The inverse of :meth:`to_dict`. ``ValueError``/``TypeError`` for data of another shape."""
        if not isinstance(data, dict) or "role" not in data:
            raise ValueError(f"a message is a JSON object with a 'role', got {type(data).__name__}")
        # Loading a session parses every message of its window: keep this path lean
        # (a dict look-up instead of the Enum call, no work for absent fields).
        role = _ROLES.get(data["role"]) or Role(data["role"])
        get = data.get
        calls = get("tool_calls")
        return cls(
            role,
            get("content"),
            tuple(ToolCall.from_dict(c) for c in calls) if calls else (),
            get("tool_call_id"),
            get("name"),
            get("agent"),
            bool(get("interrupted", False)),
            bool(get("is_error", False)),
            get("reasoning"),
            get("finish_reason"),
            None,
            get("summary_through"),
            tuple(items) if (items := get("items")) else (),
            None if (version := get("agent_version")) is None else str(version),
            tuple([Attachment.from_dict(a) for a in attached]) if (attached := get("attachments")) else (),
        )

    def to_json(self) -> str:
        return compact_json(self.to_dict())

    @classmethod
    def from_json(cls, text: str, *, lazy_attachments: bool = False) -> Message:
        """:meth:`from_dict` of the JSON ``text``; ``lazy_attachments``: attachments read on
        first use, as :func:`stored_message` reads a store's message."""
        return stored_message(text) if lazy_attachments else cls.from_dict(json.loads(text))

    @property
    def says_nothing(self) -> bool:
        """A MODEL message with neither text (whitespace counts as none) nor tool calls (a
        reply that was empty, only whitespace, or reasoning only). It is kept in the session
        but left out of requests: several providers refuse an assistant message with empty
        content."""
        return self.role is Role.MODEL and not (self.content or "").strip() and not self.tool_calls

    def to_wire(self, blobs: Mapping[str, bytes] | None = None, *, data_urls: bool = False) -> dict[str, Any]:
        """The Chat Completions form of this message (``role`` ``assistant`` for MODEL).

        ``content`` is a string on the wire (``""`` when the message has none), except for a
        USER message with :attr:`attachments`: a list of content parts then
        (:func:`chatflow_cli.core.attachments.wire_content`), whose bytes come from each
        attachment's ``data`` or from ``blobs`` (sha256 -> bytes). ``data_urls``: an image's
        URL is a :class:`~chatflow_cli.core.attachments.DataURL` (for a client whose
        ``takes_data_urls`` is true) instead of a str. A TOOL message is its text alone
        (:func:`wire_messages` sends its images after it).
        """
        if self.attachments and self.role is not Role.TOOL:
            from .attachments import wire_content

            return {"role": self.role.wire,
                    "content": wire_content(self.content, self.attachments, blobs or {}, data_urls=data_urls)}
        data: dict[str, Any] = {"role": self.role.wire}
        if self.role is Role.MODEL:
            # A message that only calls tools goes out with content "" rather than null:
            # OpenAI accepts both; llama.cpp's server refuses null and its chat template
            # breaks on a missing key.
            data["content"] = self.content if self.content is not None else ""
            if self.tool_calls:
                data["tool_calls"] = [call.to_wire() for call in self.tool_calls]
        elif self.role is Role.TOOL:
            data["tool_call_id"] = self.tool_call_id
            data["content"] = self.content if self.content is not None else ""
        else:
            data["content"] = self.content if self.content is not None else ""
        return data


#: Said to a model that takes no images, after a tool result that returned some.
IMAGES_NOT_SHOWN = "[the images are not shown: this model takes no images]"


def wire_messages(messages: Iterable[Message], blobs: Mapping[str, bytes] | None = None, *, images: bool = True,
                  wire: Callable[[Message], dict[str, Any]] | None = None,
                  data_urls: bool = False) -> list[dict[str, Any]]:
    """The Chat Completions messages of ``messages`` (those that say something:
    :attr:`Message.says_nothing`), each as ``wire`` makes it (default :meth:`Message.to_wire`
    with ``blobs``).

    Chat Completions tool messages take text only, so the images TOOL messages carry (an MCP
    tool's image content) follow the run of tool results they are in, as one USER message:
    a text part naming them, then each image as an ``image_url`` part (their bytes from each
    attachment or ``blobs``). With ``images`` False (a model that takes no images) they are
    not sent: each such tool result's text, which names them, says so instead
    (:data:`IMAGES_NOT_SHOWN`). ``data_urls``: their URLs as
    :class:`~chatflow_cli.core.attachments.DataURL` values, as :meth:`Message.to_wire` makes them.

    Raises:
        ChatflowError: the bytes of an image to send are neither at hand nor in ``blobs``.
    """
    out: list[dict[str, Any]] = []
    held: list[Message] = []

    def flush() -> None:
        if held:
            out.append(_tool_images(held, blobs or {}, data_urls))
            held.clear()

    for message in messages:
        if message.says_nothing:
            continue
        if message.role is not Role.TOOL:
            flush()
        data = wire(message) if wire is not None else (
            message.to_wire(blobs) if message.attachments else message.to_wire())
        if message.role is Role.TOOL and message.attachments:
            if images:
                held.append(message)
            else:
                data = {**data, "content": f"{data.get('content') or ''}\n{IMAGES_NOT_SHOWN}".lstrip("\n")}
        out.append(data)
    flush()
    return out


def _tool_images(results: Sequence[Message], blobs: Mapping[str, bytes], data_urls: bool) -> dict[str, Any]:
    """The USER message carrying the images of ``results`` (TOOL messages), in order."""
    from .attachments import wire_content

    named = "; ".join(f"{', '.join(a.name or a.sha256[:12] for a in m.attachments)} from {m.name or 'a tool'} "
                      f"(call {m.tool_call_id})" for m in results)
    attached = [a for m in results for a in m.attachments]
    return {"role": "user", "content": wire_content(f"The images the tool results above returned: {named}.",
                                                    attached, blobs, data_urls=data_urls)}


#: How :meth:`Message.to_json` writes its last member, the attachments.
_ATTACHMENTS_KEY = ',"attachments":['


def stored_message(text: str | dict[str, Any]) -> Message:
    """The message a store wrote, from its JSON text (:meth:`Message.to_json`) or the data
    parsed from it, with its attachments read lazily: the :class:`Attachment` values are
    made on the first read of :attr:`Message.attachments` (a window or a listing nobody reads
    files of pays nothing for them; a malformed one raises ``ValueError`` there, not here).
    The text is not even parsed past the start of the attachments, which ``to_json`` writes
    last: their JSON text is kept as it is."""
    if not isinstance(text, str):
        attached = text.get("attachments") if isinstance(text, dict) else None
        if not attached:
            return Message.from_dict(text)
        bare = {k: v for k, v in text.items() if k != "attachments"}
        return _LazyAttachmentsMessage.of(Message.from_dict(bare), attached)
    if text.endswith("]}"):  # else it has no attachments: they would end it
        cut = text.rfind(_ATTACHMENTS_KEY)
        if cut > 0:
            try:  # the message without its attachments; where the key was not the top
                data = json.loads(text[:cut] + "}")  # level's, that text is no JSON
            except ValueError:
                data = None
            if type(data) is dict:
                return _LazyAttachmentsMessage.of(Message.from_dict(data), text[cut + len(_ATTACHMENTS_KEY) - 1:-1])
        return stored_message(json.loads(text))
    return Message.from_dict(json.loads(text))


_slot_attachments: Any = Message.__dict__["attachments"]  # the slot's descriptor


class _LazyAttachmentsMessage(Message):
    """A :class:`Message` a store loaded whose attachments nobody read yet: its attachments
    slot holds their JSON as read (the text of the array, or the list). The first read of
    :attr:`attachments` makes them :class:`Attachment` values and the message a plain
    :class:`Message` again; equality, ``repr``, copies and pickling read them first, so it
    behaves as the Message it is. (A Message made any other way never pays for this.)"""

    __slots__ = ()

    @staticmethod
    def of(message: Message, raw: Any) -> Message:
        """``message`` (made without attachments) holding ``raw``, its attachments' JSON."""
        _slot_attachments.__set__(message, raw)
        object.__setattr__(message, "__class__", _LazyAttachmentsMessage)
        return message

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        raw = _slot_attachments.__get__(self)
        value = raw if type(raw) is tuple else _parse_stored(raw)
        _slot_attachments.__set__(self, value)
        object.__setattr__(self, "__class__", Message)
        return value

    @attachments.setter
    def attachments(self, value: tuple[Attachment, ...]) -> None:  # the inherited __init__ (replace())
        _slot_attachments.__set__(self, value)

    def __eq__(self, other: object) -> bool:
        self.attachments  # noqa: B018 - a plain Message from here on
        return self == other

    __hash__ = Message.__hash__

    def __repr__(self) -> str:
        self.attachments  # noqa: B018
        return repr(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        self.attachments  # noqa: B018
        return self.__reduce_ex__(protocol)


def _parse_stored(raw: Any) -> tuple[Attachment, ...]:
    if type(raw) is str:
        try:
            raw = json.loads(raw)
        except ValueError:
            raise ValueError("a stored message's attachments are not one JSON array at the end of "
                             "its JSON (chatflow writes them last)") from None
    if type(raw) is not list:
        raise ValueError(f"a message's attachments are a JSON array, got {type(raw).__name__}")
    return tuple([Attachment.from_dict(a) for a in raw])


def history_problems(messages: Sequence[Message], *, pending_ok: bool = False) -> list[str]:
    """Return the broken validity checks of ``messages`` as ``"<check>: <detail>"`` strings.

    An empty list means the history may be sent to a model. An empty history, or one of
    SYSTEM messages only, is valid. ``pending_ok=True`` accepts tool calls of the *last*
    MODEL message that are still unanswered at the end (a stored session waiting for
    custom tool results); such a history is valid to store, not to send.
    """
    problems: list[str] = []
    i = 0
    n = len(messages)
    while i < n and messages[i].role is Role.SYSTEM:
        i += 1
    for j in range(i, n):
        if messages[j].role is Role.SYSTEM:
            problems.append(f"system_leading: message {j} is SYSTEM after a non-system message")
    if i < n and messages[i].role is not Role.USER:
        problems.append(f"first_after_system_is_user: message {i} is {messages[i].role.value.upper()}")
    seen_ids: set[str] = set()
    open_calls: list[str] = []  # ids of the current MODEL message's calls still unanswered
    for j in range(i, n):
        msg = messages[j]
        if msg.role is Role.TOOL:
            if msg.tool_call_id in open_calls:
                open_calls.remove(msg.tool_call_id)
            else:
                problems.append(
                    f"tool_result_follows_call: message {j} answers {msg.tool_call_id!r}, "
                    "which is not an open call of the preceding MODEL message"
                )
            continue
        if open_calls:
            problems.append(f"tool_call_answered_once: calls {open_calls} unanswered before message {j}")
            open_calls = []
        if msg.role is Role.MODEL:
            for call in msg.tool_calls:
                if call.id in seen_ids:
                    problems.append(f"tool_call_id_unique: {call.id!r} appears again at message {j}")
                seen_ids.add(call.id)
            open_calls = [call.id for call in msg.tool_calls]
    if open_calls and not pending_ok:
        problems.append(f"tool_call_answered_once: calls {open_calls} unanswered at the end")
    return problems


def check_history(messages: Sequence[Message], *, pending_ok: bool = False, session_id: str | None = None) -> None:
    """Raise :class:`InvalidHistoryError` when :func:`history_problems` finds any."""
    problems = history_problems(messages, pending_ok=pending_ok)
    if problems:
        raise InvalidHistoryError(
            f"invalid history: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
            problems=problems,
            session_id=session_id,
        )
