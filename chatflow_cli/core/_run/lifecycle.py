"""A turn's beginning and its ending, around the loop of :mod:`.turn`.

* Beginning: ``store.begin_turn``, waiting in the store's queue while the session is busy
  (:func:`begin_turn_when_free`; :func:`release_claim` and :func:`end_lease` free what a
  turn that never started held); and the context window of a turn's requests --
  :class:`ContextWindow`, mixed into :class:`~chatflow_cli.core.runner.Runner`: the token
  budget, the turns that fit it, and compaction before a turn when the window would not fit.
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

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..agents import Agent
from ..errors import ChatflowError, RateLimitedError, RunInterrupted, SessionBusyError
from ..events import Event, EventType, SessionStatus
from ..memory.context import split_turns
from ..messages import Message
from ..tokens import ContextBudget, context_budget, estimate_tokens, select_window
from .cancel import CancelToken
from .host import RunnerHost
from .results import StreamEvent
from .state import TurnRequest, TurnState

if TYPE_CHECKING:  # pragma: no cover
    from ..memory.context import SessionContext
    from ..memory.protocol import ContextStore, TurnStart, TurnStore

__all__ = ["ContextWindow", "begin_turn_when_free", "end_lease", "lease_of", "release_claim", "store_failed",
           "store_interrupted"]

log = logging.getLogger("chatflow_cli.core.runner")


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
        from ..errors import CompactionDoesNotFitError, SessionNotFoundError, SummaryTooLongError

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
