"""Compaction: summaries that replace old turns in the context window, and the window's token counts."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from ..errors import PendingToolCallsError, SessionBusyError, SessionDeletedError
from ..events import Event, EventType, SessionStatus
from ..messages import Message, Role
from ._checks import _check_session_id
from ._core import _StoreCore
from ._port import _busy_message, Owner
from .context import SessionBinding, SessionContext


class _Compaction(_StoreCore):
    """Compaction of a session's window into a summary, and token counts of the window."""

    def summaries(self, session_id: str, include_removed: bool = False) -> list[tuple[Message, bool]]:
        """The session's compaction summaries in the order they were made: ``(message,
        removed)`` pairs; ``message.summary_through`` is K, the last turn it covers.

        The rule for copies and rollbacks: a summary of turns 1..K belongs to exactly the
        histories that contain turns 1..K unchanged. A rollback to n < K marks it removed
        (``removed`` True; listed only with ``include_removed``); a copy of the session up to
        turn N (a fork) takes the live summaries with K <= N, and only those.

        Raises:
            SessionNotFoundError: no such session.
        """
        _check_session_id(session_id)
        with self._read() as tx:
            self._require(tx, session_id)
            return [(item.message, item.removed is not None) for item in tx.summaries(session_id, include_removed)]

    def window_tokens(self, session_id: str) -> tuple[int, list[tuple[int, int]]]:
        """``(tokens, turns)`` of the stored context window (SYSTEM messages, the newest
        summary, the live turns after it, newest ``max_turns``), from the stored counts:
        the window's total and ``(turn number, tokens)`` of each of its turns, oldest first.

        Raises:
            SessionNotFoundError: no such session.
        """
        _check_session_id(session_id)
        from ..tokens import message_tokens

        with self._read() as tx:
            row = self._require(tx, session_id)
            window = tx.window(session_id, self._window_first(tx, row))
        per_turn: dict[int, int] = {}
        for turn, message in window:
            if turn > 0:
                per_turn[turn] = per_turn.get(turn, 0) + message_tokens(message)
        return sum(message_tokens(m) for _, m in window), sorted(per_turn.items())

    def begin_compaction(self, session_id: str, *, owner: Owner) -> SessionContext:
        """Take the session for a compaction as :meth:`begin_turn` takes it for a turn.

        In one transaction: a dead owner's turn is recovered, then the session is marked
        ``running`` under ``owner`` (``status`` event, reason ``compaction started``), so
        other callers find it busy until :meth:`finish_compaction` or :meth:`release`.

        Returns:
            The session's context, holding the lease.

        Raises:
            SessionNotFoundError: no such session.
            SessionBusyError: a live owner runs the session, or callers queue for it.
            SessionTerminatedError: the session is terminated.
            PendingToolCallsError: tool calls of the last turn wait for results (that turn is
                not whole yet).
        """
        _check_session_id(session_id)
        with self._write() as tx:
            row = self._require(tx, session_id)
            if row.status is SessionStatus.RUNNING and row.owner is not None and not row.owner.alive():
                self._recover(tx, row, None)
            self._refuse_terminated(row)
            if row.status is SessionStatus.RUNNING and row.owner is not None:
                raise SessionBusyError(_busy_message(session_id, row.owner, tx), session_id=session_id,
                                       pid=row.owner.pid)
            if any(o.alive() for _, o in tx.queue_list(session_id)):
                raise SessionBusyError(f"session {session_id!r} is busy: earlier turns wait for it",
                                       session_id=session_id)
            ctx = self._context(tx, row, quiet=True)
            pending = [c.id for c in ctx.pending_tool_calls]
            if pending:
                raise PendingToolCallsError(
                    f"session {session_id} waits for tool results {', '.join(pending)}: compact it after they "
                    "are submitted", tool_use_ids=pending, session_id=session_id)
            ctx.set_status(SessionStatus.RUNNING, "compaction started", owner=owner.to_dict())
            self._apply(tx, row, ctx._pending())
            row.owner = owner
            tx.update_row(row)
            binding = SessionBinding(id(self), row.incarnation, self._base_of(row),
                                     partial(self._load_live_turns, row.session_id, row.incarnation), owner.token)
            ctx._saved(len(ctx._pending()), row.metadata, binding)
        return ctx

    def finish_compaction(self, session: SessionContext, summary: Message, payload: Mapping[str, Any]) -> list[Event]:
        """Store ``summary`` (a SYSTEM message with ``summary_through`` K) with its
        ``context.compacted`` event ``payload`` and mark the session idle, in one transaction.

        ``session``: the context :meth:`begin_compaction` returned (its lease must still hold).

        Raises:
            SessionBusyError: the lease was lost (another process recovered the session).
            SessionDeletedError: the session was deleted meanwhile.
            ValueError: ``summary`` is not a summary of turns within the session.
        """
        through = summary.summary_through
        if summary.role is not Role.SYSTEM or through is None:
            raise ValueError("the summary must be Message.summary(text, through)")
        binding = session._binding
        with self._write() as tx:
            row = tx.get_row(session.session_id)
            if row is None or binding is None or row.incarnation != binding.incarnation:
                raise SessionDeletedError(f"session {session.session_id} was deleted", session_id=session.session_id)
            if row.owner is None or row.owner.token != binding.lease or row.status is not SessionStatus.RUNNING:
                raise SessionBusyError(f"session {session.session_id!r} is busy: the compaction lost the session",
                                       session_id=session.session_id)
            if not 1 <= through <= row.turn_count:
                raise ValueError(f"turn {through} is not a turn of session {session.session_id} (1..{row.turn_count})")
            from ..tokens import message_tokens

            first = max(1, row.turn_count - row.max_turns + 1, through + 1)
            kept = [m for _, m in tx.window(row.session_id, first) if m.summary_through is None]
            data = {**payload, "through": through,
                    "tokens_after": sum(message_tokens(m) for m in kept) + message_tokens(summary)}
            event = self._append(tx, row.session_id, EventType.CONTEXT_COMPACTED.value, data, None)
            tx.insert_message(row.session_id, 0, summary, event.seq)
            ctx = self._context(tx, row, quiet=True, lease=binding.lease)
            ctx.set_status(SessionStatus.IDLE, "compaction finished")
            events = [event, *self._apply(tx, row, ctx._pending())]
        self._notify_turn_ended()
        return events
