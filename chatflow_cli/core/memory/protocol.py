"""What front-ends and the Runner need of a session store, apart from any backend.

:class:`SessionStoreProtocol` is the structural type (``typing.Protocol``) of a store:
every store of this package satisfies it (:class:`~chatflow_cli.core.memory.base.BaseSessionStore`
implements it once for all backends), and a new backend satisfies it by subclassing
``BaseSessionStore`` and supplying transactions. Code that only *uses* a store -- the
command line, the REPL, the Runner -- annotates with this type, not with a backend class.

The value types a caller reads back live here too: :class:`SessionSummary` (a row of
``list_sessions``), :class:`TurnRecord` (a stored turn), :class:`TurnStart` (what
``begin_turn`` returns) and :class:`MessageState` (where an inbound message id stands).
They are plain frozen data; identity and storage live in the stores.

Times are UTC epoch seconds throughout; turn numbers are the user-visible ones (1, 2, 3...
for the life of a session; 0 holds the SYSTEM messages).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..events import Event, EventType, SessionStatus
from ..messages import Message

if TYPE_CHECKING:
    from .context import SessionContext
    from .owner import Owner
    from .search import SearchHit

__all__ = ["MessageState", "SessionStoreProtocol", "SessionSummary", "TurnRecord", "TurnStart"]


class MessageState(str, enum.Enum):
    """Where an inbound message id stands (:meth:`BaseSessionStore.message_state`).

    ``new``: never seen, expired, or its claim is free again (holder dead, turn failed or
    interrupted, claim released); ``in_progress``: claimed by a live holder whose turn has
    not finished; ``processed``: its turn completed (or stopped for custom tool results), a
    duplicate for ``DEFAULT_DEDUP_TTL_HOURS``.
    """

    NEW = "new"
    IN_PROGRESS = "in_progress"
    PROCESSED = "processed"


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One stored turn, for ``chatflow sessions show``.

    ``in_window``: the turn is live and among the newest ``max_turns``; ``rolled_back`` /
    ``failed``: the turn was taken out by a rollback or a failure (only listed with
    ``include_rolled_back=True``; a turn number may then appear more than once, oldest first).
    Turn 0 holds the SYSTEM messages when ``first=0``.
    """

    number: int
    messages: tuple[Message, ...]
    in_window: bool
    rolled_back: bool = False
    failed: bool = False
    #: the model that answered the turn and the API root it was asked at, as its
    #: ``turn.completed`` records them; None when unknown (a turn that did not complete, or
    #: one stored before chatflow recorded them)
    model: str | None = None
    base_url: str | None = None


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A row of ``list_sessions``. ``status`` is effective: a dead owner's ``running`` shows ``idle``.

    Times are UTC epoch seconds; ``preview`` is the first live user message, at most 80 characters.
    ``failed`` is True when the session's last turn failed: a ``turn.failed`` event with no
    completed or interrupted turn and no rollback after it.
    """

    session_id: str
    active_agent_name: str
    status: SessionStatus
    turn_count: int
    max_turns: int
    created_at: float
    updated_at: float
    preview: str
    metadata: dict[str, Any]
    failed: bool = False
    #: where the session was forked from: ``{"session_id", "turn", "seq"}``; None otherwise
    forked_from: dict[str, Any] | None = None
    #: the session's title: the one set (``set_title``), else the first line of the first
    #: user message (no model call)
    title: str = ""
    #: True when the title was set, not derived
    title_set: bool = False
    #: epoch seconds it was archived; None: not archived
    archived_at: float | None = None
    #: ``{agent name: {"version": str, "turn": int}}``: the latest version of each agent
    #: that ran in the session and the last turn it ran that version in; an agent that never
    #: ran with a known version is absent (sessions stored before versions were recorded)
    agent_versions: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def agent_version(self) -> str | None:
        """The latest version of the active agent that ran in the session, or None (unknown)."""
        entry = self.agent_versions.get(self.active_agent_name)
        return None if entry is None else str(entry["version"])

    @property
    def cursor(self) -> str:
        """Where a listing that ended at this row goes on (``list_sessions(after=...)``):
        stable while sessions are updated (an updated session moves to the top; the rest
        of the pages neither skip nor repeat a row)."""
        return f"{self.updated_at!r}:{self.session_id}"


@dataclass(slots=True)
class TurnStart:
    """What :meth:`BaseSessionStore.begin_turn` returns.

    ``session``: a fresh context, authoritative while the caller owns the turn.
    ``turn``: the turn number started (or continued, or replayed).
    ``replayed``: None normally; for a repeated idempotency key with the same message, the
    stored ``turn.completed`` payload of the original turn with ``"outcome": "completed"``
    added — or, when that turn is still open, ``{"turn": n, "outcome": <"running" |
    "pending">}``. Nothing is written then. When the first attempt gave no result
    (``failed`` -- also a rate-limited turn that left the session ``rescheduled`` --,
    ``interrupted`` or ``rolled_back``), the same key with the same message is *not* a
    replay: the turn runs again and the key then maps to the new attempt, so a webhook that
    retries a failed delivery can succeed.
    ``events``: the events this call appended.
    ``queued``: the ticket of a caller that asked to queue (``enqueue=True``) for a busy
    session: nothing else was written, ``turn`` is 0; pass the ticket back until the turn
    starts (or give it up with :meth:`BaseSessionStore.leave_turn_queue`).
    """

    session: SessionContext
    turn: int
    replayed: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)
    queued: int | None = None


@runtime_checkable
class SessionStoreProtocol(Protocol):
    """The store operations front-ends and the Runner use (synchronous forms).

    Every method validates its arguments the same way in every store (TypeError for a
    wrong type, ValueError for a value out of range, UsageError for text that is not valid
    Unicode) and raises :class:`~chatflow_cli.core.errors.SessionNotFoundError` for an
    unknown session where a session must exist. Each store also has an async twin
    ``a<name>`` of every method (not part of this protocol).
    """

    #: Turns kept in a new session's context window unless it is created with ``max_turns``.
    default_max_turns: int

    def set_agent_resolver(self, resolver: Callable[[str], Any] | None) -> None:
        """Map a stored agent name back to the Agent on load."""
        ...

    def get(self, session_id: str) -> SessionContext | None:
        """The session's context, or None when absent."""
        ...

    def get_or_create(
        self,
        session_id: str,
        default_agent: Any,
        max_turns: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionContext:
        """Load the session, or create it with ``default_agent``."""
        ...

    def save(self, session: SessionContext) -> list[Event]:
        """Apply the context's journal in one transaction; the events appended."""
        ...

    def delete(self, session_id: str) -> bool:
        """Delete the session with its whole log; False when there was none."""
        ...

    def rollback(self, session_id: str, to_turn: int | None = None, *, last: int | None = None) -> list[Event]:
        """Keep turns 1..``to_turn``, or remove the newest ``last`` turns, in one transaction."""
        ...

    def session_summary(self, session_id: str) -> SessionSummary:
        """One session's :class:`SessionSummary`, read without loading its window or agent."""
        ...

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

    def set_title(self, session_id: str, title: str | None) -> None:
        """Set (or with None clear) the session's title."""
        ...

    def archive(self, session_id: str) -> bool:
        """Archive the session; False when it already was."""
        ...

    def unarchive(self, session_id: str) -> bool:
        """Unarchive the session; False when it was not archived."""
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

    def fork(self, session_id: str, at: int | None = None, *, into: str | None = None) -> SessionSummary:
        """Copy completed turns 1..``at`` into a new session; the new session's summary."""
        ...

    def forked_from(self, session_id: str) -> dict[str, Any] | None:
        """Where the session was forked from, or None."""
        ...

    def latest_session_id(self) -> str | None:
        """The most recently updated session's id, or None."""
        ...

    def active_agent_name(self, session_id: str) -> str | None:
        """The name of the session's active agent (one row read); None when there is no session."""
        ...

    def window_tokens(self, session_id: str) -> tuple[int, list[tuple[int, int]]]:
        """``(tokens, [(turn number, tokens), ...])`` of the stored context window, oldest first."""
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

    def append_event(
        self,
        session_id: str,
        type: EventType | str,
        payload: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Event:
        """Append one custom (non-reserved) event."""
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

    def submit_tool_result(self, session_id: str, tool_use_id: str, output: str) -> list[str]:
        """Record a custom tool's result; the tool-call ids still unanswered."""
        ...

    def submitted_tool_results(self, session_id: str) -> dict[str, str]:
        """Results already submitted for the open turn's pending tool calls, by tool-call id."""
        ...

    def session_endpoint(self, session_id: str) -> tuple[str | None, str | None]:
        """The ``(model, base_url)`` stored with the session."""
        ...

    def set_session_endpoint(self, session_id: str, model: str | None, base_url: str | None) -> None:
        """Store the model name and base URL the session talks to."""
        ...

    def claim_message(self, message_id: str, *, owner: Owner | None = None) -> bool:
        """Claim an inbound message id atomically; True for exactly one caller."""
        ...

    def mark_message_processed(self, message_id: str) -> None:
        """Claim ``message_id`` for the next Runner turn of this thread or task."""
        ...

    def is_message_processed(self, message_id: str, *, wait: float = ...) -> bool:
        """True when a delivery of ``message_id`` must be skipped."""
        ...

    def message_state(self, message_id: str) -> MessageState:
        """Where ``message_id`` stands."""
        ...

    def complete_message(self, message_id: str) -> None:
        """Record ``message_id`` as processed now."""
        ...

    def release_message(self, message_id: str) -> bool:
        """Undo a claim whose processing failed."""
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

    def close(self) -> None:
        """Release the store's resources."""
        ...
