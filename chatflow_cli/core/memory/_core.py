"""The core every store-rules mixin derives from: the transaction port, agent resolution, and
the helpers that load a session's window and apply a context's journal in one transaction;
and the message claim made last in this thread or task (:func:`take_context_claim`), which
the message claims of ``_claims`` record and the Runner's next turn takes over."""

from __future__ import annotations

import contextvars
import copy
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Self

from ..errors import (
    SessionArchivedError,
    SessionBusyError,
    SessionDeletedError,
    SessionNotFoundError,
    SessionTerminatedError,
    UsageError,
)
from ..events import Event, EventType, SessionStatus
from ..messages import Message, Role
from ..resources.mounts import RESOURCE_MOUNTED, RESOURCE_UNMOUNTED, Mount, fold_mounts
from ..typevars import T
from ._checks import (
    DEFAULT_MAX_TURNS,
    TITLE_CHARS,
    _check_idempotency_key,
    _check_max_turns,
    _check_metadata,
    _check_session_id,
    _check_text,
    _fallback_agent,
    agent_name_of,
)
from ._port import (
    DEFAULT_DEDUP_TTL_HOURS,
    _PREVIEW_CHARS,
    _MessageRow,
    _SessionRow,
    TurnOwnerDied,
    _compacting,
    _Tx,
    logger,
    _ran,
    title_of,
    Owner,
)
from .context import AGENT_TRAIL_EVENTS, AgentTrail, JournalEntry, SessionBinding, SessionContext, restore_context
from .values import SessionSummary


#: The message id claimed last in this thread or asyncio task, with the claim's owner token
#: and the store's id: the next Runner turn started in the same context completes the claim
#: when the turn completes (and frees it when the turn fails), so
#: ``store.mark_message_processed(id)`` then ``runner.run_async(...)`` is safe as written.
_CLAIM: contextvars.ContextVar[tuple[int, str, str] | None] = contextvars.ContextVar("chatflow_claim", default=None)


def take_context_claim(store: Any) -> tuple[str, str] | None:
    """(message id, owner token) of the claim made last in this context on ``store``, once."""
    claim = _CLAIM.get()
    if claim is None or claim[0] != id(store):
        return None
    _CLAIM.set(None)
    return claim[1], claim[2]



#: Sessions per store whose last bounded edit keeps its context for the next (see _KeptContexts).
KEPT_EDIT_CONTEXTS = 64


def _unbound(first: int, last: int) -> dict[int, list[Message]]:
    """The loader of a context after its edit committed (the next edit rebinds a kept one).

    Raises:
        UsageError: always -- a change's context is used after its edit.
    """
    raise UsageError("the context of an edit was used after the edit: change a session inside store.edit()")


@dataclass(slots=True)
class _Kept:
    ctx: SessionContext
    position: tuple[str, int]  # (incarnation, last seq) of the log right after the edit
    last_turns: int
    marks: object | None  # the transaction's window_marks()


class _KeptContexts:
    """The context each recent bounded edit (``edit(..., last_turns=N)``) ended with, per session.

    The next edit of the session takes it instead of loading the window again when the log
    is where that edit left it -- the same incarnation and last ``seq``, read under the write
    lock -- and the row still says what the context holds (turn count, status, agent,
    metadata, agent versions): every change to a session appends an event, so any other
    writer, in this process or another, makes the next edit load afresh. A context is taken
    out while an edit uses it and put back only after that edit committed, saved and made to
    look freshly loaded; a change that raises, a dry run, or a change that returns the
    context itself leaves nothing kept. At most :data:`KEPT_EDIT_CONTEXTS` sessions, oldest
    dropped first.
    """

    def __init__(self, size: int = KEPT_EDIT_CONTEXTS) -> None:
        self.size = size
        self._kept: dict[str, _Kept] = {}
        self._lock = threading.Lock()

    def take(self, row: _SessionRow, position: tuple[str, int], last_turns: int) -> _Kept | None:
        """The kept context of ``row``'s session when it is still current, else None (dropped either way)."""
        with self._lock:
            kept = self._kept.pop(row.session_id, None)
        if kept is None or kept.position != position or kept.last_turns != last_turns:
            return None
        ctx = kept.ctx
        current = (
            not ctx._journal
            and ctx.turn_count == row.turn_count
            and ctx.status is row.status
            and ctx.max_turns == min(row.max_turns, last_turns)
            and agent_name_of(ctx.active_agent) == row.active_agent_name
            and ctx.metadata == row.metadata == ctx._saved_metadata
            and ctx._agent_versions == row.agent_versions
        )
        return kept if current else None

    def put(self, ctx: SessionContext, row: _SessionRow, position: tuple[str, int], last_turns: int,
            marks: object | None) -> None:
        if self.size <= 0:
            return
        if getattr(ctx.active_agent, "name", None) != row.active_agent_name:  # a name: an agent, as a load gives
            ctx._agent = _fallback_agent(row.active_agent_name)
        with self._lock:
            self._kept.pop(row.session_id, None)
            self._kept[row.session_id] = _Kept(ctx, position, last_turns, marks)
            while len(self._kept) > self.size:
                del self._kept[next(iter(self._kept))]


