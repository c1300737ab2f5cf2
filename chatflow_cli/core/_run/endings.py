"""Storing the end of a turn that did not complete: interrupted, or failed.

Each ending is written once, in one ``store.save`` of the session the turn ran on. When
that fails (the in-memory session may be half-written), the ending is written again on a
fresh copy read from the store, so the session is never left ``running`` by this process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RateLimitedError
from ..events import Event, SessionStatus
from ..messages import Message
from .state import TurnState

if TYPE_CHECKING:  # pragma: no cover
    from ..memory.context import SessionContext
    from ..memory.protocol import SessionStoreProtocol

__all__ = ["store_failed", "store_interrupted"]

log = logging.getLogger("chatflow_cli.core.runner")


def store_interrupted(store: SessionStoreProtocol, session: SessionContext, state: TurnState,
                      reason: str) -> list[Event]:
    """Store the interrupted turn once: partial text, finished results, synthetic ones; then idle.

    Returns:
        The events written (none when even the fresh copy could not be written).
    """
    partial = "".join(state.partial) or None
    try:
        pending = {c.id: c for c in session.pending_tool_calls}
        for call_id, (text, is_error) in state.finished.items():
            if call_id in pending:
                session.add_message(Message.tool(call_id, text, name=pending[call_id].name, is_error=is_error))
        session.interrupt_turn(reason=reason, partial_text=partial, agent=state.agent,
                               partial_reasoning=state.reasoning)
        session.set_status(SessionStatus.IDLE, reason=reason)
        return list(store.save(session))
    except BaseException as exc:  # noqa: BLE001 - the in-memory session may be half-written
        log.warning("storing the interrupted turn from memory failed (%s); retrying from the store", exc)
        return _close_from_store(store, session.session_id, lambda s: s.interrupt_turn(
            reason=reason, partial_text=partial, agent=state.agent, partial_reasoning=state.reasoning), reason)


def store_failed(store: SessionStoreProtocol, session: SessionContext, state: TurnState,
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
    try:
        session.fail_turn(exc, agent=state.start_agent)  # also undoes a handoff made in the turn
        session.set_status(status, reason=reason, **extra)
        return list(store.save(session))
    except BaseException as second:  # noqa: BLE001
        log.warning("storing the failed turn from memory failed (%s); retrying from the store", second)

        def close(s: SessionContext) -> None:
            s.fail_turn(exc, agent=state.start_agent)

        return _close_from_store(store, session.session_id, close, reason, status=status, **extra)


def _close_from_store(store: SessionStoreProtocol, session_id: str, action: Callable[[SessionContext], None],
                      reason: str, *,
                      status: SessionStatus = SessionStatus.IDLE, **extra: Any) -> list[Event]:
    try:
        fresh = store.get(session_id)
        if fresh is None:
            return []
        try:
            action(fresh)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not close turn of %s: %s", session_id, exc)
        fresh.set_status(status, reason=reason, **extra)
        return list(store.save(fresh))
    except Exception as exc:  # noqa: BLE001 - the owner record lets a later run recover it
        log.error("could not release session %s: %s", session_id, exc)
        return []
