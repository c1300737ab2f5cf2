"""The Runner: runs one turn of a session against an OpenAI-compatible server (issue 4).

::

    runner = Runner(starting_agent=agent, session_store=store)
    result = runner.run("user-1", "Where is order 404?")          # sync
    result = await runner.run_async("user-1", "Where is order 404?")
    for event in runner.run_streamed("user-1", "Hi"):               # events as they happen
        ...

A turn, step by step:

1. ``store.begin_turn`` (one short transaction) creates the session if needed, claims it
   for this process (status ``running`` with an owner record; a live owner elsewhere means
   :class:`~chatflow_cli.core.errors.SessionBusyError` after ``wait`` seconds of polling),
   and appends the user message. An ``idempotency_key`` already used with the same message
   returns the first result from the log without calling the model -- unless that attempt
   gave no result (failed, rescheduled, interrupted): then the turn runs again.
2. The request goes out as Chat Completions: the active agent's instructions first, as a
   system message, then the session's context window (already pruned to ``max_turns``
   whole turns). Every request passes :func:`~chatflow_cli.core.messages.check_history`
   first.
3. The streamed reply is folded by the model client; text deltas are yielded as they come.
   A reply with tool calls is stored (one transaction), the tools run — several calls of
   one reply run concurrently, each on its own thread — and their results are appended under
   their ids in call order, then the model is asked again. A tool that raises, an unknown
   tool name, or arguments that are not valid JSON (or do not fit the parameters) become an
   error TOOL result (``is_error``) that the model sees; the turn goes on.
4. A call to ``transfer_to_<agent>`` makes that agent the session's active agent (a
   ``handoff`` event, once) and answers the call with a TOOL result; the new agent answers
   in the same turn with its own instructions and tools.
5. A call to a custom tool (:meth:`Tool.custom`, seed 003) ends the run with the session
   ``idle`` and a ``tool.pending`` event listing the ids to answer. Regular tools called in
   the same reply run and their results are recorded as submitted (an error result keeps
   ``is_error`` in the TOOL message stored when the turn continues).
   :meth:`Runner.submit_tool_result` answers one id; once all are answered the turn
   continues, the results sent in call order.
6. A reply without tool calls completes the turn: ``turn.completed``, pruning, status
   ``idle`` — in one transaction.

Whether a reply finished is decided once, by the reply's verdict
(:attr:`~chatflow_cli.core.model.ModelTurn.verdict`); the Runner acts on it:

* ``truncated`` (``finish_reason`` ``length`` or ``content_filter``): the turn completes,
  its MODEL message and ``turn.completed`` carry the ``finish_reason``, and so does the
  :class:`RunResult` (``truncated`` is true).
* ``invalid_tool_call`` (arguments that are not a complete JSON object, or no function
  name): nothing runs and nothing is offered as pending; the turn fails
  (:class:`~chatflow_cli.core.errors.InvalidToolCallError`, exit 5).
* ``broken`` (no finish reason: the connection closed or timed out mid-reply, or the
  stream just ended): what arrived is kept as an interrupted turn, exactly as after
  Ctrl-C, and :class:`~chatflow_cli.core.errors.StreamBrokenError` (exit 6) is raised.
* A reply with neither text nor tool calls (empty, or reasoning only) completes the
  turn; its MODEL message keeps the reasoning but is left out of later requests
  (:attr:`~chatflow_cli.core.messages.Message.says_nothing`), since several providers
  refuse an empty assistant message.

More than ``max_tool_rounds`` replies with tool calls in one turn raise
:class:`~chatflow_cli.core.errors.MaxToolRoundsExceeded`; the turn is failed like any other
failure, so the session stays valid.

Failures (connection refused, timeouts, 401, 404, 400, invalid JSON in the stream): the turn is
marked failed and leaves the context window as it was before the turn; the user message
stays in the event log so the caller can retry it; the session returns to ``idle`` and the
chatflow error is raised. 429/5xx are retried by the model client (honouring
``Retry-After``); when retries run out the session becomes ``rescheduled`` with
``retry_at`` in the status event and :class:`~chatflow_cli.core.errors.RateLimitedError`
is raised.

Interrupts: Ctrl-C (``KeyboardInterrupt``; in the main thread the Runner turns the first
Ctrl-C into a cancel request so it never lands inside a database write — a second Ctrl-C
raises at once), a set ``cancel`` event, or the cancellation of the ``run_async`` task. A
cancel request wakes a streaming read at once and stops running tools from being waited
for (they finish in the background on daemon threads); a request whose server has not yet
sent response headers ends at the client's timeout (or at a second Ctrl-C). The partial model text is kept as a
MODEL message flagged ``interrupted``, every unanswered tool call gets a synthetic result
("interrupted, side effects unknown"), all persisted once with a ``turn.interrupted``
event; the session returns to ``idle`` and the next turn is valid. Then
:class:`~chatflow_cli.core.errors.RunInterrupted` is raised (``asyncio.CancelledError``
for a cancelled task, as asyncio expects).

No SQLite transaction is ever open across a network call: the Runner only calls store
methods, each one short transaction, between model requests.

Stream events (:class:`StreamEvent`): runtime ones — ``text.delta``, ``tool.call_started``,
``tool.call_finished``, ``result`` — and every event written to the session's log while the
run goes (``message.user``, ``message.model``, ``tool.result``, ``handoff``, ``status``,
``tool.pending``, ``turn.completed``, ``turn.failed``, ``turn.interrupted``…), each carrying
its log ``seq``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

from .agents import Agent, HandoffTool, reachable_agents
from .errors import (
    ChatflowError,
    ConfigError,
    InvalidToolCallError,
    MaxToolRoundsExceeded,
    ProviderResponseError,
    RateLimitedError,
    RunInterrupted,
    SessionBusyError,
    StreamBrokenError,
    UsageError,
)
from .events import Event, EventType, SessionStatus
from .memory import storable_text
from .messages import Message, Role, ToolCall, check_history
from ._stream import ModelTurn, ReplyState, TextDelta, Usage, cut_phrase
from .tools import Tool, ToolArgumentsError, to_json_text

__all__ = [
    "DEFAULT_WAIT_S",
    "INTERRUPTED_RESULT",
    "RUN_WORKERS",
    "RunResult",
    "Runner",
    "StreamEvent",
    "set_run_workers",
]

log = logging.getLogger(__name__)

#: How long a turn waits, by default, for a session other turns run or queue for (seconds).
DEFAULT_WAIT_S = 60.0

INTERRUPTED_RESULT = "Interrupted before a result: side effects unknown."


# --------------------------------------------------------------------------------------
# results and events
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
        pending_tool_calls: custom tool calls waiting for ``submit_tool_result`` (seed 003).
        events: the events this run wrote to the session's log, in ``seq`` order.
        replayed: the result came from the log (idempotency key seen before); no model call.
        finish_reason: why the final reply ended (``"stop"``; ``"length"`` or
            ``"content_filter"`` when it was cut: the turn is stored, marked with it);
            ``None`` when the run stopped for custom tools.
        reasoning: the final reply's reasoning text, when the server sent one.
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
            "usage": self.usage.to_dict(),
            "status": self.status.value,
            "pending_tool_calls": [c.to_dict() for c in self.pending_tool_calls],
            "replayed": self.replayed,
            "finish_reason": self.finish_reason,
            "reasoning": self.reasoning,
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


class _Cancelled(Exception):
    """Internal: the cancel event was set."""


class _Broken(Exception):
    """Internal: the model's reply stopped before it finished (``args[0]`` says why)."""