def mount_log(tx: Any, session_id: str) -> list[Event]:
    """The ``resource.mounted`` / ``resource.unmounted`` events of the stored session
    ``session_id`` (in the transaction ``tx``), in ``seq`` order: two indexed reads of the
    event log by type, one when it never mounted anything (then ``[]``)."""
    mounted = tx.events_of_type(session_id, RESOURCE_MOUNTED, 0)
    if not mounted:
        return []
    return sorted(mounted + tx.events_of_type(session_id, RESOURCE_UNMOUNTED, 0), key=lambda e: e.seq)


def stored_mounts(tx: Any, session_id: str) -> list[Mount]:
    """The mounts in force in the stored session ``session_id`` (in the transaction ``tx``):
    the fold of its :func:`mount_log`."""
    events = mount_log(tx, session_id)
    return fold_mounts(events) if events else []


class _StoreCore:
    """Backend hooks (:meth:`_read`, :meth:`_write`, :meth:`_run_blocking`) and the helpers shared
    by every concern of :class:`~chatflow_cli.core.memory.base.BaseSessionStore`."""

    def __init__(self, default_max_turns: int = DEFAULT_MAX_TURNS) -> None:
        self.default_max_turns = _check_max_turns(default_max_turns, "default_max_turns")
        self.clock: Callable[[], float] = time.time
        self._resolver: Callable[[str], Any] | None = None
        self._dedup_ttl_s = DEFAULT_DEDUP_TTL_HOURS * 3600.0
        # Notified when a turn ends or a waiter leaves: waiters of this process wake at once
        # (other processes' waiters poll).
        self._turn_ended = threading.Condition(threading.Lock())
        self._kept = _KeptContexts()

    # -- backend -----------------------------------------------------------------------
    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        raise NotImplementedError
        yield  # pragma: no cover

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        raise NotImplementedError
        yield  # pragma: no cover

    async def _run_blocking(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` for an async twin. Here on the loop; SQLite on disk overrides it."""
        return fn(*args, **kwargs)

    async def _run_writing(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a write that never waits for another write (an edit, a save, an event) for an
        async twin: :meth:`_run_blocking` here; SQLite on disk queues them on one thread."""
        return await self._run_blocking(fn, *args, **kwargs)

    def close(self) -> None:
        """Release resources; the in-memory store has none."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- agents ------------------------------------------------------------------------
    def set_agent_resolver(self, resolver: Callable[[str], Any] | None) -> None:
        """Map a stored ``active_agent_name`` back to the Agent (with its tools and handoffs) on load.

        With no resolver, or when it returns None, the session gets the caller's
        ``default_agent`` if its name matches, else a fallback agent of that name with no
        tools, and a warning is logged.
        """
        self._resolver = resolver

    def _resolve_agent(self, name: str, default_agent: Any = None, quiet: bool = False) -> Any:
        if quiet:  # the store's own bookkeeping (rollback, tool results) never looks at the agent
            return _fallback_agent(name)
        agent = self._resolver(name) if self._resolver is not None else None
        if agent is not None:
            return agent
        if default_agent is not None and agent_name_of(default_agent) == name:
            return default_agent
        logger.warning(
            "no agent resolver knows agent %r: the session gets a fallback agent with no tools "
            "(call store.set_agent_resolver() or use a Runner)",
            name,
        )
        return _fallback_agent(name)

    # -- helpers -----------------------------------------------------------------------
    def _append(
        self,
        tx: _Tx,
        session_id: str,
        type: str,
        payload: dict[str, Any],
        turn: int | None = None,
        key: str | None = None,
        text: str | None = None,
        created_at: float | None = None,
    ) -> Event:
        # Every event (messages ride in their events' payloads) is checked here, the same for
        # both stores, before anything of it is written. ``text``: the payload's compact JSON
        # when it was already checked (a message's event, built from the message's checked JSON).
        if not type.isascii():
            _check_text(type, "event type", session_id)
        if key is not None:
            _check_idempotency_key(key)
        if text is None:
            text = _check_text(payload, f"{type} event", session_id)
        when = self.clock() if created_at is None else created_at
        event = Event(session_id, tx.next_seq(session_id), type, payload, when, key)
        tx.insert_event(event, turn, text)
        return event

    def _context(
        self,
        tx: _Tx,
        row: _SessionRow,
        default_agent: Any = None,
        quiet: bool = False,
        effective: bool = False,
        lease: str | None = None,
        last_turns: int | None = None,
    ) -> SessionContext:
        """The row's context. ``effective``: a dead owner's ``running`` shows ``idle`` (reads for
        callers); the store's own writes keep the stored status. ``lease``: the owner token
        of the run the context is given to (:meth:`begin_turn`). ``last_turns``: hold only
        the newest N turns (a context for an edit that needs no more; older turns still load
        on demand, for a rollback)."""
        window_turns = row.max_turns if last_turns is None else min(row.max_turns, last_turns)
        window = tx.live_window(row.session_id, max(1, row.turn_count - window_turns + 1))
        agent = self._resolve_agent(row.active_agent_name, default_agent, quiet)
        return restore_context(
            row.session_id,
            agent,
            window_turns,
            dict(row.metadata),
            self._effective_status(row) if effective else row.status,
            window,
            row.turn_count,
            self._binding_in(tx, row, lease, lambda name: self._resolve_agent(name, default_agent, quiet)),
            agent_versions=row.agent_versions,
            resources=stored_mounts(tx, row.session_id),
        )

    def _binding_in(self, tx: _Tx, row: _SessionRow, lease: str | None = None,
                    resolve: Callable[[str], Any] | None = None) -> SessionBinding:
        """A binding whose loader (and agent trail) reads pruned turns inside ``tx`` (the
        transaction the context is used in); :meth:`_detach` switches it to the store's own
        reads. ``resolve``: an agent object by name (default: a fallback agent, as an edit's)."""
        session_id = row.session_id
        return SessionBinding(
            id(self),
            row.incarnation,
            self._base_of(row),
            lambda first, last: self._group_live(tx.turn_messages(session_id, first, last, False)),
            lease,
            lambda: self._agent_trail(tx, session_id),
            resolve if resolve is not None else _fallback_agent,
        )

    @staticmethod
    def _agent_trail(tx: _Tx, session_id: str) -> AgentTrail:
        """The session's :class:`AgentTrail`, replayed from its ``session.created``,
        ``handoff``, ``rollback`` and ``turn.failed`` events only (indexed reads by type)."""
        events = [e for kind in AGENT_TRAIL_EVENTS for e in tx.events_of_type(session_id, kind, 0)]
        events.sort(key=lambda e: e.seq)
        trail = AgentTrail()
        for event in events:
            trail.replay(event.type, event.payload)
        return trail

    def _read_agent_trail(self, session_id: str, incarnation: str) -> AgentTrail:
        with self._read() as tx:
            row = tx.get_row(session_id)
            if row is None or row.incarnation != incarnation:
                raise SessionDeletedError(f"session {session_id} was deleted", session_id=session_id)
            return self._agent_trail(tx, session_id)

    @staticmethod
    def _window_first(tx: _Tx, row: _SessionRow) -> int:
        """The window's first turn: the newest ``max_turns`` live turns, after the turns the
        newest summary covers."""
        through = tx.latest_summary_through(row.session_id)
        return max(1, row.turn_count - row.max_turns + 1, (through or 0) + 1)

    @staticmethod
    def _base_of(row: _SessionRow) -> tuple[SessionStatus, str | None, str]:
        """What a status or handoff change must not silently overwrite: status, owner, agent.

        A value that changed and changed back (idle -> running -> idle under another run's
        owner) compares equal: such a change overwrites nothing the other writer left.
        """
        return (row.status, row.owner.token if row.owner else None, row.active_agent_name)

    def _refuse_stale_base(self, session: SessionContext, row: _SessionRow, ops: Sequence[JournalEntry]) -> None:
        """SessionBusyError when ``ops`` change status or agent but another writer changed
        them since ``session`` was loaded -- unless ``session`` belongs to the run that
        holds the lease (begin_turn's owner of the running row)."""
        if not any(op.kind in ("status", "agent") for op in ops):
            return
        binding = session._binding
        if binding is None or binding.base == self._base_of(row):
            return
        base = binding.base
        lease = row.owner.token if row.owner is not None and row.status is SessionStatus.RUNNING else None
        if lease is not None and binding.lease == lease:
            return
        raise SessionBusyError(
            f"session {row.session_id!r} is busy: it changed since it was loaded (status {base[0].value} -> "
            f"{row.status.value}, agent {base[2]!r} -> {row.active_agent_name!r}); load it again",
            session_id=row.session_id,
        )

    def _detach(self, ctx: SessionContext) -> SessionContext:
        """``ctx`` (made by :meth:`_context`) ready to leave the store: it reads pruned turns
        through the store's own transactions from now on."""
        binding = ctx._binding
        assert binding is not None
        binding.loader = partial(self._load_live_turns, ctx.session_id, binding.incarnation)
        binding.agents = partial(self._read_agent_trail, ctx.session_id, binding.incarnation)
        return ctx

    def _load_live_turns(self, session_id: str, incarnation: str, first: int, last: int) -> dict[int, list[Message]]:
        with self._read() as tx:
            row = tx.get_row(session_id)
            if row is None or row.incarnation != incarnation:
                raise SessionDeletedError(f"session {session_id} was deleted", session_id=session_id)
            return self._group_live(tx.turn_messages(session_id, first, last, False))

    @staticmethod
    def _group_live(stored: list[_MessageRow]) -> dict[int, list[Message]]:
        out: dict[int, list[Message]] = {}
        for item in stored:
            out.setdefault(item.turn, []).append(item.message)
        return out

    def _new_row(
        self, session_id: str, agent: Any, max_turns: int | None, metadata: Mapping[str, Any] | None
    ) -> _SessionRow:
        _check_session_id(session_id, empty_ok=False)
        turns = self.default_max_turns if max_turns is None else _check_max_turns(max_turns)
        name = agent_name_of(agent)
        _check_text(name, "agent name", session_id)
        now = self.clock()
        return _SessionRow(
            session_id,
            secrets.token_hex(8),
            name,
            _check_metadata(metadata) if metadata is not None else {},
            turns,
            0,
            SessionStatus.IDLE,
            None,
            now,
            now,
        )

    def _create(self, tx: _Tx, row: _SessionRow, system: str | None = None) -> list[Event]:
        tx.insert_row(row)
        payload = {"agent": row.active_agent_name, "max_turns": row.max_turns, "metadata": row.metadata}
        events = [self._append(tx, row.session_id, EventType.SESSION_CREATED.value, payload)]
        if system:
            msg = Message.system(system)
            event = self._append(
                tx, row.session_id, EventType.MESSAGE_SYSTEM.value, {"turn": 0, "message": msg.to_dict()}, 0
            )
            tx.insert_message(row.session_id, 0, msg, event.seq)
            events.append(event)
        return events

    def _require(self, tx: _Tx, session_id: str) -> _SessionRow:
        row = tx.get_row(session_id)
        if row is None:
            raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
        return row

    @staticmethod
    def _refuse_terminated(row: _SessionRow) -> None:
        if row.status is SessionStatus.TERMINATED:
            raise SessionTerminatedError(
                f"session {row.session_id} is terminated: it accepts no more changes", session_id=row.session_id
            )

    def _apply(self, tx: _Tx, row: _SessionRow, ops: Sequence[JournalEntry]) -> list[Event]:
        """Apply journal entries to ``row`` and storage, one event each (nothing at all for none)."""
        if not ops:
            return []
        events: list[Event] = []
        now = self.clock()
        for op in ops:
            if row.status is SessionStatus.TERMINATED:
                self._refuse_terminated(row)
            turn: int | None = op.payload.get("turn") if isinstance(op.payload.get("turn"), int) else None
            payload = op.payload
            if op.kind == "metadata":  # a patch on the stored metadata, not the context's whole dict
                merged = {**row.metadata, **op.payload.get("changes", {})}
                for key in op.payload.get("removed", ()):
                    merged.pop(key, None)
                row.metadata = merged
                payload = {**op.payload, "metadata": copy.deepcopy(merged)}
            if op.kind == "rollback":  # the agent active at the end of the turn it rolls back to comes back
                trail = self._agent_trail(tx, row.session_id)
                if trail.created is None:
                    trail.created = row.active_agent_name
                agent = trail.agent_at(int(op.payload["to_turn"]), op.payload.get("system") is True)
                payload = {**op.payload, "active_agent": agent}
            text = None
            if op.text is not None and payload is op.payload and len(payload) == 2 and turn is not None:
                # {"turn": n, "message": {...}}: its JSON is the message's checked JSON, wrapped
                text = f'{{"turn":{turn},"message":{op.text}}}'
            event = self._append(tx, row.session_id, op.type, payload, turn, text=text, created_at=op.at)
            events.append(event)
            if op.attachments:  # the bytes of files the event names (a tool result's images)
                tx.attachments_add(row.session_id, op.attachments)  # type: ignore[attr-defined]
            holder = row.owner.token if row.owner is not None else None
            if turn is not None and op.kind == "event":
                if op.type in (EventType.TURN_COMPLETED.value, EventType.TOOL_PENDING.value):
                    tx.processed_finish_turn(row.session_id, turn, holder, now)
                elif op.type == EventType.TURN_INTERRUPTED.value:
                    tx.processed_drop_turn(row.session_id, turn, holder)
            if op.kind == "message":
                assert op.message is not None
                if op.message.role is Role.USER:
                    self._refuse_archived(row)
                stale = op.turn != 0 and op.turn < row.turn_count
                if (
                    stale
                    or op.turn > row.turn_count + 1
                    or (op.message.role is Role.USER and op.turn != row.turn_count + 1)
                ):
                    raise SessionBusyError(
                        f"session {row.session_id!r} is busy: it changed since it was loaded (turn {op.turn} vs stored "
                        f"{row.turn_count}); load it again",
                        session_id=row.session_id,
                    )
                tx.insert_message(row.session_id, op.turn, op.message, event.seq, op.text)
                row.turn_count = max(row.turn_count, op.turn)
                message = op.message
                if message.role is Role.MODEL and message.agent and message.agent_version:
                    row.agent_versions = _ran(row.agent_versions, message.agent, message.agent_version, op.turn)
            elif op.kind == "agent_version":
                row.agent_versions = _ran(row.agent_versions, str(op.payload["agent"]), str(op.payload["version"]),
                                          op.turn)
            elif op.kind == "summary":
                assert op.message is not None
                tx.insert_message(row.session_id, 0, op.message, event.seq)
            elif op.kind == "rollback":
                to_turn = int(op.payload["to_turn"])
                # "system": the SYSTEM messages (turn 0) go too
                first = 0 if op.payload.get("system") is True else to_turn + 1
                tx.remove_turns(row.session_id, first, None, "rolled_back", event.seq)
                tx.remove_summaries(row.session_id, to_turn, event.seq)
                row.turn_count = min(row.turn_count, to_turn)
                row.active_agent_name = str(payload["active_agent"])
            elif op.kind == "turn_failed":
                tx.processed_drop_turn(row.session_id, op.turn, holder)
                if op.turn > 0:
                    tx.remove_turns(row.session_id, op.turn, None, "failed", event.seq)
                    row.turn_count = min(row.turn_count, op.turn - 1)
                if "active_agent" in op.payload:  # a handoff inside the failed turn is undone
                    row.active_agent_name = str(op.payload["active_agent"])
            elif op.kind == "status":
                row.status = SessionStatus(op.payload["status"])
                if row.status is not SessionStatus.RUNNING:
                    row.owner = None
            elif op.kind == "agent":
                row.active_agent_name = str(op.payload["to_agent"])
            elif op.kind == "title":
                row.title = op.payload.get("title") or None
            elif op.kind == "archive":
                row.archived_at = now if op.type == EventType.SESSION_ARCHIVED.value else None
        row.updated_at = now
        tx.update_row(row)
        return events

    @staticmethod
    def _refuse_archived(row: _SessionRow) -> None:
        if row.archived_at is not None:
            raise SessionArchivedError(
                f"session {row.session_id} is archived: it takes no new turns until "
                f"'chatflow sessions unarchive {row.session_id}'",
                session_id=row.session_id,
            )

    @staticmethod
    def _summary(
        tx: _Tx, row: _SessionRow, status: SessionStatus, preview: str | None = None, failed: bool | None = None
    ) -> SessionSummary:
        if preview is None:
            preview = tx.preview(row.session_id)
        return SessionSummary(
            row.session_id,
            row.active_agent_name,
            status,
            row.turn_count,
            row.max_turns,
            row.created_at,
            row.updated_at,
            preview[:_PREVIEW_CHARS],
            dict(row.metadata),
            _StoreCore._last_turn_failed(tx, row.session_id) if failed is None else failed,
            forked_from=dict(row.forked_from) if row.forked_from else None,
            title=title_of(row.title, preview)[:TITLE_CHARS],
            title_set=bool(row.title),
            archived_at=row.archived_at,
            agent_versions=copy.deepcopy(row.agent_versions),
        )

    @staticmethod
    def _last_turn_failed(tx: _Tx, session_id: str) -> bool:
        """True when a ``turn.failed`` is the newest of the events that end a turn."""
        failed = tx.last_event(session_id, "turn.failed")
        if failed is None:
            return False
        return not any(tx.last_event(session_id, kind, after_seq=failed.seq) is not None
                       for kind in ("turn.completed", "turn.interrupted", "rollback"))

    @staticmethod
    def _effective_status(row: _SessionRow) -> SessionStatus:
        if row.status is SessionStatus.RUNNING and (row.owner is None or not row.owner.alive()):
            return SessionStatus.IDLE
        return row.status

    def _recover(self, tx: _Tx, row: _SessionRow, default_agent: Any) -> list[Event]:
        """Close a dead owner's running turn: one ending, then ``session.recovered`` and ``idle``.

        The ending is ``turn.interrupted`` (reason ``owner died``); a turn started under an
        idempotency key or a message id, whose retry replaces it, ends with ``turn.failed``
        only (``error_type`` ``TurnOwnerDied``), which takes it out of the window. An owner
        that was alive but cut off past its lease (its pid still runs on this host, or it ran
        on another host) is said so: ``"lease_expired": true`` in ``session.recovered``, and
        the texts say its lease ran out instead of that it died.

        A dead compaction (the session was taken with reason ``compaction started``) has no
        turn of its own: no turn is interrupted, and ``session.recovered`` says
        ``"during": "compaction"``; nothing of the compaction was stored.
        """
        dead = row.owner
        ctx = self._context(tx, row, default_agent)
        turn = ctx.turn_count
        if _compacting(tx, row.session_id):
            ctx.record_event(EventType.SESSION_RECOVERED, {"turn": turn, "owner": dead.to_dict() if dead else {},
                                                           "during": "compaction"})
            ctx.set_status(SessionStatus.IDLE, "recovered: the compacting process died; nothing was compacted")
            return self._apply(tx, row, ctx._pending())
        retried = turn > 0 and (tx.idempotency_turn_keyed(row.session_id, turn) or tx.processed_turn_claimed(
            row.session_id, turn))
        # a live process cut off past its lease (its pid still runs here, or it runs on
        # another host), or a process that died
        cut_off = dead is not None and Owner.alive(dead)
        if retried:
            # its sender retries it (same key or message id): the retry replaces it in the
            # window. One ending: turn.failed takes it out of the window (no turn.interrupted too)
            gone = "was cut off (its lease ran out)" if cut_off else "died"
            ctx.fail_turn(TurnOwnerDied(f"the process running this turn {gone}; a retry of its message replaces it"))
        else:
            ctx.interrupt_turn(reason="owner's lease ran out" if cut_off else "owner died")
        recovered: dict[str, Any] = {"turn": turn, "owner": dead.to_dict() if dead else {}}
        if cut_off:
            recovered["lease_expired"] = True
        ctx.record_event(EventType.SESSION_RECOVERED, recovered)
        ctx.set_status(SessionStatus.IDLE, "recovered: the running process's lease ran out" if cut_off
                       else "recovered: the running process died")
        return self._apply(tx, row, ctx._pending())

    def _notify_turn_ended(self) -> None:
        with self._turn_ended:
            self._turn_ended.notify_all()
