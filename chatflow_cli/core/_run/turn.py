"""One turn of a run: begun (waiting while the session is busy), the model asked, tools
run, handoffs followed, and its ending stored -- :class:`TurnLoop`, mixed into
:class:`~chatflow_cli.core.runner.Runner` (the runner module's docstring tells the turn
step by step); and the context window of the turn's requests -- :class:`ContextWindow`,
mixed into the Runner too: the token budget, the turns that fit it, and compaction before
a turn when the window would not fit."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from ..stream import ModelTurn, ReplyState, TextDelta, Usage, normalize_usage
from ..agents import Agent
from ..errors import (
    BadRequestError,
    ChatflowError,
    ConfigError,
    InvalidToolCallError,
    MaxToolRoundsExceeded,
    ProviderResponseError,
    RunInterrupted,
    StreamBrokenError,
    UsageError,
)
from ..events import Event, EventType, SessionStatus
from ..memory import storable_text
from ..memory.context import split_turns
from ..messages import Message, Role, ToolCall, check_history, wire_messages
from ..tokens import ContextBudget, context_budget, estimate_tokens, reply_tokens, select_window
from ..tools import Tool
from ..cancel import INTERRUPT_REQUESTED, Cancelled, CancelToken, interruptions, watch_interrupt_requests
from .host import RunnerHost
from .lifecycle import (
    Broken,
    InvalidAfterTools,
    RunResult,
    StreamEvent,
    TurnRequest,
    TurnState,
    begin_turn_when_free,
    end_lease,
    lease_of,
    release_claim,
    store_failed,
    store_interrupted,
)
from .tools import answer_at_once, run_concurrently
from ..attachments import refuse_images_to_a_text_only_model

if TYPE_CHECKING:  # pragma: no cover
    import asyncio

    from ..memory.context import SessionContext
    from ..resources.mounts import Mount
    from ..resources.vaults import SessionSecrets, Vaults
    from ..memory.protocol import TurnStart

__all__ = ["ContextWindow", "TurnLoop", "recorded_url", "refused_text", "turn_tools"]

log = logging.getLogger("chatflow_cli.core.runner")


class TurnLoop(RunnerHost):
    """The turn of :class:`~chatflow_cli.core.runner.Runner`: :meth:`_turn` is the generator
    of one run's events, from ``store.begin_turn`` to the stored ending."""

    # -- the turn ----------------------------------------------------------------------------
    def _begin(self, session_id: str, request: TurnRequest, wait: float, cancel: CancelToken) -> TurnStart:
        """``store.begin_turn``, waiting in the session's queue up to ``wait`` seconds
        (:func:`~chatflow_cli.core._run.lifecycle.begin_turn_when_free`)."""
        return begin_turn_when_free(self.store, session_id, request, wait=wait, cancel=cancel,
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
                usage=Usage.from_dict(normalize_usage(replay.get("usage"))) or Usage(),
                usage_reported=normalize_usage(replay.get("usage")) is not None,
                status=session.status,
                events=written,
                replayed=True,
                finish_reason=replay.get("finish_reason"),
                resources=self._ran_with(session_id, turn, session),
            )
        if outcome == "pending":
            return RunResult(None, _name(session.active_agent), session_id, turn, Usage(), session.status,
                             pending_tool_calls=tuple(session.pending_tool_calls), events=written, replayed=True,
                             resources=tuple(session.resources))
        raise UsageError(
            f"turn {turn} of session {session_id}, sent with this idempotency key, was {outcome.replace('_', ' ')}; "
            "nothing was run again (send the message with a new key to retry it)",
            session_id=session_id,
        )

    def _ran_with(self, session_id: str, turn: int, session: SessionContext) -> tuple[Mount, ...]:
        """The resources the stored turn ``turn`` ran with (its live run, as the event log
        says); the session's mounts now when the store cannot say."""
        load = getattr(self.store, "load_turns", None)
        if load is not None:
            try:
                runs = [r for r in load(session_id, first=turn, last=turn) if not (r.rolled_back or r.failed)]
            except ChatflowError:
                runs = []
            if runs:
                return tuple(runs[-1].resources)
        return tuple(session.resources)

    def _turn(
        self,
        session_id: str,
        request: TurnRequest,
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
            if request.user_message is not None:
                if request.user_message.attachments:
                    refuse_images_to_a_text_only_model(self.model_client, request.user_message, session_id)
                for item in self._auto_compact(session_id, request.user_message):
                    if isinstance(item, StreamEvent):
                        yield item
                    else:
                        yield from stored([item], None)
            begun = self._begin(session_id, request, wait, cancel)
        except BaseException:
            # the turn never started (a store error, bad text, a busy session, an interrupt):
            # the message was not processed, so the claim this run carries is freed for its redelivery
            release_claim(self.store, request)
            raise
        turn: int = begun.turn
        if begun.replayed is not None:
            yield from stored(list(begun.events), turn)
            result = self._replayed(session_id, begun, tuple(written))
            yield StreamEvent("result", session_id, turn=result.turn, result=result)
            return

        session = begun.session
        state = TurnState(agent=session.active_agent, start_agent=session.active_agent)
        unwatch = watch_interrupt_requests(self.store, session_id, lease_of(session), cancel)
        try:
            try:
                yield from stored(list(begun.events), turn)
                if any([session.mount(m) for m in request.resources]):
                    yield from stored(self.store.save(session), turn)  # resource.mounted, before the reply
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
        except interruptions() as exc:
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
            end_lease(self.store, lease_of(session), stored=state.released or state.ended)
        yield StreamEvent("result", session_id, turn=turn,  # the mounts in force: those it ran with
                          result=dataclasses.replace(result, events=tuple(written), resources=tuple(session.resources)))

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
        preloaded: set[str] = set()  # the vaults whose values this turn has registered as secrets
        while True:
            if cancel.is_set():
                raise Cancelled()
            agent: Agent = state.agent
            told, warned = set(state.unavailable), set(state.unknown_tools)
            tools = turn_tools(self.store, session, turn, agent, state)
            for server in [name for name in state.unavailable if name not in told]:
                yield StreamEvent("mcp.unavailable", session_id, {"server": server, "error": state.unavailable[server],
                                                                  "agent": agent.name}, turn=turn)
            for server in [name for name in state.unknown_tools if name not in warned]:
                yield StreamEvent("mcp.unknown_tools", session_id, {"server": server, "warning":
                                                                    state.unknown_tools[server]}, turn=turn)
            if session.resources:  # every value of a mounted vault is a secret before anything is sent
                preload_vault_values(self.vaults, session, preloaded)
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
            state.data_urls = getattr(client, "takes_data_urls", False) is True
            # the images tool results returned go to a model that takes images (not the embedded
            # model, nor one that refused them before): see wire_messages
            images = any(m.attachments for m in outgoing if m.role is Role.TOOL) \
                and not getattr(client, "local", False) and model not in self.text_only_models
            tool_choice = agent.tool_choice if requests == 0 and tools else None
            if isinstance(tool_choice, str) and tool_choice in tools:
                tool_choice = {"type": "function", "function": {"name": tool_choice}}
            requests += 1
            while True:
                sent = [m for m in outgoing if m.attachments and (images or m.role is not Role.TOOL)]
                if sent:
                    state.fetch_blobs(sent, self.store)
                wire = wire_messages(outgoing, state.blobs, images=images, wire=state.wire, data_urls=state.data_urls)
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
                except BadRequestError as exc:
                    if not images or state.partial or "image" not in exc.message.lower():
                        raise
                    # the model takes no images: the tool results' images stay in the session, and
                    # this request and every later one of this Runner go without them
                    log.info("model %s refused the images of tool results (%s): sent again without them",
                             model, exc.message)
                    self.text_only_models.add(model)
                    images = False
                    continue
                finally:
                    unwatch()
                    close = getattr(stream, "close", None)
                    if close is not None and reply is None:
                        close()
                break
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

            decided, asking = self._approvals(calls, tools)
            waiting_ids = {c.id for c in asking}
            custom = [c for c in calls if (c.name in tools and tools[c.name].is_custom) or c.id in waiting_ids]
            outcomes = yield from self._run_tools(session, turn, agent, tools, calls, cancel, loop, state,
                                                  decided, frozenset(waiting_ids))
            state.ran.extend(c.name for c in calls if c.id in outcomes)
            if custom:
                # stop here; regular results wait with the custom ones, sent in call order
                for call in calls:
                    if call.id in outcomes:
                        self._record_submitted(session, turn, call, *outcomes[call.id],
                                               images=state.images.pop(call.id, ()))
                self._record_wholes(session, turn, state, outcomes)
                pending: dict[str, Any] = {"turn": turn, "tool_use_ids": [c.id for c in custom],
                                           "tools": [c.to_dict() for c in custom]}
                if asking:
                    pending["approval"] = [c.id for c in asking]
                session.record_event(EventType.TOOL_PENDING, pending)
                waits = ("waiting for approvals" if len(asking) == len(custom) else
                         "waiting for approvals and custom tool results" if asking else "waiting for custom tool results")
                session.set_status(SessionStatus.IDLE, reason=waits)
                events = self.store.save(session)
                state.released = True
                yield from stored(events, turn)
                return RunResult(None, agent.name, session_id, turn, state.usage, SessionStatus.IDLE,
                                 usage_reported=state.known_usage() is not None,
                                 pending_tool_calls=tuple(custom), context=state.context,
                                 approval_tool_calls=tuple(asking))
            handoff_to: Agent | None = None
            for call in calls:
                text, is_error = outcomes[call.id]
                session.add_message(Message.tool(call.id, text, name=call.name, is_error=is_error,
                                                 attachments=state.images.pop(call.id, ())))
                target = state.handoffs.get(call.id)
                if target is not None and handoff_to is None:
                    handoff_to = target
                    session.set_active_agent(target, tool_call_id=call.id)
            if handoff_to is not None:
                state.agent = handoff_to
                if self._version_of(handoff_to) is not None:
                    session.note_agent_version(handoff_to)  # agent.changed when it is another version now
            self._record_wholes(session, turn, state, outcomes)
            yield from stored(self.store.save(session), turn)

    def _version_of(self, agent: Any) -> str | None:
        """``agent.version`` for an agent of this Runner; None for one it does not know (a
        stored agent name no resolver knows gets a stand-in whose version means nothing)."""
        known = self.agents.get(_name(agent))
        return known.version if known is not None and known is agent else None

    @staticmethod
    def _record_wholes(session: SessionContext, turn: int, state: TurnState,
                       outcomes: dict[str, tuple[str, bool]]) -> None:
        """The complete results of calls whose text was cut for the model: one ``mcp.output``
        event each ``{"turn", "tool_use_id", "output"}``, stored with the results."""
        for call_id in [i for i in state.wholes if i in outcomes]:
            session.record_event("mcp.output", {"turn": turn, "tool_use_id": call_id,
                                                "output": state.wholes.pop(call_id)})

    def _approvals(self, calls: list[ToolCall], tools: dict[str, Tool]
                   ) -> tuple[dict[str, tuple[str, bool]], list[ToolCall]]:
        """The approval policy of each call: ``(answered, asking)``. ``answered``: calls
        refused (policy ``never``, or the approver said no) with their error result;
        ``asking``: calls of ``ask`` tools waiting for an approval (no approver to ask)."""
        answered: dict[str, tuple[str, bool]] = {}
        asking: list[ToolCall] = []
        for call in calls:
            found = tools.get(call.name)
            policy = getattr(found, "approval", None)
            if found is None or policy is None or policy == "always" or call.name in self.approved_tools:
                continue
            if policy == "never":
                answered[call.id] = (refused_text(call.name, "its approval policy is never"), True)
                continue
            approver = self.approver
            if approver is None:
                asking.append(call)
                continue
            answer = approver(call, found)
            if answer == "always":
                self.approved_tools.add(call.name)
            elif answer not in ("yes", True):
                answered[call.id] = (refused_text(call.name, "the user declined it"), True)
        return answered, asking

    def _record_submitted(self, session: SessionContext, turn: int, call: ToolCall, output: str, is_error: bool,
                          images: tuple[Any, ...] = ()) -> None:
        """A regular call's result waiting beside custom ones; an error result carries
        ``"is_error": true`` so the TOOL message stored when the turn continues is flagged,
        and the images its tool returned ``"attachments"`` (their bytes stored with the event)."""
        payload: dict[str, Any] = {"turn": turn, "tool_use_id": call.id, "output": output}
        if is_error:
            payload["is_error"] = True
        if images:
            payload["attachments"] = [a.to_dict() for a in images]
        session.record_event(EventType.TOOL_RESULT_SUBMITTED, payload, attachments=images)

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
        session: SessionContext,
        turn: int,
        agent: Agent,
        tools: dict[str, Tool],
        calls: list[ToolCall],
        cancel: CancelToken,
        loop: asyncio.AbstractEventLoop | None,
        state: TurnState,
        answered: dict[str, tuple[str, bool]] | None = None,
        waiting: frozenset[str] = frozenset(),
    ) -> Generator[StreamEvent, None, dict[str, tuple[str, bool]]]:
        """Run the regular and handoff calls; returns ``{call id: (text, is_error)}`` (custom
        calls and those ``waiting`` for an approval left out; ``answered`` ones kept as given)."""
        session_id = session.session_id
        outcomes: dict[str, tuple[str, bool]] = dict(answered or {})
        for call in calls:
            found = tools.get(call.name)
            if (found is None or not found.is_custom) and call.id not in waiting:
                yield StreamEvent("tool.call_started", session_id,
                                  {"id": call.id, "name": call.name, "arguments": call.arguments,
                                   "agent": agent.name}, turn=turn)
        runnable = answer_at_once(calls, tools, state, outcomes, waiting)
        timings: dict[str, float] = {}
        if runnable:
            # always on a thread, even one call: the waiting side stays responsive to a cancel request
            run_concurrently(runnable, outcomes, timings, cancel, loop, state, turn_secrets(self.vaults, session, runnable))
        for call in calls:
            if call.id in outcomes:
                text, is_error = outcomes[call.id]
                finished = {"id": call.id, "name": call.name, "output": text, "is_error": is_error,
                            "duration_ms": round(timings.get(call.id, 0.0) * 1000, 3)}
                if state.images.get(call.id):  # the images its tool returned (their metadata)
                    finished["attachments"] = [a.to_dict() for a in state.images[call.id]]
                yield StreamEvent("tool.call_finished", session_id, finished, turn=turn)
        return outcomes


