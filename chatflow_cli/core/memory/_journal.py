"""Loading and saving sessions, the event log, and edits outside a Runner turn."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Generic, Protocol, runtime_checkable

from ..errors import IdempotencyConflictError, SessionBusyError, SessionDeletedError, UsageError
from ..events import Event, EventType, SessionStatus, event_type_name, is_reserved_event_type, use_instead
from ..messages import Message
from ._checks import _check_idempotency_key, _check_max_turns, _check_metadata, _check_session_id, _check_text, json_sha256
from ..resources.mounts import Mount, mounts_at
from ..typevars import T
from ._core import _StoreCore, _unbound, mount_log
from ._listing import SessionLookup
from ._port import _busy_message
from ._twins import async_twin
from .context import SessionBinding, SessionContext, Turn
from .values import TurnRecord


@dataclass(slots=True)
class EditResult(Generic[T]):
    """What :meth:`BaseSessionStore.edit` returns: the change's ``value``, the ``events``
    appended, ``replayed`` (the idempotency key was applied before: nothing changed) and
    ``missing`` (no such session and nothing to create it with)."""

    value: T | None
    events: list[Event] = field(default_factory=list)
    replayed: bool = False
    missing: bool = False
    position: tuple[str, int] | None = None  #: the log position after the edit (see ``log_position``)
    before: tuple[str, int] | None = None  #: the log position the change was applied at
    max_turns: int | None = None  #: the stored session's context window after the edit, in turns


class _RolledBack(Exception):
    """Raised inside a dry-run edit's transaction, so the store rolls it back; carries the result."""

    def __init__(self, result: EditResult[Any]) -> None:
        super().__init__("dry run")
        self.result = result


@runtime_checkable
class ContextStore(Protocol):
    """Loading a session's context and saving what it journalled: the Runner's turns and the
    edits outside them both work on a :class:`SessionContext`."""

    def get(self, session_id: str) -> SessionContext | None:
        """The session's context, or None when absent."""
        ...

    def save(self, session: SessionContext) -> list[Event]:
        """Apply the context's journal in one transaction; the events appended."""
        ...