class _InvalidAfterTools(Exception):
    """Internal: a later round's reply has an invalid tool call after earlier rounds ran
    tools (``args``: the verdict's reason and finish reason)."""


class _CancelToken:
    """A cancel request: the caller's ``threading.Event`` plus the model stream to close at once.

    When the Runner owns the token (Ctrl-C in the main thread, a cancelled ``run_async``
    task), :meth:`set` closes the stream's socket itself. When the caller passed its own
    event, :meth:`watch` polls it every 50 ms during a request, so a server that has gone
    silent cannot hold a cancelled run until the read timeout.
    """

    __slots__ = ("event", "external", "stream", "reason")

    def __init__(self, event: threading.Event | None = None) -> None:
        self.external = event is not None
        self.event = event if event is not None else threading.Event()
        self.stream: Any = None
        self.reason = "cancelled"

    def is_set(self) -> bool:
        return self.event.is_set()

    def set(self) -> None:
        self.event.set()
        _cancel_stream(self.stream)

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)

    def watch(self, stream: Any) -> Callable[[], None]:
        """Cancel ``stream`` as soon as the token is set, until the returned ``stop()`` is called."""
        self.stream = stream
        if not self.external:
            def forget() -> None:
                self.stream = None

            return forget
        done = threading.Event()

        def watcher() -> None:
            while not done.is_set():
                if self.event.wait(0.05):
                    if not done.is_set():
                        _cancel_stream(stream)
                    return

        threading.Thread(target=watcher, name="chatflow-cancel-watch", daemon=True).start()

        def stop() -> None:
            done.set()
            self.stream = None

        return stop


def _cancel_stream(stream: Any) -> None:
    if stream is not None and hasattr(stream, "cancel"):
        try:
            stream.cancel()  # wakes a read blocked on a silent server
        except Exception as exc:  # noqa: BLE001 - best effort; the event alone stops it at the next chunk
            log.debug("closing the model stream on cancel failed: %s", exc)


