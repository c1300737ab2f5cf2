"""The Runner: runs one turn of a session against an OpenAI-compatible server.

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

Agent versions: every MODEL message carries the version of the agent that gave it
(:attr:`Agent.version <chatflow_cli.core.agents.Agent.version>`), and ``turn.completed`` the
answering agent's. When an agent starts in a turn (the active agent at the turn's start, a
handoff's target) as another version than the one it last ran in the session, an
``agent.changed`` event ``{"turn", "agent", "version", "previous_version", "since_turn"}``
is stored and streamed before the agent's request (:meth:`SessionContext.note_agent_version
<chatflow_cli.core.memory.SessionContext.note_agent_version>`): once per change, since the
store records the new version with it.
5. A call to a custom tool (:meth:`Tool.custom`) ends the run with the session
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
import dataclasses
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, cast

from ._run import cancel as _cancel
from ._run.cancel import (
    INTERRUPT_REQUESTED,
    RUN_WORKERS,
    Cancelled,
    CancelToken,
    ctrl_c_cancels,
    events_from_worker,
    watch_interrupt_requests,
)
from ._run.endings import lease_of, store_failed, store_interrupted
from ._run.state import Broken, InvalidAfterTools, TurnState
from ._run.tools import answer_at_once, output_text, run_concurrently
from ._run.waiting import begin_turn, end_lease, release_claim
from ._stream import ModelTurn, ReplyState, TextDelta, Usage, cut_phrase
from .agents import Agent, reachable_agents
from .errors import (
    ChatflowError,
    ConfigError,
    InvalidToolCallError,
    MaxToolRoundsExceeded,
    ProviderResponseError,
    RunInterrupted,
    StreamBrokenError,
    UsageError,
)
from .events import Event, EventType, SessionStatus
from .memory import storable_text
from .messages import Message, Role, ToolCall, check_history
from .resources.vaults import SessionSecrets, Vaults
from .memory.context import INTERRUPTED_TOOL_RESULT, split_turns
from .usage import normalise_usage
from .tokens import ContextBudget, context_budget, estimate_tokens, reply_tokens, select_window
from .tools import Tool

if TYPE_CHECKING:  # pragma: no cover
    from .memory.context import SessionContext
    from .memory.protocol import SessionStoreProtocol, TurnStart
    from .model import ChatClient

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

#: The tool result that answers a tool call whose turn was interrupted before its result (the
#: context's own constant, under the name the Runner has always exported).
INTERRUPTED_RESULT = INTERRUPTED_TOOL_RESULT


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
        pending_tool_calls: custom tool calls waiting for ``submit_tool_result``.
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
            "replayed": self.replayed,
            "finish_reason": self.finish_reason,
            "reasoning": self.reasoning,
            "context": self.context,
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


# --------------------------------------------------------------------------------------
# the Runner
# --------------------------------------------------------------------------------------
_lease_of = lease_of


class Runner:
    """Runs turns of sessions kept in ``session_store``.

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
        max_context_tokens: the model's context size in tokens, for every agent; None: the
            agent's own ``max_context_tokens``, else the model table of
            :mod:`chatflow_cli.core.tokens`, else no token budget (a model nobody knows).
            Each request carries the SYSTEM messages and the newest whole turns of the
            window that fit this size minus the reply reserve (``max_tokens``, else a
            quarter of the size, at most 4,096); the newest turn is always sent whole, with a
            warning when it alone is over the budget.
        compact_at: automatic compaction: when the stored window and the new message pass
            this share of the token budget, turns before the newest ones (about 30 % of the
            budget) are summarised (:mod:`chatflow_cli.core.compaction`) before the turn's
            request. None turns it off; a model with no known context size never compacts.
            A compaction that fails is logged and the turn goes on without it.
        compact_prompt: replaces the compaction prompt.
        vaults: reads the values of vault entries for tools with secret parameters
            (:class:`~chatflow_cli.core.resources.vaults.Vaults`); None: no vault can be read,
            so such a tool gets an error result saying its secret is missing.

    Attributes:
        mounted_vaults: the vaults whose entries fill secret parameters, in mount order
            (the first holding an entry wins), for every session this Runner runs.
        agent_vaults: ``{agent name: vault names}`` searched after ``mounted_vaults`` while
            that agent answers (``vaults = [...]`` of an agent in config.toml).

    Raises:
        ValueError: ``max_tool_rounds`` is not an int >= 0.
        AgentDefinitionError: two reachable agents share a name.
    """

    def __init__(
        self,
        starting_agent: Agent,
        session_store: SessionStoreProtocol,
        *,
        model_client: ChatClient | Callable[[], ChatClient] | None = None,
        default_model: str | None = None,
        max_tool_rounds: int = 10,
        max_tokens: int | None = None,
        temperature: float | None = None,
        max_context_tokens: int | None = None,
        compact_at: float | None = 0.8,
        compact_prompt: str | None = None,
        vaults: Vaults | None = None,
    ) -> None:
        if compact_at is not None and (isinstance(compact_at, bool) or not 0 < compact_at <= 1):
            raise ValueError(f"compact_at must be a fraction in (0, 1] or None, got {compact_at!r}")
        if max_context_tokens is not None and (
            isinstance(max_context_tokens, bool) or not isinstance(max_context_tokens, int) or max_context_tokens < 2
        ):
            raise ValueError(f"max_context_tokens must be an int >= 2, got {max_context_tokens!r}")
        if isinstance(max_tool_rounds, bool) or not isinstance(max_tool_rounds, int) or max_tool_rounds < 0:
            raise ValueError(f"max_tool_rounds must be an int >= 0, got {max_tool_rounds!r}")
        self.starting_agent = starting_agent
        self.agents: dict[str, Agent] = reachable_agents(starting_agent)
        self.store = session_store
        self.default_model = default_model
        self.max_tool_rounds = max_tool_rounds
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_context_tokens = max_context_tokens
        self.compact_at = compact_at
        self.compact_prompt = compact_prompt
        self.vaults = vaults
        self.mounted_vaults: tuple[str, ...] = ()
        self.agent_vaults: dict[str, tuple[str, ...]] = {}
        # a client has ``stream``; anything else given is a factory called on first use
        self._client: ChatClient | None = (
            cast("ChatClient", model_client) if model_client is not None and hasattr(model_client, "stream") else None)
        self._client_factory: Callable[[], ChatClient] | None = (
            cast("Callable[[], ChatClient] | None", model_client) if self._client is None else None)
        self._client_lock = threading.Lock()
        #: Called once when a run starts waiting (``wait`` > 0) for a session another process
        #: runs: ``{"session_id", "pid" (the running turn's process, or None), "wait_s"}``.
        #: Front-ends use it to say what a turn waits for; exceptions from it are ignored.
        self.on_wait: Callable[[dict[str, Any]], None] | None = None
        session_store.set_agent_resolver(self.agents.get)

    # -- public API -----------------------------------------------------------------------
    @property
    def session_store(self) -> SessionStoreProtocol:
        return self.store

    @property
    def model_client(self) -> ChatClient:
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
    def model_client(self, client: ChatClient) -> None:
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

        Returns:
            The turn's :class:`RunResult` (``replayed=True`` when it came from the log).

        Raises:
            SessionBusyError: the session stayed busy for ``wait`` seconds.
            RunInterrupted: Ctrl-C or ``cancel``; the turn was stored as interrupted.
            StreamBrokenError: the reply stopped before it finished; kept as an interrupted turn.
            InvalidToolCallError: the reply holds a tool call that cannot run.
            MaxToolRoundsExceeded: more than ``max_tool_rounds`` replies with tool calls.
            RateLimitedError: 429/5xx after the retries; the session is ``rescheduled``.
            ChatflowError: any other provider or configuration error (module docstring); the
                turn is stored as failed and the session is ``idle`` again.
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
        start = self._start(message, metadata, idempotency_key, message_id, max_turns, system)
        return self._guarded(session_id, start, wait=wait, cancel=cancel, loop=None)

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
        """Async twin of :meth:`run`, for handlers on an event loop (a webhook endpoint).

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
        start = self._start(message, metadata, idempotency_key, message_id, max_turns, system)
        async for event in self._in_thread(session_id, start, wait=wait):
            yield event

    def _start(self, message: Message, metadata: dict[str, Any] | None, idempotency_key: str | None,
               message_id: str | None, max_turns: int | None, system: str | None) -> dict[str, Any]:
        """``begin_turn``'s arguments for a new turn; the message id is ``message_id``, or the
        claim this thread or task made last (``store.claim_message``)."""
        start: dict[str, Any] = {"user_message": message, "metadata": metadata, "idempotency_key": idempotency_key,
                                 "max_turns": max_turns, "system": system}
        if message_id is not None:
            start["message_id"] = message_id
            return start
        from .memory import take_context_claim

        claim = take_context_claim(self.store)
        if claim is not None:
            start.update(message_id=claim[0], message_claim=claim[1])
        return start

    def submit_tool_result(
        self, session_id: str, tool_use_id: str, output: Any, *, wait: float = DEFAULT_WAIT_S,
        cancel: threading.Event | None = None,
    ) -> RunResult | None:
        """Answer one pending custom tool call and, once all are answered, continue the turn.

        ``output`` is text (anything else is JSON-encoded).

        Returns:
            ``None`` while other ids are still pending, else the :class:`RunResult` of the
            continued turn.

        Raises:
            ToolResultError: an unknown id, or a second answer for one (nothing is written).
            ChatflowError: as :meth:`run`, from the continued turn.
        """
        remaining = self.store.submit_tool_result(session_id, tool_use_id, output_text(output))
        if remaining:
            return None
        return _drain(self.continue_streamed(session_id, wait=wait, cancel=cancel))

    async def asubmit_tool_result(self, session_id: str, tool_use_id: str, output: Any, *,
                                  wait: float = DEFAULT_WAIT_S) -> RunResult | None:
        """Async twin of :meth:`submit_tool_result`."""
        remaining = await asyncio.to_thread(self.store.submit_tool_result, session_id, tool_use_id,
                                            output_text(output))
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
        token = CancelToken(cancel)
        with ctrl_c_cancels(token):
            yield from self._turn(session_id, start, wait=wait, cancel=token, loop=loop)

    def _in_thread(self, session_id: str, start: dict[str, Any], *, wait: float) -> AsyncIterator[StreamEvent]:
        """Run the turn generator on a worker thread, handing its events to the event loop."""
        return events_from_worker(lambda cancel, loop: self._turn(session_id, start, wait=wait, cancel=cancel,
                                                                  loop=loop))

    # -- the turn ----------------------------------------------------------------------------
    def _begin(self, session_id: str, start: dict[str, Any], wait: float, cancel: CancelToken) -> TurnStart:
        """``store.begin_turn``, waiting in the session's queue up to ``wait`` seconds (:func:`begin_turn`)."""
        return begin_turn(self.store, session_id, start, wait=wait, cancel=cancel,
                          default_agent=self.starting_agent, on_wait=self.on_wait)

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
                usage=Usage.from_dict(normalise_usage(replay.get("usage"))) or Usage(),
                usage_reported=normalise_usage(replay.get("usage")) is not None,
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
        cancel: CancelToken,
        loop: asyncio.AbstractEventLoop | None,
    ) -> Iterator[StreamEvent]:
        written: list[Event] = []

        def stored(events: list[Event], turn: int | None) -> Iterator[StreamEvent]:
            for event in events:
                written.append(event)
                yield StreamEvent(event.type, session_id, event.payload, turn=event.payload.get("turn", turn),
                                  seq=event.seq)

        try:
            if start.get("user_message") is not None:
                for item in self._auto_compact(session_id, start["user_message"]):
                    if isinstance(item, StreamEvent):
                        yield item
                    else:
                        yield from stored([item], None)
            begun = self._begin(session_id, start, wait, cancel)
        except BaseException:
            # the turn never started (a store error, bad text, a busy session, an interrupt):
            # the message was not processed, so the claim this run carries is freed for its redelivery
            release_claim(self.store, start)
            raise
        turn: int = begun.turn
        if begun.replayed is not None:
            yield from stored(list(begun.events), turn)
            result = self._replayed(session_id, begun, tuple(written))
            yield StreamEvent("result", session_id, turn=result.turn, result=result)
            return

        session = begun.session
        state = TurnState(agent=session.active_agent, start_agent=session.active_agent)
        unwatch = watch_interrupt_requests(self.store, session_id, _lease_of(session), cancel)
        try:
            try:
                yield from stored(list(begun.events), turn)
                if self._version_of(state.agent) is not None and session.note_agent_version(state.agent):
                    yield from stored(self.store.save(session), turn)  # agent.changed, before the reply
                result = yield from self._loop(session, turn, state, cancel, loop, stored)
            except Exception as exc:
                if cancel.is_set() and not isinstance(exc, Cancelled) and not state.released:
                    # cancelled while a request was still connecting: its error is the cancel's echo
                    raise Cancelled() from exc
                raise
        except Broken as exc:
            if state.released:  # pragma: no cover - raised before anything is released
                raise
            events = store_interrupted(self.store, session, state, reason="broken stream")
            yield from stored(events, turn)
            raise StreamBrokenError(f"{exc.args[0]}; what arrived is kept as interrupted turn {turn}",
                                    session_id=session_id) from None
        except InvalidAfterTools as exc:
            if state.released:  # pragma: no cover - raised before anything is released
                raise
            ran = ", ".join(dict.fromkeys(state.ran))
            events = store_interrupted(self.store, session, state, reason="invalid tool call")
            yield from stored(events, turn)
            hint = "; or raise the token limit" if exc.args[1] == "length" else ""
            raise InvalidToolCallError(
                f"the model's reply cannot be used: {exc.args[0]}; it did not run, but earlier rounds ran {ran}: "
                f"turn {turn} is kept as interrupted up to its last complete round (send a message to go on{hint})",
                session_id=session_id) from None
        except (KeyboardInterrupt, Cancelled, GeneratorExit, asyncio.CancelledError) as exc:
            closing = isinstance(exc, GeneratorExit)
            if state.released:  # the turn was already stored as finished; only the consumer left
                raise
            events = store_interrupted(self.store, session, state, reason=cancel.reason if isinstance(exc, Cancelled)
                                     or closing else "interrupted")
            if closing:  # the consumer went away: nothing more may be yielded
                written.extend(events)
                raise
            yield from stored(events, turn)
            asked = " at another process's request" if cancel.reason == INTERRUPT_REQUESTED else ""
            raise RunInterrupted(f"turn {turn} was interrupted{asked}; the session is ready for the next message",
                                 session_id=session_id) from (None if isinstance(exc, Cancelled) else exc)
        except BaseException as exc:
            if state.released:
                raise
            if getattr(exc, "keeps_partial_reply", False) and state.partial:
                # the model server died mid-reply: what it said stays, as an interrupted turn
                events = store_interrupted(self.store, session, state, reason=f"interrupted: {type(exc).__name__}")
            else:
                events = store_failed(self.store, session, state, exc)
            yield from stored(events, turn)
            if isinstance(exc, ChatflowError) and exc.session_id is None:
                exc.session_id = session_id
            raise
        finally:
            unwatch()
            # the lease is renewed only while the turn runs: it ends here, by whatever path
            end_lease(self.store, _lease_of(session), stored=state.released or state.ended)
        yield StreamEvent("result", session_id, turn=turn,
                          result=dataclasses.replace(result, events=tuple(written)))

    def _loop(
        self,
        session: SessionContext,
        turn: int,
        state: TurnState,
        cancel: CancelToken,
        loop: asyncio.AbstractEventLoop | None,
        stored: Callable[[list[Event], int | None], Iterator[StreamEvent]],
    ) -> Generator[StreamEvent, None, RunResult]:
        session_id = session.session_id
        client = self.model_client
        requests = 0
        while True:
            if cancel.is_set():
                raise Cancelled()
            agent: Agent = state.agent
            tools = agent.all_tools()
            model = agent.model or self.default_model
            if not model:
                raise ConfigError(f"no model for agent {agent.name!r}: set Agent(model=...) or "
                                  "Runner(default_model=...)", session_id=session_id)
            outgoing, state.context = self._budget_window(session, agent, model)
            dropped = state.context.get("dropped")
            if dropped and not state.dropped_told:
                state.dropped_told = True  # once a turn: later rounds drop the same turns or more
                yield StreamEvent("context.dropped", session_id, {"first": dropped[0], "last": dropped[1],
                                                                   "summarised": False}, turn=turn)
            check_history(outgoing, session_id=session_id)
            wire = [state.wire(m) for m in outgoing if not m.says_nothing]
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
                        raise Cancelled()
            finally:
                unwatch()
                close = getattr(stream, "close", None)
                if close is not None and reply is None:
                    close()
            if reply is None:
                raise ProviderResponseError("the model's stream ended without a reply", session_id=session_id)
            if reply.usage is not None:
                state.usage = state.usage + reply.usage
                state.usage_reported = True
            else:
                state.usage_missing = True  # the turn's usage is unknown: never a partial sum
            # the reply's tokens in the next request's context: the provider's count when it
            # reported one (less its reasoning, which is not sent back), else estimated when stored
            counted = reply_tokens(reply.usage, reasoning=bool(reply.reasoning))
            verdict = reply.verdict
            if verdict.state is ReplyState.INTERRUPTED:
                raise Cancelled()
            if verdict.state is ReplyState.BROKEN:
                state.reasoning = storable_text(reply.reasoning) if reply.reasoning else None
                raise Broken(verdict.reason)  # the partial text in state.partial is kept
            if verdict.state is ReplyState.INVALID_TOOL_CALL:
                if state.ran:  # earlier rounds ran tools: keep them, up to the last complete round
                    raise InvalidAfterTools(verdict.reason, verdict.finish_reason)
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
                session.add_message(Message.model(text, agent=agent.name, reasoning=reasoning, finish_reason=cut,
                                                  tokens=counted, agent_version=self._version_of(agent)))
                session.complete_turn(text, agent, state.known_usage(), finish_reason=verdict.finish_reason,
                                      agent_version=self._version_of(agent), model=model,
                                      base_url=recorded_url(client))
                session.set_status(SessionStatus.IDLE, reason="turn completed")
                events = self.store.save(session)
                state.released = True
                yield from stored(events, turn)
                return RunResult(text, agent.name, session_id, turn, state.usage, SessionStatus.IDLE,
                                 usage_reported=state.known_usage() is not None,
                                 finish_reason=verdict.finish_reason, reasoning=reasoning, context=state.context)

            state.rounds += 1
            if state.rounds > self.max_tool_rounds:
                raise MaxToolRoundsExceeded(
                    f"the model kept calling tools past max_tool_rounds={self.max_tool_rounds} in turn {turn}; "
                    "the turn was dropped from the context window (max_tool_rounds in config.toml, or "
                    "Runner(max_tool_rounds=N), allows more)",
                    session_id=session_id,
                )
            session.add_message(Message.model(content or None, calls, agent=agent.name, reasoning=reasoning,
                                              tokens=counted, agent_version=self._version_of(agent)))
            yield from stored(self.store.save(session), turn)

            custom = [c for c in calls if c.name in tools and tools[c.name].is_custom]
            outcomes = yield from self._run_tools(session_id, turn, agent, tools, calls, cancel, loop, state)
            state.ran.extend(c.name for c in calls if c.id in outcomes)
            if custom:
                # stop here; regular results wait with the custom ones, sent in call order
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
                                 usage_reported=state.known_usage() is not None,
                                 pending_tool_calls=tuple(custom), context=state.context)
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
                if self._version_of(handoff_to) is not None:
                    session.note_agent_version(handoff_to)  # agent.changed when it is another version now
            yield from stored(self.store.save(session), turn)

    def _version_of(self, agent: Any) -> str | None:
        """``agent.version`` for an agent of this Runner; None for one it does not know (a
        stored agent name no resolver knows gets a stand-in whose version means nothing)."""
        known = self.agents.get(_name(agent))
        return known.version if known is not None and known is agent else None

    def _auto_compact(self, session_id: str, message: Message) -> list[Event | StreamEvent]:
        """Compact the session before its next turn, when needed; the events (stored ones, and
        a runtime ``context.compaction_failed`` ``{"through", "error"}``) to pass on.

        A compaction is needed when the next request, as the stored window stands, would
        leave out turns no summary covers (they do not fit the token budget beside the new
        message), or when the window passes ``compact_at`` of the budget. It summarises
        through the newest turn that must leave the window, or further back to keep about
        30 % of the budget as live turns (:func:`compaction_point`, the new message counted
        as the newest turn), so no turn leaves the request without a summary. With
        compaction off (``compact_at`` None) or failing, the turns are dropped and the
        request's ``context.dropped`` event says so.

        Automatic compaction stops for the session when it cannot help: the model's summary
        was refused as not shorter than what it replaces (:class:`SummaryTooLongError`), its
        request did not fit the model's context either (:class:`CompactionDoesNotFitError`), or
        what stays in every request after it (the summary, the SYSTEM messages and the
        agent's instructions) takes more than ``compact_at`` minus the 30 % kept as live
        turns (at least half of ``compact_at``) of the budget: the window could not get
        under ``compact_at`` for long, and every next turn would compact again, summarising
        the summary. A stored
        ``context.compaction_stopped`` event ``{"through", "reason"}`` says so once; until a
        later compaction (``sessions compact``, ``/compact``) or a rollback, automatic
        compaction is not tried again and turns that do not fit are dropped.
        """
        from .compaction import KEEP_SHARE, compact_session, compaction_stopped, compaction_through
        from .errors import CompactionDoesNotFitError, SessionNotFoundError, SummaryTooLongError

        try:
            info = self.store.session_summary(session_id)
        except SessionNotFoundError:
            return []
        agent = self.agents.get(info.active_agent_name, self.starting_agent)
        model = agent.model or self.default_model
        budget = self._budget(agent, model) if model else None
        if budget is None or not model or self.compact_at is None:
            return []
        tokens, turns = self.store.window_tokens(session_id)
        if not turns:
            return []
        new_turn = estimate_tokens(message)
        instructions = estimate_tokens(Message.system(agent.instructions)) if agent.instructions else 0
        through = compaction_through(tokens - sum(t for _, t in turns) + instructions, turns, new_turn,
                                     budget.tokens, self.compact_at)
        if through is None or compaction_stopped(self.store, session_id):
            return []
        try:
            done = compact_session(self.store, session_id, self.model_client, model, through=through,
                                   prompt=self.compact_prompt,
                                   tools=[t.to_wire() for t in agent.all_tools().values()] or None,
                                   max_tokens=self.max_tokens, temperature=self.temperature)
        except (SummaryTooLongError, CompactionDoesNotFitError) as exc:
            return [self._stop_compaction(session_id, through, exc.message)]
        except ChatflowError as exc:
            log.warning("session %s: automatic compaction through turn %d failed (%s); the turn goes on "
                        "without it", session_id, through, exc)
            return [StreamEvent("context.compaction_failed", session_id, {"through": through, "error": exc.message})]
        events: list[Event | StreamEvent] = list(done.events)
        after, kept = self.store.window_tokens(session_id)
        fixed = after - sum(cost for _, cost in kept) + instructions  # the summary, SYSTEM messages, instructions
        limit = int(max(self.compact_at - KEEP_SHARE, self.compact_at / 2) * budget.tokens)
        if fixed > limit:
            events.append(self._stop_compaction(
                session_id, through, f"the summary and system messages alone take about {fixed} tokens of the "
                f"budget of {budget.tokens} (more than {limit}), so every next turn would compact again"))
        return events

    def _stop_compaction(self, session_id: str, through: int, reason: str) -> Event:
        """Store ``context.compaction_stopped`` ``{"through", "reason"}``: automatic compaction
        is not tried again for the session until a later compaction or a rollback."""
        log.warning("session %s: automatic compaction through turn %d stopped: %s", session_id, through, reason)
        event: Event = self.store.append_event(session_id, "context.compaction_stopped",
                                               {"through": through, "reason": reason})
        return event

    def _budget(self, agent: Agent, model: str) -> ContextBudget | None:
        """The token budget of ``agent``'s requests: the Runner's ``max_context_tokens``, the
        agent's, else the model table (None: unknown model)."""
        return context_budget(model, max_context_tokens=self.max_context_tokens,
                              configured=agent.max_context_tokens, reply_tokens=self.max_tokens)

    def budget_for(self, agent_name: str | None = None) -> ContextBudget | None:
        """The :class:`~chatflow_cli.core.tokens.ContextBudget` of the named agent's requests
        (default: the starting agent), or None when its model's context size is unknown."""
        agent = self.agents.get(agent_name or "", self.starting_agent)
        model = agent.model or self.default_model
        return self._budget(agent, model) if model else None

    def _budget_window(self, session: SessionContext, agent: Agent, model: str) -> tuple[list[Message], dict[str, Any]]:
        """The messages of the next request: the agent's instructions, the window's SYSTEM
        messages, then the newest whole turns of the window that fit the token budget (the
        open turn always, whole); and the context use ``{"tokens", "budget", "context",
        "turns", "over_budget"}``."""
        history = session.history
        systems, _preamble, turns = split_turns(history)
        if agent.instructions:
            systems = [Message.system(agent.instructions), *systems]
        budget = self._budget(agent, model)
        limit = budget.tokens if budget is not None else 2**62
        kept, tokens = select_window(systems, turns, limit)
        over = budget is not None and tokens > limit
        numbers = [t.number for t in session.turns]
        if len(numbers) != len(turns):  # pragma: no cover - the window's turns are its numbered turns
            numbers = list(range(len(turns)))
        dropped = [numbers[0], numbers[len(turns) - kept - 1]] if kept < len(turns) else None
        summary = next((m.summary_through for m in systems if m.summary_through is not None), None)
        if over:
            log.warning("session %s: the context (%d tokens: system messages%s and the newest turn) is over the "
                        "context budget of %d tokens; it is sent whole", session.session_id, tokens,
                        ", summary" if summary else "", limit)
        outgoing = [*systems, *(m for msgs in turns[len(turns) - kept:] for m in msgs)]
        use = {"tokens": tokens, "budget": budget.tokens if budget is not None else None,
               "context": budget.context if budget is not None else None, "turns": kept, "over_budget": over,
               "first_turn": numbers[len(turns) - kept] if kept else None, "summary_through": summary,
               "system_messages": sum(1 for m in systems if m.summary_through is None), "dropped": dropped}
        return outgoing, use

    def _record_submitted(self, session: SessionContext, turn: int, call: ToolCall, output: str, is_error: bool) -> None:
        """A regular call's result waiting beside custom ones; an error result carries
        ``"is_error": true`` so the TOOL message stored when the turn continues is flagged."""
        payload: dict[str, Any] = {"turn": turn, "tool_use_id": call.id, "output": output}
        if is_error:
            payload["is_error"] = True
        session.record_event(EventType.TOOL_RESULT_SUBMITTED, payload)

    @staticmethod
    def _fresh_ids(session: SessionContext, calls: list[ToolCall]) -> list[ToolCall]:
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
        cancel: CancelToken,
        loop: asyncio.AbstractEventLoop | None,
        state: TurnState,
    ) -> Generator[StreamEvent, None, dict[str, tuple[str, bool]]]:
        """Run the regular and handoff calls; returns ``{call id: (text, is_error)}`` (custom calls left out)."""
        outcomes: dict[str, tuple[str, bool]] = {}
        for call in calls:
            found = tools.get(call.name)
            if found is None or not found.is_custom:
                yield StreamEvent("tool.call_started", session_id,
                                  {"id": call.id, "name": call.name, "arguments": call.arguments,
                                   "agent": agent.name}, turn=turn)
        runnable = answer_at_once(calls, tools, state, outcomes)
        timings: dict[str, float] = {}
        if runnable:
            # always on a thread, even one call: the waiting side stays responsive to a cancel request
            run_concurrently(runnable, outcomes, timings, cancel, loop, state, self._secrets_for(agent, runnable))
        for call in calls:
            if call.id in outcomes:
                text, is_error = outcomes[call.id]
                yield StreamEvent("tool.call_finished", session_id,
                                  {"id": call.id, "name": call.name, "output": text, "is_error": is_error,
                                   "duration_ms": round(timings.get(call.id, 0.0) * 1000, 3)}, turn=turn)
        return outcomes

    def _secrets_for(self, agent: Agent, runnable: list[tuple[ToolCall, Tool]]) -> SessionSecrets | None:
        """The vaults that fill this round's secret parameters (None: no tool has one)."""
        if not any(found.secrets for _, found in runnable):
            return None
        return SessionSecrets(self.vaults, (*self.mounted_vaults, *self.agent_vaults.get(agent.name, ())))


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _name(agent: Any) -> str:
    return str(getattr(agent, "name", agent) or "")


def _drain(events: Iterator[StreamEvent]) -> RunResult:
    result: RunResult | None = None
    for event in events:
        if event.result is not None:
            result = event.result
    assert result is not None, "a run ends with a result event or an error"
    return result


def set_run_workers(count: int) -> None:
    """Bound the shared ``run_async`` pool at ``count`` threads (>= 1); threads already
    started stay. Runs beyond the bound wait for a thread, in order.

    Raises:
        ValueError: ``count`` is not an int >= 1.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an int >= 1, got {count!r}")
    _cancel.pool.size = count


def recorded_url(client: Any) -> str | None:
    """The API root a turn records as answered at (``turn.completed``'s ``base_url``): the
    client's ``display_url`` (its ``base_url`` without any ``user:password@``: never a
    secret); None for the embedded local model (its server's port changes from run to run)
    or a client that names none."""
    if getattr(client, "local", False):
        return None
    url = getattr(client, "display_url", None)
    return url if isinstance(url, str) and url else None
