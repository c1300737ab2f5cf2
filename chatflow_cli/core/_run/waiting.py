"""Starting a turn, waiting in the store's queue while the session is busy."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RunInterrupted, SessionBusyError
from .cancel import CancelToken
from .state import TurnRequest

if TYPE_CHECKING:  # pragma: no cover
    from ..agents import Agent
    from ..memory.protocol import TurnStart, TurnStore

__all__ = ["begin_turn_when_free", "end_lease", "release_claim"]

log = logging.getLogger("chatflow_cli.core.runner")


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
