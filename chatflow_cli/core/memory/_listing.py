"""Listing sessions and their summaries, titles and archive."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import SessionBusyError, UsageError
from ..events import Event, EventType, SessionStatus
from ._checks import _check_session_id, _check_text, _check_title
from ._core import _StoreCore
from ._port import ListFilter, _busy_message
from ._twins import async_twin
from .values import SessionSummary, TurnRecord

if TYPE_CHECKING:  # pragma: no cover
    from .search import SearchHit


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
        updated_at = float(head)
        if not math.isfinite(updated_at):
            raise ValueError
        return updated_at, session_id
    except ValueError:
        raise UsageError(
            f"{cursor!r} is neither a session id nor a listing cursor: pass a session id or the "
            "'cursor' value printed with --json"
        ) from None


@runtime_checkable
class SessionLookup(Protocol):
    """One session's stored facts, read without loading its window or resolving its agent:
    what most callers of a store look up first."""

    def session_summary(self, session_id: str) -> SessionSummary:
        """One session's :class:`SessionSummary`, read without loading its window or agent."""
        ...

    def active_agent_name(self, session_id: str) -> str | None:
        """The name of the session's active agent (one row read); None when there is no session."""
        ...

    def session_endpoint(self, session_id: str) -> tuple[str | None, str | None]:
        """The ``(model, base_url)`` stored with the session."""
        ...


@runtime_checkable
class ListingStore(SessionLookup, Protocol):
    """What the front-ends need to list, show, find and file sessions (``sessions ls``,
    ``show``, ``search``, ``fork``, ``rename``, ``archive``, ``replay``): reads, and the
    writes that file a session (a fork, a title, the archive) without changing its turns."""

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
        """Sessions, most recently updated first, in one query."""
        ...

    def latest_session_id(self) -> str | None:
        """The most recently updated session's id, or None."""
        ...

    def load_turns(
        self, session_id: str, first: int = 1, last: int | None = None, include_rolled_back: bool = False
    ) -> list[TurnRecord]:
        """Stored turns ``first..last``."""
        ...

    def events(self, session_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        """Events with ``seq > after_seq`` in seq order (the replay cursor)."""
        ...

    def last_seq(self, session_id: str) -> int:
        """The session's newest event seq."""
        ...

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
        """Full-text search; one hit per matching turn, best first."""
        ...

    def fork(
        self,
        session_id: str,
        at: int | None = None,
        *,
        into: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionSummary:
        """Copy completed turns 1..``at`` into a new session; the new session's summary."""
        ...

    def forked_from(self, session_id: str) -> dict[str, Any] | None:
        """Where the session was forked from, or None."""
        ...

    def set_title(self, session_id: str, title: str | None) -> None:
        """Set (or with None clear) the session's title."""
        ...

    def archive(self, session_id: str) -> bool:
        """Archive the session; False when it already was."""
        ...

    def unarchive(self, session_id: str) -> bool:
        """Unarchive the session; False when it was not archived."""
        ...


class _Listing(_StoreCore):
    """Session listing, one session's summary, titles and archive."""

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

    asession_summary = async_twin(session_summary)

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
            after: a session id or a :attr:`SessionSummary.cursor`: only the rows after it
                in this order (a session id: after that session's current position). A
                session updated since the cursor was printed moves before it, so paging on
                never repeats or skips the others. A stored session id wins over a cursor
                that spells the same text.

        Raises:
            TypeError: an argument of the wrong type.
            ValueError: ``status`` is not a :class:`SessionStatus` value, ``limit`` < 0.
            UsageError: ``after`` is neither a stored session id nor a cursor this store
                printed (a non-finite time included).
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
        if after is not None and not isinstance(after, str):
            raise TypeError(f"after must be a str or None, got {type(after).__name__}")
        out: list[SessionSummary] = []
        with self._read() as tx:
            position: tuple[float, str] | None = None
            if after is not None:
                anchor = tx.get_row(after) if after and len(after) <= 512 and after.isprintable() else None
                position = (anchor.updated_at, anchor.session_id) if anchor is not None else parse_cursor(after)
            where = ListFilter(
                agent, tuple(pairs), None if since is None else float(since), None if until is None else float(until),
                title, bool(archived), position, limit if wanted is None else None,
            )
            for row, preview, failed in tx.list_summaries(where):
                effective = self._effective_status(row)
                if wanted is not None and effective is not wanted:
                    continue
                out.append(self._summary(tx, row, effective, preview, failed))
                if limit is not None and len(out) >= limit:
                    break
        return out

    alist_sessions = async_twin(list_sessions)

    def set_title(self, session_id: str, title: str | None) -> None:
        """Set the session's title (one line, at most 200 characters, stripped), or with
        None or ``""`` clear it (the title is then derived again). Journals ``session.titled``
        ``{"title"}``; no change, no event. ``updated_at`` does not change (the session keeps
        its place in :meth:`list_sessions`).

        Raises:
            SessionNotFoundError: no such session.
            TypeError: ``title`` is not a str or None.
            ValueError: ``title`` longer than 200 characters.
        """
        _check_session_id(session_id)
        text = _check_title(title, session_id) or ""
        with self._write() as tx:
            row = self._require(tx, session_id)
            if (row.title or "") == text:
                return
            row.title = text or None
            self._append(tx, session_id, EventType.SESSION_TITLED.value, {"title": row.title})
            tx.update_row(row)  # a new title is no new activity: ``updated_at`` stays

    aset_title = async_twin(set_title, writes=True)

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
                raise SessionBusyError(_busy_message(session_id, row.owner, tx), session_id=session_id)
            row.archived_at = self.clock()
            self._append(tx, session_id, EventType.SESSION_ARCHIVED.value, {})
            tx.update_row(row)
            return True

    aarchive = async_twin(archive, writes=True)

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

    aunarchive = async_twin(unarchive, writes=True)

    def latest_session_id(self) -> str | None:
        """The most recently updated session's id, or None when the store is empty."""
        with self._read() as tx:
            return tx.latest_session_id()

    alatest_session_id = async_twin(latest_session_id)