# --------------------------------------------------------------------------------------
# the context window of a turn's requests: the token budget, compaction when due
# --------------------------------------------------------------------------------------
class ContextWindow(RunnerHost):
    """The token budget and the window of :class:`~chatflow_cli.core.runner.Runner`'s
    requests, and automatic compaction."""

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
        from ..errors import CompactionDoesNotFitError, SummaryTooLongError

        name = self.store.active_agent_name(session_id)  # one row read; None: a new session
        if name is None:
            return []
        agent = self.agents.get(name, self.starting_agent)
        model = agent.model or self.default_model
        budget = self._budget(agent, model) if model else None
        if budget is None or not model or self.compact_at is None:
            return []
        tokens, turns = self.store.window_tokens(session_id)
        if not turns:
            return []
        from ..compaction import KEEP_SHARE, compact_session, compaction_stopped, compaction_through

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


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _name(agent: Any) -> str:
    return str(getattr(agent, "name", agent) or "")


def recorded_url(client: Any) -> str | None:
    """The API root a turn records as answered at (``turn.completed``'s ``base_url``): the
    client's ``display_url`` (its ``base_url`` without any ``user:password@``: never a
    secret); None for the embedded local model (its server's port changes from run to run)
    or a client that names none."""
    if getattr(client, "local", False):
        return None
    url = getattr(client, "display_url", None)
    return url if isinstance(url, str) and url else None


