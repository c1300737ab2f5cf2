"""What a run gives its caller: :class:`RunResult` and the :class:`StreamEvent` s of a
streamed run (both public through :mod:`chatflow_cli.core.runner`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from .._stream import Usage, cut_phrase
from ..events import Event, SessionStatus
from ..messages import ToolCall
from ..resources.mounts import Mount

__all__ = ["RunResult", "StreamEvent", "drain"]


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    """What a run returns.

    Attributes:
        content: the final text of the turn (``None`` when the run stopped for custom tools).
        agent: the name of the agent that answered (the active agent after any handoff).
        session_id: the session.
        turn: the user-visible turn number (1, 2, 3… for the session's life).
        usage: token usage summed over the turn's model requests.
        status: the session's status when the run returned (``idle`` normally).
        pending_tool_calls: custom tool calls waiting for ``submit_tool_result``, and tool
            calls waiting for an approval (``approval_tool_calls``).
        approval_tool_calls: the pending calls of tools whose policy is ``ask``, made with no
            way to ask (no ``Runner.approver``): answered by ``Runner.approve_tool_call`` /
            ``deny_tool_call``.
        events: the events this run wrote to the session's log, in ``seq`` order.
        replayed: the result came from the log (idempotency key seen before); no model call.
        finish_reason: why the final reply ended (``"stop"``; ``"length"`` or
            ``"content_filter"`` when it was cut: the turn is stored, marked with it);
            ``None`` when the run stopped for custom tools.
        reasoning: the final reply's reasoning text, when the server sent one.
        usage_reported: the server reported token usage for every request of the turn; when
            one came back without (llama-cpp-python's server streams none), ``usage`` holds
            what was reported and :meth:`to_dict` gives ``"usage": null`` rather than a false
            0 or a partial sum (``turn.completed`` stores ``null`` alike).
        context: the context use of the turn's last request, ``{"tokens", "budget",
            "context", "turns", "over_budget", "first_turn", "summary_through",
            "system_messages", "dropped"}`` (``budget``/``context`` None when the model's
            context size is unknown; ``turns``: whole turns sent, from ``first_turn``;
            ``summary_through``: K of the summary sent, or None; ``system_messages``: the
            SYSTEM messages sent beside it, the agent's instructions included;
            ``dropped``: ``[first, last]`` of the turns of the window left out for the
            budget, unsummarised, or None); None for a replay.
        resources: the resources the turn ran with (:class:`~chatflow_cli.core.resources.Mount`:
            the session's mounts in force when it ended, as the event log says), in the order
            they were first mounted.
    """

    content: str | None
    agent: str
    session_id: str
    turn: int
    usage: Usage = dataclasses.field(default_factory=Usage)
    status: SessionStatus = SessionStatus.IDLE
    pending_tool_calls: tuple[ToolCall, ...] = ()
    events: tuple[Event, ...] = ()
    replayed: bool = False
    finish_reason: str | None = None
    reasoning: str | None = None
    context: dict[str, Any] | None = None
    usage_reported: bool = True
    approval_tool_calls: tuple[ToolCall, ...] = ()
    resources: tuple[Mount, ...] = ()

    @property
    def truncated(self) -> bool:
        """The final reply was cut by the token limit or a content filter (stored, marked)."""
        return bool(cut_phrase(self.finish_reason))

    @property
    def reasoning_only(self) -> bool:
        """The model answered with reasoning and no text (nothing of it is sent back)."""
        return not self.content and bool(self.reasoning) and not self.pending_tool_calls

    @property
    def final_output(self) -> str | None:
        """Alias of :attr:`content` (the name the OpenAI Agents SDK uses)."""
        return self.content

    def to_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "agent": self.agent,
            "session_id": self.session_id,
            "turn": self.turn,
            "usage": self.usage.to_dict() if self.usage_reported else None,
            "status": self.status.value,
            "pending_tool_calls": [c.to_dict() for c in self.pending_tool_calls],
            "awaiting_approval": [c.id for c in self.approval_tool_calls],
            "replayed": self.replayed,
            "finish_reason": self.finish_reason,
            "reasoning": self.reasoning,
            "context": self.context,
            "resources": [m.to_dict() for m in self.resources],
        }


@dataclasses.dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a streamed run.

    ``type`` is a runtime type (``text.delta`` ``{"text"}``, ``tool.call_started`` ``{"id",
    "name", "arguments"}``, ``tool.call_finished`` ``{"id", "name", "output", "is_error",
    "duration_ms"}``, ``result`` with :attr:`result` set) or the type of an event just
    written to the log (``seq`` set, ``data`` is its payload).
    """

    type: str
    session_id: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    turn: int | None = None
    seq: int | None = None
    result: RunResult | None = None

    @property
    def persisted(self) -> bool:
        return self.seq is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "session_id": self.session_id}
        if self.seq is not None:
            out["seq"] = self.seq
        if self.turn is not None:
            out["turn"] = self.turn
        out["data"] = self.result.to_dict() if self.result is not None else self.data
        return out


def drain(events: Iterator[StreamEvent]) -> RunResult:
    """The :class:`RunResult` the ``result`` event of ``events`` carries, after every event.

    Raises:
        whatever the run raises (a run ends with a result event or an error).
    """
    result: RunResult | None = None
    for event in events:
        if event.result is not None:
            result = event.result
    assert result is not None, "a run ends with a result event or an error"
    return result