@runtime_checkable
class EditStore(ContextStore, SessionLookup, Protocol):
    """What changes a stored session outside a Runner turn: imports (``sessions import``),
    edits, rollback (``sessions rollback``, ``/rollback``), deletion, the stored endpoint."""

    def get_or_create(
        self,
        session_id: str,
        default_agent: Any,
        max_turns: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionContext:
        """Load the session, or create it with ``default_agent``."""
        ...

    def edit(
        self,
        session_id: str,
        change: Callable[[SessionContext], T],
        *,
        create_agent: Any = None,
        max_turns: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        digest: str = "",
        last_turns: int | None = None,
        idempotency_keys: Mapping[str, str] | None = None,
        dry_run: bool = False,
        created_at: float | None = None,
        updated_at: float | None = None,
    ) -> EditResult[T]:
        """Load the session, apply ``change`` to it and save it, in one write transaction."""
        ...

    def rollback(self, session_id: str, to_turn: int | None = None, *, last: int | None = None) -> list[Event]:
        """Keep turns 1..``to_turn``, or remove the newest ``last`` turns, in one transaction."""
        ...

    def delete(self, session_id: str) -> bool:
        """Delete the session with its whole log; False when there was none."""
        ...

    def set_session_endpoint(self, session_id: str, model: str | None, base_url: str | None) -> None:
        """Store the model name and base URL the session talks to."""
        ...

    def turn_count(self, session_id: str) -> int:
        """The number of the session's last live turn (0 when it has none or does not exist)."""
        ...

    def log_position(self, session_id: str) -> tuple[str, int] | None:
        """``(incarnation, last seq)`` of the session's log, or None when it does not exist."""
        ...

    def window_turns(self, session_id: str) -> tuple[Turn, ...]:
        """The turns of the session's context window, read without resolving its agent."""
        ...

    def idempotency_digests(self, session_id: str, keys: Sequence[str]) -> dict[str, str]:
        """The keys of ``keys`` already used in the session, with the digest kept with each."""
        ...


class _Journal(_StoreCore):
    """Sessions as contexts (get, save, edit, delete), the event log and turn history reads."""

    # -- sessions ----------------------------------------------------------------------
    def get(self, session_id: str) -> SessionContext | None:
        """The session's context (window loaded with an indexed query), or None when absent.

        ``status`` is effective, as in :meth:`list_sessions`: a dead owner's ``running``
        shows ``idle``. Nothing is written; the next :meth:`begin_turn` recovers the turn
        (``turn.interrupted`` + ``session.recovered``).

        Raises:
            TypeError: ``session_id`` is not a str.
            UsageError: ``session_id`` is not valid Unicode text.
            SessionDeletedError: later, from the returned context's reads, once the session is deleted.
        """
        _check_session_id(session_id)
        with self._read() as tx:
            row = tx.get_row(session_id)
            ctx = None if row is None else self._context(tx, row, effective=True)
        return None if ctx is None else self._detach(ctx)

    aget = async_twin(get)

    def get_or_create(
        self,
        session_id: str,
        default_agent: Any,
        max_turns: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionContext:
        """Load the session, or create it (``session.created`` event) with ``default_agent``.

        ``max_turns`` (default: the store's ``default_max_turns``) and ``metadata`` apply
        only to a new session. ``status`` is effective, as in :meth:`get`. ``metadata``: a
        dict with str keys and JSON-serialisable values (TypeError otherwise).

        Raises:
            TypeError: ``session_id`` is not a str, ``max_turns`` not an int, ``metadata`` not a
                JSON-serialisable dict with str keys.
            ValueError: ``session_id`` is empty (creating), ``max_turns`` outside 1..1,000,000.
            UsageError: text that is not valid Unicode (a lone surrogate).
        """
        _check_session_id(session_id)
        if max_turns is not None:
            _check_max_turns(max_turns)
        if metadata is not None:
            metadata = _check_metadata(metadata)
        with self._read() as tx:
            row = tx.get_row(session_id)
            if row is not None:
                return self._detach(self._context(tx, row, default_agent, effective=True))
        with self._write() as tx:
            row = tx.get_row(session_id)
            if row is None:
                row = self._new_row(session_id, default_agent, max_turns, metadata)
                self._create(tx, row)
            ctx = self._context(tx, row, default_agent, effective=True)
        return self._detach(ctx)

    aget_or_create = async_twin(get_or_create)

    def save(self, session: SessionContext) -> list[Event]:
        """Apply the context's journal in one transaction; return the events appended.

        A context never stored before is created. Raises :class:`SessionDeletedError`
        when the session was deleted since it was loaded, :class:`SessionTerminatedError`
        once it is terminated; nothing is written then.

        Concurrent writers (a context loaded before another writer saved):

        * metadata changes are a patch of the keys set (or deleted) on this context, merged
          into the stored metadata -- another writer's keys are kept; afterwards
          ``session.metadata`` is the stored, merged dict;
        * a turn change (new messages) from a stale window raises :class:`SessionBusyError`;
        * so does a status or handoff change when the stored status, owner or agent changed
          since this context was loaded ("changed since it was loaded") -- except for the
          context :meth:`begin_turn` returned to the run that still holds the lease;
        * the context :meth:`begin_turn` returned saves only while its run holds the lease
          (the session is ``running`` under its owner token) until it saved the turn's end:
          when the turn ended meanwhile (a save that committed, then raised), or another
          process recovered it as dead (a worker cut off from the database past its lease),
          any change from it raises :class:`SessionBusyError` and nothing is written -- a
          late reply never lands in the turn that replaced it, nor ends a turn twice.

        Raises:
            SessionDeletedError: the session was deleted since the context was loaded.
            SessionTerminatedError: the session is terminated.
            SessionBusyError: the changes were made from a stale window or base (see above), or a
                context made by hand names a session that already exists.
        """
        ops = session._pending()
        bound = session._binding
        with self._write() as tx:
            row = tx.get_row(session.session_id)
            events: list[Event] = []
            if bound is not None:
                if row is None or row.incarnation != bound.incarnation:
                    raise SessionDeletedError(
                        f"session {session.session_id} was deleted", session_id=session.session_id
                    )
            elif row is None:  # created with the agent it started with: its journal holds the handoffs since
                row = self._new_row(session.session_id, session._created_agent, session.max_turns, session.metadata)
                events += self._create(tx, row)
            else:
                raise SessionBusyError(
                    f"session {session.session_id!r} is busy: it already exists in the store; load it with get()",
                    session_id=session.session_id,
                )
            if ops:
                self._refuse_terminated(row)
                self._refuse_lost_lease(session, row)
                self._refuse_stale_base(session, row, ops)
            events += self._apply(tx, row, ops)
        if any(op.kind == "status" for op in ops):
            self._notify_turn_ended()
        if bound is None:  # stored for the first time
            bound = SessionBinding(id(self), row.incarnation, self._base_of(row),
                                   partial(self._load_live_turns, row.session_id, row.incarnation),
                                   agents=partial(self._read_agent_trail, row.session_id, row.incarnation),
                                   resolve=self._resolve_agent)
        binding = replace(bound, store_id=id(self), incarnation=row.incarnation, base=self._base_of(row))
        rolled_back = any(op.kind == "rollback" for op in ops)
        session._saved(len(ops), row.metadata, binding, agent=row.active_agent_name if rolled_back else None)
        return events

    asave = async_twin(save, writes=True)

    @staticmethod
    def _refuse_lost_lease(session: SessionContext, row: Any) -> None:
        """SessionBusyError when ``session`` is the context of a run (``begin_turn``'s, with a
        lease) that still believes it runs the session -- it has not saved the turn's end --
        while the stored session is no longer ``running`` under that owner token: the turn
        ended already (a save that committed but raised), or another process recovered it."""
        binding = session._binding
        lease = binding.lease if binding is not None else None
        if lease is None or binding is None or binding.base[0] is not SessionStatus.RUNNING or binding.base[1] != lease:
            return  # no run, or its end was saved: an ordinary context now (stale checks apply)
        if row.status is SessionStatus.RUNNING and row.owner is not None and row.owner.token == lease:
            return
        raise SessionBusyError(
            f"session {row.session_id!r}: this turn no longer holds the session (it ended, or another process "
            "recovered it as dead after its lease ran out); nothing of it was written",
            session_id=row.session_id,
        )

    def release(
        self, /, session: SessionContext, status: SessionStatus | str = SessionStatus.IDLE, reason: str = "", **extra: Any
    ) -> list[Event]:
        """End a run: ``session.set_status(status, reason, **extra)`` then :meth:`save`."""
        session.set_status(status, reason, **extra)
        return self.save(session)

    arelease = async_twin(release, writes=True)

    def delete(self, session_id: str) -> bool:
        """Delete the session with its messages, events and keys; False when there was none.

        A task still holding its context gets :class:`SessionDeletedError` on its next
        store read or write.

        Raises:
            TypeError: ``session_id`` is not a str.
        """
        _check_session_id(session_id)
        with self._write() as tx:
            return tx.delete_row(session_id)

    adelete = async_twin(delete, writes=True)

    def message_tokens(self, session_id: str) -> dict[int, int]:
        """The stored token count of every message of the session's turns and SYSTEM messages
        (removed ones too), by the seq of the event that recorded it: what a lossless export
        keeps beside the events, since a provider's count is not an estimate an import could
        make again. SessionNotFoundError when absent."""
        _check_session_id(session_id)
        with self._read() as tx:
            self._require(tx, session_id)
            stored = tx.turn_messages(session_id, 0, None, True)
        return {item.seq: item.message.tokens for item in stored
                if item.seq is not None and item.message.tokens is not None}

    def load_turns(
        self, session_id: str, first: int = 1, last: int | None = None, include_rolled_back: bool = False
    ) -> list[TurnRecord]:
        """Stored turns first..last (for ``sessions show``); SessionNotFoundError when absent.

        Returns:
            :class:`TurnRecord` items in turn order; with ``include_rolled_back``, a removed turn
            comes before the live turn of the same number.

        Raises:
            SessionNotFoundError: no such session.
        """
        _check_session_id(session_id)
        with self._read() as tx:
            row = self._require(tx, session_id)
            stored = tx.turn_messages(session_id, first, last, include_rolled_back)
            window_first = self._window_first(tx, row)
            ends = tx.turn_events(session_id, EventType.TURN_COMPLETED.value, max(first, 1), last) if stored else []
            rollbacks = tx.events_of_type(session_id, EventType.ROLLBACK.value, 0) if ends else []
            mounts = mount_log(tx, session_id) if stored else []
            finals = sorted([*ends, *(e for kind in (EventType.TURN_FAILED, EventType.TURN_INTERRUPTED)
                                      for e in tx.turn_events(session_id, kind.value, max(first, 1), last))],
                            key=lambda e: e.seq) if mounts else []
        groups: dict[tuple[int, int | None, str | None], list[Message]] = {}
        starts: dict[tuple[int, int | None, str | None], int] = {}
        for item in stored:
            key = (item.turn, item.removed_at_seq, item.removed)
            groups.setdefault(key, []).append(item.message)
            if item.seq is not None:
                starts[key] = min(starts.get(key, item.seq), item.seq)
        runs = sorted(seq for (number, _, _), seq in starts.items() if number > 0)  # where each run began
        records = []
        for key, msgs in groups.items():
            turn, removed_at, reason = key
            done = _completion(ends, rollbacks, turn, removed_at)
            records.append(TurnRecord(
                turn,
                tuple(msgs),
                in_window=reason is None and (turn == 0 or turn >= window_first),
                rolled_back=reason == "rolled_back",
                failed=reason == "failed",
                model=_text(done.payload.get("model")) if done is not None else None,
                base_url=_text(done.payload.get("base_url")) if done is not None else None,
                resources=_ran_with(mounts, finals, turn, starts.get(key), runs),
            ))
        records.sort(key=lambda r: (r.number, r.rolled_back is False and r.failed is False))
        return records

    aload_turns = async_twin(load_turns)

    # -- events ------------------------------------------------------------------------
    def events(self, session_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        """Events with ``seq > after_seq`` in seq order, at most ``limit`` (the ``replay`` cursor).

        Raises :class:`SessionNotFoundError` when the session does not exist. ``seq`` is per
        incarnation: after ``delete(session_id)`` and a new session under the same id, the
        log starts again at 1, so a cursor kept across the delete must be reset to 0.
        """
        _check_session_id(session_id)
        with self._read() as tx:
            self._require(tx, session_id)
            return tx.events(session_id, after_seq, limit)

    aevents = async_twin(events)

    def last_seq(self, session_id: str) -> int:
        """The session's newest event seq (SessionNotFoundError when absent)."""
        _check_session_id(session_id)
        with self._read() as tx:
            self._require(tx, session_id)
            return tx.next_seq(session_id) - 1

    alast_seq = async_twin(last_seq)

    def append_event(
        self,
        session_id: str,
        type: EventType | str,
        payload: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Event:
        """Append one custom event. A repeated ``idempotency_key`` with the same type and payload
        returns the original event; with another payload, :class:`IdempotencyConflictError`.
        Nothing is written in either case.

        ``type``: a non-empty str (TypeError otherwise). Reserved types — those chatflow
        writes and derives state from: ``status``, ``rollback``, ``handoff``, and every type
        starting with ``message.``, ``tool.``, ``turn.``, ``session.`` or ``metadata.``
        (``RESERVED_EVENT_PREFIXES``) — raise :class:`UsageError` naming the method to use,
        since an event appended here would never be applied and the log would contradict
        the session. Anything else (``"note"``, ``"billing.refund"``…) is accepted.

        ``payload``: a dict with str keys and JSON-serialisable values (TypeError otherwise),
        stored as its JSON copy in both stores; text must be valid Unicode (UsageError).

        Raises:
            TypeError: a bad ``type``, ``payload`` or ``idempotency_key``.
            UsageError: a reserved ``type``, or text that is not valid Unicode.
            IdempotencyConflictError: the key was used with another type or payload.
            SessionNotFoundError: no such session.
            SessionTerminatedError: the session is terminated (a repeated key still replays).
        """
        _check_session_id(session_id)
        kind = event_type_name(type)
        if idempotency_key is not None:
            _check_idempotency_key(idempotency_key)
        if is_reserved_event_type(kind):
            raise UsageError(
                f"event type {kind!r} is reserved for chatflow's own events: use {use_instead(kind)}",
                session_id=session_id,
            )
        data = _check_metadata(payload if payload is not None else {}, "payload")
        if not kind.isascii():
            _check_text(kind, "event type", session_id)
        digest = json_sha256({"type": kind, "payload": data})
        with self._write() as tx:
            row = self._require(tx, session_id)
            if idempotency_key is not None:
                known = tx.idempotency_get(session_id, idempotency_key)
                if known is not None:
                    if known[0] != digest:
                        raise IdempotencyConflictError(
                            f"idempotency key {idempotency_key!r} was used with another payload", session_id=session_id
                        )
                    original = tx.events(session_id, known[2] - 1, 1)
                    return original[0]
            self._refuse_terminated(row)
            turn = data.get("turn") if isinstance(data.get("turn"), int) else None
            event = self._append(tx, session_id, kind, data, turn, idempotency_key)
            if idempotency_key is not None:
                tx.idempotency_put(session_id, idempotency_key, digest, None, event.seq, self.clock())
            row.updated_at = self.clock()
            tx.update_row(row)
            return event

    aappend_event = async_twin(append_event, writes=True)

    # -- edits outside a Runner turn (imports, Agents SDK sessions) --------------------
    def edit(
        self,
        /,
        session_id: str,
        change: Callable[[SessionContext], T],
        *,
        create_agent: Any = None,
        max_turns: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        digest: str = "",
        last_turns: int | None = None,
        idempotency_keys: Mapping[str, str] | None = None,
        dry_run: bool = False,
        created_at: float | None = None,
        updated_at: float | None = None,
    ) -> EditResult[T]:
        """Load the session, call ``change(session)`` and save what it journalled, all in one
        write transaction; return the change's result and the events appended.

        ``change`` uses the context's methods (``add_message``, ``rollback_to``,
        ``complete_turn``, ``set_active_agent``, ``record_event``...), so every rule and
        check of :meth:`save` applies, and the events of one edit have consecutive ``seq``.
        It runs inside the transaction: keep it short, with no network I/O. When it raises,
        nothing is written.

        ``create_agent``: an agent (or its name) to create the session with when it does not
        exist (``session.created``, with ``max_turns`` and ``metadata``); without it, a
        missing session gives ``EditResult(None, [], missing=True)`` and ``change`` is not
        called. ``idempotency_key``: an edit already applied under this key in the session
        is not applied again (``replayed=True``, ``change`` not called); ``digest`` is kept
        with the key. ``last_turns``: the context holds only the newest N turns (its
        ``max_turns`` is N; the stored session keeps its own): an edit that appends to the
        last turn then costs the same however long the session is. ``idempotency_keys``:
        more keys (key -> digest) recorded in the same transaction, read after the change
        ran (the change may fill the mapping).
        ``created_at`` (UTC epoch seconds): the creation time of a session this edit
        creates, instead of now; ``updated_at``: the session's last-activity time after the
        edit, instead of now (an import keeps its source's times, so ``list_sessions``
        orders and ``since`` filters imported history by when it happened).
        ``dry_run``: do all of it -- create, change, check, append -- then roll the
        transaction back: the result (and any error) is what the real edit would give, and
        nothing is written.

        Raises:
            SessionBusyError: a live run owns the session (its turn is running).
            SessionTerminatedError: the session is terminated.
        """
        _check_session_id(session_id)
        if idempotency_key is not None:
            _check_idempotency_key(idempotency_key)
        if max_turns is not None:
            _check_max_turns(max_turns)
        if metadata:  # {} needs no copy; anything else is checked before the transaction
            metadata = _check_metadata(metadata)
        try:
            return self._edit(session_id, change, create_agent, max_turns, metadata, idempotency_key, digest,
                              last_turns, idempotency_keys if idempotency_keys is not None else {}, dry_run,
                              (created_at, updated_at))
        except _RolledBack as done:
            return done.result

    aedit = async_twin(edit, writes=True)

    def _edit(
        self,
        session_id: str,
        change: Callable[[SessionContext], T],
        create_agent: Any,
        max_turns: int | None,
        metadata: Mapping[str, Any] | None,
        idempotency_key: str | None,
        digest: str,
        last_turns: int | None,
        idempotency_keys: Mapping[str, str],
        dry_run: bool,
        times: tuple[float | None, float | None] = (None, None),
    ) -> EditResult[T]:
        with self._write() as tx:
            row = tx.get_row(session_id)
            events: list[Event] = []
            created = row is None
            if row is None:
                if create_agent is None:
                    return EditResult(None, [], missing=True)
                row = self._new_row(session_id, create_agent, max_turns, metadata)
                events += self._create(tx, row)
            if idempotency_key is not None and tx.idempotency_get(session_id, idempotency_key) is not None:
                return EditResult(None, events, replayed=True)
            self._refuse_terminated(row)
            if row.status is SessionStatus.RUNNING and row.owner is not None and row.owner.alive():
                raise SessionBusyError(_busy_message(session_id, row.owner, tx), session_id=session_id)
            before = (row.incarnation, tx.next_seq(session_id) - 1)
            kept = None if created or last_turns is None else self._kept.take(row, before, last_turns)
            if kept is None:
                ctx = self._context(tx, row, quiet=True, last_turns=last_turns)
            else:
                ctx = kept.ctx
                ctx._binding = self._binding_in(tx, row)
                tx.assume_window(session_id, kept.marks)
            value = change(ctx)
            ops = ctx._pending()
            events += self._apply(tx, row, ops)
            if (created and times[0] is not None) or times[1] is not None:
                if created and times[0] is not None:
                    row.created_at = float(times[0])
                if times[1] is not None:
                    row.updated_at = float(times[1])
                tx.update_row(row)
            last_seq = events[-1].seq if events else before[1]
            if idempotency_key is not None:
                tx.idempotency_put(session_id, idempotency_key, digest, None, last_seq, self.clock())
            for key, key_digest in idempotency_keys.items():
                _check_idempotency_key(key)
                tx.idempotency_put(session_id, key, key_digest, None, last_seq, self.clock())
            result = EditResult(value, events, position=(row.incarnation, last_seq), before=before,
                                max_turns=row.max_turns)
            if dry_run:
                raise _RolledBack(result)  # leaves the transaction: it is rolled back
            marks = None
            if last_turns is not None:
                first = max(1, row.turn_count - min(row.max_turns, last_turns) + 1)
                marks = tx.window_marks(session_id, first, row.turn_count)
        if last_turns is not None and value is not ctx:  # committed: the next edit may start from here
            binding = SessionBinding(id(self), row.incarnation, self._base_of(row), _unbound)
            if ctx._saved(len(ops), row.metadata, binding, stored=(row.turn_count, row.status)):
                self._kept.put(ctx, row, (row.incarnation, last_seq), last_turns, marks)
        return result

    def window_turns(self, session_id: str) -> tuple[Turn, ...]:
        """The turns of the session's context window (``()`` when the session does not exist),
        read without resolving its agent."""
        _check_session_id(session_id)
        with self._read() as tx:
            row = tx.get_row(session_id)
            if row is None:
                return ()
            return self._context(tx, row, quiet=True).turns

    awindow_turns = async_twin(window_turns)

    def turn_count(self, session_id: str) -> int:
        """The number of the session's last live turn (0 when it has none or does not exist)."""
        _check_session_id(session_id)
        with self._read() as tx:
            row = tx.get_row(session_id)
            return 0 if row is None else row.turn_count

    def log_position(self, session_id: str) -> tuple[str, int] | None:
        """``(incarnation, last seq)`` of the session's log, or None when it does not exist.

        Two reads of the same session return the same position exactly when nothing was
        written to it in between (the incarnation changes when the id is deleted and made
        again): a cheap check that something read before is still current."""
        _check_session_id(session_id)
        with self._read() as tx:
            row = tx.get_row(session_id)
            return None if row is None else (row.incarnation, tx.next_seq(session_id) - 1)

    alog_position = async_twin(log_position)

    def window_dicts(self, session_id: str) -> tuple[tuple[str, int] | None, list[tuple[int, dict[str, Any]]]]:
        """The log position (see :meth:`log_position`) and the context window's messages as
        ``(turn, Message.to_dict() form)`` pairs, SYSTEM messages first (turn 0), read together;
        ``(None, [])`` when the session does not exist. For readers that need no
        :class:`Message` objects (the Agents SDK session's ``get_items``)."""
        _check_session_id(session_id)
        with self._read() as tx:
            row = tx.get_row(session_id)
            if row is None:
                return None, []
            position = (row.incarnation, tx.next_seq(session_id) - 1)
            return position, tx.window_dicts(session_id, max(1, row.turn_count - row.max_turns + 1))

    awindow_dicts = async_twin(window_dicts)

    def active_agent_name(self, session_id: str) -> str | None:
        """The name of the session's active agent; None when the session does not exist."""
        _check_session_id(session_id)
        with self._read() as tx:
            row = tx.get_row(session_id)
            return None if row is None else row.active_agent_name

    aactive_agent_name = async_twin(active_agent_name)


def _completion(ends: list[Event], rollbacks: list[Event], turn: int, removed_at: int | None) -> Event | None:
    """The ``turn.completed`` of one stored run of turn ``turn`` among ``ends``: the newest
    one (before ``removed_at``, the seq that took a removed run out) that no rollback below
    ``turn`` came after (that one completed an earlier run of the same number)."""
    for end in reversed(ends):
        if end.payload.get("turn") != turn or (removed_at is not None and end.seq >= removed_at):
            continue
        later = [r for r in rollbacks if end.seq < r.seq and (removed_at is None or r.seq < removed_at)]
        if any(int(r.payload.get("to_turn", 0) or 0) < turn for r in later):
            return None
        return end
    return None


def _ran_with(mounts: list[Event], finals: list[Event], turn: int, start: int | None,
              starts: list[int]) -> tuple[Mount, ...]:
    """The resources one stored run of ``turn`` ran with: the mounts in force at the event
    that ended it (the first ``turn.completed``, ``turn.failed`` or ``turn.interrupted`` of
    ``turn`` after its first message ``start``, before the next run began), or now when it
    has not ended. Turn 0 (the SYSTEM messages) ran nothing: ``()``."""
    if not mounts or turn == 0 or start is None:
        return ()
    following = next((s for s in starts if s > start), None)
    end = next((e.seq for e in finals if e.seq > start and e.payload.get("turn") == turn
                and (following is None or e.seq < following)), None)
    if end is None and following is not None:
        end = following - 1
    return tuple(mounts_at(mounts, end))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
