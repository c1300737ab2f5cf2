"""Starting turns (leases, recovery, idempotent retries), interrupts, the turn queue and the model endpoint."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from ..dsn import url_without_userinfo
from ..errors import IdempotencyConflictError, PendingToolCallsError, SessionBusyError, UsageError
from ..events import Event, EventType, SessionStatus
from ..messages import Attachment, Message, Role
from ._checks import _check_idempotency_key, _check_max_turns, _check_metadata, _check_session_id, _check_text, json_sha256
from ._claims import _Claims
from ._journal import ContextStore
from ._listing import SessionLookup
from ._port import _MessageRecord, _SessionRow, _Tx, _busy_message, Owner
from ._tool_results import _ToolResults
from ._twins import async_twin
from .context import SessionContext
from .values import MessageState, TurnStart


#: Outcomes of a first attempt that produced no result: the same idempotency key with the
#: same message runs the turn again (see :class:`TurnStart`).
_RETRYABLE_OUTCOMES = frozenset({"failed", "interrupted", "rolled_back"})


@runtime_checkable
class TurnStore(ContextStore, SessionLookup, Protocol):
    """What the Runner needs of a store to run turns: start one (claiming the session, or
    waiting in its queue), save its messages and events, take custom tool results, end its
    lease; and the stored window's size, for compaction."""

    def set_agent_resolver(self, resolver: Callable[[str], Any] | None) -> None:
        """Map a stored agent name back to the Agent on load."""
        ...

    def begin_turn(
        self,
        session_id: str,
        *,
        default_agent: Any,
        user_message: Message | None,
        owner: Owner,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        max_turns: int | None = None,
        system: str | None = None,
        message_id: str | None = None,
        message_claim: str | None = None,
        ticket: int | None = None,
        enqueue: bool = False,
    ) -> TurnStart:
        """Start (or continue, or replay) a turn in one transaction."""
        ...

    def append_event(
        self,
        session_id: str,
        type: EventType | str,
        payload: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Event:
        """Append one custom (non-reserved) event."""
        ...

    def submit_tool_result(self, session_id: str, tool_use_id: str, output: str, *, is_error: bool = False,
                           attachments: Sequence[Attachment] = ()) -> list[str]:
        """Record a custom tool's result (an error result with ``is_error``; the images a tool
        returned as ``attachments``); the tool-call ids still unanswered."""
        ...

    def submitted_tool_results(self, session_id: str) -> dict[str, str]:
        """Results already submitted for the open turn's pending tool calls, by tool-call id."""
        ...

    def window_tokens(self, session_id: str) -> tuple[int, list[tuple[int, int]]]:
        """``(tokens, [(turn number, tokens), ...])`` of the stored context window, oldest first."""
        ...

    def turn_may_start(self, session_id: str, ticket: int | None = None) -> bool:
        """A read-only look: False while a live owner or an earlier waiter holds the session."""
        ...

    def running_turn_pid(self, session_id: str) -> int | None:
        """The pid of the live owner running the session's turn, or None."""
        ...

    def leave_turn_queue(self, session_id: str, ticket: int) -> None:
        """Give up a place in the session's turn queue."""
        ...

    def wait_turn_ended(self, timeout: float) -> None:
        """Sleep until a turn of this store object ends, at most ``timeout`` seconds."""
        ...

    def end_lease(self, owner_token: str, *, stored: bool) -> None:
        """The run holding ``owner_token`` (a turn, or a message claim) is over."""
        ...


class _Turns(_Claims, _ToolResults):
    """Turn start, interrupts, the turn queue and the endpoint a session talks to."""

    # -- turns -------------------------------------------------------------------------
    def begin_turn(
        self,
        session_id: str,
        *,
        default_agent: Any,
        user_message: Message | None,
        owner: Owner,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        max_turns: int | None = None,
        system: str | None = None,
        message_id: str | None = None,
        message_claim: str | None = None,
        ticket: int | None = None,
        enqueue: bool = False,
    ) -> TurnStart:
        """Start (or continue) a turn in one transaction; see the design notes and events.py.

        In this order: recovers a dead owner's turn (``turn.interrupted`` +
        ``session.recovered``; a turn started under an idempotency key or a message id is
        then also taken out of the context window, ``turn.failed``, so its retry replaces
        it); replays a processed ``message_id`` (the turn it started) or waits for one
        another live holder claimed (SessionBusyError); creates the session when new (with
        ``system`` as its first message); replays a repeated idempotency key whose first
        attempt has a result; refuses a terminated session (SessionTerminatedError), one a
        live owner runs or for which earlier callers queue (SessionBusyError -- or, with
        ``enqueue=True`` and no ``ticket``, a :class:`TurnStart` whose ``queued`` is this
        caller's ticket; callers with a ticket start in ticket order); refuses a user
        message while tool calls wait (PendingToolCallsError); then marks the session
        ``running`` under ``owner``, appends the user message and, with ``message_id``,
        records the claim as held by ``owner`` for this turn: it becomes processed when
        the turn completes and free again when it fails or is interrupted.
        ``message_claim``: the owner token of a claim this caller made with
        :meth:`claim_message`. ``user_message=None`` continues the open turn once every
        pending tool result was submitted.

        Raises:
            TypeError: ``user_message`` is not a USER :class:`Message` or None, or another
                argument has the wrong type.
            SessionBusyError: a live owner runs the session, earlier callers queue for it, or
                another live holder processes ``message_id``.
            SessionTerminatedError: the session is terminated.
            IdempotencyConflictError: the key was used with another message.
            PendingToolCallsError: a user message while tool calls wait for results, or a
                continuation while some results are missing.
            UsageError: a continuation with no open turn, or text that is not valid Unicode.
        """
        _check_session_id(session_id)
        if user_message is not None and (not isinstance(user_message, Message) or user_message.role is not Role.USER):
            raise TypeError("user_message must be a USER Message or None")
        if max_turns is not None:
            _check_max_turns(max_turns)
        if metadata is not None:
            metadata = _check_metadata(metadata)
        if idempotency_key is not None:
            _check_idempotency_key(idempotency_key)
        if message_id is not None:
            self._check_message_id(message_id)
        if user_message is not None:
            _check_text(user_message.to_dict(), "user message", session_id)
        digest = json_sha256(user_message.to_dict() if user_message is not None else None)
        with self._write() as tx:
            now = self.clock()
            events: list[Event] = []
            row = tx.get_row(session_id)
            if row is not None and row.status is SessionStatus.RUNNING and row.owner is not None:
                if not row.owner.alive():  # first, so a retry sees the dead attempt closed
                    events += self._recover(tx, row, default_agent)
            if message_id is not None and user_message is not None:
                replay = self._message_replay(tx, session_id, row, message_id, message_claim, default_agent, now)
                if replay is not None:
                    if ticket is not None:
                        tx.queue_remove(session_id, ticket)
                    replay.events = events
                    return replay
            if row is None:
                row = self._new_row(session_id, default_agent, max_turns, metadata)
                events += self._create(tx, row, system)
            elif idempotency_key is not None:
                known = tx.idempotency_get(session_id, idempotency_key)
                if known is not None:
                    if known[0] != digest:
                        raise IdempotencyConflictError(
                            f"idempotency key {idempotency_key!r} was used with another message",
                            session_id=session_id,
                        )
                    turn = int(known[1] or 0)
                    outcome = self._outcome(tx, row, turn, known[2])
                    if outcome["outcome"] not in _RETRYABLE_OUTCOMES:
                        if ticket is not None:
                            tx.queue_remove(session_id, ticket)
                        replay_start = TurnStart(self._context(tx, row, default_agent), turn, outcome, events)
                        self._detach(replay_start.session)
                        return replay_start
                    # the first attempt gave no result: run the message again; the key then
                    # maps to this attempt (idempotency_put below replaces the old record)
            self._refuse_terminated(row)
            self._refuse_archived(row)
            busy = row.status is SessionStatus.RUNNING and row.owner is not None
            ahead = []
            for waiter, waiter_owner in tx.queue_list(session_id):
                if not waiter_owner.alive():
                    tx.queue_remove(session_id, waiter)
                elif ticket is None or waiter < ticket:
                    ahead.append(waiter)
            if busy or ahead:
                if enqueue and ticket is None:
                    queued = tx.queue_add(session_id, owner, now)
                    waiting = TurnStart(self._context(tx, row, default_agent, effective=True), 0, None, events, queued)
                    self._detach(waiting.session)
                    return waiting
                if busy:
                    raise SessionBusyError(_busy_message(session_id, row.owner, tx), session_id=session_id,
                                           pid=row.owner.pid if row.owner is not None else None)
                raise SessionBusyError(
                    f"session {session_id!r} is busy: {len(ahead)} earlier turn(s) wait for it", session_id=session_id
                )
            if ticket is not None:
                tx.queue_remove(session_id, ticket)
            ctx = self._context(tx, row, default_agent)
            if metadata and any(ctx.metadata.get(k) != v for k, v in metadata.items()):
                ctx.update_metadata(metadata)
            pending = ctx.pending_tool_calls
            if user_message is not None:
                if pending:
                    submitted = self._submitted(tx, session_id)
                    missing = [c.id for c in pending if c.id not in submitted]
                    if missing:  # only the ids still to answer, never those already submitted
                        text = _waits_text(tx, session_id, ctx.turn_count, missing)
                    else:
                        text = (
                            f"session {session_id} has every tool result of turn {ctx.turn_count}: continue that "
                            "turn (Runner.submit_tool_result, or begin_turn with user_message=None) first"
                        )
                    raise PendingToolCallsError(text, tool_use_ids=missing, session_id=session_id)
                ctx.set_status(SessionStatus.RUNNING, "turn started", owner=owner.to_dict())
                ctx.add_message(user_message)
            else:
                if not pending:
                    raise UsageError(f"session {session_id} has no open turn to continue", session_id=session_id)
                submitted = self._submitted(tx, session_id)
                missing = [c.id for c in pending if c.id not in submitted]
                if missing:
                    raise PendingToolCallsError(
                        f"session {session_id} still waits for tool results {', '.join(missing)}",
                        tool_use_ids=missing,
                        session_id=session_id,
                    )
                ctx.set_status(SessionStatus.RUNNING, "turn continued", owner=owner.to_dict())
                for call in pending:
                    output, is_error, attached = submitted[call.id]
                    ctx.add_message(Message.tool(call.id, output, name=call.name, is_error=is_error,
                                                 attachments=attached))
            journal = ctx._pending()
            new_events = self._apply(tx, row, journal)
            events += new_events
            row.owner = owner
            tx.update_row(row)
            turn = ctx.turn_count
            if idempotency_key is not None and user_message is not None:
                first_seq = next(e.seq for e in new_events if e.type == EventType.MESSAGE_USER.value)
                tx.idempotency_put(session_id, idempotency_key, digest, turn, first_seq, self.clock())
            if message_id is not None and user_message is not None:
                tx.processed_purge(now, self._dedup_ttl_s)
                tx.processed_put(message_id, _MessageRecord("in_progress", now, owner, session_id, turn))
            # The window is loaded once: the context that made the change becomes what a fresh
            # load would give (a second load cost as much as the first, ~1 ms for 40 turns).
            # This run holds the lease: its status changes are never stale.
            binding = ctx._binding
            assert binding is not None
            binding = replace(binding, store_id=id(self), incarnation=row.incarnation, base=self._base_of(row),
                              lease=owner.token)
            if not ctx._saved(len(journal), row.metadata, binding, stored=(row.turn_count, row.status)):
                ctx = self._context(tx, row, default_agent, lease=owner.token)
        return TurnStart(self._detach(ctx), turn, None, events)

    abegin_turn = async_twin(begin_turn)

    def _outcome(self, tx: _Tx, row: _SessionRow, turn: int, seq: int) -> dict[str, Any]:
        # The first ending of the turn after the key's message: a turn number is used again
        # after a failure, so a later ending may belong to another message.
        ends: list[tuple[int, str, Event]] = []
        for type, outcome in (
            (EventType.TURN_COMPLETED, "completed"),
            (EventType.TURN_FAILED, "failed"),
            (EventType.TURN_INTERRUPTED, "interrupted"),
        ):
            first = next((e for e in tx.events_of_type(row.session_id, type.value, seq) if e.payload.get("turn") == turn),
                         None)
            if first is not None:
                ends.append((first.seq, outcome, first))
        if ends:
            _, outcome, event = min(ends, key=lambda end: end[0])
            if outcome == "completed":
                return {**event.payload, "outcome": "completed"}
            return {"turn": turn, "outcome": outcome}
        rollback = tx.last_event(row.session_id, EventType.ROLLBACK.value, None, seq)
        if rollback is not None and int(rollback.payload.get("to_turn", 0)) < turn:
            return {"turn": turn, "outcome": "rolled_back"}
        if self._effective_status(row) is SessionStatus.RUNNING:
            return {"turn": turn, "outcome": "running"}
        return {"turn": turn, "outcome": "pending"}

    def _message_replay(
        self,
        tx: _Tx,
        session_id: str,
        row: _SessionRow | None,
        message_id: str,
        claim: str | None,
        default_agent: Any,
        now: float,
    ) -> TurnStart | None:
        """The replay of a processed ``message_id``; SessionBusyError while another live holder
        has it in progress; None when this caller may run it (free, expired, or its own claim)."""
        record = tx.processed_get(message_id)
        state = self._state_of(record, now)
        if record is None or state is MessageState.NEW:
            return None
        if state is MessageState.IN_PROGRESS:
            assert record.holder is not None
            if claim is not None and record.holder.token == claim:
                return None
            raise SessionBusyError(
                f"message {message_id!r} is being processed by pid {record.holder.pid} on {record.holder.host}",
                session_id=session_id,
            )
        where = record.session_id or session_id
        source = row if where == session_id else tx.get_row(where)
        turn = record.turn or 0
        outcome: dict[str, Any] = {"turn": turn, "outcome": "completed", "content": None, "message_id": message_id}
        if source is None:
            ctx = SessionContext(where, default_agent)
        else:
            ctx = self._detach(self._context(tx, source, default_agent, effective=True))
            done = tx.last_event(where, EventType.TURN_COMPLETED.value, turn) if turn else None
            if done is not None:
                outcome = {**done.payload, "outcome": "completed", "message_id": message_id}
            elif turn and tx.last_event(where, EventType.TOOL_PENDING.value, turn) is not None:
                outcome = {"turn": turn, "outcome": "pending", "message_id": message_id}
        return TurnStart(ctx, turn, outcome)

    # -- the model endpoint a session talks to ---------------------------------------------
    def session_endpoint(self, session_id: str) -> tuple[str | None, str | None]:
        """The ``(model, base_url)`` stored with the session, ``(None, None)`` when none was.

        Front-ends store the model and endpoint a session was created with (never an API
        key) so that resuming it talks to the same server. The base URL comes back without
        any ``user:password@`` (:func:`~chatflow_cli.core.dsn.url_without_userinfo`), also
        from a database written before it was removed on write: such a row is redacted on
        each read and never migrated (it stays in the file until the endpoint is set again).
        Raises :class:`SessionNotFoundError` for an unknown session.
        """
        _check_session_id(session_id)
        with self._read() as tx:
            self._require(tx, session_id)
            model, base_url = tx.endpoint_get(session_id) or (None, None)
        return model, url_without_userinfo(base_url) if base_url is not None else None

    asession_endpoint = async_twin(session_endpoint)

    def set_session_endpoint(self, session_id: str, model: str | None, base_url: str | None) -> None:
        """Store the model name and base URL (``None``: not set) the session talks to.

        Values are strings of at most 2,048 characters; an API key has no place here, and a
        ``user:password@`` in ``base_url`` is left out (the one exception to a store giving
        back what it was given: a password is never written). Raises
        :class:`SessionNotFoundError`, or TypeError/ValueError for bad values.
        """
        _check_session_id(session_id)
        for name, value in (("model", model), ("base_url", base_url)):
            if value is not None:
                if not isinstance(value, str):
                    raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
                if len(value) > 2048:
                    raise ValueError(f"{name} is longer than 2048 characters")
                _check_text(value, name, session_id)
        if base_url is not None:
            base_url = url_without_userinfo(base_url)
        with self._write() as tx:
            self._require(tx, session_id)
            tx.endpoint_put(session_id, model, base_url, self.clock())

    aset_session_endpoint = async_twin(set_session_endpoint, writes=True)

    # -- interrupting a running turn ---------------------------------------------------
    def request_interrupt(self, session_id: str) -> int | None:
        """Ask the process running ``session_id``'s turn -- in this process, another one or on
        another host -- to stop it: a ``turn.interrupt_requested`` event naming the turn and
        its owner. The Runner running it notices within ``INTERRUPT_POLL_S`` and stops at the
        next chunk or tool boundary, as after Ctrl-C: the partial reply is kept, open tool
        calls get the synthetic result, the turn is ``turn.interrupted`` and the session idle.

        Returns the turn asked to stop, or None when no live owner runs a turn (nothing is
        written then). Raises :class:`SessionNotFoundError`.
        """
        _check_session_id(session_id)
        with self._write() as tx:
            row = self._require(tx, session_id)
            if row.status is not SessionStatus.RUNNING or row.owner is None or not row.owner.alive():
                return None
            turn = row.turn_count
            payload = {"turn": turn, "owner": row.owner.token}
            self._append(tx, session_id, EventType.TURN_INTERRUPT_REQUESTED.value, payload, turn)
            row.updated_at = self.clock()
            tx.update_row(row)
        return turn

    arequest_interrupt = async_twin(request_interrupt, writes=True)

    def interrupt_requested(self, session_id: str, owner_token: str) -> bool:
        """True once :meth:`request_interrupt` asked the turn that ``owner_token``'s run holds
        to stop (a read; the Runner polls it while a turn runs)."""
        with self._read() as tx:
            row = tx.get_row(session_id)
            if row is None or row.status is not SessionStatus.RUNNING or row.owner is None:
                return False
            if row.owner.token != owner_token:
                return False
            asked = tx.last_event(session_id, EventType.TURN_INTERRUPT_REQUESTED.value, row.turn_count)
        return asked is not None and asked.payload.get("owner") == owner_token

    # -- turn queue --------------------------------------------------------------------
    def turn_may_start(self, session_id: str, ticket: int | None = None) -> bool:
        """A read-only look: False while a live owner runs the session or a live waiter with an
        earlier ticket (any, for ``ticket=None``) waits for it. Waiters poll this, not
        :meth:`begin_turn`, so waiting never takes the write lock."""
        with self._read() as tx:
            row = tx.get_row(session_id)
            if row is None:
                return True
            if row.status is SessionStatus.RUNNING and row.owner is not None and row.owner.alive():
                return False
            return not any(
                (ticket is None or waiter < ticket) and owner.alive() for waiter, owner in tx.queue_list(session_id)
            )

    def running_turn_pid(self, session_id: str) -> int | None:
        """The process id of the live owner running ``session_id``'s turn, or ``None`` when no
        turn runs (or the session does not exist): the same read-only look as
        :meth:`turn_may_start`, so a waiter can say whom it waits for."""
        with self._read() as tx:
            row = tx.get_row(session_id)
            if row is None or row.status is not SessionStatus.RUNNING or row.owner is None or not row.owner.alive():
                return None
            return int(row.owner.pid)

    def leave_turn_queue(self, session_id: str, ticket: int) -> None:
        """Give up the place ``ticket`` (from :meth:`begin_turn` with ``enqueue=True``) holds."""
        with self._write() as tx:
            tx.queue_remove(session_id, ticket)
        self._notify_turn_ended()

    def end_lease(self, owner_token: str, *, stored: bool) -> None:
        """The run holding ``owner_token`` -- a turn :meth:`begin_turn` started, or a message
        claim -- is over, by whatever path (completed, failed, interrupted, cancelled, or an
        error of the store itself). The Runner calls it when a turn ends; nothing is written.

        ``stored``: the run's ending (or the claim's release) was written. When it was not
        (the database was down), the owner counts as dead in this process from now on, so
        the next :meth:`begin_turn` recovers the turn at once and the claim is free again,
        instead of both looking held by a live process. A store with leases
        (PostgreSQL) stops renewing the lease either way, and when ``stored`` is False
        expires it as soon as the database answers, for other hosts too.
        """
        if not stored:
            Owner.end_run(owner_token)
        self._notify_turn_ended()

    def wait_turn_ended(self, timeout: float) -> None:
        """Sleep until a turn of this store object ends or a waiter leaves, at most ``timeout`` s."""
        with self._turn_ended:
            self._turn_ended.wait(timeout)


def _waits_text(tx: Any, session_id: str, turn: int, missing: list[str]) -> str:
    """What the open turn waits for: approvals (``--approve``/``--deny``, as the turn's
    ``tool.pending`` lists them), custom tool results, or both."""
    event = tx.last_event(session_id, EventType.TOOL_PENDING.value, turn)
    asking = {str(i) for i in (event.payload.get("approval") or ())} if event is not None else set()
    approvals = [i for i in missing if i in asking]
    results = [i for i in missing if i not in asking]
    parts = []
    if approvals:
        parts.append(f"an approval of {', '.join(approvals)} (--approve ID or --deny ID)")
    if results:
        parts.append(f"tool results {', '.join(results)}")
    return f"session {session_id} waits for {' and '.join(parts)}"
