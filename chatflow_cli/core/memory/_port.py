"""The transaction port every store implements (:class:`_Tx`) and the records it carries.

A backend supplies a :class:`_Tx` (rows, events, messages, idempotency keys, message claims,
the turn queue) from ``_read()`` and ``_write()``; the session rules above it live in the
``_core`` mixin and the per-concern mixins that :class:`~chatflow_cli.core.memory.base.BaseSessionStore`
composes. This module also holds the small values several mixins share (limits, the
session row, list and search filters, the busy message), and :class:`Owner`, the owner of a
running turn: the lease record a ``running`` session carries.

An :class:`Owner` names a process (pid, its start time read from ``/proc/<pid>/stat``, the
host) and one run of it (a random token). :meth:`Owner.alive` tells a live owner from a
dead one, or from a new process that reuses a dead owner's pid, so a store can recover a
turn whose process died. Claims on inbound message ids record their holder the same way."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..events import Event, SessionStatus
from ..messages import Message
from ._checks import metadata_matches

if TYPE_CHECKING:  # pragma: no cover
    from .search import Query, SearchHit

logger = logging.getLogger(__name__.rpartition(".")[0] + ".base")  # the store rules log as ``memory.base``

#: How long (hours) a processed message id counts as a duplicate: 8 days, covering a 7-day
#: re-delivery window such as WhatsApp's.
DEFAULT_DEDUP_TTL_HOURS = 192
#: How long (seconds) ``is_message_processed`` waits, by default, for a claim another process
#: holds to end (processed, or free again because the holder died or its turn failed).
DUPLICATE_WAIT_S = 60.0

_PREVIEW_CHARS = 80


class TurnOwnerDied(Exception):
    """Why a recovered turn left the context window (the ``error_type`` of its ``turn.failed``)."""


def _busy_message(session_id: str, owner: Any, tx: Any = None) -> str:
    """The :class:`SessionBusyError` text for a session another live run owns (a turn, or
    a compaction when ``tx`` shows the session was taken for one)."""
    what = "a compaction" if tx is not None and _compacting(tx, session_id) else "a turn"
    return f"session {session_id!r} is busy: {what} is running in pid {owner.pid} on {owner.host}"


def _compacting(tx: Any, session_id: str) -> bool:
    """True when the session's newest ``status`` event took it for a compaction."""
    taken = tx.last_event(session_id, "status")
    return taken is not None and taken.payload.get("status") == SessionStatus.RUNNING.value and \
        taken.payload.get("reason") == "compaction started"


#: Owner tokens of this process whose run is over although the store may still name them
#: (the turn's ending could not be written: the database was down). Oldest dropped first.
_ENDED_KEPT = 65536
_ended: dict[str, None] = {}
_ended_lock = threading.Lock()


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) from ``/proc/<pid>/stat``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # "pid (comm) state ppid ..." — comm may hold spaces and parentheses: split after the last ")".
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])  # field 3 (state) and field 22 (starttime)
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Owner:
    """Who runs a session's current turn: the lease record of a ``running`` session.

    ``pid`` plus ``start_time`` (the process start time in clock ticks since boot, field 22
    of ``/proc/<pid>/stat``; 0 where there is no ``/proc``) tell a live owner from a new
    process that reuses a dead owner's pid. ``host`` is the machine; ``token`` is random
    per run, so two runs of one process are told apart.
    """

    pid: int
    start_time: int
    host: str
    token: str

    @classmethod
    def current(cls) -> Owner:
        """This process, with a fresh token."""
        pid = os.getpid()
        stat = _proc_stat(pid)
        return cls(pid=pid, start_time=stat[1] if stat else 0, host=socket.gethostname(), token=secrets.token_hex(8))

    @classmethod
    def of_process(cls, pid: int) -> Owner:
        """Another local process ``pid`` as an owner (used by tests and recovery tools)."""
        stat = _proc_stat(pid)
        return cls(pid=pid, start_time=stat[1] if stat else 0, host=socket.gethostname(), token=secrets.token_hex(8))

    @staticmethod
    def end_run(token: str) -> None:
        """Mark the run ``token`` names as over in this process: from now :meth:`alive` is
        False for every owner record with this token, so a turn or claim it left behind (its
        ending could not be stored) is recovered, or free again, at once instead of looking
        held by a live process."""
        with _ended_lock:
            _ended[token] = None
            while len(_ended) > _ENDED_KEPT:
                del _ended[next(iter(_ended))]

    def alive(self) -> bool:
        """True while the owning process runs and the run has not ended.

        Owners on another host cannot be checked and count as alive. A zombie (exited,
        not yet reaped) counts as dead; so does a process whose start time differs from
        the recorded one (the pid was reused), and a run of this process that
        :meth:`end_run` marked as over.
        """
        if self.token in _ended:
            return False
        if self.host != socket.gethostname():
            return True
        if self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        stat = _proc_stat(self.pid)
        if stat is None:
            return not os.path.isdir("/proc")
        state, start = stat
        if state in ("Z", "X"):
            return False
        return not (self.start_time and start != self.start_time)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time, "host": self.host, "token": self.token}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Owner:
        return cls(int(data["pid"]), int(data.get("start_time", 0)), str(data.get("host", "")), str(data["token"]))


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
class _MessageRow:
    """A message's stored row (as :class:`_SessionRow` is a session's): the message, its turn,
    and whether and when it was removed from the window."""

    turn: int
    message: Message
    removed: str | None = None  # None live, "rolled_back" or "failed"
    removed_at_seq: int | None = None
    seq: int | None = None  # the seq of the event that recorded the message (turn_messages gives it)


