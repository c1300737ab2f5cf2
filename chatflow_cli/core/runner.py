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
   one reply run concurrently, each on its own thread, except a ``sequential`` tool's calls
   (the memory tools'), which run one after another in the reply's order — and their
   results are appended under their ids in call order, then the model is asked again. A tool that raises, an unknown
   tool name, or arguments that are not valid JSON (or do not fit the parameters) become an
   error TOOL result (``is_error``) that the model sees; the turn goes on.
4. A call to ``transfer_to_<agent>`` makes that agent the session's active agent (a
   ``handoff`` event, once) and answers the call with a TOOL result; the new agent answers
   in the same turn with its own instructions and tools.
5. A call to a custom tool (:meth:`Tool.custom`) ends the run with the session
   ``idle`` and a ``tool.pending`` event listing the ids to answer. Regular tools called in
   the same reply run and their results are recorded as submitted (an error result keeps
   ``is_error`` in the TOOL message stored when the turn continues).
   :meth:`Runner.submit_tool_result` answers one id; once all are answered the turn
   continues, the results sent in call order. A call of a tool whose approval policy is
   ``ask`` (the tools of MCP servers, :mod:`chatflow_cli.core.mcp`, by default) is put to
   :attr:`Runner.approver` when there is one, else it waits the same way (listed in
   ``tool.pending``'s ``approval`` and :attr:`RunResult.approval_tool_calls`) until
   :meth:`Runner.approve_tool_call` runs it or :meth:`Runner.deny_tool_call` refuses it; a
   ``never`` tool's call gets an error result saying it is not allowed.
6. A reply without tool calls completes the turn: ``turn.completed``, pruning, status
   ``idle`` — in one transaction.

Agent versions: every MODEL message carries the version of the agent that gave it
(:attr:`Agent.version <chatflow_cli.core.agents.Agent.version>`; none for a stored agent
name that no agent of this Runner answers to), and ``turn.completed`` the answering
agent's. When an agent starts in a turn (the active agent at the turn's start, a handoff's
target) as another version than the one it last ran in the session (not the first time the
session sees it), an ``agent.changed`` event ``{"turn", "agent", "version",
"previous_version", "since_turn"}`` is stored and streamed before the agent's request
(:meth:`SessionContext.note_agent_version
<chatflow_cli.core.memory.SessionContext.note_agent_version>`): once per change, since the
store records the new version with it.

Whether a reply finished is decided once, by the reply's verdict
(:attr:`~chatflow_cli.core.model.ModelTurn.verdict`); the Runner acts on it:

* ``truncated`` (a reply without tool calls whose ``finish_reason`` is not ``stop``,
  ``tool_calls``, ``error`` or ``abort``: ``length`` (``max_tokens`` is stored as
  ``length``), ``content_filter``, or one chatflow does not know): the turn completes,
  its MODEL message and ``turn.completed`` carry the ``finish_reason``, and so does the
  :class:`RunResult` (``truncated`` is true).
* ``invalid_tool_call`` (arguments that are not a complete JSON object, or no function
  name): nothing runs and nothing is offered as pending; the turn fails
  (:class:`~chatflow_cli.core.errors.InvalidToolCallError`, exit 5).
* ``broken`` (no finish reason: the connection closed or timed out mid-reply, or the
  stream just ended; or the server ended the reply with ``finish_reason`` ``error`` or
  ``abort``, as vLLM does): what arrived is kept as an interrupted turn, exactly as after
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

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from . import cancel as _cancel
from .cancel import RUN_WORKERS, CancelToken, ctrl_c_cancels, events_from_worker
from ._run.lifecycle import RunResult, StreamEvent, TurnRequest, drain
from ._run.tools import output_text
from ._run.turn import ContextWindow, TurnLoop
from .agents import Agent, reachable_agents
from .messages import Message, Role
from .resources.mounts import Mount, unique_mounts

if TYPE_CHECKING:  # pragma: no cover
    import asyncio

    from .memory.protocol import TurnStore
    from .resources.vaults import Vaults
    from .model import ChatClient

__all__ = [
    "DEFAULT_WAIT_S",
    "RUN_WORKERS",
    "RunResult",
    "Runner",
    "StreamEvent",
    "set_run_workers",
]

#: How long a turn waits, by default, for a session other turns run or queue for (seconds).
DEFAULT_WAIT_S = 60.0