# -- what the session's mounts give a turn ---------------------------------------------------
def refused_text(name: str, why: str) -> str:
    """The error result of a call that did not run for want of an approval."""
    return f"Error: the call to {name} was not run: {why}. Nothing ran; do not try it again unless the user asks."


def turn_tools(store: Any, session: SessionContext, turn: int, agent: Agent,
               state: TurnState | None = None) -> dict[str, Tool]:
    """The agent's tools, with the memory tools of the memory stores mounted on ``session``
    and the tools of the agent's MCP servers (the agent's own tool of the same name wins);
    writes are recorded as turn ``turn``'s. A server whose tools are known (listed earlier,
    or kept in its tools cache) is not started here: it starts when the model calls one of
    them. The others are started here, in parallel, to list their tools; one that fails to
    start is left out and named in ``state.unavailable`` (not tried again in this turn)."""
    tools = agent.all_tools()
    mounts = [m for m in session.resources if m.kind == "memory_store"]
    if not mounts and not agent.mcp_servers:
        return tools
    extra: dict[str, Tool] = {}
    if mounts:
        from ..resources.documents import Author
        from ..resources.memory_tools import memory_tools

        extra.update((t.name, t) for t in memory_tools(store, mounts, Author(session.session_id, turn, agent.name)))
    if agent.mcp_servers:
        from ..mcp import MCPServerError, start_all
        from ..mcp.servers import unknown_tools_note

        unavailable = state.unavailable if state is not None else {}
        unknown = [server for server in agent.mcp_servers if server.known_tools() is None]
        unavailable.update(start_all(unknown, skip=lambda name: name in unavailable))
        for server in agent.mcp_servers:
            if server.name in unavailable:
                continue
            try:
                extra.update(server.agent_tools())
            except MCPServerError as exc:  # it stopped between the start and now
                unavailable[server.name] = str(exc)
                continue
            note = unknown_tools_note(server)
            if note is not None and state is not None:
                state.unknown_tools[server.name] = note
    return {**extra, **tools}


