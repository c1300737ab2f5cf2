"""What a turn starts from, carries and gives, and its beginning and ending around the loop
of :mod:`.turn`.

* What a run asks the store to start (:class:`TurnRequest`), what one turn carries between
  its model requests (:class:`TurnState`), the Runner's internal signals (:class:`Broken`,
  :class:`InvalidAfterTools`), and what a run gives its caller: :class:`RunResult` and the
  :class:`StreamEvent` s of a streamed run (both public through
  :mod:`chatflow_cli.core.runner`).
* Beginning: ``store.begin_turn``, waiting in the store's queue while the session is busy
  (:func:`begin_turn_when_free`; :func:`release_claim` and :func:`end_lease` free what a
  turn that never started held).
* Ending: storing the end of a turn that did not complete, interrupted or failed
  (:func:`store_interrupted`, :func:`store_failed`; :func:`lease_of`).

  A turn has one ending. Each ending is written once, in one ``store.save`` of the session
  the turn ran on -- unless that session still holds the journal of an ending whose save
  failed (the completion's commit may have happened): then, as when the save fails (the
  in-memory session may be half-written), the ending is written on a fresh copy read from
  the store, and only while the stored session still runs this turn under its lease. A turn
  the store shows as ended already (its completion committed before an error, or another
  process recovered it as dead) gets no second ending. So the session is never left
  ``running`` by this process, and never ended twice.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..stream import Usage, cut_phrase
from ..agents import Agent
from ..errors import ExitStatus, RateLimitedError, RunInterrupted, SessionBusyError
from ..events import Event, EventType, SessionStatus
from ..messages import Message, ToolCall
from ..resources.mounts import Mount
from ..cancel import CancelToken

if TYPE_CHECKING:  # pragma: no cover
    from ..memory.context import SessionContext
    from ..memory.protocol import ContextStore, TurnStart, TurnStore

__all__ = ["Broken", "InvalidAfterTools", "RunResult", "StreamEvent", "TurnRequest", "TurnState",
           "begin_turn_when_free", "drain", "end_lease", "lease_of", "release_claim", "store_failed",
           "store_interrupted"]

log = logging.getLogger("chatflow_cli.core.runner")


# --------------------------------------------------------------------------------------
# what a run asks the store to start, what one turn carries between its model requests,
# and the Runner's internal signals
# --------------------------------------------------------------------------------------
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
    # the client takes an image's URL as a DataURL (its takes_data_urls): set as the turn begins
    data_urls: bool = False

    def known_usage(self) -> dict[str, int] | None:
        """The turn's usage as stored (:func:`~chatflow_cli.core.stream.normalize_usage`'s shape), or None when
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
        :meth:`fetch_blobs`; images' URLs as :class:`DataURL` values with :attr:`data_urls`)."""
        cached = self._wire.get(id(message))
        if cached is not None and cached[0] is message:
            return cached[1]
        data = message.to_wire(self._blobs, data_urls=self.data_urls) if message.attachments else message.to_wire()
        self._wire[id(message)] = (message, data)
        return data


# --------------------------------------------------------------------------------------
# what a run gives its caller (public through chatflow_cli.core.runner)
# --------------------------------------------------------------------------------------
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
    def exit_status(self) -> ExitStatus:
        """The exit status of ``chatflow chat`` for this reply: :attr:`ExitStatus.INCOMPLETE`
        (10) when it was cut (:attr:`truncated`), else success. A reply that did not finish
        at all is no result: the run raised its error, whose exit code it is."""
        return ExitStatus.INCOMPLETE if self.truncated else ExitStatus.SUCCESS

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


