"""Rolling a session back to an earlier turn: the rule for which turns stay (:func:`rollback_target`)
and the store's rollback."""

from __future__ import annotations

from typing import Any

from ..errors import SessionBusyError
from ..events import Event, SessionStatus
from ._checks import _check_session_id
from ._core import _StoreCore
from ._port import _busy_message
from ._twins import async_twin


def _rollback_argument(to_turn: Any, last: Any) -> tuple[str, int]:
    """``("to_turn", n)`` or ``("last", k)``: exactly one given, an int (TypeError otherwise)."""
    if (to_turn is None) == (last is None):
        raise TypeError("give exactly one of to_turn (keep turns 1..N) or last (remove the newest K turns)")
    name, value = ("to_turn", to_turn) if to_turn is not None else ("last", last)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return name, value


def rollback_target(
    turn_count: int, *, to_turn: int | None = None, last: int | None = None, session_id: str | None = None
) -> int:
    """The turn a rollback keeps up to, for a session whose last live turn is ``turn_count``.

    ``to_turn=N`` keeps turns 1..N (0 keeps only the SYSTEM messages); ``last=K`` removes the
    newest K turns, so it keeps turns 1..``turn_count - K``. :meth:`BaseSessionStore.rollback`
    applies this rule inside its write transaction; a front-end may apply it to a
    :class:`SessionSummary` to show what a rollback would remove before asking.

    Args:
        turn_count: the number of the session's last live turn (>= 0).
        to_turn: the last turn to keep, or None.
        last: how many of the newest turns to remove, or None.
        session_id: named in error messages when given.

    Returns:
        The turn to keep up to, in ``0..turn_count``; equal to ``turn_count`` (nothing to
        remove) only for ``to_turn=turn_count``.

    Raises:
        TypeError: neither or both of ``to_turn`` and ``last`` given, or one is not an int.
        ValueError: ``to_turn`` outside ``0..turn_count``, or ``last`` outside ``1..turn_count``.
    """
    name, value = _rollback_argument(to_turn, last)
    where = f"session {session_id!r}" if session_id is not None else "the session"
    if name == "to_turn":
        if value < 0:
            raise ValueError(f"turn {value} is not a turn number (0 keeps only the system messages)")
        if value > turn_count:
            raise ValueError(f"turn {value} is beyond the last turn of {where} ({turn_count})")
        return value
    if value < 1:
        raise ValueError(f"the number of newest turns to remove must be at least 1, got {value}")
    if value > turn_count:
        turns = f"{turn_count} turn" + ("" if turn_count == 1 else "s")
        raise ValueError(f"{where} has only {turns}; cannot remove the last {value}")
    return turn_count - value


class _Rollback(_StoreCore):
    """Rollback of the newest turns of a session."""

    def rollback(self, session_id: str, to_turn: int | None = None, *, last: int | None = None) -> list[Event]:
        """Remove the newest turns of the stored session in one transaction (``chatflow sessions rollback``).

        ``to_turn=N`` (also positional: ``rollback(session_id, N)``) keeps turns 1..N, 0 only
        the SYSTEM messages; ``last=K`` removes the newest K turns *as stored when the
        transaction runs* (see :func:`rollback_target`). Removed turns stay in the log
        (``load_turns(..., include_rolled_back=True)``); the next new turn is ``N + 1``.

        Returns:
            The events appended: one ``rollback`` event, payload ``{"to_turn": N,
            "removed_turns": [N + 1, ...]}`` (``removed_turns`` is empty for
            ``to_turn=turn_count``).

        Raises:
            TypeError: neither or both of ``to_turn`` and ``last``, or a non-int.
            ValueError: ``to_turn`` outside ``0..turn_count`` or ``last`` outside
                ``1..turn_count``; nothing is written.
            SessionNotFoundError: no such session.
            SessionBusyError: a live owner is running a turn of the session.
            SessionTerminatedError: the session is terminated.
        """
        _check_session_id(session_id)
        _rollback_argument(to_turn, last)
        with self._write() as tx:
            row = self._require(tx, session_id)
            self._refuse_terminated(row)
            if row.status is SessionStatus.RUNNING and row.owner is not None and row.owner.alive():
                raise SessionBusyError(_busy_message(session_id, row.owner, tx), session_id=session_id)
            target = rollback_target(row.turn_count, to_turn=to_turn, last=last, session_id=session_id)
            ctx = self._context(tx, row, quiet=True)
            ctx.rollback_to(target)
            return self._apply(tx, row, ctx._pending())

    arollback = async_twin(rollback, writes=True)
