"""The session rules, written once for every store: :class:`BaseSessionStore` over the :class:`_Tx` port.

A backend supplies only transactions: a :class:`_Tx` (storage primitives: rows, events,
messages, idempotency keys, message claims, the turn queue) yielded by ``_read()`` and
``_write()``. Everything else -- window loading, turn numbering, the event log, idempotency,
owner leases, turn recovery, de-duplication -- lives in :class:`BaseSessionStore`, so every
store behaves the same (one contract test suite runs against each).

Event ``seq`` and deleted sessions: ``seq`` counts 1, 2, 3... per *incarnation* of a session
id. ``store.delete(session_id)`` removes the session with its whole event log, so a session
created again under the same id is a new incarnation whose log starts again at ``seq`` 1.
A consumer that keeps a ``replay`` cursor (``after_seq``) across a delete must reset it;
a context still held from the old incarnation gets :class:`SessionDeletedError` instead of
writing into the new one.

De-duplication of inbound messages (webhooks): a message id is *claimed* (in progress) by
the process that handles it -- the claim records its holder, an :class:`Owner` as for a
running turn -- and becomes *processed* when the turn it started completes, in the same
transaction. A processed id stays a duplicate while ``now < processed_at +
DEFAULT_DEDUP_TTL_HOURS`` (192 h, which covers a 7-day re-delivery window). A claim whose
holder died, or whose turn failed or was interrupted, is free again, so the platform's
redelivery runs it. :meth:`BaseSessionStore.claim_message` checks and claims in one atomic
step; ``is_message_processed`` / ``mark_message_processed`` claim the same way, and a Runner
turn started next in the same thread or task completes the claim. ``is_message_processed``
waits (bounded) while another process holds the id, so a duplicate delivery runs the message
itself when that holder dies before answering.
"""

from __future__ import annotations

import contextvars
import copy
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Self, TypeVar

from ..errors import (
    IdempotencyConflictError,
    PendingToolCallsError,
    SessionArchivedError,
    SessionBusyError,
    SessionDeletedError,
    SessionNotFoundError,
    SessionTerminatedError,
    ToolResultError,
    UsageError,
)
from ..events import Event, EventType, SessionStatus, _event_type, _is_reserved, _use_instead
from ..messages import Message, Role
from ._checks import (
    DEFAULT_MAX_TURNS,
    metadata_matches,
    _agent_name,
    _check_idempotency_key,
    _check_max_turns,
    _check_metadata,
    _check_session_id,
    _check_text,
    _check_wait,
    _fallback_agent,
    _sha256,
)
from .context import _MESSAGE_EVENT, SessionBinding, SessionContext, Turn, _Op
from .owner import Owner
from .protocol import MessageState, SessionSummary, TurnRecord, TurnStart
from .search import Query, SearchHit, parse_query

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "DUPLICATE_WAIT_S",
    "BaseSessionStore",
    "EditResult",
    "TurnOwnerDied",
    "rollback_target",
    "take_context_claim",
]

logger = logging.getLogger(__name__)

#: How long (hours) a processed message id counts as a duplicate: 8 days, covering a 7-day
#: re-delivery window such as WhatsApp's.
DEFAULT_DEDUP_TTL_HOURS = 192
#: How long (seconds) ``is_message_processed`` waits, by default, for a claim another process
#: holds to end (processed, or free again because the holder died or its turn failed).
DUPLICATE_WAIT_S = 60.0

_PREVIEW_CHARS = 80
_TITLE_CHARS = 200
_T = TypeVar("_T")


class TurnOwnerDied(Exception):
    """Why a recovered turn left the context window (the ``error_type`` of its ``turn.failed``)."""


def _busy_message(session_id: str, owner: Any) -> str:
    """The :class:`SessionBusyError` text for a session another live run owns."""
    return f"session {session_id!r} is busy: a turn is running in pid {owner.pid} on {owner.host}"


@dataclass(frozen=True, slots=True)
class _MessageRecord:
    """One stored message id: ``state`` ("in_progress" | "completed"), ``at`` (UTC epoch
    seconds of the last change; the TTL counts from it), the claim's ``holder`` (None once
    completed), and the turn the claim started (``session_id``, ``turn``; None until then)."""

    state: str
    at: float
    holder: Owner | None = None
    session_id: str | None = None
    turn: int | None = None


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


@dataclass(slots=True)
class EditResult(Generic[_T]):
    """What :meth:`BaseSessionStore.edit` returns: the change's ``value``, the ``events``
    appended, ``replayed`` (the idempotency key was applied before: nothing changed) and
    ``missing`` (no such session and nothing to create it with)."""

    value: _T | None
    events: list[Event] = field(default_factory=list)
    replayed: bool = False
    missing: bool = False
    position: tuple[str, int] | None = None  #: the log position after the edit (see ``log_position``)
    before: tuple[str, int] | None = None  #: the log position the change was applied at


class _RolledBack(Exception):
    """Raised inside a dry-run edit's transaction, so the store rolls it back; carries the result."""

    def __init__(self, result: EditResult[Any]) -> None:
        super().__init__("dry run")
        self.result = result


#: Outcomes of a first attempt that produced no result: the same idempotency key with the
#: same message runs the turn again (see :class:`TurnStart`).
_RETRYABLE_OUTCOMES = frozenset({"failed", "interrupted", "rolled_back"})


@dataclass(slots=True)
class _SessionRow:
    """A session's stored row (one per backend: dict entry or ``chatflow_sessions`` row)."""

    session_id: str
    incarnation: str
    active_agent_name: str
    metadata: dict[str, Any]
    max_turns: int
    turn_count: int
    status: SessionStatus
    owner: Owner | None
    created_at: float
    updated_at: float
    #: {"session_id", "turn", "seq"} of the session this one was forked from, else None
    forked_from: dict[str, Any] | None = None
    title: str | None = None  # set by the user; None: derived from the first user message
    archived_at: float | None = None  # epoch seconds; None: not archived
    #: {agent name: {"version": str, "turn": int}}: the latest version each agent ran in
    #: the session and the last turn it ran that version in (empty: none known)
    agent_versions: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListFilter:
    """What :meth:`BaseSessionStore.list_sessions` is limited to (already checked)."""

    agent: str | None = None
    metadata: tuple[tuple[str, str], ...] = ()  # (key, value): the stored value, or its JSON, equals value
    since: float | None = None  # updated at or after (epoch seconds)
    until: float | None = None  # updated before
    title: str | None = None  # case-insensitive substring of the (effective) title
    archived: bool = False  # True: only archived sessions; False: only the others
    after: tuple[float, str] | None = None  # (updated_at, session_id) of the last row seen
    limit: int | None = None  # in SQL, when no status filter runs after it


def _ran(versions: dict[str, dict[str, Any]], agent: str, version: str, turn: int) -> dict[str, dict[str, Any]]:
    """``versions`` (a session's latest version of each agent) after ``agent`` ran ``version``
    in ``turn``."""
    return {**versions, agent: {"version": version, "turn": turn}}


def title_of(title: str | None, preview: str) -> str:
    """The title shown for a session: its own, else the first line of its first user message."""
    if title:
        return title
    lines = preview.strip().splitlines()
    return lines[0].strip() if lines else ""


def _cursor(updated_at: float, session_id: str) -> str:
    return f"{updated_at!r}:{session_id}"