# --------------------------------------------------------------------------------------
# beginning: starting a turn, waiting in the store's queue while the session is busy
# --------------------------------------------------------------------------------------
def begin_turn_when_free(store: TurnStore, session_id: str, request: TurnRequest, *, wait: float,
                         cancel: CancelToken, default_agent: Agent,
                         on_wait: Callable[[dict[str, Any]], None] | None) -> TurnStart:
    """``store.begin_turn``, waiting up to ``wait`` seconds while the session is busy.

    The first busy attempt takes a ticket in the store's queue for the session, so
    waiting turns start in the order they reached the store (in this process and in
    others). Waiters of this process wake when a turn of the store object ends; others
    poll with a read (20 ms, doubling to 100 ms) and try again once the turn may start.
    A replayed idempotency key whose first turn is still running, and a message id
    another live holder is running, count as busy too: the wait then ends with that
    turn's result. Giving up (time out, interrupt, error) leaves the queue -- or, when the
    store cannot be reached, ends the ticket's lease (``store.end_lease(stored=False)``) so
    it holds nobody up once the store answers; the caller frees the message claim
    ``request`` carries (:func:`release_claim`).

    Args:
        request: the caller's part of ``begin_turn``'s arguments (user message, metadata,
            claims…).
        wait: seconds to wait at most; ``0`` refuses a busy session at once.
        default_agent: the agent of a new session.
        on_wait: called once, when the wait starts, with ``{"session_id", "pid" (the running
            turn's process, or None), "wait_s"}``; its exceptions are ignored.

    Returns:
        What ``store.begin_turn`` returned for the turn that started (or was replayed).

    Raises:
        SessionBusyError: still busy after ``wait`` seconds (``pid`` names the running
            turn's process when the store can say).
        RunInterrupted: ``cancel`` was set while waiting.
    """
    from ..errors import StoreError
    from ..memory import Owner

    deadline = time.monotonic() + max(0.0, float(wait))
    delay = 0.02
    ticket: int | None = None
    ticket_owner: str | None = None  # the token of the owner the ticket was taken for
    begun: TurnStart | None = None
    announced = False
    try:
        while True:
            owner = Owner.current()
            try:
                try:
                    begun = store.begin_turn(
                        session_id,
                        default_agent=default_agent,
                        owner=owner,
                        ticket=ticket,
                        enqueue=wait > 0 and ticket is None,
                        user_message=request.user_message,
                        metadata=request.metadata,
                        idempotency_key=request.idempotency_key,
                        max_turns=request.max_turns,
                        system=request.system,
                        message_id=request.message_id,
                        message_claim=request.message_claim,
                    )
                except StoreError as exc:
                    if exc.written is None:  # the turn may have started with nobody to run it
                        end_lease(store, owner.token, stored=False)
                    raise
                if begun.queued is not None:
                    ticket, ticket_owner = begun.queued, owner.token
                    begun = None
                    raise SessionBusyError(
                        f"session {session_id!r} is busy: other turns run or wait for it (waited {wait:g} s)",
                        session_id=session_id, pid=_running_pid(store, session_id))
                replay = begun.replayed
                if replay is not None:
                    ticket = None  # a replay gave the ticket up
                if replay is not None and replay.get("outcome") == "running":
                    begun = None
                    raise SessionBusyError(
                        f"session {session_id!r} is busy: it is still running turn {replay.get('turn')}, started "
                        "with this idempotency key", session_id=session_id)
                ticket = None  # begin_turn removed it
                return begun
            except SessionBusyError as exc:
                if on_wait is not None and wait > 0 and not announced:  # once, when the wait starts
                    announced = True
                    try:
                        on_wait({"session_id": session_id, "pid": getattr(exc, "pid", None), "wait_s": float(wait)})
                    except Exception:  # noqa: BLE001 - a display problem never breaks the turn
                        log.debug("on_wait failed", exc_info=True)
                while True:  # poll with reads until the turn may start, then try again
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise
                    _wait_for_turn_end(store, min(delay, remaining))
                    if cancel.is_set():
                        raise RunInterrupted("interrupted while waiting for a busy session",
                                             session_id=session_id) from None
                    delay = min(delay * 2, 0.1)
                    if _may_start(store, session_id, ticket):
                        break
    finally:
        if ticket is not None and begun is None:
            try:
                store.leave_turn_queue(session_id, ticket)
            except Exception as exc:  # noqa: BLE001 - the run's own error is raised instead
                # its holder counts as dead from now on, as a turn whose ending was not
                # stored: the ticket is skipped at once here, and its lease is expired on
                # the database clock as soon as the database answers, for other hosts too
                log.warning("could not leave the queue of session %s: %s", session_id, exc)
                end_lease(store, ticket_owner, stored=False)


def release_claim(store: TurnStore, request: TurnRequest) -> None:
    """Free the message claim ``request`` carries (``store.claim_message`` /
    ``mark_message_processed`` in the caller's thread or task), for a run that failed before
    its turn started: the message was not processed, so its redelivery must run. When even
    that fails (the database is down), the claim's holder counts as dead from now on
    (:func:`end_lease`), so the claim is free once the database answers."""
    claim, message_id = request.message_claim, request.message_id
    if claim is None or message_id is None or not hasattr(store, "_release_held"):
        return
    try:
        store._release_held(message_id, claim)
    except Exception as exc:  # noqa: BLE001 - the run's own error is raised instead
        log.warning("could not release the claim of message %s: %s", message_id, exc)
        end_lease(store, claim, stored=False)
    else:
        end_lease(store, claim, stored=True)


def end_lease(store: TurnStore, token: str | None, *, stored: bool) -> None:
    """``store.end_lease(token, stored=...)`` when the store has it; never raises."""
    end = getattr(store, "end_lease", None)
    if end is None or token is None:
        return
    try:
        end(token, stored=stored)
    except Exception as exc:  # noqa: BLE001 - only the lease's early end is lost; it runs out
        log.warning("could not end the lease of a run: %s", exc)


def _may_start(store: TurnStore, session_id: str, ticket: int | None) -> bool:
    check = getattr(store, "turn_may_start", None)
    return True if check is None else bool(check(session_id, ticket))


def _running_pid(store: TurnStore, session_id: str) -> int | None:
    """The pid of the process running ``session_id``'s turn, when the store can say (a cheap read)."""
    look = getattr(store, "running_turn_pid", None)
    try:
        return None if look is None else look(session_id)
    except Exception:  # noqa: BLE001 - only the waiting message loses the pid
        return None