# --------------------------------------------------------------------------------------
# the Runner
# --------------------------------------------------------------------------------------
class Runner:
    """Runs turns of sessions kept in ``session_store`` (issue 4, seed 000).

    Args:
        starting_agent: the agent of a new session; every agent reachable through handoffs
            is known to the Runner (names unique: ``AgentDefinitionError`` otherwise) and the
            Runner registers the store's agent resolver with them.
        session_store: a :class:`~chatflow_cli.core.memory.BaseSessionStore`.
        model_client: a :class:`~chatflow_cli.core.model.ModelClient`, or a callable making
            one; ``None`` makes ``ModelClient()`` on first use, which reads
            ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` like the ``openai`` package does.
        default_model: the model of agents whose ``model`` is ``None``.
        max_tool_rounds: replies with tool calls allowed in one turn (default 10).
        max_tokens, temperature: passed on each request when set.
    """

    def __init__(
        self,
        starting_agent: Agent,
        session_store: Any,
        *,
        model_client: Any = None,
        default_model: str | None = None,
        max_tool_rounds: int = 10,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> None:
        if isinstance(max_tool_rounds, bool) or not isinstance(max_tool_rounds, int) or max_tool_rounds < 0:
            raise ValueError(f"max_tool_rounds must be an int >= 0, got {max_tool_rounds!r}")
        self.starting_agent = starting_agent
        self.agents: dict[str, Agent] = reachable_agents(starting_agent)
        self.store = session_store
        self.default_model = default_model
        self.max_tool_rounds = max_tool_rounds
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._client = model_client if model_client is not None and hasattr(model_client, "stream") else None
        self._client_factory: Callable[[], Any] | None = model_client if self._client is None else None
        self._client_lock = threading.Lock()
        #: Called once when a run starts waiting (``wait`` > 0) for a session another process
        #: runs: ``{"session_id", "pid" (the running turn's process, or None), "wait_s"}``.
        #: Front-ends use it to say what a turn waits for; exceptions from it are ignored.
        self.on_wait: Callable[[dict[str, Any]], None] | None = None
        session_store.set_agent_resolver(self.agents.get)

    # -- public API -----------------------------------------------------------------------
    @property
    def session_store(self) -> Any:
        return self.store

    @property
    def model_client(self) -> Any:
        """The model client, made on first use (see the class docstring)."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    if self._client_factory is not None:
                        self._client = self._client_factory()
                    else:
                        from .model import ModelClient

                        self._client = ModelClient()
        return self._client

    @model_client.setter
    def model_client(self, client: Any) -> None:
        """Send the next turns through ``client`` (another endpoint); a turn running keeps its own."""
        self._client = client

    def run(
        self,
        session_id: str,
        user_message: str | Message,
        metadata: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        message_id: str | None = None,
        wait: float = DEFAULT_WAIT_S,
        max_turns: int | None = None,
        system: str | None = None,
        cancel: threading.Event | None = None,
    ) -> RunResult:
        """Run one turn and return its :class:`RunResult`.

        ``metadata`` is merged into the session's metadata; ``max_turns`` and ``system`` (a
        system message) apply when the session is created; ``cancel``, when set from another
        thread, interrupts the run.

        ``wait``: while another run owns the session, this turn waits its turn -- turns that
        wait start in arrival order, across processes -- for at most ``wait`` seconds
        (default ``DEFAULT_WAIT_S``, 60), then raises :class:`SessionBusyError`; ``wait=0``
        refuses a busy session at once.

        ``message_id``: an inbound message id (a webhook delivery's id) to process once:
        claimed in the same transaction that starts the turn, processed when the turn
        completes, free again when it fails (so a redelivery runs it). A processed id
        returns the first turn's result with ``replayed=True`` and calls no model; an id
        another live process is running waits for that turn's result. Without
        ``message_id``, a claim made in this thread or task with
        ``store.claim_message`` / ``store.mark_message_processed`` is used the same way.

        Raises the chatflow errors of the module docstring; :class:`RunInterrupted` after an
        interrupt (the turn was stored as interrupted).
        """
        return _drain(self.run_streamed(session_id, user_message, metadata, idempotency_key=idempotency_key,
                                        message_id=message_id, wait=wait, max_turns=max_turns, system=system,
                                        cancel=cancel))

    def run_streamed(
        self,
        session_id: str,
        user_message: str | Message,
        metadata: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        message_id: str | None = None,
        wait: float = DEFAULT_WAIT_S,
        max_turns: int | None = None,
        system: str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[StreamEvent]:
        """Like :meth:`run`, yielding :class:`StreamEvent` s as they happen; the last is ``result``.

        Closing the iterator early (``break``) interrupts the turn like Ctrl-C would, without
        raising.
        """
        message = user_message if isinstance(user_message, Message) else Message.user(str(user_message))
        if message.role is not Role.USER:
            raise ValueError("user_message must be a USER message")
        return self._guarded(
            session_id,
            {"user_message": message, "metadata": metadata, "idempotency_key": idempotency_key,
             "max_turns": max_turns, "system": system, **self._message_claim(message_id)},
            wait=wait,
            cancel=cancel,
            loop=None,
        )

    async def run_async(
        self,
        session_id: str,
        user_message: str | Message,
        metadata: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        message_id: str | None = None,
        wait: float = DEFAULT_WAIT_S,
        max_turns: int | None = None,
        system: str | None = None,
    ) -> RunResult:
        """Async twin of :meth:`run` (seed 000's webhook example).

        The turn runs on a thread of a shared pool of ``RUN_WORKERS`` (16) threads (the
        event loop never blocks on the network or the database; more concurrent runs queue
        for a thread, in order; see :func:`set_run_workers`); async tools run on the
        caller's loop. Cancelling the task interrupts
        the turn: it is stored as interrupted before ``CancelledError`` propagates.
        """
        result: RunResult | None = None
        async for event in self.run_streamed_async(
            session_id, user_message, metadata, idempotency_key=idempotency_key, message_id=message_id, wait=wait,
            max_turns=max_turns, system=system,
        ):
            if event.result is not None:
                result = event.result
        assert result is not None
        return result

    async def run_streamed_async(
        self,
        session_id: str,
        user_message: str | Message,
        metadata: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        message_id: str | None = None,
        wait: float = DEFAULT_WAIT_S,
        max_turns: int | None = None,
        system: str | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Async twin of :meth:`run_streamed`."""
        message = user_message if isinstance(user_message, Message) else Message.user(str(user_message))
        kwargs = {"user_message": message, "metadata": metadata, "idempotency_key": idempotency_key,
                  "max_turns": max_turns, "system": system, **self._message_claim(message_id)}
        async for event in self._in_thread(session_id, kwargs, wait=wait):
            yield event

    def _message_claim(self, message_id: str | None) -> dict[str, Any]:
        """begin_turn's message arguments: ``message_id``, or the claim this context made last."""
        if message_id is not None:
            return {"message_id": message_id}
        from .memory import take_context_claim

        claim = take_context_claim(self.store)
        return {} if claim is None else {"message_id": claim[0], "message_claim": claim[1]}

    def submit_tool_result(
        self, session_id: str, tool_use_id: str, output: Any, *, wait: float = DEFAULT_WAIT_S,
        cancel: threading.Event | None = None,
    ) -> RunResult | None:
        """Answer one pending custom tool call (seed 003) and, once all are answered, continue the turn.

        ``output`` is text (anything else is JSON-encoded). Returns ``None`` while other ids
        are still pending, else the :class:`RunResult` of the continued turn. An unknown id or
        a second answer for one raises :class:`~chatflow_cli.core.errors.ToolResultError` and
        writes nothing.
        """
        remaining = self.store.submit_tool_result(session_id, tool_use_id, _output_text(output))
        if remaining:
            return None
        return _drain(self.continue_streamed(session_id, wait=wait, cancel=cancel))

    async def asubmit_tool_result(self, session_id: str, tool_use_id: str, output: Any, *,
                                  wait: float = DEFAULT_WAIT_S) -> RunResult | None:
        """Async twin of :meth:`submit_tool_result`."""
        remaining = await asyncio.to_thread(self.store.submit_tool_result, session_id, tool_use_id,
                                            _output_text(output))
        if remaining:
            return None
        result: RunResult | None = None
        async for event in self._in_thread(session_id, {"user_message": None}, wait=wait):
            if event.result is not None:
                result = event.result
        return result

    def continue_streamed(
        self, session_id: str, *, wait: float = DEFAULT_WAIT_S, cancel: threading.Event | None = None
    ) -> Iterator[StreamEvent]:
        """Continue a turn whose custom tool calls are all answered, streaming its events."""
        return self._guarded(session_id, {"user_message": None}, wait=wait, cancel=cancel, loop=None)

    def close(self) -> None:
        """Close the model client's connections (it reconnects if used again)."""
        client = self._client
        if client is not None and hasattr(client, "close"):
            client.close()

    # -- driving a run from sync and async callers ------------------------------------------
    def _guarded(
        self,
        session_id: str,
        start: dict[str, Any],
        *,
        wait: float,
        cancel: threading.Event | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> Iterator[StreamEvent]:
        """The turn generator, with Ctrl-C turned into a cancel request while it runs in the main thread."""
        token = _CancelToken(cancel)
        previous = None
        if threading.current_thread() is threading.main_thread():
            try:
                if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                    def on_sigint(signum: int, frame: Any) -> None:
                        if token.is_set():  # a second Ctrl-C: stop right now
                            raise KeyboardInterrupt
                        token.set()

                    previous = signal.signal(signal.SIGINT, on_sigint)
            except ValueError:  # not the main interpreter's main thread after all
                previous = None
        try:
            yield from self._turn(session_id, start, wait=wait, cancel=token, loop=loop)
        finally:
            if previous is not None:
                try:
                    signal.signal(signal.SIGINT, previous)
                except ValueError:
                    pass

    async def _in_thread(self, session_id: str, start: dict[str, Any], *, wait: float) -> AsyncIterator[StreamEvent]:
        """Run the turn generator in a worker thread, handing its events to the event loop."""
        loop = asyncio.get_running_loop()
        cancel = _CancelToken()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        done = threading.Event()

        def put(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
            except RuntimeError:  # the loop is closed: nobody listens any more
                pass

        def work() -> None:
            try:
                for event in self._turn(session_id, start, wait=wait, cancel=cancel, loop=loop):
                    put("event", event)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                put("error", exc)
            else:
                put("end", None)
            finally:
                done.set()

        _RUN_POOL.submit(work)
        try:
            while True:
                kind, value = await queue.get()
                if kind == "event":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            # interrupt the turn and let the worker store it as interrupted before we go
            cancel.set()
            await _wait_thread(done)
            raise
        finally:
            cancel.set()  # an early exit of the consumer interrupts a turn still going

    # -- the turn ----------------------------------------------------------------------------
    def _begin(self, session_id: str, start: dict[str, Any], wait: float, cancel: _CancelToken) -> Any:
        """``store.begin_turn``, waiting up to ``wait`` seconds while the session is busy.

        The first busy attempt takes a ticket in the store's queue for the session, so
        waiting turns start in the order they reached the store (in this process and in
        others). Waiters of this process wake when a turn of the store object ends; others
        poll with a read (20 ms, doubling to 100 ms) and try again once the turn may start.
        A replayed idempotency key whose first turn is still running, and a message id
        another live holder is running, count as busy too: the wait then ends with that
        turn's result. Giving up (time out, interrupt, error) leaves the queue.
        """
        from .memory import Owner

        deadline = time.monotonic() + max(0.0, float(wait))
        delay = 0.02
        ticket: int | None = None
        begun: Any = None
        announced = False
        try:
            while True:
                try:
                    begun = self.store.begin_turn(
                        session_id,
                        default_agent=self.starting_agent,
                        owner=Owner.current(),
                        ticket=ticket,
                        enqueue=wait > 0 and ticket is None,
                        **start,
                    )
                    if begun.queued is not None:
                        ticket = begun.queued
                        begun = None
                        raise SessionBusyError(
                            f"session {session_id!r} is busy: other turns run or wait for it (waited {wait:g} s)",
                            session_id=session_id, pid=_running_pid(self.store, session_id))
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
                    hook = self.on_wait
                    if hook is not None and wait > 0 and not announced:  # once, when the wait starts
                        announced = True
                        try:
                            hook({"session_id": session_id, "pid": getattr(exc, "pid", None), "wait_s": float(wait)})
                        except Exception:  # noqa: BLE001 - a display problem never breaks the turn
                            log.debug("on_wait failed", exc_info=True)
                    while True:  # poll with reads until the turn may start, then try again
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise
                        _wait_for_turn_end(self.store, min(delay, remaining))
                        if cancel.is_set():
                            raise RunInterrupted("interrupted while waiting for a busy session",
                                                 session_id=session_id) from None
                        delay = min(delay * 2, 0.1)
                        if _may_start(self.store, session_id, ticket):
                            break
        finally:
            if ticket is not None and begun is None:
                try:
                    self.store.leave_turn_queue(session_id, ticket)
                except Exception as exc:  # noqa: BLE001 - a dead waiter's ticket is skipped anyway
                    log.warning("could not leave the queue of session %s: %s", session_id, exc)
            claim = start.get("message_claim")
            if begun is None and claim is not None and hasattr(self.store, "_release_held"):
                # the turn never started: the message was not processed, its redelivery must run
                try:
                    self.store._release_held(start["message_id"], claim)
                except Exception as exc:  # noqa: BLE001 - the run's own error is raised instead
                    log.warning("could not release the claim of message %s: %s", start["message_id"], exc)

    def _replayed(self, session_id: str, begun: Any, written: tuple[Event, ...]) -> RunResult:
        """The :class:`RunResult` of a turn started earlier with the same idempotency key.

        Outcomes (``begin_turn``'s ``replayed["outcome"]``): ``completed`` gives the first
        result; ``pending`` (custom tool calls wait) gives an idle result listing them.
        A first attempt that gave no result (``failed``, rescheduled, ``interrupted``,
        ``rolled_back``) is no replay: ``begin_turn`` runs the turn again under the same key.
        Any other outcome raises :class:`UsageError` (defensive; not reached today).
        """
        replay = begun.replayed
        turn = int(replay.get("turn", begun.turn) or begun.turn)
        outcome = replay.get("outcome", "completed")
        session = begun.session
        if outcome == "completed":
            return RunResult(
                content=replay.get("content"),
                agent=str(replay.get("agent") or _name(session.active_agent)),
                session_id=session_id,
                turn=turn,
                usage=Usage.from_dict(replay.get("usage")) or Usage(),
                status=session.status,
                events=written,
                replayed=True,
                finish_reason=replay.get("finish_reason"),
            )
        if outcome == "pending":
            return RunResult(None, _name(session.active_agent), session_id, turn, Usage(), session.status,
                             pending_tool_calls=tuple(session.pending_tool_calls), events=written, replayed=True)
        raise UsageError(
            f"turn {turn} of session {session_id}, sent with this idempotency key, was {outcome.replace('_', ' ')}; "
            "nothing was run again (send the message with a new key to retry it)",
            session_id=session_id,
        )

    def _turn(
        self,
        session_id: str,
        start: dict[str, Any],
        *,
        wait: float,
        cancel: _CancelToken,
        loop: asyncio.AbstractEventLoop | None,
    ) -> Iterator[StreamEvent]:
        written: list[Event] = []

        def stored(events: list[Event], turn: int | None) -> Iterator[StreamEvent]:
            for event in events:
                written.append(event)
                yield StreamEvent(event.type, session_id, event.payload, turn=event.payload.get("turn", turn),
                                  seq=event.seq)

        begun = self._begin(session_id, start, wait, cancel)
        turn: int = begun.turn
        if begun.replayed is not None:
            yield from stored(list(begun.events), turn)
            result = self._replayed(session_id, begun, tuple(written))
            yield StreamEvent("result", session_id, turn=result.turn, result=result)
            return

        session = begun.session
        state = _TurnState(agent=session.active_agent, start_agent=session.active_agent)
        unwatch = _watch_interrupt_requests(self.store, session_id, getattr(session, "_lease", None), cancel)
        try:
            try:
                yield from stored(list(begun.events), turn)
                result = yield from self._loop(session, turn, state, cancel, loop, stored)
            except Exception as exc:
                if cancel.is_set() and not isinstance(exc, _Cancelled) and not state.released:
                    # cancelled while a request was still connecting: its error is the cancel's echo
                    raise _Cancelled() from exc
                raise
        except _Broken as exc:
            if state.released:  # pragma: no cover - raised before anything is released
                raise
            events = self._interrupt(session, turn, state, reason="broken stream")
            yield from stored(events, turn)
            raise StreamBrokenError(f"{exc.args[0]}; what arrived is kept as interrupted turn {turn}",
                                    session_id=session_id) from None
        except _InvalidAfterTools as exc:
            if state.released:  # pragma: no cover - raised before anything is released
                raise
            ran = ", ".join(dict.fromkeys(state.ran))
            events = self._interrupt(session, turn, state, reason="invalid tool call")
            yield from stored(events, turn)
            hint = "; or raise the token limit" if exc.args[1] == "length" else ""
            raise InvalidToolCallError(
                f"the model's reply cannot be used: {exc.args[0]}; it did not run, but earlier rounds ran {ran}: "
                f"turn {turn} is kept as interrupted up to its last complete round (send a message to go on{hint})",
                session_id=session_id) from None
        except (KeyboardInterrupt, _Cancelled, GeneratorExit, asyncio.CancelledError) as exc:
            closing = isinstance(exc, GeneratorExit)
            if state.released:  # the turn was already stored as finished; only the consumer left
                raise
            events = self._interrupt(session, turn, state, reason=cancel.reason if isinstance(exc, _Cancelled)
                                     or closing else "interrupted")
            if closing:  # the consumer went away: nothing more may be yielded
                written.extend(events)
                raise
            yield from stored(events, turn)
            asked = " at another process's request" if cancel.reason == _REQUESTED else ""
            raise RunInterrupted(f"turn {turn} was interrupted{asked}; the session is ready for the next message",
                                 session_id=session_id) from (None if isinstance(exc, _Cancelled) else exc)
        except BaseException as exc:
            if state.released:
                raise
            if getattr(exc, "keeps_partial_reply", False) and state.partial:
                # the model server died mid-reply: what it said stays, as an interrupted turn
                events = self._interrupt(session, turn, state, reason=f"interrupted: {type(exc).__name__}")
            else:
                events = self._fail(session, turn, state, exc)
            yield from stored(events, turn)
            if isinstance(exc, ChatflowError) and exc.session_id is None:
                exc.session_id = session_id
            raise
        finally:
            unwatch()
        yield StreamEvent("result", session_id, turn=turn,
                          result=dataclasses.replace(result, events=tuple(written)))

    def _loop(
        self,
        session: Any,
        turn: int,
        state: _TurnState,
        cancel: _CancelToken,
        loop: asyncio.AbstractEventLoop | None,
        stored: Callable[[list[Event], int | None], Iterator[StreamEvent]],
    ) -> Generator[StreamEvent, None, RunResult]:
        session_id = session.session_id
        client = self.model_client
        requests = 0
        while True:
            if cancel.is_set():
                raise _Cancelled()
            agent: Agent = state.agent
            tools = agent.all_tools()
            history = session.history
            if agent.instructions:
                outgoing = [Message.system(agent.instructions), *history]
            else:
                outgoing = list(history)
            check_history(outgoing, session_id=session_id)
            wire = [state.wire(m) for m in outgoing if not m.says_nothing]
            model = agent.model or self.default_model
            if not model:
                raise ConfigError(f"no model for agent {agent.name!r}: set Agent(model=...) or "
                                  "Runner(default_model=...)", session_id=session_id)
            tool_choice = agent.tool_choice if requests == 0 and tools else None
            if isinstance(tool_choice, str) and tool_choice in tools:
                tool_choice = {"type": "function", "function": {"name": tool_choice}}
            requests += 1
            reply = None
            state.partial = []
            stream = client.stream(model, wire, [t.to_wire() for t in tools.values()] or None,
                                   tool_choice=tool_choice, max_tokens=self.max_tokens,
                                   temperature=self.temperature, cancel=cancel.event)
            unwatch = cancel.watch(stream)
            try:
                for item in stream:
                    if isinstance(item, TextDelta):
                        delta = storable_text(item.text)
                        state.partial.append(delta)
                        yield StreamEvent("text.delta", session_id, {"text": delta, "agent": agent.name},
                                          turn=turn)
                    elif isinstance(item, ModelTurn):
                        reply = item
                    if cancel.is_set():
                        raise _Cancelled()
            finally:
                unwatch()
                close = getattr(stream, "close", None)
                if close is not None and reply is None:
                    close()
            if reply is None:
                raise ProviderResponseError("the model's stream ended without a reply", session_id=session_id)
            if reply.usage is not None:
                state.usage = state.usage + reply.usage
            verdict = reply.verdict
            if verdict.state is ReplyState.INTERRUPTED:
                raise _Cancelled()
            if verdict.state is ReplyState.BROKEN:
                state.reasoning = storable_text(reply.reasoning) if reply.reasoning else None
                raise _Broken(verdict.reason)  # the partial text in state.partial is kept
            if verdict.state is ReplyState.INVALID_TOOL_CALL:
                if state.ran:  # earlier rounds ran tools: keep them, up to the last complete round
                    raise _InvalidAfterTools(verdict.reason, verdict.finish_reason)
                hint = "send the message again, or raise the token limit" if verdict.finish_reason == "length" \
                    else "send the message again"
                raise InvalidToolCallError(
                    f"the model's reply cannot be used: {verdict.reason}; nothing ran and turn {turn} was not kept "
                    f"({hint})", session_id=session_id)
            calls = self._fresh_ids(session, list(reply.tool_calls or ()))
            content = storable_text(reply.content) if reply.content else reply.content
            reasoning = storable_text(reply.reasoning) if reply.reasoning else None
            state.partial = []
            if not calls:
                text = content or ""
                cut = verdict.finish_reason if verdict.truncated else None
                session.add_message(Message.model(text, agent=agent.name, reasoning=reasoning, finish_reason=cut))
                session.complete_turn(text, agent, state.usage.to_dict(), finish_reason=verdict.finish_reason)
                session.set_status(SessionStatus.IDLE, reason="turn completed")
                events = self.store.save(session)
                state.released = True
                yield from stored(events, turn)
                return RunResult(text, agent.name, session_id, turn, state.usage, SessionStatus.IDLE,
                                 finish_reason=verdict.finish_reason, reasoning=reasoning)

            state.rounds += 1
            if state.rounds > self.max_tool_rounds:
                raise MaxToolRoundsExceeded(
                    f"the model kept calling tools past max_tool_rounds={self.max_tool_rounds} in turn {turn}; "
                    "the turn was dropped from the context window",
                    session_id=session_id,
                )
            session.add_message(Message.model(content or None, calls, agent=agent.name, reasoning=reasoning))
            yield from stored(self.store.save(session), turn)

            custom = [c for c in calls if c.name in tools and tools[c.name].is_custom]
            outcomes = yield from self._run_tools(session_id, turn, agent, tools, calls, cancel, loop, state)
            state.ran.extend(c.name for c in calls if c.id in outcomes)
            if custom:
                # seed 003: stop here; regular results wait with the custom ones, sent in call order
                for call in calls:
                    if call.id in outcomes:
                        self._record_submitted(session, turn, call, *outcomes[call.id])
                session.record_event(EventType.TOOL_PENDING, {"turn": turn, "tool_use_ids": [c.id for c in custom],
                                                               "tools": [c.to_dict() for c in custom]})
                session.set_status(SessionStatus.IDLE, reason="waiting for custom tool results")
                events = self.store.save(session)
                state.released = True
                yield from stored(events, turn)
                return RunResult(None, agent.name, session_id, turn, state.usage, SessionStatus.IDLE,
                                 pending_tool_calls=tuple(custom))
            handoff_to: Agent | None = None
            for call in calls:
                text, is_error = outcomes[call.id]
                session.add_message(Message.tool(call.id, text, name=call.name, is_error=is_error))
                target = state.handoffs.get(call.id)
                if target is not None and handoff_to is None:
                    handoff_to = target
                    session.set_active_agent(target, tool_call_id=call.id)
            if handoff_to is not None:
                state.agent = handoff_to
            yield from stored(self.store.save(session), turn)

    def _record_submitted(self, session: Any, turn: int, call: ToolCall, output: str, is_error: bool) -> None:
        """A regular call's result waiting beside custom ones; an error result carries
        ``"is_error": true`` so the TOOL message stored when the turn continues is flagged."""
        payload: dict[str, Any] = {"turn": turn, "tool_use_id": call.id, "output": output}
        if is_error:
            payload["is_error"] = True
        session.record_event(EventType.TOOL_RESULT_SUBMITTED, payload)

    @staticmethod
    def _fresh_ids(session: Any, calls: list[ToolCall]) -> list[ToolCall]:
        """Give every call an id unique in the session (local servers reuse ``call_0``; some send none)."""
        if not calls:
            return calls
        used = {c.id for m in session.history if m.role is Role.MODEL for c in m.tool_calls}
        fixed: list[ToolCall] = []
        for call in calls:
            call_id = storable_text(call.id or "")
            if not call_id or call_id in used:
                call_id = f"call_{uuid.uuid4().hex[:24]}"
            used.add(call_id)
            name, arguments = storable_text(call.name), storable_text(call.arguments)
            same = call_id == call.id and name == call.name and arguments == call.arguments
            fixed.append(call if same else ToolCall(call_id, name, arguments))
        return fixed

    # -- tools -------------------------------------------------------------------------------
    def _run_tools(
        self,
        session_id: str,
        turn: int,
        agent: Agent,
        tools: dict[str, Tool],
        calls: list[ToolCall],
        cancel: _CancelToken,
        loop: asyncio.AbstractEventLoop | None,
        state: _TurnState,
    ) -> Generator[StreamEvent, None, dict[str, tuple[str, bool]]]:
        """Run the regular and handoff calls; returns ``{call id: (text, is_error)}`` (custom calls left out)."""
        outcomes: dict[str, tuple[str, bool]] = {}
        runnable: list[tuple[ToolCall, Tool]] = []
        for call in calls:
            found = tools.get(call.name)
            if found is not None and found.is_custom:
                continue
            yield StreamEvent("tool.call_started", session_id,
                              {"id": call.id, "name": call.name, "arguments": call.arguments, "agent": agent.name},
                              turn=turn)
            if found is None:
                known = ", ".join(sorted(tools)) or "none"
                outcomes[call.id] = (f"Error: unknown tool {call.name!r}. Available tools: {known}.", True)
            elif isinstance(found, HandoffTool):
                if any(isinstance(tools.get(c.name), HandoffTool) for c in calls[: calls.index(call)]):
                    outcomes[call.id] = ("Error: only the first handoff of a reply is followed.", True)
                else:
                    state.handoffs[call.id] = found.target
                    outcomes[call.id] = (f"Transferred to {found.target.name}. {found.target.name} answers now.",
                                         False)
            else:
                runnable.append((call, found))
        timings: dict[str, float] = {}
        if runnable:
            # always on a thread, even one call: the waiting side stays responsive to a cancel request
            yield from self._run_parallel(runnable, outcomes, timings, cancel, loop, state)
        for call in calls:
            if call.id in outcomes:
                text, is_error = outcomes[call.id]
                yield StreamEvent("tool.call_finished", session_id,
                                  {"id": call.id, "name": call.name, "output": text, "is_error": is_error,
                                   "duration_ms": round(timings.get(call.id, 0.0) * 1000, 3)}, turn=turn)
        return outcomes

    def _run_parallel(
        self,
        runnable: list[tuple[ToolCall, Tool]],
        outcomes: dict[str, tuple[str, bool]],
        timings: dict[str, float],
        cancel: _CancelToken,
        loop: asyncio.AbstractEventLoop | None,
        state: _TurnState,
    ) -> Iterator[StreamEvent]:
        """Run the calls concurrently, each on its own daemon thread, and wait for all.

        Daemon threads, not a pool: a tool abandoned by an interrupt keeps running in the
        background but never holds up the process's exit. The wait wakes every 50 ms to
        notice a cancel request.
        """
        futures: list[tuple[ToolCall, concurrent.futures.Future[tuple[str, bool, float]]]] = []
        for call, found in runnable:
            future: concurrent.futures.Future[tuple[str, bool, float]] = concurrent.futures.Future()
            thread = threading.Thread(target=_run_into, args=(future, found, call, loop),
                                      name=f"chatflow-tool-{call.name}"[:40], daemon=True)
            thread.start()
            futures.append((call, future))
        pending = {f for _, f in futures}
        by_future = {f: c for c, f in futures}
        try:
            while pending:
                done, pending = concurrent.futures.wait(pending, timeout=0.05,
                                                        return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    text, is_error, took = future.result()
                    call = by_future[future]
                    outcomes[call.id] = (text, is_error)
                    timings[call.id] = took
                if pending and cancel.is_set():
                    raise _Cancelled()
        except BaseException:
            # results that did come in are kept; the others get synthetic results
            state.finished = dict(outcomes)
            raise
        if False:  # pragma: no cover - makes this a generator for `yield from`
            yield
        return None

    # -- endings -----------------------------------------------------------------------------
    def _interrupt(self, session: Any, turn: int, state: _TurnState, reason: str) -> list[Event]:
        """Store the interrupted turn once: partial text, finished results, synthetic ones; then idle."""
        partial = "".join(state.partial) or None
        try:
            pending = {c.id: c for c in session.pending_tool_calls}
            for call_id, (text, is_error) in state.finished.items():
                if call_id in pending:
                    session.add_message(Message.tool(call_id, text, name=pending[call_id].name, is_error=is_error))
            session.interrupt_turn(reason=reason, partial_text=partial, agent=state.agent,
                                   partial_reasoning=state.reasoning)
            session.set_status(SessionStatus.IDLE, reason=reason)
            return list(self.store.save(session))
        except BaseException as exc:  # noqa: BLE001 - the in-memory session may be half-written
            log.warning("storing the interrupted turn from memory failed (%s); retrying from the store", exc)
            return self._close_from_store(session.session_id, lambda s: s.interrupt_turn(
                reason=reason, partial_text=partial, agent=state.agent, partial_reasoning=state.reasoning), reason)

    def _fail(self, session: Any, turn: int, state: _TurnState, exc: BaseException) -> list[Event]:
        """Store a failed turn: out of the window, ``turn.failed``, then idle or rescheduled."""
        if isinstance(exc, RateLimitedError):
            status, extra = SessionStatus.RESCHEDULED, {"retry_at": exc.retry_at}
        else:
            status, extra = SessionStatus.IDLE, {}
        reason = f"turn failed: {type(exc).__name__}"
        try:
            session.fail_turn(exc, agent=state.start_agent)  # also undoes a handoff made in the turn
            session.set_status(status, reason=reason, **extra)
            return list(self.store.save(session))
        except BaseException as second:  # noqa: BLE001
            log.warning("storing the failed turn from memory failed (%s); retrying from the store", second)

            def close(s: Any) -> None:
                s.fail_turn(exc, agent=state.start_agent)

            return self._close_from_store(session.session_id, close, reason, status=status, **extra)

    def _close_from_store(self, session_id: str, action: Callable[[Any], None], reason: str, *,
                          status: SessionStatus = SessionStatus.IDLE, **extra: Any) -> list[Event]:
        try:
            fresh = self.store.get(session_id)
            if fresh is None:
                return []
            try:
                action(fresh)
            except Exception as exc:  # noqa: BLE001
                log.warning("could not close turn of %s: %s", session_id, exc)
            fresh.set_status(status, reason=reason, **extra)
            return list(self.store.save(fresh))
        except Exception as exc:  # noqa: BLE001 - the owner record lets a later run recover it
            log.error("could not release session %s: %s", session_id, exc)
            return []


@dataclasses.dataclass
class _TurnState:
    agent: Agent
    start_agent: Any = None  # the active agent when the turn began (restored if the turn fails)
    usage: Usage = dataclasses.field(default_factory=Usage)
    rounds: int = 0
    ran: list[str] = dataclasses.field(default_factory=list)  # names of the tools run in this turn, in order
    partial: list[str] = dataclasses.field(default_factory=list)
    reasoning: str | None = None  # the reasoning of a reply that broke off (kept with the interrupted turn)
    handoffs: dict[str, Agent] = dataclasses.field(default_factory=dict)
    finished: dict[str, tuple[str, bool]] = dataclasses.field(default_factory=dict)
    released: bool = False  # the turn's end (idle) is stored: nothing left to undo
    # Chat Completions form of each message sent in this turn, by identity (messages are
    # immutable; the tuple keeps the message alive so its id is not reused)
    _wire: dict[int, tuple[Message, dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def wire(self, message: Message) -> dict[str, Any]:
        """``message.to_wire()``, computed once per turn."""
        cached = self._wire.get(id(message))
        if cached is not None and cached[0] is message:
            return cached[1]
        data = message.to_wire()
        self._wire[id(message)] = (message, data)
        return data


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _name(agent: Any) -> str:
    return str(getattr(agent, "name", agent) or "")


def _output_text(output: Any) -> str:
    """A submitted custom-tool result as text: as a tool's return value (:func:`to_json_text`)."""
    return storable_text(to_json_text(output))


def _invoke(found: Tool, call: ToolCall, loop: asyncio.AbstractEventLoop | None) -> tuple[str, bool]:
    """Run one tool call; errors become text the model sees (``is_error`` True). The text is
    made storable (:func:`~chatflow_cli.core.memory.storable_text`: lone surrogates escaped)."""
    try:
        return storable_text(found.invoke(call.arguments, loop=loop)), False
    except ToolArgumentsError as exc:
        return storable_text(f"Error: invalid arguments for {call.name}: {exc}"), True
    except Exception as exc:  # noqa: BLE001 - the model sees the error and the turn goes on
        log.info("tool %s raised %s: %s", call.name, type(exc).__name__, exc)
        return storable_text(f"Error: {call.name} raised {type(exc).__name__}: {exc}"), True


def _run_into(future: concurrent.futures.Future[tuple[str, bool, float]], found: Tool, call: ToolCall,
              loop: asyncio.AbstractEventLoop | None) -> None:
    if not future.set_running_or_notify_cancel():
        return
    began = time.perf_counter()
    try:
        text, is_error = _invoke(found, call, loop)
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt/SystemExit raised by a tool
        future.set_exception(exc)
    else:
        future.set_result((text, is_error, time.perf_counter() - began))


def _drain(events: Iterator[StreamEvent]) -> RunResult:
    result: RunResult | None = None
    for event in events:
        if event.result is not None:
            result = event.result
    assert result is not None, "a run ends with a result event or an error"
    return result


#: Seconds between two looks, while a turn runs, at whether another process asked it to stop
#: (``store.request_interrupt``; ``chatflow sessions interrupt``).
INTERRUPT_POLL_S = 0.25
_REQUESTED = "interrupt requested"


def _watch_interrupt_requests(store: Any, session_id: str, lease: str | None,
                              cancel: _CancelToken) -> Callable[[], None]:
    """Poll ``store.interrupt_requested`` every :data:`INTERRUPT_POLL_S` while the turn runs;
    a request sets ``cancel`` (the turn stops at its next chunk or tool boundary). Returns
    the function that stops watching."""
    look = getattr(store, "interrupt_requested", None)
    if look is None or lease is None:
        return lambda: None
    done = threading.Event()

    def watch() -> None:
        while not done.wait(INTERRUPT_POLL_S):
            try:
                asked = look(session_id, lease)
            except Exception as exc:  # noqa: BLE001 - the turn's own writes report a store that fails
                log.debug("could not look for an interrupt request: %s", exc)
                continue
            if asked and not done.is_set():
                cancel.reason = _REQUESTED
                cancel.set()
                return

    threading.Thread(target=watch, name="chatflow-interrupt-watch", daemon=True).start()
    return done.set


def _may_start(store: Any, session_id: str, ticket: int | None) -> bool:
    check = getattr(store, "turn_may_start", None)
    return True if check is None else bool(check(session_id, ticket))


def _running_pid(store: Any, session_id: str) -> int | None:
    """The pid of the process running ``session_id``'s turn, when the store can say (a cheap read)."""
    look = getattr(store, "running_turn_pid", None)
    try:
        return None if look is None else look(session_id)
    except Exception:  # noqa: BLE001 - only the waiting message loses the pid
        return None


def _wait_for_turn_end(store: Any, timeout: float) -> None:
    """Sleep ``timeout`` seconds, or less when a turn of ``store`` ends in this process."""
    wait = getattr(store, "wait_turn_ended", None)
    if wait is None:
        time.sleep(timeout)
    else:
        wait(timeout)


class _RunPool:
    """A shared pool of at most ``size`` daemon threads running ``run_async`` turns.

    Threads start on demand and stay for later runs; work beyond ``size`` concurrent runs
    waits in a FIFO queue. Daemon threads, like the tool threads: a run still going never
    holds up the process's exit.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.threads = 0
        self._outstanding = 0  # jobs queued or running

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._outstanding += 1
            start = self.threads < self.size and self._outstanding > self.threads
            if start:
                self.threads += 1
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._serve, name="chatflow-run", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException:  # noqa: BLE001 - a job reports its own errors
                log.exception("a run_async job failed")
            finally:
                with self._lock:
                    self._outstanding -= 1


#: Threads of the shared pool that runs ``run_async`` turns (each blocks on the model's
#: network reply and short store transactions; the event loop never does). More busy
#: threads make the event loop wait longer for the GIL: 200 concurrent runs with a model
#: that answers at once stall the loop about 0.2 s with 32 threads, about 1 s with one
#: thread per run (tests/benchmarks/bench_webhook.py). Change it with set_run_workers().
RUN_WORKERS = 16
_RUN_POOL = _RunPool(RUN_WORKERS)


def set_run_workers(count: int) -> None:
    """Bound the shared ``run_async`` pool at ``count`` threads (>= 1); threads already
    started stay. Runs beyond the bound wait for a thread, in order."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an int >= 1, got {count!r}")
    _RUN_POOL.size = count

#: Longest a cancelled ``run_async`` task waits for its worker to store the interrupted turn.
#: Only a request still connecting (no response headers yet) can take that long; the
#: worker then stores the interruption by itself when the request gives up.
CANCEL_GRACE_S = 10.0


async def _wait_thread(done: threading.Event) -> None:
    deadline = time.monotonic() + CANCEL_GRACE_S
    while not done.is_set() and time.monotonic() < deadline:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:  # keep waiting: the turn must be stored first
            continue
