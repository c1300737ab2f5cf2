"""Listing, searching, forking, titling and archiving sessions."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from typing import Any

from .._dsn import url_without_userinfo
from ..errors import SessionBusyError, UsageError
from ..events import EventType, SessionStatus
from ..messages import Role
from ._checks import _check_metadata, _check_session_id, _check_text, _check_title
from ._core import _StoreCore
from ._checks import TITLE_CHARS
from ._mounts import stored_mounts
from ._port import ListFilter, SearchFilter, _SessionRow, _busy_message, _Tx, parse_cursor, _ran
from .context import MESSAGE_EVENT_TYPE
from .protocol import SessionSummary
from .search import SearchHit, parse_query


_FORK_TITLE = " (fork)"


class _Listing(_StoreCore):
    """Session listing, search, fork, titles and archive."""

    def fork(
        self,
        session_id: str,
        at: int | None = None,
        *,
        into: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionSummary:
        """Copy turns 1..``at`` of a session into a new session, in one transaction.

        The new session's history is the source's live SYSTEM messages and turns 1..``at``,
        copied (nothing is re-run), with the agent, ``max_turns`` and stored model and
        endpoint (:meth:`session_endpoint`) of the source. Each copied message keeps the
        time the source stored it (its message event's ``created_at``), so searches by time
        and ages see the original times. The source's metadata is NOT copied (metadata names
        the external conversation a session serves, which a branch does not): the fork has
        ``metadata`` (default none). A title the user set on the source is kept with
        `` (fork)`` appended (cut to fit 200 characters); a derived title is derived again.
        The resources mounted on the source are mounted on the fork (one ``resource.mounted``
        event each, after ``session.created``): both then share the same memory stores.
        Its event log starts with ``session.created`` whose payload carries ``"forked_from":
        {"session_id", "turn", "seq"}`` (``seq``: the point the fork was taken from, the seq of
        the last event of turn ``at`` in the source: :meth:`_fork_point`),
        then one message event per copied message and, after each copied turn the source
        completed, its ``turn.completed`` (the source's payload), then, for each live summary
        of turns 1..K with K <= ``at``, a ``context.compacted`` event (the source's payload
        plus ``"copied_from": {"session_id", "seq"}``) and the summary itself, so the new
        session's context window uses it. The source is not changed.

        Only completed turns are copied: while the source runs a turn (stored status
        ``running``), its newest turn is left out, and ``at`` defaults to the newest
        completed turn.

        Args:
            at: the last turn to copy (0: only the SYSTEM messages); default: the newest
                completed turn.
            into: the new session's id; default ``<source>-fork-<6 hex digits>``.
            metadata: the new session's metadata (a JSON-ready mapping); default ``{}``.

        Returns:
            The new session's :class:`SessionSummary` (``forked_from`` set).

        Raises:
            SessionNotFoundError: no session ``session_id``.
            ValueError: ``at`` outside 0..the newest completed turn, or ``into`` empty.
            UsageError: a session ``into`` already exists.
            TypeError: an argument of the wrong type.
        """
        _check_session_id(session_id)
        own_metadata = _check_metadata(metadata) if metadata is not None else {}
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
            origin = {"session_id": session_id, "turn": turn, "seq": self._fork_point(tx, session_id, turn)}
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
            title = None
            if source.title:
                title = source.title[: TITLE_CHARS - len(_FORK_TITLE)].rstrip() + _FORK_TITLE
            row = _SessionRow(
                new_id, secrets.token_hex(8), agent, own_metadata, source.max_turns, turn,
                SessionStatus.IDLE, None, now, now, origin, title=title, agent_versions=versions,
            )
            tx.insert_row(row)
            payload = {"agent": agent, "max_turns": row.max_turns, "metadata": row.metadata, "forked_from": origin}
            self._append(tx, new_id, EventType.SESSION_CREATED.value, payload)
            if title is not None:
                self._append(tx, new_id, EventType.SESSION_TITLED.value, {"title": title})
            for mount in stored_mounts(tx, session_id):  # the fork runs with the source's resources
                self._append(tx, new_id, EventType.RESOURCE_MOUNTED.value, mount.to_dict())
            endpoint = tx.endpoint_get(session_id)
            if endpoint is not None and (endpoint[0] is not None or endpoint[1] is not None):
                url = url_without_userinfo(endpoint[1]) if endpoint[1] is not None else None  # an old row's password stays behind
                tx.endpoint_put(new_id, endpoint[0], url, now)
            times = self._message_times(tx, session_id, stored)
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
                    tx, new_id, MESSAGE_EVENT_TYPE[item.message.role],
                    {"turn": item.turn, "message": item.message.to_dict()}, item.turn, created_at=times.get(id(item)),
                )
                tx.insert_message(new_id, item.turn, item.message, event.seq)
            for number in sorted(done):
                self._append(tx, new_id, EventType.TURN_COMPLETED.value, done[number], number)
            self._copy_summaries(tx, session_id, new_id, turn)
            return self._summary(tx, row, row.status)

    @staticmethod
    def _fork_point(tx: _Tx, session_id: str, turn: int) -> int:
        """The seq of the source's event a fork at ``turn`` is taken from: the newest message,
        ``turn.completed`` or ``turn.interrupted`` event of live turn ``turn`` (a rolled-back or
        failed run of that number came before it; what came after, later turns included, is
        not in the fork); for turn 0, the last event before turn 1 began (the newest seq when
        no turn began)."""
        kinds = set(MESSAGE_EVENT_TYPE.values())
        ends = (EventType.TURN_COMPLETED.value, EventType.TURN_INTERRUPTED.value)
        point = 0
        for event in tx.events(session_id, 0, None):
            number = event.payload.get("turn")
            if not isinstance(number, int) or isinstance(number, bool):
                number = None
            if turn == 0:
                if number is not None and number >= 1 and event.type in kinds:
                    return point
                point = event.seq
            elif number == turn and (event.type in kinds or event.type in ends):
                point = event.seq
        return point

    @staticmethod
    def _message_times(tx: _Tx, session_id: str, stored: list[Any]) -> dict[int, float]:
        """``id(item)`` -> the time the source stored it, for the live messages ``stored``.

        A turn's live messages are the newest message events of that turn (a rolled-back or
        failed run of the same turn number came before them); each is checked against the
        event's message, and a message without its event is left out (it gets the fork's time)."""
        kinds = set(MESSAGE_EVENT_TYPE.values())
        by_turn: dict[int, list[Any]] = {}
        for event in tx.events(session_id, 0, None):
            number = event.payload.get("turn") if event.type in kinds else None
            if isinstance(number, int) and not isinstance(number, bool):
                by_turn.setdefault(number, []).append(event)
        live: dict[int, list[Any]] = {}
        for item in stored:
            live.setdefault(item.turn, []).append(item)
        out: dict[int, float] = {}
        for number, items in live.items():
            events = by_turn.get(number, [])[-len(items):]
            if len(events) != len(items):
                continue
            for item, event in zip(items, events):
                if event.payload.get("message") == item.message.to_dict():
                    out[id(item)] = event.created_at
        return out

    def _copy_summaries(self, tx: _Tx, source_id: str, new_id: str, turn: int) -> None:
        """Copy the source's live summaries of turns 1..K with K <= ``turn`` into ``new_id``,
        each with its ``context.compacted`` event (the source's payload plus ``"copied_from":
        {"session_id", "seq"}``, the source event's seq), in the order they were made."""
        compacted = tx.events_of_type(source_id, EventType.CONTEXT_COMPACTED.value, 0)
        for item in tx.summaries(source_id, False):
            through = item.message.summary_through
            if through is None or through > turn:
                continue
            origin = next((e for e in reversed(compacted) if e.payload.get("through") == through
                           and e.payload.get("summary", item.message.content) == item.message.content), None)
            payload: dict[str, Any] = dict(origin.payload) if origin is not None else {"through": through}
            payload["copied_from"] = {"session_id": source_id, "seq": origin.seq if origin is not None else None}
            event = self._append(tx, new_id, EventType.CONTEXT_COMPACTED.value, payload, None)
            tx.insert_message(new_id, 0, item.message, event.seq)

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
            :class:`SearchHit` items, best first (ties: newest first). A hit in a turn a fork
            copied from its source carries ``forked_from`` (the source session and turn).

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
            hits = tx.search(parsed, where)
            origins: dict[str, dict[str, Any] | None] = {}
            out: list[SearchHit] = []
            for hit in hits:
                if hit.session_id not in origins:
                    row = tx.get_row(hit.session_id)
                    origins[hit.session_id] = row.forked_from if row is not None else None
                origin = origins[hit.session_id]
                if origin is not None and isinstance(origin.get("turn"), int) and hit.turn <= origin["turn"]:
                    hit = dataclasses.replace(hit, forked_from={"session_id": origin.get("session_id"), "turn": hit.turn})
                out.append(hit)
            return out

    def _before_search(self) -> None:
        """Bring the store's search index up to date (a store that indexes on write: nothing)."""

    def latest_session_id(self) -> str | None:
        """The most recently updated session's id, or None when the store is empty."""
        with self._read() as tx:
            return tx.latest_session_id()
