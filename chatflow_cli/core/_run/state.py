"""What a run asks the store to start, what one turn carries between its model requests,
and the Runner's internal signals."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .._stream import Usage
from ..agents import Agent
from ..messages import Message
from ..resources.mounts import Mount

__all__ = ["Broken", "InvalidAfterTools", "TurnRequest", "TurnState"]


@dataclasses.dataclass(frozen=True, slots=True)
class TurnRequest:
    """The caller's part of ``store.begin_turn``'s arguments for one run; the waiting loop
    adds the rest (the default agent, the owner, the queue ticket).

    Attributes:
        user_message: the USER message of a new turn; None continues a turn whose custom
            tool calls are all answered.
        metadata: merged into the session's metadata.
        idempotency_key: a key already used with the same message replays the first result.
        max_turns: the window size of a session this turn creates.
        system: the system message of a session this turn creates.
        message_id: an inbound message id to process once (claimed with the turn).
        message_claim: the owner token of the claim on ``message_id`` this thread or task
            made before the run (``store.claim_message``), or None.
        resources: mounts the session gets once the turn began, those not mounted yet.
    """

    user_message: Message | None
    metadata: Mapping[str, Any] | None = None
    idempotency_key: str | None = None
    max_turns: int | None = None
    system: str | None = None
    message_id: str | None = None
    message_claim: str | None = None
    resources: tuple[Mount, ...] = ()


class Broken(Exception):
    """The model's reply stopped before it finished (``args[0]`` says why)."""


class InvalidAfterTools(Exception):
    """A later round's reply has an invalid tool call after earlier rounds ran tools
    (``args``: the verdict's reason and finish reason)."""


@dataclasses.dataclass
class TurnState:
    """One turn's running state.

    Attributes:
        agent: the agent answering now (changes at a handoff).
        start_agent: the active agent when the turn began (restored if the turn fails).
        usage: token usage summed over the turn's requests.
        rounds: replies with tool calls so far.
        ran: names of the tools run in this turn, in order.
        partial: text deltas of the reply being streamed.
        reasoning: the reasoning of a reply that broke off (kept with the interrupted turn).
        handoffs: tool call id -> the agent that call hands off to.
        finished: tool call id -> ``(text, is_error)`` of calls that finished before an interrupt.
        released: the turn's end (idle) is stored: nothing left to undo.
        ended: the ending of a turn that did not complete is stored, or the store shows the
            turn ended already (no second ending was written).
        context: the context use of the latest request (see ``RunResult.context``).
        dropped_told: the turn's ``context.dropped`` event was yielded.
        wholes: tool call id -> the complete result of a call whose text was cut for the
            model (stored as an ``mcp.output`` event beside the call).
        images: tool call id -> the images a call's tool returned (attachments with their
            bytes), stored with its TOOL message.
        unavailable: tool servers that failed to start in this turn -> what happened (not
            tried again until the next turn).
        unknown_tools: tool servers whose ``tools``/``tool_approval`` name tools they do not
            list -> the warning (each said once a server object, :func:`~chatflow_cli.core.mcp.servers.unknown_tools_note`).
    """

    agent: Agent
    start_agent: Any = None
    usage: Usage = dataclasses.field(default_factory=Usage)
    rounds: int = 0
    ran: list[str] = dataclasses.field(default_factory=list)
    partial: list[str] = dataclasses.field(default_factory=list)
    reasoning: str | None = None
    handoffs: dict[str, Agent] = dataclasses.field(default_factory=dict)
    finished: dict[str, tuple[str, bool]] = dataclasses.field(default_factory=dict)
    released: bool = False
    ended: bool = False
    context: dict[str, Any] | None = None
    usage_reported: bool = False  # a request of the turn came back with usage
    usage_missing: bool = False  # a request of the turn came back without usage
    dropped_told: bool = False  # a context.dropped event was yielded for this turn
    wholes: dict[str, str] = dataclasses.field(default_factory=dict)
    images: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    unavailable: dict[str, str] = dataclasses.field(default_factory=dict)
    unknown_tools: dict[str, str] = dataclasses.field(default_factory=dict)
    # Chat Completions form of each message sent in this turn, by identity (messages are
    # immutable; the tuple keeps the message alive so its id is not reused)
    _wire: dict[int, tuple[Message, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    # bytes of attachments read from the store for this turn's requests, by sha256
    _blobs: dict[str, bytes] = dataclasses.field(default_factory=dict)

    def known_usage(self) -> dict[str, int] | None:
        """The turn's usage as stored (:mod:`chatflow_cli.core.usage`'s shape), or None when
        a request of the turn reported none: unknown, never a false 0 or a partial sum."""
        if not self.usage_reported or self.usage_missing:
            return None
        return self.usage.to_dict()

    def fetch_blobs(self, messages: list[Message], store: object) -> None:
        """Read, in one store read, the bytes of the attachments of ``messages`` that are
        neither at hand nor read before in this turn (``store.attachment_data``)."""
        missing = {a.sha256 for m in messages for a in m.attachments if a.data is None} - self._blobs.keys()
        read = getattr(store, "attachment_data", None)
        if missing and read is not None:
            self._blobs.update(read(missing))

    @property
    def blobs(self) -> Mapping[str, bytes]:
        """The attachments' bytes :meth:`fetch_blobs` read, by sha256."""
        return self._blobs

    def wire(self, message: Message) -> dict[str, Any]:
        """``message.to_wire()``, computed once per turn (attachments' bytes from
        :meth:`fetch_blobs`)."""
        cached = self._wire.get(id(message))
        if cached is not None and cached[0] is message:
            return cached[1]
        data = message.to_wire(self._blobs) if message.attachments else message.to_wire()
        self._wire[id(message)] = (message, data)
        return data
