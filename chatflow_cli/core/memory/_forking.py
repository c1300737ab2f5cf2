"""Forking a session: a new session with a copy of the source's first turns."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from ..dsn import url_without_userinfo
from ..errors import UsageError
from ..events import EventType, SessionStatus
from ..messages import Role
from ._checks import TITLE_CHARS, _check_metadata, _check_session_id
from ._listing import _Listing
from ._core import stored_mounts
from ._port import _ran, _SessionRow, _Tx
from ._twins import async_twin
from .context import MESSAGE_EVENT_TYPE
from .values import SessionSummary

_FORK_TITLE = " (fork)"


class _Forking(_Listing):
    """Forks of a session and where a session was forked from (a fork answers with the
    new session's summary, as listed)."""

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
        completed, its ``turn.completed`` (the source's payload), then the ``mcp.output``
        events (whole tool results cut for the model) of the copied calls, then, for each live summary
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
            self._copy_whole_results(tx, session_id, new_id, turn, stored)
            self._copy_summaries(tx, session_id, new_id, turn)
            return self._summary(tx, row, row.status)

    afork = async_twin(fork, writes=True)

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

    def _copy_whole_results(self, tx: _Tx, source_id: str, new_id: str, turn: int, stored: list[Any]) -> None:
        """Copy the ``mcp.output`` events (the whole text of a tool result cut for the model)
        of the copied calls of turns 1..``turn``: the cut result's note says it is kept."""
        answered = {item.message.tool_call_id for item in stored if item.message.role is Role.TOOL}
        for event in tx.events_of_type(source_id, "mcp.output", 0):
            number = event.payload.get("turn")
            if isinstance(number, int) and number <= turn and event.payload.get("tool_use_id") in answered:
                self._append(tx, new_id, "mcp.output", dict(event.payload), number)

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
