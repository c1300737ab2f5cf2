"""One conversation's state: :class:`SessionContext`, its turns and its journal of changes.

A context holds the *context window*: every SYSTEM message, then the newest ``max_turns``
whole turns. A turn starts at a USER message and holds everything up to the next USER
message, so pruning never separates a tool call from its result. Turn numbers are the ones
users see: 1, 2, 3... for the life of the session, stable across pruning; after
``rollback_to(2)`` the next new turn is turn 3.

Every change is recorded in a private *journal* (:class:`JournalEntry` entries, each carrying the
event that records it); ``store.save(session)`` applies the journal in one transaction and
appends one event per change to the session's log (event types in
:mod:`chatflow_cli.core.events`). A context made by hand, with no store, keeps its own
events (``events``, seq 1, 2, 3...) and its pruned turns in memory.

The seam to the stores (:class:`SessionBinding`, :class:`JournalEntry`, the agent trail)
is :mod:`chatflow_cli.core.memory.binding`; its names are importable from here too.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidHistoryError, PendingToolCallsError, SessionTerminatedError, UsageError
from ..events import (
    RECORDABLE_EVENT_TYPES,
    Event,
    EventType,
    SessionStatus,
    event_type_name,
    is_reserved_event_type,
    use_instead,
)
from ..messages import Attachment, Message, Role, ToolCall
from ..resources.mounts import Mount, unique_mounts
from ..resources.secrets import scrub_values
from ..stream import normalize_usage
from .binding import AGENT_TRAIL_EVENTS, MESSAGE_EVENT_TYPE, AgentTrail, JournalEntry, SessionBinding, TurnLoader
from ._checks import (
    DEFAULT_MAX_TURNS,
    _check_max_turns,
    _check_metadata,
    _check_session_id,
    _check_text,
    _check_title,
    _plain_usage,
    agent_name_of,
    storable_text,
)

__all__ = [
    "AGENT_TRAIL_EVENTS",
    "INTERRUPTED_TOOL_RESULT",
    "MESSAGE_EVENT_TYPE",
    "JournalEntry",
    "SessionBinding",
    "SessionContext",
    "Turn",
    "TurnLoader",
    "AgentTrail",
    "restore_context",
    "split_turns",
]

#: Content of the TOOL result a tool call gets when its turn is interrupted before a result.
INTERRUPTED_TOOL_RESULT = "Interrupted before a result: side effects unknown."


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of the context window: its user-visible ``number`` and its messages (USER first)."""

    number: int
    messages: tuple[Message, ...]


def _open_calls(messages: Sequence[Message]) -> tuple[ToolCall, ...]:
    """Tool calls of the last MODEL message that no TOOL message after it answers yet."""
    answered: set[str] = set()
    for msg in reversed(messages):
        if msg.role is Role.TOOL:
            answered.add(msg.tool_call_id or "")
            continue
        if msg.role is Role.MODEL:
            return tuple(call for call in msg.tool_calls if call.id not in answered)
        if msg.role is Role.SYSTEM:
            continue
        return ()
    return ()


def split_turns(messages: Sequence[Message]) -> tuple[list[Message], list[Message], list[list[Message]]]:
    """(system messages, non-system messages before the first USER, turns)."""
    systems: list[Message] = []
    preamble: list[Message] = []
    turns: list[list[Message]] = []
    for msg in messages:
        if msg.role is Role.SYSTEM:
            systems.append(msg)
        elif msg.role is Role.USER:
            turns.append([msg])
        elif turns:
            turns[-1].append(msg)
        else:
            preamble.append(msg)
    return systems, preamble, turns