def turn_secrets(vaults: Vaults | Callable[[], Vaults] | None, session: SessionContext,
                 runnable: list[tuple[ToolCall, Tool]]) -> SessionSecrets | None:
    """The secrets of this round's tool calls: the vaults mounted on ``session`` now, in the
    order they were mounted (the first vault holding an entry wins), read through ``vaults``
    (a factory: made now; None: none can be read, a secret is missing). None when no tool of
    the round has a ``Secret`` parameter."""
    if not any(found.secrets for _, found in runnable):
        return None
    from ..resources.vaults import SessionSecrets

    reader = vaults() if callable(vaults) else vaults
    return SessionSecrets(reader, [m.name for m in session.resources if m.kind == "vault"])


def preload_vault_values(vaults: Vaults | Callable[[], Vaults] | None, session: SessionContext,
                         done: set[str]) -> None:
    """Register as secrets the values of every entry of the vaults mounted on ``session`` (those
    not in ``done``, which gets them), before the model is asked anything: a tool result that
    holds a value (a memory document with the token in it) is scrubbed even when no tool of
    this process has read the vault yet. A vault or entry that cannot be read is no error
    here: the tool that needs it says so."""
    names = [m.name for m in session.resources if m.kind == "vault" and m.name not in done]
    if not names or vaults is None:
        return
    done.update(names)
    reader = vaults() if callable(vaults) else vaults
    for name in names:
        reader.remember_all(name)