def _wait_for_turn_end(store: TurnStore, timeout: float) -> None:
    """Sleep ``timeout`` seconds, or less when a turn of ``store`` ends in this process."""
    wait = getattr(store, "wait_turn_ended", None)
    if wait is None:
        time.sleep(timeout)
    else:
        wait(timeout)


# --------------------------------------------------------------------------------------
# ending: storing the end of a turn that did not complete, interrupted or failed
# --------------------------------------------------------------------------------------
#: Event types that end a turn (a turn pending custom tool results ends its run too).
_ENDINGS = frozenset({EventType.TURN_COMPLETED.value, EventType.TURN_FAILED.value, EventType.TURN_INTERRUPTED.value,
                      EventType.TOOL_PENDING.value})


def lease_of(session: SessionContext) -> str | None:
    """The owner token of the run a context from ``begin_turn`` was given to, or None."""
    binding = getattr(session, "_binding", None)
    if binding is not None:
        return getattr(binding, "lease", None)
    return getattr(session, "_lease", None)


def _holds_unsaved_ending(session: SessionContext) -> bool:
    """The session's journal holds an ending whose save failed (it may have committed)."""
    return any(entry.type in _ENDINGS for entry in getattr(session, "_journal", ()))


def store_interrupted(store: ContextStore, session: SessionContext, state: TurnState,
                      reason: str) -> list[Event]:
    """Store the interrupted turn once: partial text, finished results, synthetic ones; then idle.

    Returns:
        The events written (none when even the fresh copy could not be written).
    """
    partial = "".join(state.partial) or None
    lease = lease_of(session)

    def close(s: SessionContext) -> None:
        s.interrupt_turn(reason=reason, partial_text=partial, agent=state.agent, partial_reasoning=state.reasoning)

    if _holds_unsaved_ending(session):
        return _close_from_store(store, session.session_id, close, reason, lease=lease, state=state)
    try:
        pending = {c.id: c for c in session.pending_tool_calls}
        for call_id, (text, is_error) in state.finished.items():
            if call_id in pending:
                session.add_message(Message.tool(call_id, text, name=pending[call_id].name, is_error=is_error))
        session.interrupt_turn(reason=reason, partial_text=partial, agent=state.agent,
                               partial_reasoning=state.reasoning)
        session.set_status(SessionStatus.IDLE, reason=reason)
        events = list(store.save(session))
        state.ended = True
        return events
    except BaseException as exc:  # noqa: BLE001 - the in-memory session may be half-written
        log.warning("storing the interrupted turn from memory failed (%s); retrying from the store", exc)
        return _close_from_store(store, session.session_id, close, reason, lease=lease, state=state)


def store_failed(store: ContextStore, session: SessionContext, state: TurnState,
                 exc: BaseException) -> list[Event]:
    """Store a failed turn: out of the window, ``turn.failed``, the agent of the turn's start
    restored; then ``idle``, or ``rescheduled`` with ``retry_at`` after a :class:`RateLimitedError`.

    Returns:
        The events written (none when even the fresh copy could not be written).
    """
    if isinstance(exc, RateLimitedError):
        status, extra = SessionStatus.RESCHEDULED, {"retry_at": exc.retry_at}
    else:
        status, extra = SessionStatus.IDLE, {}
    reason = f"turn failed: {type(exc).__name__}"
    lease = lease_of(session)

    def close(s: SessionContext) -> None:
        s.fail_turn(exc, agent=state.start_agent)

    if _holds_unsaved_ending(session):
        return _close_from_store(store, session.session_id, close, reason, lease=lease, state=state, status=status,
                                 **extra)
    try:
        session.fail_turn(exc, agent=state.start_agent)  # also undoes a handoff made in the turn
        session.set_status(status, reason=reason, **extra)
        events = list(store.save(session))
        state.ended = True
        return events
    except BaseException as second:  # noqa: BLE001
        log.warning("storing the failed turn from memory failed (%s); retrying from the store", second)
        return _close_from_store(store, session.session_id, close, reason, lease=lease, state=state, status=status,
                                 **extra)


def _close_from_store(store: ContextStore, session_id: str, action: Callable[[SessionContext], None],
                      reason: str, *, lease: str | None, state: TurnState,
                      status: SessionStatus = SessionStatus.IDLE, **extra: Any) -> list[Event]:
    """The ending written on a fresh copy of the session, only while the stored session still
    runs this turn under ``lease`` (the save refuses it otherwise, atomically)."""
    try:
        fresh = store.get(session_id)
        if fresh is None:
            state.ended = True
            return []
        binding = fresh._binding
        if lease is not None and binding is not None:
            if binding.base[0] is not SessionStatus.RUNNING or binding.base[1] != lease:
                log.info("turn of session %s already ended (completed, or recovered by another process): "
                         "no second ending is written", session_id)
                state.ended = True
                return []
            binding.lease = lease  # the save checks the lease still holds, in its transaction
        try:
            action(fresh)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not close turn of %s: %s", session_id, exc)
        fresh.set_status(status, reason=reason, **extra)
        events = list(store.save(fresh))
        state.ended = True
        return events
    except Exception as exc:  # noqa: BLE001 - the owner record lets a later run recover it
        log.error("could not release session %s: %s", session_id, exc)
        return []
