"""Rolling a session back to an earlier turn."""

from __future__ import annotations


from ..errors import SessionBusyError
from ..events import Event, SessionStatus
from ._checks import _check_session_id
from ._core import _StoreCore
from ._port import _busy_message, _rollback_argument, rollback_target


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
