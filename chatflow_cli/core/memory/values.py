"""The values a session store hands back, apart from any backend.

:class:`SessionSummary` (a row of ``list_sessions``), :class:`TurnRecord` (a stored turn),
:class:`TurnStart` (what ``begin_turn`` returns) and :class:`MessageState` (where an inbound
message id stands). They are plain data; identity and storage live in the stores. What a
caller may ask of a store is in :mod:`~chatflow_cli.core.memory.protocol`.

Times are UTC epoch seconds throughout; turn numbers are the user-visible ones (1, 2, 3...
for the life of a session; 0 holds the SYSTEM messages).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..events import Event, SessionStatus
from ..messages import Message

if TYPE_CHECKING:
    from ..resources.mounts import Mount
    from .context import SessionContext

__all__ = ["MessageState", "SessionSummary", "TurnRecord", "TurnStart"]


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
    #: the resources the turn ran with: the session's mounts in force when it ended (when it
    #: still runs, or waits for tool results: now), in the order they were first mounted;
    #: derived from the ``resource.*`` events of the log (:func:`~chatflow_cli.core.resources.mounts.mounts_at`)
    resources: tuple[Mount, ...] = ()


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