def parse_cursor(cursor: str) -> tuple[float, str]:
    """``(updated_at, session_id)`` of a :attr:`SessionSummary.cursor`.

    Raises:
        UsageError: not a cursor this store printed.
    """
    head, sep, session_id = cursor.partition(":") if isinstance(cursor, str) else ("", "", "")
    try:
        if not sep or not session_id:
            raise ValueError
        return float(head), session_id
    except ValueError:
        raise UsageError(f"{cursor!r} is not a listing cursor: pass the 'next' value printed with --json") from None


@dataclass(frozen=True, slots=True)
class SearchFilter:
    """What a search is limited to (checked by :meth:`BaseSessionStore.search`)."""

    session_id: str | None = None
    agent: str | None = None
    since: float | None = None  # UTC epoch seconds; messages stored at or after
    limit: int = 20
    include_tools: bool = False
    include_removed: bool = False


@dataclass(frozen=True, slots=True)
class _StoredMessage:
    turn: int
    message: Message
    removed: str | None = None  # None live, "rolled_back" or "failed"
    removed_at_seq: int | None = None


class _Tx:
    """Storage primitives one backend runs inside a transaction (read or write).

    The session rules live in :class:`BaseSessionStore`; a backend implements only these.
    Every write method may only be called inside a write transaction.
    """

    def get_row(self, session_id: str) -> _SessionRow | None:
        raise NotImplementedError

    def insert_row(self, row: _SessionRow) -> None:
        raise NotImplementedError

    def update_row(self, row: _SessionRow) -> None:
        raise NotImplementedError

    def delete_row(self, session_id: str) -> bool:
        raise NotImplementedError

    def list_rows(self, agent: str | None) -> list[_SessionRow]:
        """Rows ordered by ``updated_at`` descending (then session id)."""
        raise NotImplementedError

    def list_summaries(self, where: ListFilter) -> list[tuple[_SessionRow, str, bool | None]]:
        """(row, preview, last turn failed -- None: not read) of the sessions under ``where``, ``updated_at`` descending then
        session id, at most ``where.limit`` -- in one query where the backend has queries.

        This generic form filters :meth:`list_rows` and reads each preview; a backend
        overrides it with one query."""
        out: list[tuple[_SessionRow, str, bool | None]] = []
        for row in self.list_rows(where.agent):
            if (row.archived_at is not None) != where.archived:
                continue
            if not all(metadata_matches(row.metadata, k, v) for k, v in where.metadata):
                continue
            if (where.since is not None and row.updated_at < where.since) or (
                where.until is not None and row.updated_at >= where.until
            ):
                continue
            if where.after is not None and not (
                row.updated_at < where.after[0]
                or (row.updated_at == where.after[0] and row.session_id > where.after[1])
            ):
                continue
            preview = self.preview(row.session_id)
            if where.title is not None and where.title.casefold() not in title_of(row.title, preview).casefold():
                continue
            out.append((row, preview, None))
            if where.limit is not None and len(out) >= where.limit:
                break
        return out

    def latest_session_id(self) -> str | None:
        raise NotImplementedError

    def next_seq(self, session_id: str) -> int:
        """MAX(seq) + 1 for the session, read inside the current transaction."""
        raise NotImplementedError

    def insert_event(self, event: Event, turn: int | None, payload_json: str | None = None) -> None:
        """Store ``event``; ``payload_json``: its payload's compact JSON when already made."""
        raise NotImplementedError

    def events(self, session_id: str, after_seq: int, limit: int | None) -> list[Event]:
        raise NotImplementedError

    def last_event(self, session_id: str, type: str, turn: int | None = None, after_seq: int = 0) -> Event | None:
        raise NotImplementedError

    def events_of_type(self, session_id: str, type: str, after_seq: int) -> list[Event]:
        raise NotImplementedError

    def insert_message(self, session_id: str, turn: int, message: Message, seq: int,
                       message_json: str | None = None) -> None:
        """Store a live message; ``message_json``: its ``to_json()`` when already made."""
        raise NotImplementedError

    def remove_turns(self, session_id: str, first: int, last: int | None, reason: str, seq: int) -> None:
        """Mark live messages of turns first..last (None: no upper bound), turn >= 1, as removed."""
        raise NotImplementedError

    def window(self, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        """Live SYSTEM messages of turn 0 that are not summaries, then the newest live summary
        (highest ``summary_through``, then newest), then live messages of turns >= first_turn,
        in order; the summary comes as ``(0, message)``."""
        raise NotImplementedError

    def latest_summary_through(self, session_id: str) -> int | None:
        """K of the session's newest live summary (highest K), or None when it has none."""
        raise NotImplementedError

    def remove_summaries(self, session_id: str, after_turn: int, seq: int) -> None:
        """Mark live summaries whose K is above ``after_turn`` removed (``rolled_back``) at ``seq``."""
        raise NotImplementedError

    def summaries(self, session_id: str, include_removed: bool) -> list[_StoredMessage]:
        """The session's summaries (turn 0) in the order they were stored."""
        raise NotImplementedError

    def window_dicts(self, session_id: str, first_turn: int) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`window` as ``Message.to_dict()`` dicts; a backend that stores JSON may
        return it parsed, without building messages."""
        return [(turn, msg.to_dict()) for turn, msg in self.window(session_id, first_turn)]

    def turn_messages(
        self, session_id: str, first: int, last: int | None, include_removed: bool
    ) -> list[_StoredMessage]:
        """Messages of turns first..last in (turn, insertion) order; turn 0 only its SYSTEM
        messages that are not summaries."""
        raise NotImplementedError

    def preview(self, session_id: str) -> str:
        """The first live user message of turn 1; with none, the newest user message of a
        failed turn (a session whose first turn failed shows what was sent); else ``""``."""
        raise NotImplementedError

    def idempotency_get(self, session_id: str, key: str) -> tuple[str, int | None, int] | None:
        """(request hash, turn, event seq) recorded for the key, or None."""
        raise NotImplementedError

    def idempotency_put(self, session_id: str, key: str, digest: str, turn: int | None, seq: int, now: float) -> None:
        raise NotImplementedError

    def idempotency_turn_keyed(self, session_id: str, turn: int) -> bool:
        """True when a ``begin_turn`` idempotency key maps to ``turn``."""
        raise NotImplementedError

    def processed_get(self, message_id: str) -> _MessageRecord | None:
        raise NotImplementedError

    def processed_put(self, message_id: str, record: _MessageRecord) -> None:
        """Insert or replace the record of ``message_id``."""
        raise NotImplementedError

    def processed_turn_claimed(self, session_id: str, turn: int) -> bool:
        """True when an in-progress claim started ``turn`` of the session."""
        raise NotImplementedError

    def processed_finish_turn(self, session_id: str, turn: int, holder: str | None, now: float) -> None:
        """In-progress claims that started ``turn`` of the session under the holder token
        ``holder`` (None: any) become completed at ``now``."""
        raise NotImplementedError

    def processed_drop_turn(self, session_id: str, turn: int, holder: str | None) -> None:
        """Forget in-progress claims that started ``turn`` of the session under the holder
        token ``holder`` (None: any): the turn failed or was interrupted."""
        raise NotImplementedError

    def processed_purge(self, now: float, ttl_s: float) -> None:
        raise NotImplementedError

    def processed_release(self, message_id: str) -> bool:
        """Forget the record of ``message_id``; True if there was one."""
        raise NotImplementedError

    def endpoint_get(self, session_id: str) -> tuple[str | None, str | None] | None:
        """The (model, base URL) stored with the session, or None when none was stored."""
        raise NotImplementedError

    def endpoint_put(self, session_id: str, model: str | None, base_url: str | None, now: float) -> None:
        raise NotImplementedError

    def queue_add(self, session_id: str, owner: Owner, now: float) -> int:
        """Append a waiter for the session; its ticket (increasing across the store)."""
        raise NotImplementedError

    def queue_list(self, session_id: str) -> list[tuple[int, Owner]]:
        """The session's waiters, oldest ticket first."""
        raise NotImplementedError

    def queue_remove(self, session_id: str, ticket: int) -> None:
        raise NotImplementedError

    def search(self, query: Query, where: SearchFilter) -> list[SearchHit]:
        """Turns matching ``query`` under ``where``, best first, at most ``where.limit``:
        one hit per (session, turn, removal) -- the best-ranked message of the turn."""
        raise NotImplementedError


class BaseSessionStore:
    """The session rules, shared by every store.

    Subclasses provide :meth:`_read` and :meth:`_write` (context managers yielding a
    :class:`_Tx`); everything else — pruning windows, turn numbering, the event log,
    idempotency, owner leases, de-duplication — is implemented here once, so both stores
    behave the same (one contract test suite runs against each).

    Every public method has an async twin named ``a<name>``; it runs the method through
    :meth:`_run_blocking` (on the event loop here; on a private thread pool for on-disk
    SQLite). ``clock`` (callable -> UTC epoch seconds) may be replaced, e.g. in tests.
    """

    #: True when the storage never blocks on disk: async twins then stay on the event loop.
    _ephemeral = True

    def __init__(self, default_max_turns: int = DEFAULT_MAX_TURNS) -> None:
        self.default_max_turns = _check_max_turns(default_max_turns, "default_max_turns")
        self.clock: Callable[[], float] = time.time
        self._resolver: Callable[[str], Any] | None = None
        self._dedup_ttl_s = DEFAULT_DEDUP_TTL_HOURS * 3600.0
        # Notified when a turn ends or a waiter leaves: waiters of this process wake at once
        # (other processes' waiters poll).
        self._turn_ended = threading.Condition(threading.Lock())

    # -- backend -----------------------------------------------------------------------
    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        raise NotImplementedError
        yield  # pragma: no cover

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        raise NotImplementedError
        yield  # pragma: no cover

    async def _run_blocking(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
        """Run ``fn`` for an async twin. Here on the loop; SQLite on disk overrides it."""
        return fn(*args, **kwargs)

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
        if default_agent is not None and _agent_name(default_agent) == name:
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
        event = Event(session_id, tx.next_seq(session_id), type, payload, self.clock(), key)
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
        through = tx.latest_summary_through(row.session_id)
        first = max(1, row.turn_count - window_turns + 1, (through or 0) + 1)
        window = tx.window(row.session_id, first)
        agent = self._resolve_agent(row.active_agent_name, default_agent, quiet)
        # Inside the transaction, pruned turns come from the same transaction; _detach()
        # switches to the store's own reads before the context leaves the store.
        binding = SessionBinding(
            id(self),
            row.incarnation,
            self._base_of(row),
            lambda first, last: self._group_live(tx.turn_messages(row.session_id, first, last, False)),
            lease,
        )
        return SessionContext._restore(
            row.session_id,
            agent,
            window_turns,
            dict(row.metadata),
            self._effective_status(row) if effective else row.status,
            window,
            row.turn_count,
            binding,
            agent_versions=row.agent_versions,
        )

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

    def _refuse_stale_base(self, session: SessionContext, row: _SessionRow, ops: Sequence[_Op]) -> None:
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
        return ctx

    def _load_live_turns(self, session_id: str, incarnation: str, first: int, last: int) -> dict[int, list[Message]]:
        with self._read() as tx:
            row = tx.get_row(session_id)
            if row is None or row.incarnation != incarnation:
                raise SessionDeletedError(f"session {session_id} was deleted", session_id=session_id)
            return self._group_live(tx.turn_messages(session_id, first, last, False))

    @staticmethod
    def _group_live(stored: list[_StoredMessage]) -> dict[int, list[Message]]:
        out: dict[int, list[Message]] = {}
        for item in stored:
            out.setdefault(item.turn, []).append(item.message)
        return out

    def _new_row(
        self, session_id: str, agent: Any, max_turns: int | None, metadata: Mapping[str, Any] | None
    ) -> _SessionRow:
        _check_session_id(session_id, empty_ok=False)
        turns = self.default_max_turns if max_turns is None else _check_max_turns(max_turns)
        name = _agent_name(agent)
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

    def _apply(self, tx: _Tx, row: _SessionRow, ops: Sequence[_Op]) -> list[Event]:
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
            text = None
            if op.text is not None and payload is op.payload and len(payload) == 2 and turn is not None:
                # {"turn": n, "message": {...}}: its JSON is the message's checked JSON, wrapped
                text = f'{{"turn":{turn},"message":{op.text}}}'
            event = self._append(tx, row.session_id, op.type, payload, turn, text=text)
            events.append(event)
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
            elif op.kind == "rollback":
                to_turn = int(op.payload["to_turn"])
                tx.remove_turns(row.session_id, to_turn + 1, None, "rolled_back", event.seq)
                tx.remove_summaries(row.session_id, to_turn, event.seq)
                row.turn_count = min(row.turn_count, to_turn)
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
        row.updated_at = now
        tx.update_row(row)
        return events

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
          context :meth:`begin_turn` returned to the run that still holds the lease.

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
            elif row is None:
                row = self._new_row(session.session_id, session.active_agent, session.max_turns, session.metadata)
                events += self._create(tx, row)
            else:
                raise SessionBusyError(
                    f"session {session.session_id!r} is busy: it already exists in the store; load it with get()",
                    session_id=session.session_id,
                )
            if ops:
                self._refuse_terminated(row)
                self._refuse_stale_base(session, row, ops)
            events += self._apply(tx, row, ops)
        if any(op.kind == "status" for op in ops):
            self._notify_turn_ended()
        if bound is None:  # stored for the first time
            bound = SessionBinding(id(self), row.incarnation, self._base_of(row),
                                   partial(self._load_live_turns, row.session_id, row.incarnation))
        binding = SessionBinding(id(self), row.incarnation, self._base_of(row), bound.loader, bound.lease)
        session._saved(len(ops), row.metadata, binding)
        return events

    def release(
        self, session: SessionContext, status: SessionStatus | str = SessionStatus.IDLE, reason: str = "", **extra: Any
    ) -> list[Event]:
        """End a run: ``session.set_status(status, reason, **extra)`` then :meth:`save`."""
        session.set_status(status, reason, **extra)
        return self.save(session)

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
                raise SessionBusyError(_busy_message(session_id, row.owner), session_id=session_id)
            target = rollback_target(row.turn_count, to_turn=to_turn, last=last, session_id=session_id)
            ctx = self._context(tx, row, quiet=True)
            ctx.rollback_to(target)
            return self._apply(tx, row, ctx._pending())

    def fork(self, session_id: str, at: int | None = None, *, into: str | None = None) -> SessionSummary:
        """Copy turns 1..``at`` of a session into a new session, in one transaction.

        The new session's history is the source's live SYSTEM messages and turns 1..``at``,
        copied (nothing is re-run), with the agent, ``max_turns`` and metadata of the source.
        Its event log starts with ``session.created`` whose payload carries ``"forked_from":
        {"session_id", "turn", "seq"}`` (``seq``: the source's newest event seq at the fork),
        then one message event per copied message and, after each copied turn the source
        completed, its ``turn.completed`` (the source's payload). The source is not changed.

        Only completed turns are copied: while the source runs a turn (stored status
        ``running``), its newest turn is left out, and ``at`` defaults to the newest
        completed turn.

        Args:
            at: the last turn to copy (0: only the SYSTEM messages); default: the newest
                completed turn.
            into: the new session's id; default ``<source>-fork-<6 hex digits>``.

        Returns:
            The new session's :class:`SessionSummary` (``forked_from`` set).

        Raises:
            SessionNotFoundError: no session ``session_id``.
            ValueError: ``at`` outside 0..the newest completed turn, or ``into`` empty.
            UsageError: a session ``into`` already exists.
            TypeError: an argument of the wrong type.
        """
        _check_session_id(session_id)
        if at is not None and (isinstance(at, bool) or not isinstance(at, int)):
            raise TypeError(f"at must be an int or None, got {type(at).__name__}")
        if into is not None:
            _check_session_id(into, empty_ok=False)
        with self._write() as tx:
            source = self._require(tx, session_id)
            completed = source.turn_count - (1 if source.status is SessionStatus.RUNNING else 0)
            completed = max(0, completed)
            turn = completed if at is None else at
            if not 0 <= turn <= completed:
                running = " (its newest turn is still running)" if completed < source.turn_count else ""
                raise ValueError(
                    f"cannot fork session {session_id} at turn {turn}: it has completed turns 1..{completed}{running}"
                )
            new_id = into if into is not None else f"{session_id}-fork-{secrets.token_hex(3)}"
            if tx.get_row(new_id) is not None:
                raise UsageError(f"session {new_id!r} already exists: fork into another id", session_id=new_id)
            origin = {"session_id": session_id, "turn": turn, "seq": tx.next_seq(session_id) - 1}
            stored = tx.turn_messages(session_id, 0, turn, False)
            agent = source.active_agent_name
            for item in stored:
                if item.message.role is Role.MODEL and item.message.agent:
                    agent = item.message.agent  # the agent that spoke last in the copied turns
            versions: dict[str, dict[str, Any]] = {}
            for item in stored:  # the latest version each agent ran in the copied turns
                if item.message.role is Role.MODEL and item.message.agent and item.message.agent_version:
                    versions = _ran(versions, item.message.agent, item.message.agent_version, item.turn)
            now = self.clock()
            row = _SessionRow(
                new_id, secrets.token_hex(8), agent, copy.deepcopy(source.metadata), source.max_turns, turn,
                SessionStatus.IDLE, None, now, now, origin, agent_versions=versions,
            )
            tx.insert_row(row)
            payload = {"agent": agent, "max_turns": row.max_turns, "metadata": row.metadata, "forked_from": origin}
            self._append(tx, new_id, EventType.SESSION_CREATED.value, payload)
            done: dict[int, dict[str, Any]] = {}
            for number in range(1, turn + 1):
                event = tx.last_event(session_id, EventType.TURN_COMPLETED.value, number)
                if event is not None:
                    done[number] = dict(event.payload)
            previous: int | None = None
            for item in stored:
                if previous is not None and item.turn != previous and previous in done:
                    self._append(tx, new_id, EventType.TURN_COMPLETED.value, done.pop(previous), previous)
                previous = item.turn
                event = self._append(
                    tx, new_id, _MESSAGE_EVENT[item.message.role],
                    {"turn": item.turn, "message": item.message.to_dict()}, item.turn,
                )
                tx.insert_message(new_id, item.turn, item.message, event.seq)
            for number in sorted(done):
                self._append(tx, new_id, EventType.TURN_COMPLETED.value, done[number], number)
            return self._summary(tx, row, row.status)

    def forked_from(self, session_id: str) -> dict[str, Any] | None:
        """``{"session_id", "turn", "seq"}`` of the session ``session_id`` was forked from, or None.

        Raises:
            SessionNotFoundError: no such session.
        """
        return self.session_summary(session_id).forked_from

    def session_summary(self, session_id: str) -> SessionSummary:
        """One session's :class:`SessionSummary` (as a row of :meth:`list_sessions`).

        A cheap read: the stored row and the preview, with no window loaded and no agent
        resolved (so no agent resolver is needed). ``status`` is effective: a dead owner's
        ``running`` shows ``idle``.

        Raises:
            SessionNotFoundError: no such session.
        """
        _check_session_id(session_id)
        with self._read() as tx:
            row = self._require(tx, session_id)
            return self._summary(tx, row, self._effective_status(row))

    def list_sessions(
        self,
        limit: int | None = None,
        agent: str | None = None,
        status: SessionStatus | str | None = None,
        *,
        metadata: Mapping[str, str] | None = None,
        since: float | None = None,
        until: float | None = None,
        title: str | None = None,
        archived: bool = False,
        after: str | None = None,
    ) -> list[SessionSummary]:
        """Sessions, most recently updated first (then by id), with their effective status.

        One query reads the rows with their previews (the SQLite store), however many rows.

        Args:
            limit: at most this many rows (None: all).
            agent: only sessions whose active agent has this name.
            status: only sessions with this effective status.
            metadata: only sessions whose metadata has every ``key: value`` given -- the
                stored value is the string ``value``, or its JSON text is (``{"n": 3}``
                matches ``"3"``, ``{"vip": true}`` matches ``"true"``).
            since: only sessions updated at or after this UTC epoch second.
            until: only sessions updated before this UTC epoch second.
            title: only sessions whose title (set, or derived) contains this text, ignoring case.
            archived: False (default): only sessions not archived; True: only archived ones.
            after: a :attr:`SessionSummary.cursor`: only the rows after it in this order.
                A session updated since the cursor was printed moves before it, so paging
                on never repeats or skips the others.

        Raises:
            TypeError: an argument of the wrong type.
            ValueError: ``status`` is not a :class:`SessionStatus` value, ``limit`` < 0.
            UsageError: ``after`` is not a cursor this store printed.
        """
        if agent is not None:
            if not isinstance(agent, str):
                raise TypeError(f"agent must be a str or None, got {type(agent).__name__}")
            _check_text(agent, "agent")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"limit must be an int or None, got {type(limit).__name__}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        pairs: list[tuple[str, str]] = []
        for key, value in (metadata or {}).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError("metadata filters are str keys with str values")
            _check_text(key, "metadata key")
            _check_text(value, "metadata value")
            pairs.append((key, value))
        for name, bound in (("since", since), ("until", until)):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))):
                raise TypeError(f"{name} must be epoch seconds (a number) or None, got {type(bound).__name__}")
        if title is not None:
            if not isinstance(title, str):
                raise TypeError(f"title must be a str or None, got {type(title).__name__}")
            _check_text(title, "title")
        wanted = SessionStatus(status) if status is not None else None
        where = ListFilter(
            agent, tuple(pairs), None if since is None else float(since), None if until is None else float(until),
            title, bool(archived), parse_cursor(after) if after is not None else None,
            limit if wanted is None else None,
        )
        out: list[SessionSummary] = []
        with self._read() as tx:
            for row, preview, failed in tx.list_summaries(where):
                effective = self._effective_status(row)
                if wanted is not None and effective is not wanted:
                    continue
                out.append(self._summary(tx, row, effective, preview, failed))
                if limit is not None and len(out) >= limit:
                    break
        return out

    def set_title(self, session_id: str, title: str | None) -> None:
        """Set the session's title (one line, at most 200 characters, stripped), or with
        None or ``""`` clear it (the title is then derived again). Journals ``session.titled``
        ``{"title"}``; no change, no event.

        Raises:
            SessionNotFoundError: no such session.
            TypeError: ``title`` is not a str or None.
            ValueError: ``title`` longer than 200 characters.
        """
        _check_session_id(session_id)
        if title is not None and not isinstance(title, str):
            raise TypeError(f"title must be a str or None, got {type(title).__name__}")
        text = " ".join((title or "").split())
        if len(text) > _TITLE_CHARS:
            raise ValueError(f"a title is at most {_TITLE_CHARS} characters, got {len(text)}")
        if text:
            _check_text(text, "title", session_id)
        with self._write() as tx:
            row = self._require(tx, session_id)
            if (row.title or "") == text:
                return
            row.title = text or None
            self._append(tx, session_id, EventType.SESSION_TITLED.value, {"title": row.title})
            row.updated_at = self.clock()
            tx.update_row(row)

    def archive(self, session_id: str) -> bool:
        """Archive the session: kept whole, left out of :meth:`list_sessions` (unless
        ``archived=True``), and refusing new turns (:class:`SessionArchivedError`) until
        :meth:`unarchive`. Journals ``session.archived``. ``updated_at`` does not change.

        Returns:
            False when it was archived already (nothing written).

        Raises:
            SessionNotFoundError: no such session.
            SessionBusyError: a live owner is running a turn of it.
        """
        _check_session_id(session_id)
        with self._write() as tx:
            row = self._require(tx, session_id)
            if row.archived_at is not None:
                return False
            if row.status is SessionStatus.RUNNING and row.owner is not None and row.owner.alive():
                raise SessionBusyError(_busy_message(session_id, row.owner), session_id=session_id)
            row.archived_at = self.clock()
            self._append(tx, session_id, EventType.SESSION_ARCHIVED.value, {})
            tx.update_row(row)
            return True

    def unarchive(self, session_id: str) -> bool:
        """Undo :meth:`archive` (journals ``session.unarchived``); False when it was not archived.

        Raises:
            SessionNotFoundError: no such session.
        """
        _check_session_id(session_id)
        with self._write() as tx:
            row = self._require(tx, session_id)
            if row.archived_at is None:
                return False
            row.archived_at = None
            self._append(tx, session_id, EventType.SESSION_UNARCHIVED.value, {})
            tx.update_row(row)
            return True

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
            BaseSessionStore._last_turn_failed(tx, row.session_id) if failed is None else failed,
            forked_from=dict(row.forked_from) if row.forked_from else None,
            title=title_of(row.title, preview)[:_TITLE_CHARS],
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

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        agent: str | None = None,
        since: float | None = None,
        limit: int = 20,
        include_tools: bool = False,
        include_removed: bool = False,
    ) -> list[SearchHit]:
        """Full-text search over stored user and model text, one hit per turn, best first.

        ``query`` uses the syntax of :mod:`chatflow_cli.core.memory.search`. Turn 0 (SYSTEM
        messages) is never searched. The SQLite store ranks by bm25 over an FTS5 index the
        store keeps in step with the messages in the same transaction; the in-memory store
        scans its messages and ranks by the number of matched word occurrences.

        Args:
            session_id: only this session.
            agent: only sessions whose active agent has this name.
            since: only messages stored at or after this UTC epoch second.
            limit: at most this many hits (1..10,000).
            include_tools: also search tool results and tool-call names and arguments.
            include_removed: also find rolled-back and failed turns (their hits carry
                ``removed``).

        Returns:
            :class:`SearchHit` items, best first (ties: newest first).

        Raises:
            UsageError: the query cannot be parsed (the message says how to write it).
            TypeError: an argument of the wrong type.
            ValueError: ``limit`` outside 1..10,000.
        """
        parsed = parse_query(query)
        if session_id is not None:
            _check_session_id(session_id)
        if agent is not None and not isinstance(agent, str):
            raise TypeError(f"agent must be a str or None, got {type(agent).__name__}")
        if since is not None and (isinstance(since, bool) or not isinstance(since, (int, float))):
            raise TypeError(f"since must be epoch seconds (a number) or None, got {type(since).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {type(limit).__name__}")
        if not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be between 1 and 10000, got {limit}")
        where = SearchFilter(session_id, agent, None if since is None else float(since), limit,
                             bool(include_tools), bool(include_removed))
        self._before_search()
        with self._read() as tx:
            return tx.search(parsed, where)

    def _before_search(self) -> None:
        """Bring the store's search index up to date (a store that indexes on write: nothing)."""

    def latest_session_id(self) -> str | None:
        """The most recently updated session's id, or None when the store is empty."""
        with self._read() as tx:
            return tx.latest_session_id()

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
        groups: dict[tuple[int, int | None, str | None], list[Message]] = {}
        for item in stored:
            groups.setdefault((item.turn, item.removed_at_seq, item.removed), []).append(item.message)
        records = [
            TurnRecord(
                turn,
                tuple(msgs),
                in_window=reason is None and (turn == 0 or turn >= window_first),
                rolled_back=reason == "rolled_back",
                failed=reason == "failed",
            )
            for (turn, _seq, reason), msgs in groups.items()
        ]
        records.sort(key=lambda r: (r.number, r.rolled_back is False and r.failed is False))
        return records

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
                raise SessionBusyError(_busy_message(session_id, row.owner), session_id=session_id,
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

    def last_seq(self, session_id: str) -> int:
        """The session's newest event seq (SessionNotFoundError when absent)."""
        _check_session_id(session_id)
        with self._read() as tx:
            self._require(tx, session_id)
            return tx.next_seq(session_id) - 1

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
        kind = _event_type(type)
        if idempotency_key is not None:
            _check_idempotency_key(idempotency_key)
        if _is_reserved(kind):
            raise UsageError(
                f"event type {kind!r} is reserved for chatflow's own events: use {_use_instead(kind)}",
                session_id=session_id,
            )
        data = _check_metadata(payload if payload is not None else {}, "payload")
        if not kind.isascii():
            _check_text(kind, "event type", session_id)
        digest = _sha256({"type": kind, "payload": data})
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
        digest = _sha256(user_message.to_dict() if user_message is not None else None)
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
                    raise SessionBusyError(_busy_message(session_id, row.owner), session_id=session_id,
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
                        text = f"session {session_id} waits for tool results {', '.join(missing)}"
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
                    output, is_error = submitted[call.id]
                    ctx.add_message(Message.tool(call.id, output, name=call.name, is_error=is_error))
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
            binding = SessionBinding(id(self), row.incarnation, self._base_of(row), binding.loader, owner.token)
            if not ctx._saved(len(journal), row.metadata, binding, stored=(row.turn_count, row.status)):
                ctx = self._context(tx, row, default_agent, lease=owner.token)
        return TurnStart(self._detach(ctx), turn, None, events)

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

    def _recover(self, tx: _Tx, row: _SessionRow, default_agent: Any) -> list[Event]:
        """Close a dead owner's running turn: interrupt it, then ``session.recovered`` and ``idle``."""
        dead = row.owner
        ctx = self._context(tx, row, default_agent)
        turn = ctx.turn_count
        retried = turn > 0 and (tx.idempotency_turn_keyed(row.session_id, turn) or tx.processed_turn_claimed(
            row.session_id, turn))
        ctx.interrupt_turn(reason="owner died")
        if retried:  # its sender retries it (same key or message id): the retry replaces it in the window
            ctx.fail_turn(TurnOwnerDied("the process running this turn died; a retry of its message replaces it"))
        ctx.record_event(EventType.SESSION_RECOVERED, {"turn": turn, "owner": dead.to_dict() if dead else {}})
        ctx.set_status(SessionStatus.IDLE, "recovered: the running process died")
        return self._apply(tx, row, ctx._pending())

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

    def _submitted(self, tx: _Tx, session_id: str) -> dict[str, tuple[str, bool]]:
        """tool_use_id -> (output, is_error) submitted since the last MODEL message.

        ``is_error`` comes from the payload's optional ``"is_error": true``, which the Runner
        sets for a regular tool's error result recorded beside custom calls.
        """
        model = tx.last_event(session_id, EventType.MESSAGE_MODEL.value)
        after = model.seq if model is not None else 0
        return {
            str(e.payload["tool_use_id"]): (str(e.payload.get("output", "")), e.payload.get("is_error") is True)
            for e in tx.events_of_type(session_id, EventType.TOOL_RESULT_SUBMITTED.value, after)
        }

    def submit_tool_result(self, session_id: str, tool_use_id: str, output: str) -> list[str]:
        """Record a custom tool's result (``tool.result_submitted``); return the ids still unanswered.

        An id that is not pending, or was already answered: :class:`ToolResultError`, nothing written.

        Raises:
            ToolResultError: ``tool_use_id`` is not pending, or already has a result.
            SessionNotFoundError: no such session.
            SessionTerminatedError: the session is terminated.
        """
        _check_session_id(session_id)
        with self._write() as tx:
            row = self._require(tx, session_id)
            self._refuse_terminated(row)
            ctx = self._context(tx, row, quiet=True)
            pending = [c.id for c in ctx.pending_tool_calls]
            submitted = self._submitted(tx, session_id)
            if tool_use_id not in pending:
                raise ToolResultError(
                    f"no pending tool call {tool_use_id!r} in session {session_id}", session_id=session_id
                )
            if tool_use_id in submitted:
                raise ToolResultError(f"tool call {tool_use_id!r} already has a result", session_id=session_id)
            payload = {"turn": ctx.turn_count, "tool_use_id": tool_use_id, "output": str(output)}
            self._append(tx, session_id, EventType.TOOL_RESULT_SUBMITTED.value, payload, ctx.turn_count)
            row.updated_at = self.clock()
            tx.update_row(row)
            return [i for i in pending if i != tool_use_id and i not in submitted]

    # -- the model endpoint a session talks to ---------------------------------------------
    def session_endpoint(self, session_id: str) -> tuple[str | None, str | None]:
        """The ``(model, base_url)`` stored with the session, ``(None, None)`` when none was.

        Front-ends store the model and endpoint a session was created with (never an API
        key) so that resuming it talks to the same server. Raises
        :class:`SessionNotFoundError` for an unknown session.
        """
        _check_session_id(session_id)
        with self._read() as tx:
            self._require(tx, session_id)
            return tx.endpoint_get(session_id) or (None, None)

    def set_session_endpoint(self, session_id: str, model: str | None, base_url: str | None) -> None:
        """Store the model name and base URL (``None``: not set) the session talks to.

        Values are strings of at most 2,048 characters; an API key has no place here.
        Raises :class:`SessionNotFoundError`, or TypeError/ValueError for bad values.
        """
        _check_session_id(session_id)
        for name, value in (("model", model), ("base_url", base_url)):
            if value is not None:
                if not isinstance(value, str):
                    raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
                if len(value) > 2048:
                    raise ValueError(f"{name} is longer than 2048 characters")
                _check_text(value, name, session_id)
        with self._write() as tx:
            self._require(tx, session_id)
            tx.endpoint_put(session_id, model, base_url, self.clock())

    # -- de-duplication ----------------------------------------------------------------
    @staticmethod
    def _check_message_id(message_id: Any) -> str:
        """Message ids are non-empty strings in every store: ``5`` and ``"5"`` must not
        differ between backends, and ``None`` would never count as a duplicate in SQLite."""
        if not isinstance(message_id, str):
            raise TypeError(f"message_id must be a str, got {type(message_id).__name__}")
        if not message_id:
            raise TypeError("message_id must be a non-empty str")
        if not message_id.isascii():
            _check_text(message_id, "message_id")
        return message_id

    def _state_of(self, record: _MessageRecord | None, now: float) -> MessageState:
        if record is None or now >= record.at + self._dedup_ttl_s:
            return MessageState.NEW
        if record.state == "completed":
            return MessageState.PROCESSED
        if record.holder is None or not record.holder.alive():
            return MessageState.NEW
        return MessageState.IN_PROGRESS

    def message_state(self, message_id: str) -> MessageState:
        """Where ``message_id`` stands: ``new``, ``in_progress`` (a live holder's claim) or
        ``processed`` (its turn completed less than 192 h ago). See :class:`MessageState`.

        ``message_id``: a non-empty ``str`` (TypeError otherwise, in every store and method).
        """
        self._check_message_id(message_id)
        with self._read() as tx:
            return self._state_of(tx.processed_get(message_id), self.clock())

    def is_message_processed(self, message_id: str, *, wait: float = DUPLICATE_WAIT_S) -> bool:
        """True when a delivery of ``message_id`` must be skipped: its turn completed (less than
        192 h ago), or a live holder is processing it now. False for a new id, and for a claim
        that is free again (its holder died, its turn failed or was interrupted, it was
        released): the caller then claims the id and runs the message.

        A claim held by a live holder in *another process* (another worker, or another host)
        is waited for, polling every 20-250 ms, at most ``wait`` seconds (default
        ``DUPLICATE_WAIT_S``, 60): True once it is processed, False once it is free again
        (that worker was killed before it answered: this delivery must run the message), and
        True when ``wait`` runs out with the holder still alive and working. ``wait=0``
        answers at once. A claim held in *this process* answers True at once: its holder (a
        thread or a task of this event loop, which a blocking wait would deadlock) cannot die
        without this process, and when its turn fails its own delivery fails and is
        delivered again. This method blocks its thread while it waits; in ``async`` code,
        ``await store.ais_message_processed(id)`` waits without blocking the event loop.

        ``message_id``: a non-empty ``str`` (TypeError otherwise, in every store and method);
        ``wait``: seconds >= 0 (ValueError otherwise).
        """
        deadline = time.monotonic() + _check_wait(wait)
        delay = 0.02
        while True:
            verdict = self._duplicate_verdict(message_id)
            remaining = deadline - time.monotonic()
            if verdict is not None:
                return verdict
            if remaining <= 0:
                return True
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.25)

    def _duplicate_verdict(self, message_id: str) -> bool | None:
        """is_message_processed's answer now, or None while another process's live holder works."""
        state = self.message_state(message_id)
        if state is not MessageState.IN_PROGRESS:
            return state is MessageState.PROCESSED
        with self._read() as tx:
            record = tx.processed_get(message_id)
        holder = record.holder if record is not None else None
        if holder is None:  # it changed between the two reads: look again
            return None
        return True if holder.pid == os.getpid() and holder.host == socket.gethostname() else None

    def mark_message_processed(self, message_id: str) -> None:
        """Claim ``message_id`` for this caller, as :meth:`claim_message` does (under the
        name webhook handlers call first): the next Runner turn this thread or asyncio task starts completes the claim
        when it completes. When another live holder already has the id in progress, that
        turn (in this context) waits for it and returns its result instead of running twice.
        A processed id stays processed. ``message_id``: a non-empty str (TypeError).
        """
        _CLAIM.set((id(self), message_id, self._mark(message_id)))

    def _mark(self, message_id: str) -> str:
        """mark_message_processed's transaction; the claim's owner token (a fresh one when
        another holder has it: this caller's turn then waits for that holder)."""
        self._check_message_id(message_id)
        owner = Owner.current()
        now = self.clock()
        with self._write() as tx:
            tx.processed_purge(now, self._dedup_ttl_s)
            old = tx.processed_get(message_id)
            if self._state_of(old, now) is MessageState.NEW:
                tx.processed_put(message_id, self._new_claim(old, owner, now))
        return owner.token

    def claim_message(self, message_id: str, *, owner: Owner | None = None) -> bool:
        """Claim ``message_id`` in one atomic step: True for exactly one caller while the id is
        new (never seen, expired, or its claim is free again).

        The claim records its holder (``owner``, default: this process); it is *in progress*
        until the turn it starts completes -- the next Runner turn started in this thread or
        asyncio task, in the same transaction as ``turn.completed`` -- and then *processed*
        for 192 hours. A claim whose holder died, or whose turn failed or was interrupted,
        is free again. Without a Runner turn, call :meth:`complete_message` when done (or
        :meth:`release_message` when it failed). ``message_id``: a non-empty str (TypeError).
        """
        token = self._claim(message_id, owner)
        if token is not None:
            _CLAIM.set((id(self), message_id, token))
        return token is not None

    def _claim(self, message_id: str, owner: Owner | None) -> str | None:
        """claim_message's transaction: the holder's token when claimed, else None."""
        self._check_message_id(message_id)
        holder = owner if owner is not None else Owner.current()
        now = self.clock()
        with self._write() as tx:
            old = tx.processed_get(message_id)
            if self._state_of(old, now) is not MessageState.NEW:
                claimed = False
            else:
                tx.processed_put(message_id, self._new_claim(old, holder, now))
                claimed = True
            tx.processed_purge(now, self._dedup_ttl_s)
        return holder.token if claimed else None

    @staticmethod
    def _new_claim(old: _MessageRecord | None, holder: Owner, now: float) -> _MessageRecord:
        """A claim taking over ``old``: an attempt whose holder died keeps naming its turn, so
        the turn's recovery knows the message is retried (and takes the attempt out of the
        window)."""
        if old is not None and old.state == "in_progress" and old.session_id is not None:
            return _MessageRecord("in_progress", now, holder, old.session_id, old.turn)
        return _MessageRecord("in_progress", now, holder)

    def _release_held(self, message_id: str, token: str) -> bool:
        """Free ``message_id`` if the claim in progress is still the one ``token`` holds (a
        turn that never started: busy past its wait, refused); True when freed."""
        self._check_message_id(message_id)
        with self._write() as tx:
            record = tx.processed_get(message_id)
            if record is None or record.state != "in_progress" or record.holder is None:
                return False
            if record.holder.token != token:
                return False
            return tx.processed_release(message_id)

    def _forget_context_claim(self, message_id: str) -> None:
        claim = _CLAIM.get()
        if claim is not None and claim[0] == id(self) and claim[1] == message_id:
            _CLAIM.set(None)

    def complete_message(self, message_id: str) -> None:
        """Record ``message_id`` as processed now (for ids handled without a Runner turn).

        ``message_id``: a non-empty str (TypeError otherwise)."""
        self._check_message_id(message_id)
        now = self.clock()
        with self._write() as tx:
            old = tx.processed_get(message_id)
            tx.processed_put(
                message_id,
                _MessageRecord("completed", now, None, old.session_id if old else None, old.turn if old else None),
            )
        self._forget_context_claim(message_id)

    def release_message(self, message_id: str) -> bool:
        """Undo a claim whose processing failed, so a redelivery of ``message_id`` runs again.

        A Runner turn releases its claim itself when it fails; this is for failures before
        or outside a turn. Returns True when a record was removed. ``message_id``: a
        non-empty ``str`` (TypeError).
        """
        self._check_message_id(message_id)
        with self._write() as tx:
            released = tx.processed_release(message_id)
        self._forget_context_claim(message_id)
        return released

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

    async def arequest_interrupt(self, session_id: str) -> int | None:
        return await self._run_blocking(self.request_interrupt, session_id)

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

    def _notify_turn_ended(self) -> None:
        with self._turn_ended:
            self._turn_ended.notify_all()

    def wait_turn_ended(self, timeout: float) -> None:
        """Sleep until a turn of this store object ends or a waiter leaves, at most ``timeout`` s."""
        with self._turn_ended:
            self._turn_ended.wait(timeout)

    # -- edits outside a Runner turn (imports, Agents SDK sessions) --------------------
    def edit(
        self,
        session_id: str,
        change: Callable[[SessionContext], _T],
        *,
        create_agent: Any = None,
        max_turns: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        digest: str = "",
        last_turns: int | None = None,
        idempotency_keys: Mapping[str, str] | None = None,
        dry_run: bool = False,
    ) -> EditResult[_T]:
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
                              last_turns, idempotency_keys if idempotency_keys is not None else {}, dry_run)
        except _RolledBack as done:
            return done.result

    def _edit(
        self,
        session_id: str,
        change: Callable[[SessionContext], _T],
        create_agent: Any,
        max_turns: int | None,
        metadata: Mapping[str, Any] | None,
        idempotency_key: str | None,
        digest: str,
        last_turns: int | None,
        idempotency_keys: Mapping[str, str],
        dry_run: bool,
    ) -> EditResult[_T]:
        with self._write() as tx:
            row = tx.get_row(session_id)
            events: list[Event] = []
            if row is None:
                if create_agent is None:
                    return EditResult(None, [], missing=True)
                row = self._new_row(session_id, create_agent, max_turns, metadata)
                events += self._create(tx, row)
            if idempotency_key is not None and tx.idempotency_get(session_id, idempotency_key) is not None:
                return EditResult(None, events, replayed=True)
            self._refuse_terminated(row)
            if row.status is SessionStatus.RUNNING and row.owner is not None and row.owner.alive():
                raise SessionBusyError(_busy_message(session_id, row.owner), session_id=session_id)
            before = (row.incarnation, tx.next_seq(session_id) - 1)
            ctx = self._context(tx, row, quiet=True, last_turns=last_turns)
            value = change(ctx)
            events += self._apply(tx, row, ctx._pending())
            last_seq = events[-1].seq if events else before[1]
            if idempotency_key is not None:
                tx.idempotency_put(session_id, idempotency_key, digest, None, last_seq, self.clock())
            for key, key_digest in idempotency_keys.items():
                _check_idempotency_key(key)
                tx.idempotency_put(session_id, key, key_digest, None, last_seq, self.clock())
            result = EditResult(value, events, position=(row.incarnation, last_seq), before=before)
            if dry_run:
                raise _RolledBack(result)  # leaves the transaction: it is rolled back
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

    def turn_count(self, session_id: str) -> int:
        """The number of the session's last live turn (0 when it has none or does not exist)."""
        _check_session_id(session_id)
        with self._read() as tx:
            row = tx.get_row(session_id)
            return 0 if row is None else row.turn_count

    def idempotency_digests(self, session_id: str, keys: Sequence[str]) -> dict[str, str]:
        """The idempotency keys of ``keys`` already used in the session, with the digest kept
        with each (``{}`` when the session does not exist)."""
        _check_session_id(session_id)
        found: dict[str, str] = {}
        with self._read() as tx:
            if tx.get_row(session_id) is None:
                return found
            for key in keys:
                known = tx.idempotency_get(session_id, key)
                if known is not None:
                    found[key] = known[0]
        return found

    def log_position(self, session_id: str) -> tuple[str, int] | None:
        """``(incarnation, last seq)`` of the session's log, or None when it does not exist.

        Two reads of the same session return the same position exactly when nothing was
        written to it in between (the incarnation changes when the id is deleted and made
        again): a cheap check that something read before is still current."""
        _check_session_id(session_id)
        with self._read() as tx:
            row = tx.get_row(session_id)
            return None if row is None else (row.incarnation, tx.next_seq(session_id) - 1)

    async def alog_position(self, session_id: str) -> tuple[str, int] | None:
        return await self._run_blocking(self.log_position, session_id)

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

    async def awindow_dicts(self, session_id: str) -> tuple[tuple[str, int] | None, list[tuple[int, dict[str, Any]]]]:
        return await self._run_blocking(self.window_dicts, session_id)

    def active_agent_name(self, session_id: str) -> str | None:
        """The name of the session's active agent; None when the session does not exist."""
        _check_session_id(session_id)
        with self._read() as tx:
            row = tx.get_row(session_id)
            return None if row is None else row.active_agent_name

    # -- async twins -------------------------------------------------------------------
    async def aedit(self, session_id: str, change: Callable[[SessionContext], _T], **kwargs: Any) -> EditResult[_T]:
        return await self._run_blocking(partial(self.edit, session_id, change, **kwargs))

    async def awindow_turns(self, session_id: str) -> tuple[Turn, ...]:
        return await self._run_blocking(self.window_turns, session_id)

    async def aactive_agent_name(self, session_id: str) -> str | None:
        return await self._run_blocking(self.active_agent_name, session_id)

    async def aget(self, session_id: str) -> SessionContext | None:
        return await self._run_blocking(self.get, session_id)

    async def aget_or_create(
        self,
        session_id: str,
        default_agent: Any,
        max_turns: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionContext:
        return await self._run_blocking(self.get_or_create, session_id, default_agent, max_turns, metadata)

    async def asave(self, session: SessionContext) -> list[Event]:
        return await self._run_blocking(self.save, session)

    async def arelease(
        self, session: SessionContext, status: SessionStatus | str = SessionStatus.IDLE, reason: str = "", **extra: Any
    ) -> list[Event]:
        return await self._run_blocking(self.release, session, status, reason, **extra)

    async def adelete(self, session_id: str) -> bool:
        return await self._run_blocking(self.delete, session_id)

    async def arollback(self, session_id: str, to_turn: int | None = None, *, last: int | None = None) -> list[Event]:
        return await self._run_blocking(self.rollback, session_id, to_turn, last=last)

    async def asession_summary(self, session_id: str) -> SessionSummary:
        return await self._run_blocking(self.session_summary, session_id)

    async def alist_sessions(
        self,
        limit: int | None = None,
        agent: str | None = None,
        status: SessionStatus | str | None = None,
        **filters: Any,
    ) -> list[SessionSummary]:
        return await self._run_blocking(self.list_sessions, limit, agent, status, **filters)

    async def asearch(self, query: str, **kwargs: Any) -> list[SearchHit]:
        return await self._run_blocking(self.search, query, **kwargs)

    async def afork(self, session_id: str, at: int | None = None, *, into: str | None = None) -> SessionSummary:
        return await self._run_blocking(self.fork, session_id, at, into=into)

    async def aset_title(self, session_id: str, title: str | None) -> None:
        return await self._run_blocking(self.set_title, session_id, title)

    async def aarchive(self, session_id: str) -> bool:
        return await self._run_blocking(self.archive, session_id)

    async def aunarchive(self, session_id: str) -> bool:
        return await self._run_blocking(self.unarchive, session_id)

    async def alatest_session_id(self) -> str | None:
        return await self._run_blocking(self.latest_session_id)

    async def aload_turns(
        self, session_id: str, first: int = 1, last: int | None = None, include_rolled_back: bool = False
    ) -> list[TurnRecord]:
        return await self._run_blocking(self.load_turns, session_id, first, last, include_rolled_back)

    async def aevents(self, session_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        return await self._run_blocking(self.events, session_id, after_seq, limit)

    async def alast_seq(self, session_id: str) -> int:
        return await self._run_blocking(self.last_seq, session_id)

    async def aappend_event(
        self,
        session_id: str,
        type: EventType | str,
        payload: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Event:
        return await self._run_blocking(self.append_event, session_id, type, payload, idempotency_key)

    async def abegin_turn(self, session_id: str, **kwargs: Any) -> TurnStart:
        return await self._run_blocking(partial(self.begin_turn, session_id, **kwargs))

    async def asubmit_tool_result(self, session_id: str, tool_use_id: str, output: str) -> list[str]:
        return await self._run_blocking(self.submit_tool_result, session_id, tool_use_id, output)

    async def asession_endpoint(self, session_id: str) -> tuple[str | None, str | None]:
        return await self._run_blocking(self.session_endpoint, session_id)

    async def aset_session_endpoint(self, session_id: str, model: str | None, base_url: str | None) -> None:
        return await self._run_blocking(self.set_session_endpoint, session_id, model, base_url)

    async def ais_message_processed(self, message_id: str, *, wait: float = DUPLICATE_WAIT_S) -> bool:
        """:meth:`is_message_processed`, waiting for another process's claim without blocking
        the event loop."""
        import asyncio  # here: importing the stores does not import asyncio

        deadline = time.monotonic() + _check_wait(wait)
        delay = 0.02
        while True:
            verdict = await self._run_blocking(self._duplicate_verdict, message_id)
            remaining = deadline - time.monotonic()
            if verdict is not None:
                return verdict
            if remaining <= 0:
                return True
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.25)

    async def amark_message_processed(self, message_id: str) -> None:
        _CLAIM.set((id(self), message_id, await self._run_blocking(self._mark, message_id)))

    async def aclaim_message(self, message_id: str, *, owner: Owner | None = None) -> bool:
        token = await self._run_blocking(self._claim, message_id, owner)
        if token is not None:  # set here: the claim belongs to the calling task's context
            _CLAIM.set((id(self), message_id, token))
        return token is not None

    async def amessage_state(self, message_id: str) -> MessageState:
        return await self._run_blocking(self.message_state, message_id)

    async def acomplete_message(self, message_id: str) -> None:
        await self._run_blocking(self.complete_message, message_id)
        self._forget_context_claim(message_id)

    async def arelease_message(self, message_id: str) -> bool:
        released = await self._run_blocking(self.release_message, message_id)
        self._forget_context_claim(message_id)
        return released
