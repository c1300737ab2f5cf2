"""``sessions interrupt``: ask the process running a session's turn -- this one, another one,
or one on another host sharing a PostgreSQL database -- to stop it.

The request is an event (``turn.interrupt_requested``) naming the turn's owner; the Runner
running that turn looks for it every ``INTERRUPT_POLL_S`` (0.25 s) and stops at its next
chunk or tool boundary, as after Ctrl-C: the partial reply is kept, open tool calls get the
synthetic result, the session is idle.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..context import notice
from ..core.errors import SessionBusyError, SessionNotFoundError
from ..lookup import not_found, store_or_missing
from ..render import dumps

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State

__all__ = ["interrupt_session"]

#: How the turn asked to stop ended, by the event that ended it.
ENDINGS = {
    "turn.interrupted": "stopped: the partial reply is kept as an interrupted turn",
    "turn.completed": "had already finished",
    "turn.failed": "failed before it could stop",
    "tool.pending": "stopped to wait for tool results",
    "session.recovered": "was recovered: its process had died",
}
_POLL_S = 0.25


def interrupt_session(state: State, session_id: str, *, wait: float, as_json: bool) -> None:
    """Ask the turn ``session_id`` runs to stop, then wait up to ``wait`` seconds for it to end
    and say how it ended (``--json``: one object: session_id, turn, requested, outcome).

    Nothing running is not an error (a notice, exit 0).

    Raises:
        SessionNotFoundError: No such session (exit 3).
        SessionBusyError: The turn still runs when ``wait`` runs out (exit 4); it was asked
            and stops at its next chunk or tool boundary.
    """
    store = store_or_missing(state, session_id)
    try:
        before = store.last_seq(session_id)
        turn = store.request_interrupt(session_id)
    except SessionNotFoundError:
        raise not_found(session_id) from None
    outcome: str | None = None
    if turn is not None and wait > 0:
        deadline = time.monotonic() + wait
        while True:
            outcome = next((e.type for e in store.events(session_id, after_seq=before)
                            if e.type in ENDINGS and e.payload.get("turn") in (turn, None)), None)
            remaining = deadline - time.monotonic()
            if outcome is not None or remaining <= 0:
                break
            pushed = getattr(store, "wait_for_events", None)
            if pushed is not None:  # PostgreSQL: woken by LISTEN/NOTIFY
                pushed(session_id, store.last_seq(session_id), min(remaining, 1.0))
            else:
                time.sleep(min(_POLL_S, remaining))
        if outcome is None:
            pid = store.running_turn_pid(session_id)
            raise SessionBusyError(
                f"asked turn {turn} of session {session_id} to stop; it is still running after {wait:g} s"
                + (f" (pid {pid})" if pid else "") + ": it stops at its next chunk or tool boundary",
                session_id=session_id, pid=pid)
    if as_json:
        state.env.stdout.write(dumps({"session_id": session_id, "turn": turn, "requested": turn is not None,
                                      "outcome": outcome}) + "\n")
        return
    if turn is None:
        notice(state, f"session {session_id} has no running turn: nothing to interrupt")
    elif outcome is None:
        notice(state, f"asked turn {turn} of session {session_id} to stop")
    else:
        notice(state, f"turn {turn} of session {session_id} {ENDINGS[outcome]}")
