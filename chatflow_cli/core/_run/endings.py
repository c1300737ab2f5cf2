"""Storing the end of a turn that did not complete: interrupted, or failed.

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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RateLimitedError
from ..events import Event, EventType, SessionStatus
from ..messages import Message
from .state import TurnState

if TYPE_CHECKING:  # pragma: no cover
    from ..memory.context import SessionContext
    from ..memory.protocol import ContextStore

__all__ = ["lease_of", "store_failed", "store_interrupted"]

log = logging.getLogger("chatflow_cli.core.runner")

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