# --------------------------------------------------------------------------------------
# the Runner
# --------------------------------------------------------------------------------------
class Runner(TurnLoop, ContextWindow):
    """Runs turns of sessions kept in ``session_store``.

    Args:
        starting_agent: the agent of a new session; every agent reachable through handoffs
            is known to the Runner (names unique: ``AgentDefinitionError`` otherwise) and the
            Runner registers the store's agent resolver with them.
        session_store: what the Runner needs of a store, a
            :class:`~chatflow_cli.core.memory.TurnStore`; every store of
            :mod:`chatflow_cli.core.memory` (in memory, SQLite, PostgreSQL) is one.
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
            (:class:`~chatflow_cli.core.resources.vaults.Vaults`, or a function making one,
            called when a tool first needs a secret); None: no vault can be read, so such a
            tool gets an error result saying its secret is missing.

    Raises:
        ValueError: ``max_tool_rounds`` is not an int >= 0.
        AgentDefinitionError: two reachable agents share a name.
    """

    def __init__(
        self,
        starting_agent: Agent,
        session_store: TurnStore,
        *,
        model_client: ChatClient | Callable[[], ChatClient] | None = None,
        default_model: str | None = None,
        max_tool_rounds: int = 10,
        max_tokens: int | None = None,
        temperature: float | None = None,
        max_context_tokens: int | None = None,
        compact_at: float | None = 0.8,
        compact_prompt: str | None = None,
        vaults: Vaults | Callable[[], Vaults] | None = None,
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
        #: Asked before a call of a tool whose approval policy is ``ask`` (the tools of MCP
        #: servers, by default): ``approver(call, tool)`` returns ``"yes"``, ``"no"`` (the call
        #: gets an error result saying the user declined) or ``"always"`` (yes, and this
        #: Runner asks no more about that tool). None (the default): such a call ends the run
        #: with the call pending, like a custom tool's, until :meth:`approve_tool_call` or
        #: :meth:`deny_tool_call` answers it.
        self.approver: Callable[[Any, Any], str] | None = None
        self.approved_tools: set[str] = set()
        self.text_only_models: set[str] = set()
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
    def session_store(self) -> TurnStore:
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
        resources: Sequence[Mount] | None = None,
        cancel: threading.Event | None = None,
    ) -> RunResult:
        """Run one turn and return its :class:`RunResult`.

        ``metadata`` is merged into the session's metadata; ``max_turns`` and ``system`` (a
        system message) apply when the session is created; ``cancel``, when set from another
        thread, interrupts the run. ``resources``: mounts (:class:`~chatflow_cli.core.resources.Mount`)
        the session gets before the turn, those not mounted yet (``resource.mounted`` events);
        while memory stores are mounted the agent is offered the memory tools
        (:mod:`chatflow_cli.core.resources.memory_tools`), and ``Secret`` parameters of its
        tools are filled from the mounted vaults.

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
        return drain(self.run_streamed(session_id, user_message, metadata, idempotency_key=idempotency_key,
                                        message_id=message_id, wait=wait, max_turns=max_turns, system=system,
                                        cancel=cancel, resources=resources))

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
        resources: Sequence[Mount] | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[StreamEvent]:
        """Like :meth:`run`, yielding :class:`StreamEvent` s as they happen; the last is ``result``.

        Closing the iterator early (``break``) interrupts the turn like Ctrl-C would, without
        raising.
        """
        message = user_message if isinstance(user_message, Message) else Message.user(str(user_message))
        if message.role is not Role.USER:
            raise ValueError("user_message must be a USER message")
        request = self._request(message, metadata, idempotency_key, message_id, max_turns, system, resources)
        return self._guarded(session_id, request, wait=wait, cancel=cancel, loop=None)

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
        resources: Sequence[Mount] | None = None,
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
            max_turns=max_turns, system=system, resources=resources,
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
        resources: Sequence[Mount] | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Async twin of :meth:`run_streamed`."""
        message = user_message if isinstance(user_message, Message) else Message.user(str(user_message))
        request = self._request(message, metadata, idempotency_key, message_id, max_turns, system, resources)
        async for event in self._in_thread(session_id, request, wait=wait):
            yield event

    def _request(self, message: Message, metadata: dict[str, Any] | None, idempotency_key: str | None,
                 message_id: str | None, max_turns: int | None, system: str | None,
                 resources: Sequence[Mount] | None = None) -> TurnRequest:
        """The :class:`TurnRequest` of a new turn; the message id is ``message_id``, or the
        claim this thread or task made last (``store.claim_message``).

        Raises:
            TypeError: ``resources`` holds something other than a :class:`Mount`.
            UsageError: one resource is in ``resources`` twice, in two modes.
        """
        mounts = tuple(resources or ())
        if not all(isinstance(m, Mount) for m in mounts):
            raise TypeError("resources must be Mount values (chatflow_cli.core.resources.Mount)")
        if mounts:
            mounts = tuple(unique_mounts(mounts, "resources"))
        if message_id is not None:
            return TurnRequest(message, metadata, idempotency_key, max_turns, system, message_id=message_id,
                               resources=mounts)
        from .memory import take_context_claim

        claim = take_context_claim(self.store)
        return TurnRequest(message, metadata, idempotency_key, max_turns, system,
                           message_id=claim[0] if claim is not None else None,
                           message_claim=claim[1] if claim is not None else None, resources=mounts)

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
            ToolResultError: an unknown id, a second answer for one, or a call that waits for
                an approval (:meth:`approve_tool_call`, :meth:`deny_tool_call`); nothing is written.
            ChatflowError: as :meth:`run`, from the continued turn.
        """
        self._refuse_result_for_approval(session_id, tool_use_id)
        remaining = self.store.submit_tool_result(session_id, tool_use_id, output_text(output))
        if remaining:
            return None
        return drain(self.continue_streamed(session_id, wait=wait, cancel=cancel))

    async def asubmit_tool_result(self, session_id: str, tool_use_id: str, output: Any, *,
                                  wait: float = DEFAULT_WAIT_S) -> RunResult | None:
        """Async twin of :meth:`submit_tool_result`."""
        import asyncio

        await asyncio.to_thread(self._refuse_result_for_approval, session_id, tool_use_id)
        remaining = await asyncio.to_thread(self.store.submit_tool_result, session_id, tool_use_id,
                                            output_text(output))
        if remaining:
            return None
        result: RunResult | None = None
        async for event in self._in_thread(session_id, TurnRequest(user_message=None), wait=wait):
            if event.result is not None:
                result = event.result
        return result

    def continue_streamed(
        self, session_id: str, *, wait: float = DEFAULT_WAIT_S, cancel: threading.Event | None = None
    ) -> Iterator[StreamEvent]:
        """Continue a turn whose custom tool calls are all answered, streaming its events."""
        return self._guarded(session_id, TurnRequest(user_message=None), wait=wait, cancel=cancel, loop=None)

    def _refuse_result_for_approval(self, session_id: str, tool_use_id: str) -> None:
        """A call waiting for an approval is run or refused (:meth:`decide_tool_call`), never
        answered with a result from outside. Raises ToolResultError."""
        from .errors import ToolResultError

        session = self.store.get(session_id)
        call = next((c for c in session.pending_tool_calls if c.id == tool_use_id), None) if session else None
        if call is not None and self.awaits_approval(session_id, call):
            raise ToolResultError(f"tool call {tool_use_id!r} ({call.name}) waits for an approval, not for a result: "
                                  "approve_tool_call or deny_tool_call it", session_id=session_id)

    def tool_server(self, session_id: str, call: Any) -> str | None:
        """The name of the MCP server whose tool ``call`` calls, among the servers of the
        session's active agent: one whose tools are known (listed in this process, or kept from
        an earlier run) that has it, else (a server whose tools are not known yet) the server
        whose name the tool's begins with, ``SERVER__`` (None: not an MCP tool's call; no
        server is started here)."""
        reader = getattr(self.store, "active_agent_name", None)
        name = reader(session_id) if callable(reader) else None
        agent = self.agents.get(name or "") or self.starting_agent
        unknown: list[str] = []
        for entry in agent.mcp_servers:
            if entry.known_tools() is None:
                unknown.append(str(entry.server.name))
                continue
            try:
                if call.name in entry.agent_tools(start=False):
                    return str(entry.server.name)
            except Exception:  # noqa: BLE001 - it stopped since: no name to give
                continue
        if call.name in agent.all_tools():
            return None
        named = [s for s in unknown if call.name.startswith(f"{s}__")]
        return max(named, key=len) if named else None

    def awaits_approval(self, session_id: str, call: Any) -> bool:
        """Whether the pending ``call`` waits for an approval (not for a custom tool's result):
        its tool is not a custom tool of the session's active agent."""
        reader = getattr(self.store, "active_agent_name", None)
        name = reader(session_id) if callable(reader) else None
        agent = self.agents.get(name or "") or self.starting_agent
        own = agent.all_tools().get(call.name)
        return own is None or not own.is_custom

    def decide_tool_call(self, session_id: str, tool_use_id: str, approve: bool,
                         on_result: Callable[[str, bool, tuple[Any, ...], float], None] | None = None) -> list[str]:
        """Answer a call waiting for an approval: run it (``approve``) and record its result,
        or record that the user declined it (an error result). Returns the ids still pending.
        ``on_result(output, is_error, attachments, duration_ms)``, if given, is told the
        result recorded (a front-end shows it as it shows the calls of a turn).

        Raises:
            SessionNotFoundError: no such session.
            ToolResultError: no such pending call, it has a result already, or its tool is
                not one that waits for an approval (a custom tool: ``submit_tool_result``).
        """
        from .errors import SessionNotFoundError, ToolResultError
        from ._run.tools import invoke_call
        from ._run.turn import refused_text, turn_secrets, turn_tools

        session = self.store.get(session_id)
        if session is None:
            raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
        call = next((c for c in session.pending_tool_calls if c.id == tool_use_id), None)
        if call is None:
            raise ToolResultError(f"no pending tool call {tool_use_id!r} in session {session_id}", session_id=session_id)
        if tool_use_id in self.store.submitted_tool_results(session_id):
            raise ToolResultError(f"tool call {tool_use_id!r} already has a result", session_id=session_id)
        agent = self.agents.get(getattr(session.active_agent, "name", "")) or self.starting_agent
        own = agent.all_tools().get(call.name)
        if own is not None and own.is_custom:
            raise ToolResultError(f"tool call {tool_use_id!r} ({call.name}) is a custom tool's: answer it with a tool "
                                  "result", session_id=session_id)
        whole: str | None = None
        images: tuple[Any, ...] = ()
        began = time.monotonic()
        if not approve:  # nothing to start: the call never runs
            text, is_error = refused_text(call.name, "the user declined it"), True
        else:
            found = turn_tools(self.store, session, session.turn_count, agent).get(call.name)
            if found is None:
                raise ToolResultError(f"tool call {tool_use_id!r}: the agent {agent.name!r} has no tool {call.name!r} "
                                      "now (its MCP server may not start: chatflow mcp ls)", session_id=session_id)
            if getattr(found, "approval", None) == "never":
                text, is_error = refused_text(call.name, "its approval policy is never"), True
            else:
                text, is_error, whole, images = invoke_call(found, call, None,
                                                            turn_secrets(self.vaults, session, [(call, found)]))
        remaining = self.store.submit_tool_result(session_id, tool_use_id, text, is_error=is_error,
                                                  **({"attachments": images} if images else {}))
        if on_result is not None:
            on_result(text, is_error, tuple(images), (time.monotonic() - began) * 1000)
        if whole is not None:
            self.store.append_event(session_id, "mcp.output", {"turn": session.turn_count, "tool_use_id": tool_use_id,
                                                               "output": whole})
        return remaining

    def approve_tool_call(self, session_id: str, tool_use_id: str, *, wait: float = DEFAULT_WAIT_S,
                          cancel: threading.Event | None = None) -> RunResult | None:
        """Approve a call waiting for an approval: it runs now, and once no call of the turn
        waits any more the turn continues (its :class:`RunResult`; None while others wait).
        Raises as :meth:`decide_tool_call` and :meth:`run`."""
        if self.decide_tool_call(session_id, tool_use_id, True):
            return None
        return drain(self.continue_streamed(session_id, wait=wait, cancel=cancel))

    def deny_tool_call(self, session_id: str, tool_use_id: str, *, wait: float = DEFAULT_WAIT_S,
                       cancel: threading.Event | None = None) -> RunResult | None:
        """Deny a call waiting for an approval: it gets an error result saying the user
        declined it, and the turn continues as with :meth:`approve_tool_call`."""
        if self.decide_tool_call(session_id, tool_use_id, False):
            return None
        return drain(self.continue_streamed(session_id, wait=wait, cancel=cancel))

    def close(self) -> None:
        """Close the model client's connections (it reconnects if used again) and stop the
        MCP servers of the Runner's agents (they start again when a turn needs them)."""
        client = self._client
        if client is not None and hasattr(client, "close"):
            client.close()
        servers = [s for a in self.agents.values() for s in a.mcp_servers]
        if servers:
            from .mcp.servers import stop_all

            stop_all(servers)

    # -- driving a run from sync and async callers ------------------------------------------
    def _guarded(
        self,
        session_id: str,
        request: TurnRequest,
        *,
        wait: float,
        cancel: threading.Event | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> Iterator[StreamEvent]:
        """The turn generator, with Ctrl-C turned into a cancel request while it runs in the main thread."""
        token = CancelToken(cancel)
        with ctrl_c_cancels(token):
            yield from self._turn(session_id, request, wait=wait, cancel=token, loop=loop)

    def _in_thread(self, session_id: str, request: TurnRequest, *, wait: float) -> AsyncIterator[StreamEvent]:
        """Run the turn generator on a worker thread, handing its events to the event loop."""
        return events_from_worker(lambda cancel, loop: self._turn(session_id, request, wait=wait, cancel=cancel,
                                                                  loop=loop))


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def set_run_workers(count: int) -> None:
    """Bound the shared ``run_async`` pool at ``count`` threads (>= 1); threads already
    started stay. Runs beyond the bound wait for a thread, in order.

    Raises:
        ValueError: ``count`` is not an int >= 1.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an int >= 1, got {count!r}")
    _cancel.pool.size = count