class SessionContext:
    """One conversation: agent, metadata, the context window, and a journal of changes.

    ``SessionContext(session_id, initial_agent, max_turns=40, metadata=None)``.

    ``history`` is a read-only tuple: change it only through :meth:`add_message`,
    :meth:`_prune_history` and :meth:`rollback_to` (editing the list by hand could
    separate a tool call from its result). A context made by hand keeps pruned turns in
    memory, so :meth:`rollback_to` can reach them; one loaded from a store asks the store.
    A context with no store keeps its own events (``events``), seq 1, 2, 3...

    Args:
        session_id: a non-empty str of valid Unicode text.
        initial_agent: the active agent (an ``Agent``, or anything with a ``name``).
        max_turns: whole turns kept in the window, an int in 1..1,000,000.
        metadata: a dict with str keys and JSON-serialisable values, kept as its JSON copy.
        resources: the resources to mount (:class:`~chatflow_cli.core.resources.mounts.Mount`
            values; journalled as ``resource.mounted`` events, see :meth:`mount`).

    Raises:
        TypeError: ``max_turns`` is not an int (bool included), or ``metadata`` is not a
            JSON-serialisable dict with str keys.
        ValueError: ``session_id`` is not a non-empty str, or ``max_turns`` is out of range.
        UsageError: ``session_id`` or ``metadata`` holds a lone surrogate, or ``resources``
            holds one resource in two modes.
    """

    def __init__(
        self,
        session_id: str,
        initial_agent: Any,
        max_turns: int = DEFAULT_MAX_TURNS,
        metadata: Mapping[str, Any] | None = None,
        resources: Sequence[Mount] | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        _check_session_id(session_id)
        self._max_turns = _check_max_turns(max_turns)
        self.session_id = session_id
        self._agent = initial_agent
        self.metadata: dict[str, Any] = _check_metadata(metadata) if metadata is not None else {}
        self._saved_metadata: dict[str, Any] = copy.deepcopy(self.metadata)
        self._messages: list[Message] = []
        self._turn_offset = 0
        self._turn_count = 0  # number of the last live turn
        self._call_ids: set[str] | None = None  # tool-call ids in the window; None: recount
        self._archive: dict[int, tuple[Message, ...]] = {}
        self._journal: list[JournalEntry] = []
        self._status = SessionStatus.IDLE
        self._local_events: list[Event] | None = []  # None once bound to a store
        self._binding: SessionBinding | None = None  # set by the store that holds the session
        self._agent_versions: dict[str, dict[str, Any]] = {}
        # the agent a store-less context started with, and the agent objects it was given by name
        self._created_agent = agent_name_of(initial_agent)
        self._agents_seen: dict[str, Any] = {self._created_agent: initial_agent}
        self._mounts: dict[tuple[str, str], Mount] = {}  # in force: stored, then journalled
        given = list(resources or ())
        if given and all(isinstance(m, Mount) for m in given):
            given = unique_mounts(given, "resources")  # one resource in two modes: UsageError
        for mount in given:
            self.mount(mount)

    # -- read-only views ---------------------------------------------------------------
    @property
    def active_agent(self) -> Any:
        return self._agent

    @active_agent.setter
    def active_agent(self, agent: Any) -> None:
        self.set_active_agent(agent)

    @property
    def max_turns(self) -> int:
        return self._max_turns

    @property
    def history(self) -> tuple[Message, ...]:
        """The context window: SYSTEM messages, then the newest turns. Read-only."""
        return tuple(self._messages)

    @property
    def turns(self) -> tuple[Turn, ...]:
        """The window's turns with their user-visible numbers."""
        _, _, turns = split_turns(self._messages)
        return tuple(Turn(self._turn_offset + k, tuple(msgs)) for k, msgs in enumerate(turns, start=1))

    @property
    def turn_count(self) -> int:
        """Number of the last live turn (0 when there is none)."""
        return self._turn_count

    @property
    def status(self) -> SessionStatus:
        return self._status

    @property
    def pending_tool_calls(self) -> tuple[ToolCall, ...]:
        """The last MODEL message's tool calls still unanswered."""
        return _open_calls(self._messages)

    @property
    def agent_versions(self) -> dict[str, dict[str, Any]]:
        """``{agent name: {"version", "turn"}}``: the latest version each agent ran in the
        session and the last turn it ran that version in, as loaded and then changed by
        this context (a copy)."""
        return copy.deepcopy(self._agent_versions)

    def note_agent_version(self, agent: Any, version: str | None = None) -> dict[str, Any] | None:
        """Say that ``agent`` (an Agent, or a name with ``version``) runs in the current turn.

        ``version`` defaults to ``agent.version``. When the session knows another version of
        this agent (it ran before, with a known version), journals ``agent.changed``
        ``{"turn", "agent", "version", "previous_version", "since_turn"}`` (``since_turn``:
        the last turn the previous version ran in) and returns that payload; the store then
        records ``version`` as the agent's latest, so the change is reported once. Returns
        None, journalling nothing, when the version is the known one, unknown (None), or the
        first this session sees of the agent (its first reply records it).
        """
        name = agent_name_of(agent)
        if version is None:
            found = getattr(agent, "version", None)
            version = found if isinstance(found, str) and found else None
        known = self._agent_versions.get(name)
        if version is None or known is None or known.get("version") == version:
            return None
        payload = {"turn": self._current_turn(), "agent": name, "version": version,
                   "previous_version": known.get("version"), "since_turn": known.get("turn")}
        self._journal_agent_change(payload)
        return payload

    def _journal_agent_change(self, payload: Mapping[str, Any]) -> None:
        """Journal one ``agent.changed`` event (``payload`` as :meth:`note_agent_version`
        makes it; an import replays a stored one through here)."""
        data = dict(payload)
        given = data.get("turn")
        turn = given if isinstance(given, int) else self._current_turn()
        name, version = data.get("agent"), data.get("version")
        if not isinstance(name, str) or not name or not isinstance(version, str) or not version:
            raise ValueError("an agent.changed event names the agent and its new version (non-empty str)")
        self._agent_versions[name] = {"version": version, "turn": turn}
        self._record(JournalEntry("agent_version", EventType.AGENT_CHANGED.value, data, turn))

    @property
    def events(self) -> tuple[Event, ...]:
        """A store-less context's own events; for a stored session, use ``store.events()``."""
        return tuple(self._local_events or ())

    # -- journal -----------------------------------------------------------------------
    #: the time events journalled now carry (None: the store's clock when it writes them)
    _event_time: float | None = None

    def set_event_time(self, at: float | None) -> None:
        """Give the events journalled from now on the time ``at`` (UTC epoch seconds) instead
        of the time the store writes them; ``None``: the store's clock again. For history
        copied from elsewhere (an import keeps each turn's time in its source, so message
        search ``--since`` and its ages agree with ``sessions ls``). Changes nothing else.

        Raises:
            ValueError: ``at`` is not a finite number of seconds.
        """
        if at is not None:
            if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
                raise ValueError(f"an event time must be finite UTC epoch seconds, not {at!r}")
            at = float(at)
        self._event_time = at

    def _record(self, op: JournalEntry) -> None:
        if self._status is SessionStatus.TERMINATED and self._local_events is not None:
            raise SessionTerminatedError(f"session {self.session_id} is terminated", session_id=self.session_id)
        if self._event_time is not None and op.at is None:
            op = dataclasses.replace(op, at=self._event_time)
        self._journal.append(op)
        if self._local_events is not None:
            seq = len(self._local_events) + 1
            self._local_events.append(Event(self.session_id, seq, op.type, op.payload,
                                            time.time() if op.at is None else op.at))

    # -- the seam to the stores (friend methods: only a store calls them) --------------
    def _pending(self) -> list[JournalEntry]:
        """The journal entries to save, oldest first (a copy; the journal keeps them).

        A change made in place on ``metadata`` since the last save is journalled first, as
        :meth:`update_metadata` would.
        """
        if self.metadata != self._saved_metadata:  # changed in place: journal it like update_metadata
            self.update_metadata({})
        return list(self._journal)

    def _saved(
        self,
        count: int,
        metadata: Mapping[str, Any],
        binding: SessionBinding,
        *,
        stored: tuple[int, SessionStatus] | None = None,
        agent: str | None = None,
    ) -> bool:
        """Acknowledge a save of the first ``count`` entries of :meth:`_pending`.

        The saved entries leave the journal; ``metadata`` (the same dict object) becomes the
        stored, merged ``metadata``; the context is bound to ``binding`` and stops keeping
        its own events. With ``stored=(turn_count, status)`` of the row just written, the
        window is also made to look freshly loaded (see :meth:`_as_stored`); the return
        value says whether it could be (True without ``stored``). ``agent``: the stored
        active agent's name after a rollback, when the store found another agent than this
        context did: the context takes that agent.
        """
        del self._journal[:count]
        if agent is not None and agent != agent_name_of(self._agent):
            self._agent = self._agent_named(agent, binding)
        if self.metadata != metadata:
            self.metadata.clear()
            self.metadata.update(copy.deepcopy(dict(metadata)))
        self._saved_metadata = copy.deepcopy(self.metadata)
        self._binding = binding
        self._local_events = None
        return True if stored is None else self._as_stored(*stored)

    # -- mutations ---------------------------------------------------------------------
    def add_message(self, msg: Message) -> None:
        """Append ``msg``; a USER message opens turn ``turn_count + 1``.

        SYSTEM messages are allowed at any time and go right after the SYSTEM messages
        already at the front (where pruning would move them), so the window is valid at
        every step. Raises :class:`InvalidHistoryError` for a non-TOOL message while tool
        calls are open, a TOOL message that answers no open call, or a tool-call id seen
        before in the window.
        """
        if not isinstance(msg, Message):
            raise TypeError(f"add_message expects a Message, got {type(msg).__name__}")
        data = msg.to_dict()
        text = _check_text(data, f"{msg.role.value} message", self.session_id)
        if msg.role is Role.SYSTEM:
            lead = 0
            while lead < len(self._messages) and self._messages[lead].role is Role.SYSTEM:
                lead += 1
            self._messages.insert(lead, msg)
            self._record(JournalEntry("message", MESSAGE_EVENT_TYPE[msg.role], {"turn": 0, "message": data}, 0, msg, text))
            return
        open_calls = self.pending_tool_calls
        if msg.role is Role.TOOL:
            if msg.tool_call_id not in {call.id for call in open_calls}:
                raise InvalidHistoryError(
                    f"tool result for {msg.tool_call_id!r} answers no open tool call",
                    problems=[f"tool_result_follows_call: {msg.tool_call_id!r}"],
                    session_id=self.session_id,
                )
        elif open_calls:
            raise InvalidHistoryError(
                f"tool calls {[c.id for c in open_calls]} need results before a {msg.role.value} message",
                problems=[f"tool_call_answered_once: {[c.id for c in open_calls]}"],
                session_id=self.session_id,
            )
        if msg.tool_calls:
            if self._call_ids is None:
                self._call_ids = {call.id for m in self._messages for call in m.tool_calls}
            seen = self._call_ids
            ids = [call.id for call in msg.tool_calls]
            dup = [i for i in ids if i in seen or ids.count(i) > 1]
            if dup:
                raise InvalidHistoryError(
                    f"tool-call id {dup[0]!r} appears twice in session {self.session_id}",
                    problems=[f"tool_call_id_unique: {dup[0]!r}"],
                    session_id=self.session_id,
                )
        turn = self._turn_count + 1 if msg.role is Role.USER else self._turn_count
        self._messages.append(msg)
        self._turn_count = turn
        if msg.role is Role.MODEL and msg.agent and msg.agent_version:
            self._agent_versions[msg.agent] = {"version": msg.agent_version, "turn": turn}
        if msg.tool_calls and self._call_ids is not None:
            self._call_ids.update(call.id for call in msg.tool_calls)
        self._record(JournalEntry("message", MESSAGE_EVENT_TYPE[msg.role], {"turn": turn, "message": data}, turn, msg, text))

    def _current_turn(self) -> int:
        """The turn new messages belong to: the last live turn (0 before the first USER message)."""
        return self._turn_count

    def _prune_history(self) -> None:
        """Prune the window: SYSTEM messages first, in order; then the newest ``max_turns`` whole turns.

        Non-system messages before the first USER message are dropped. The clean-up runs
        even when no turn has to go. A no-op while tool calls wait for results.
        """
        if self.pending_tool_calls:
            return
        systems, _preamble, turns = split_turns(self._messages)
        dropped = turns[: max(0, len(turns) - self._max_turns)]
        for k, msgs in enumerate(dropped, start=self._turn_offset + 1):
            self._archive[k] = tuple(msgs)
        self._turn_offset += len(dropped)
        kept = turns[len(dropped) :]
        self._messages = systems + [m for msgs in kept for m in msgs]
        self._call_ids = None

    def _rebuild(self, last_turn: int) -> tuple[list[Message], int]:
        """The window holding the newest ``max_turns`` of turns 1..last_turn, and its offset."""
        systems, _, window_turns = split_turns(self._messages)
        # a summary covering turns after last_turn no longer applies (the store marks it removed)
        systems = [m for m in systems if m.summary_through is None or m.summary_through <= last_turn]
        through = max((m.summary_through or 0 for m in systems), default=0)
        first = max(1, last_turn - self._max_turns + 1, through + 1)
        have: dict[int, tuple[Message, ...]] = {
            k: tuple(v) for k, v in self._archive.items() if first <= k <= last_turn
        }
        for k, msgs in enumerate(window_turns, start=self._turn_offset + 1):
            if first <= k <= last_turn:
                have[k] = tuple(msgs)
        missing = [k for k in range(first, last_turn + 1) if k not in have]
        if missing:
            if self._binding is None:
                raise ValueError(f"turns {missing[0]}..{missing[-1]} of session {self.session_id} are not available")
            loaded = self._binding.loader(missing[0], missing[-1])
            for k in missing:
                if k not in loaded:
                    raise ValueError(f"turn {k} of session {self.session_id} is not in the store")
                have[k] = tuple(loaded[k])
        messages = list(systems)
        for k in range(first, last_turn + 1):
            messages.extend(have[k])
        return messages, first - 1

    def rollback_to(self, turn: int, *, system: bool = False) -> None:
        """Keep turns 1..``turn`` (0 keeps only the SYSTEM messages); all or nothing.

        ``system=True`` (with ``turn`` 0 only) removes the SYSTEM messages too, leaving an
        empty window (an Agents SDK session's ``clear_session``).

        Raises ``ValueError`` (and changes nothing) unless ``0 <= turn <= turn_count``, or
        for ``system=True`` with a turn above 0. Turns pruned out of the window are brought
        back. Journals a ``rollback`` event ``{"to_turn": n, "removed_turns": [...]}`` (plus
        ``"system": true`` when the SYSTEM messages went too); the next new turn is ``turn + 1``.
        """
        if isinstance(turn, bool) or not isinstance(turn, int):
            raise TypeError(f"turn must be an int, got {type(turn).__name__}")
        count = self.turn_count
        if not 0 <= turn <= count:
            raise ValueError(f"cannot roll back to turn {turn}: session {self.session_id} has turns 0..{count}")
        if system and turn:
            raise ValueError(f"system=True removes the SYSTEM messages with a rollback to turn 0, not {turn}")
        messages, offset = self._rebuild(turn)
        trail = self._agent_trail()
        if system:
            messages = []
        self._messages, self._turn_offset, self._turn_count, self._call_ids = messages, offset, turn, None
        self._archive = {k: v for k, v in self._archive.items() if k <= turn}
        payload: dict[str, Any] = {"to_turn": turn, "removed_turns": list(range(turn + 1, count + 1))}
        if system:
            payload["system"] = True
        agent = trail.agent_at(turn, system)
        if agent is not None:  # the agent active at that turn comes back (the store records it too)
            payload["active_agent"] = agent
            if agent != agent_name_of(self._agent):
                self._agent = self._agent_named(agent, self._binding)
        self._record(JournalEntry("rollback", EventType.ROLLBACK.value, payload))

    def _agent_trail(self) -> AgentTrail:
        """The :class:`AgentTrail` of the session so far: the stored log's (a bound context
        asks its store), then this context's journal not yet saved."""
        binding = self._binding
        if binding is None:  # the journal holds every change since this context was made
            trail = AgentTrail(self._created_agent)
        elif binding.agents is not None:
            trail = binding.agents()
        else:
            trail = AgentTrail(None)
        for op in self._journal:
            if op.type in AGENT_TRAIL_EVENTS:
                trail.replay(op.type, op.payload)
        if trail.created is None:
            trail.created = agent_name_of(self._agent)
        return trail

    def _agent_named(self, name: str, binding: SessionBinding | None) -> Any:
        """The agent object of ``name``: one this context was given, else as the store
        resolves it, else the name itself."""
        if name in self._agents_seen:
            return self._agents_seen[name]
        if binding is not None and binding.resolve is not None:
            return binding.resolve(name)
        return name

    def set_active_agent(self, agent: Any, *, tool_call_id: str | None = None,
                         agent_version: str | None = None) -> None:
        """Make ``agent`` the active agent; journals one ``handoff`` event when it changes
        (with ``to_agent_version``: ``agent_version``, else ``agent.version``, when known)."""
        old = agent_name_of(self._agent)
        self._agent = agent
        new = agent_name_of(agent)
        if not isinstance(agent, str):
            self._agents_seen[new] = agent
        if new != old:
            payload = {"turn": self.turn_count, "from_agent": old, "to_agent": new, "tool_call_id": tool_call_id or ""}
            version = agent_version if agent_version is not None else getattr(agent, "version", None)
            if isinstance(version, str) and version:
                payload["to_agent_version"] = version
            self._record(JournalEntry("agent", EventType.HANDOFF.value, payload))

    def update_metadata(self, changes: Mapping[str, Any]) -> None:
        """Merge ``changes`` into ``metadata`` and journal ``metadata.updated`` as a *patch*.

        The patch holds the keys set here plus any changed, added or deleted in place on
        ``metadata`` since the last save. On save it is applied to the *stored* metadata, so
        two contexts loaded together that set different keys both keep their keys (no
        whole-dict overwrite). The event payload is ``{"metadata": <stored result>,
        "changes": {key: value}, "removed": [key, ...]}``. ``changes``: str keys,
        JSON-serialisable values (TypeError otherwise, in every store).
        """
        changes = _check_metadata(changes, "metadata changes")
        current = _check_metadata({**self.metadata, **changes})
        self.metadata.clear()  # the same dict object, now holding the JSON copy the stores keep
        self.metadata.update(current)
        saved = self._saved_metadata
        patch = {k: v for k, v in current.items() if k in changes or k not in saved or saved[k] != v}
        removed = [k for k in saved if k not in current]
        if not patch and not removed:
            return
        self._saved_metadata = copy.deepcopy(self.metadata)  # what the journal will leave in the store
        payload = copy.deepcopy({"metadata": current, "changes": patch, "removed": removed})
        self._record(JournalEntry("metadata", EventType.METADATA_UPDATED.value, payload))

    def set_status(self, status: SessionStatus | str, reason: str = "", **extra: Any) -> None:
        """Journal a ``status`` event ``{"status", "reason", **extra}``.

        Raises:
            ValueError: ``status`` is not a :class:`SessionStatus` value.
            SessionTerminatedError: the session is already terminated (``terminated`` is final).
        """
        status = SessionStatus(status)
        if self._status is SessionStatus.TERMINATED:
            raise SessionTerminatedError(f"session {self.session_id} is terminated", session_id=self.session_id)
        self._status = status
        self._record(JournalEntry("status", EventType.STATUS.value, {"status": status.value, "reason": reason, **extra}))

    def restore_compaction(self, payload: Mapping[str, Any]) -> None:
        """Journal a ``context.compacted`` event with its summary, as a compaction stored them:
        for copying a session's log (an import of chatflow's own export).

        ``payload``: the event's payload; ``through`` (K, a turn of the session so far) and
        ``summary`` (the summary's text) are required. On save the store keeps the summary
        as a SYSTEM message flagged as the summary of turns 1..K, so the context window
        uses it from then on (the context in hand is not changed).

        Raises:
            ValueError: ``through`` is not a turn of the session, or ``summary`` is not
                non-empty text.
        """
        through, text = payload.get("through"), payload.get("summary")
        if isinstance(through, bool) or not isinstance(through, int) or not 1 <= through <= self._turn_count:
            raise ValueError(f"a compaction through turn {through!r} does not fit the session's turns "
                             f"1..{self._turn_count}")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("a compaction needs its summary text")
        _check_text(text, "summary", self.session_id)
        summary = Message.summary(text, through)
        self._record(JournalEntry("summary", EventType.CONTEXT_COMPACTED.value, dict(payload), 0, summary))

    def restore_title(self, title: str | None) -> None:
        """Journal ``session.titled`` ``{"title"}`` as :meth:`BaseSessionStore.set_title`
        stored it: for copying a session's log (an import of chatflow's own export). On save
        the stored title becomes ``title`` (None or ``""``: no title, derived again).

        Raises:
            TypeError: ``title`` is not a str or None.
            ValueError: longer than 200 characters.
            UsageError: not valid Unicode text.
        """
        text = _check_title(title, self.session_id)
        self._record(JournalEntry("title", EventType.SESSION_TITLED.value, {"title": text}))

    def restore_archived(self, archived: bool) -> None:
        """Journal ``session.archived`` (``archived``) or ``session.unarchived`` (not), as
        :meth:`BaseSessionStore.archive` and ``unarchive`` stored them: for copying a
        session's log. On save the session is archived (no new turns until unarchived) or
        not; the payload is ``{}`` as theirs."""
        kind = EventType.SESSION_ARCHIVED if archived else EventType.SESSION_UNARCHIVED
        self._record(JournalEntry("archive", kind.value, {}))

    @property
    def resources(self) -> list[Mount]:
        """The resources mounted on the session now (stored and not yet saved), in the order
        they were first mounted."""
        return list(self._mounts.values())

    def mount(self, mount: Mount) -> bool:
        """Mount a resource: journal ``resource.mounted`` ``{"kind", "name", "mode"}``. A mount
        of a resource already mounted in another mode changes its mode; the same mount again
        journals nothing. Returns True when something changed.

        Raises:
            TypeError: ``mount`` is not a :class:`~chatflow_cli.core.resources.mounts.Mount`.
        """
        if not isinstance(mount, Mount):
            raise TypeError(f"a resource to mount is a Mount, got {type(mount).__name__}")
        if self._mounts.get(mount.key) == mount:
            return False
        self._mounts[mount.key] = mount
        self._record(JournalEntry("resource", EventType.RESOURCE_MOUNTED.value, mount.to_dict()))
        return True

    def unmount(self, name: str, kind: str = "memory_store", *, reason: str | None = None) -> bool:
        """Unmount the resource ``name`` of ``kind``: journal ``resource.unmounted`` (with the
        mode it had, and ``reason`` when given: why it was unmounted, e.g. the resource was
        deleted). Returns False (journals nothing) when it was not mounted."""
        mount = self._mounts.pop((kind, name), None)
        if mount is None:
            return False
        payload: dict[str, Any] = mount.to_dict()
        if reason:
            payload["reason"] = str(reason)
        self._record(JournalEntry("resource", EventType.RESOURCE_UNMOUNTED.value, payload))
        return True

    def record_event(self, type: EventType | str, payload: Mapping[str, Any] | None = None, *,
                     attachments: Sequence[Attachment] = ()) -> None:
        """Journal an event with no other effect (e.g. ``tool.pending``); ``attachments``: files
        the payload names whose bytes the store keeps with it, once by hash (a tool's images).

        Custom types are accepted. Of the reserved types (see ``RESERVED_EVENT_PREFIXES``)
        only those that change no stored state may be recorded here (``tool.pending``,
        ``tool.result_submitted``, ``turn.completed``, ``turn.interrupted``,
        ``turn.interrupt_requested``, ``session.recovered``, ``session.imported``); the
        others raise :class:`UsageError` naming the method that makes the change, so the log
        never contradicts the session.
        """
        kind = event_type_name(type)
        if is_reserved_event_type(kind) and kind not in RECORDABLE_EVENT_TYPES:
            raise UsageError(
                f"event type {kind!r} is reserved: use {use_instead(kind)}", session_id=self.session_id
            )
        self._record(JournalEntry("event", kind, dict(payload or {}), attachments=tuple(attachments)))

    def fail_turn(self, error: BaseException | str, *, agent: Any = None) -> None:
        """Take the current turn out of the window and journal ``turn.failed``.

        The failed turn's number is used again by the next turn, as after a rollback.
        ``agent``: the active agent when the turn began. A failed turn leaves the session as
        it was before it, so a handoff made inside it is undone: the payload then carries
        ``"active_agent"`` (the agent restored) and ``"reverted_from_agent"`` (the handoff
        target that is dropped), and the store sets ``active_agent_name`` from it. The error
        text is made storable (:func:`storable_text`).
        """
        turn = self._current_turn()
        if turn:
            messages, offset = self._rebuild(turn - 1)
            self._messages, self._turn_offset, self._turn_count, self._call_ids = messages, offset, turn - 1, None
            self._archive = {k: v for k, v in self._archive.items() if k < turn}
        error_type = type(error).__name__ if isinstance(error, BaseException) else "Error"
        # a provider error body may echo a vault value a tool read in this process: never stored
        payload: dict[str, Any] = {"turn": turn, "error": storable_text(scrub_values(str(error))),
                                   "error_type": error_type}
        if agent is not None:
            before, after = agent_name_of(self._agent), agent_name_of(agent)
            payload["active_agent"] = after
            if before != after:
                payload["reverted_from_agent"] = before
                self._agent = agent
                if not isinstance(agent, str):
                    self._agents_seen[after] = agent
        self._record(JournalEntry("turn_failed", EventType.TURN_FAILED.value, payload, turn))

    def interrupt_turn(self, reason: str = "interrupted", partial_text: str | None = None, agent: Any = None,
                       partial_reasoning: str | None = None) -> None:
        """Close the current turn after Ctrl-C or cancellation, keeping what is known.

        Every unanswered tool call gets a synthetic TOOL result (``is_error`` and
        ``interrupted`` set, content ``"Interrupted before a result: side effects
        unknown."``); partial model text (and ``partial_reasoning``, the reasoning that
        came with it, even with no text) is kept as a MODEL message with ``interrupted=True``
        (one with no text is left out of requests). Journals ``turn.interrupted``, then prunes.
        """
        open_calls = self.pending_tool_calls
        for call in open_calls:
            self.add_message(
                Message.tool(call.id, INTERRUPTED_TOOL_RESULT, name=call.name, is_error=True, interrupted=True)
            )
        if partial_text or partial_reasoning:
            name = agent_name_of(agent if agent is not None else self._agent) or None
            version = getattr(agent, "version", None)  # only of an agent the caller names
            self.add_message(Message.model(partial_text or "", agent=name, interrupted=True,
                                           reasoning=partial_reasoning or None,
                                           agent_version=version if isinstance(version, str) and version else None))
        payload = {"turn": self._current_turn(), "tool_use_ids": [c.id for c in open_calls], "reason": reason}
        self._record(JournalEntry("event", EventType.TURN_INTERRUPTED.value, payload))
        self._prune_history()

    def complete_turn(self, content: str | None, agent: Any = None, usage: Any = None,
                      finish_reason: str | None = None, *, agent_version: str | None = None,
                      model: str | None = None, base_url: str | None = None) -> None:
        """Journal ``turn.completed`` ``{"turn", "agent", "content", "usage"}``, then prune.

        ``usage`` is stored in the one shape of :func:`~chatflow_cli.core.stream.normalize_usage`
        whatever shape is given, and as ``null`` when no count is known. Added when given:
        ``"finish_reason"`` (``"stop"``, or ``"length"``/``"content_filter"`` for a reply that
        was cut), ``"agent_version"`` (the answering agent's), ``"model"`` and ``"base_url"``
        (the model that answered and the API root it was asked at, never a key: a Runner gives
        both; the embedded local model has no fixed URL, so no ``base_url``).

        Refused, with nothing journalled: :class:`UsageError` when there is no open turn
        (turn 0: no USER message yet), :class:`PendingToolCallsError` while tool calls of
        the turn still wait for results (``tool_use_ids`` lists them).
        """
        if self._current_turn() == 0:
            raise UsageError(
                f"session {self.session_id} has no open turn to complete (add a user message first)",
                session_id=self.session_id,
            )
        pending = [call.id for call in self.pending_tool_calls]
        if pending:
            raise PendingToolCallsError(
                f"turn {self._current_turn()} of session {self.session_id} still waits for tool results {', '.join(pending)}",
                tool_use_ids=pending,
                session_id=self.session_id,
            )
        payload = {
            "turn": self._current_turn(),
            "agent": agent_name_of(agent if agent is not None else self._agent),
            "content": content or "",
            "usage": normalize_usage(_plain_usage(usage)),
        }
        if finish_reason is not None:
            payload["finish_reason"] = str(finish_reason)
        if agent_version:
            payload["agent_version"] = str(agent_version)
        if model:
            payload["model"] = str(model)
        if base_url:
            payload["base_url"] = str(base_url)
        self._record(JournalEntry("event", EventType.TURN_COMPLETED.value, payload))
        self._prune_history()

    # -- stores ------------------------------------------------------------------------
    def _as_stored(self, turn_count: int, status: SessionStatus) -> bool:
        """Make a context loaded from a store and changed since (its journal saved) look as
        if loaded again: the SYSTEM messages, then the newest ``max_turns`` turns up to
        ``turn_count`` -- the store's window query --, nothing archived. False (nothing
        changed) when the context does not match the stored row; the caller loads it then.
        """
        if self._journal or self._turn_count != turn_count or self._status is not status:
            return False
        first = max(1, turn_count - self._max_turns + 1)
        systems, _preamble, turns = split_turns(self._messages)
        kept = [(k, msgs) for k, msgs in enumerate(turns, start=self._turn_offset + 1) if k >= first]
        if kept and kept[-1][0] != turn_count:
            return False
        self._messages = systems + [m for _, msgs in kept for m in msgs]
        self._turn_offset = kept[0][0] - 1 if kept else turn_count
        self._call_ids = None
        self._archive = {}
        return True

    def __repr__(self) -> str:
        return (
            f"SessionContext(session_id={self.session_id!r}, agent={agent_name_of(self._agent)!r}, "
            f"turns={self.turn_count}, window={len(self._messages)} messages, status={self._status.value})"
        )


def restore_context(
    session_id: str,
    agent: Any,
    max_turns: int,
    metadata: dict[str, Any],
    status: SessionStatus,
    window: list[tuple[int, Message]],
    turn_count: int,
    binding: SessionBinding,
    *,
    agent_versions: Mapping[str, Mapping[str, Any]] | None = None,
    resources: Sequence[Mount] = (),
) -> SessionContext:
    """A context bound to ``binding`` holding a stored ``window``: ``(turn, message)``
    pairs in order, turn 0 for the SYSTEM messages; ``turn_count`` is the number of the
    last live turn (which may be outside the window when its turns were all removed)."""
    ctx = SessionContext(session_id, agent, max_turns, metadata)
    ctx._messages = [msg for _, msg in window]
    numbers = sorted({turn for turn, _ in window if turn > 0})
    ctx._turn_offset = (numbers[0] - 1) if numbers else turn_count
    ctx._turn_count = turn_count
    ctx._status = status
    ctx._local_events = None
    ctx._binding = binding
    ctx._agent_versions = {name: dict(entry) for name, entry in (agent_versions or {}).items()}
    ctx._mounts = {mount.key: mount for mount in resources}
    return ctx