class _Tx:
    """Storage primitives one backend runs inside a transaction (read or write).

    The session rules live in :class:`BaseSessionStore`; a backend implements only these.
    Every write method may only be called inside a write transaction.
    """

    def get_row(self, session_id: str) -> _SessionRow | None:
        raise NotImplementedError

    def window_marks(self, session_id: str, first: int, last: int) -> object | None:
        """What this transaction knows of the live message rows of turn 0 and turns
        ``first..last`` that spares a later transaction its reads (SQLite: each turn's next
        position), or None; a transaction that finds the session unchanged since gives it
        to :meth:`assume_window`."""
        return None

    def assume_window(self, session_id: str, marks: object | None) -> None:
        """Take ``marks`` (:meth:`window_marks` of a transaction after which the session did not
        change) instead of reading the window; called before any other use of the session."""

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

    def turn_events(self, session_id: str, type: str, first: int, last: int | None) -> list[Event]:
        """Events of ``type`` whose turn is ``first..last`` (None: no upper bound), in seq
        order. A backend with a turn column overrides this with one indexed query."""
        return [e for e in self.events_of_type(session_id, type, 0)
                if isinstance(e.payload.get("turn"), int) and first <= e.payload["turn"]
                and (last is None or e.payload["turn"] <= last)]

    def insert_message(self, session_id: str, turn: int, message: Message, seq: int,
                       message_json: str | None = None) -> None:
        """Store a live message; ``message_json``: its ``to_json()`` when already made."""
        raise NotImplementedError

    def remove_turns(self, session_id: str, first: int, last: int | None, reason: str, seq: int) -> None:
        """Mark live messages of turns first..last (None: no upper bound) as removed; turn 0
        (the SYSTEM messages and summaries) only when ``first`` is 0."""
        raise NotImplementedError

    def window(self, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        """Live SYSTEM messages of turn 0 that are not summaries, then the newest live summary
        (highest ``summary_through``, then newest), then live messages of turns >= first_turn,
        in order; the summary comes as ``(0, message)``."""
        raise NotImplementedError

    def latest_summary_through(self, session_id: str) -> int | None:
        """K of the session's newest live summary (highest K), or None when it has none."""
        raise NotImplementedError

    def live_window(self, session_id: str, newest_first: int) -> list[tuple[int, Message]]:
        """The context window from turn ``newest_first`` on (the newest ``max_turns`` turns),
        cut after the newest summary: :meth:`window` from ``max(newest_first, K + 1)``, K the
        newest summary's :meth:`latest_summary_through` (0 without one). A backend may read
        it in one statement."""
        through = self.latest_summary_through(session_id)
        return self.window(session_id, max(newest_first, (through or 0) + 1))

    def remove_summaries(self, session_id: str, after_turn: int, seq: int) -> None:
        """Mark live summaries whose K is above ``after_turn`` removed (``rolled_back``) at ``seq``."""
        raise NotImplementedError

    def summaries(self, session_id: str, include_removed: bool) -> list[_MessageRow]:
        """The session's summaries (turn 0) in the order they were stored."""
        raise NotImplementedError

    def window_dicts(self, session_id: str, first_turn: int) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`live_window` as ``Message.to_dict()`` dicts; a backend that stores JSON may
        return it parsed, without building messages."""
        return [(turn, msg.to_dict()) for turn, msg in self.live_window(session_id, first_turn)]

    def turn_messages(
        self, session_id: str, first: int, last: int | None, include_removed: bool
    ) -> list[_MessageRow]:
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
