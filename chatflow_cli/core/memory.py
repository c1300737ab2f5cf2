"""Sessions and their stores (seed 000 "Sessões e Estado da Conversa", seed 003 "Sessions").

:class:`SessionContext` holds one conversation's *context window*: every SYSTEM message,
then the newest ``max_turns`` whole turns. A turn starts at a USER message and holds
everything up to the next USER message, so pruning never separates a tool call from its
result (seed 000, "O Algoritmo de Poda por Turnos Completos"). Turn numbers are the ones
users see: 1, 2, 3… for the life of the session, stable across pruning; after
``rollback_to(2)`` the next new turn is turn 3.

A context records what changes in a private *journal*; ``store.save(session)`` applies
the journal in one transaction and appends one event per change to the session's
append-only event log (seed 003; event types in :mod:`chatflow_cli.core.events`).

Stores share one implementation of the session rules (:class:`BaseSessionStore`); each
backend only supplies transactions over its storage:

* :class:`SessionStore` keeps everything in dicts behind one lock (tests, CLI tools,
  short-lived services; seed 000 "Armazenamento em Memória");
* :class:`~chatflow_cli.core.sqlite_store.SQLiteSessionStore` keeps it in a SQLite file.

Event ``seq`` and deleted sessions: ``seq`` counts 1, 2, 3… per *incarnation* of a session
id. ``store.delete(session_id)`` removes the session with its whole event log, so a session
created again under the same id is a new incarnation whose log starts again at ``seq`` 1.
A consumer that keeps a ``replay`` cursor (``after_seq``) across a delete must reset it;
a context still held from the old incarnation gets :class:`SessionDeletedError` instead of
writing into the new one.

De-duplication of inbound messages (webhooks): a message id is *claimed* (in progress) by
the process that handles it -- the claim records its holder, the same owner record as a
running turn -- and becomes *processed* when the turn it started completes, in the same
transaction. A processed id stays a duplicate while ``now < processed_at +
DEFAULT_DEDUP_TTL_HOURS`` (192 h: WhatsApp re-sends for 7 days). A claim whose holder died,
or whose turn failed or was interrupted, is free again, so the platform's redelivery runs
it. :meth:`BaseSessionStore.claim_message` checks and claims in one atomic step; the seed's
``is_message_processed`` / ``mark_message_processed`` pair claims the same way, and a
Runner turn started next in the same thread or task completes the claim.
``is_message_processed`` waits (bounded) while another process holds the id, so a duplicate
delivery runs the message itself when that holder dies before answering.
"""

from __future__ import annotations

import contextvars
import copy
import enum
import hashlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from functools import partial
from typing import Any, Generic, Self, TypeVar

from .errors import (
    ChatflowError,
    IdempotencyConflictError,
    InvalidHistoryError,
    PendingToolCallsError,
    SessionBusyError,
    SessionDeletedError,
    SessionNotFoundError,
    SessionTerminatedError,
    ToolResultError,
    UsageError,
)
from .events import Event, EventType, SessionStatus
from .messages import Message, Role, ToolCall

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "DUPLICATE_WAIT_S",
    "DEFAULT_MAX_TURNS",
    "EditResult",
    "RESERVED_EVENT_PREFIXES",
    "RESERVED_EVENT_TYPES",
    "BaseSessionStore",
    "MessageState",
    "Owner",
    "SessionContext",
    "SessionDeletedError",
    "SessionStore",
    "SessionSummary",
    "Turn",
    "TurnRecord",
    "TurnStart",
]

logger = logging.getLogger(__name__)

#: How long a processed message id counts as a duplicate (seed 000: 8 days, covering
#: WhatsApp's 7-day re-delivery window).
DEFAULT_DEDUP_TTL_HOURS = 192
#: How long (seconds) ``is_message_processed`` waits, by default, for a claim another process
#: holds to end (processed, or free again because the holder died or its turn failed).
DUPLICATE_WAIT_S = 60.0
#: Turns kept in the context window unless a session says otherwise (seed 000).
DEFAULT_MAX_TURNS = 40

INTERRUPTED_TOOL_RESULT = "Interrupted before a result: side effects unknown."
_PREVIEW_CHARS = 80
_T = TypeVar("_T")

#: Event types chatflow itself writes and derives state from (the session row, the window,
#: pending tool results). :meth:`BaseSessionStore.append_event` refuses them, so the log
#: never says something the derived state does not show. Any other type (``"note"``,
#: ``"billing.invoice_sent"``…) is a custom/business event and is accepted.
RESERVED_EVENT_PREFIXES = ("message.", "tool.", "turn.", "session.", "metadata.")
RESERVED_EVENT_TYPES = frozenset({"status", "rollback", "handoff"} | {t.value for t in EventType})

_USE_INSTEAD = {
    "message.": "session.add_message() then store.save()",
    "tool.result_submitted": "store.submit_tool_result()",
    "tool.": "session.add_message() (tool results) or a Runner (pending custom tools)",
    "turn.": "session.complete_turn(), fail_turn() or interrupt_turn() then store.save()",
    "session.": "store.get_or_create(), store.begin_turn() or store.delete()",
    "metadata.": "session.update_metadata() then store.save()",
    "status": "session.set_status() then store.save(), or store.release()",
    "rollback": "store.rollback() or session.rollback_to()",
    "handoff": "session.set_active_agent() then store.save()",
}

#: Types SessionContext.record_event may journal: they change no stored row or window.
_RECORDABLE = frozenset(
    {
        EventType.TOOL_PENDING.value,
        EventType.TOOL_RESULT_SUBMITTED.value,
        EventType.TURN_COMPLETED.value,
        EventType.TURN_INTERRUPTED.value,
        EventType.SESSION_RECOVERED.value,
        EventType.SESSION_IMPORTED.value,
    }
)


def _is_reserved(kind: str) -> bool:
    return kind in RESERVED_EVENT_TYPES or kind.startswith(RESERVED_EVENT_PREFIXES)


def _use_instead(kind: str) -> str:
    for prefix, method in _USE_INSTEAD.items():
        if kind == prefix or (prefix.endswith(".") and kind.startswith(prefix)):
            return method
    return "the SessionContext method that makes this change"


def _event_type(type: Any) -> str:
    kind = type.value if isinstance(type, EventType) else type
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"event type must be a non-empty str, got {kind!r}")
    return kind


#: Upper bound of ``max_turns``: far beyond any context window, and within SQLite's 64-bit integers.
MAX_TURNS_LIMIT = 1_000_000


def _check_max_turns(value: Any, name: str = "max_turns") -> int:
    """``value`` as an int in 1..1_000_000.

    TypeError for a non-int (bool too); ValueError for ``<= 0`` (0.4.0rc1) or above
    ``MAX_TURNS_LIMIT`` -- the same in both stores (SQLite could not even store 2**70).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if value > MAX_TURNS_LIMIT:
        raise ValueError(f"{name} must be at most {MAX_TURNS_LIMIT:,}, got {value}")
    return value


def _check_session_id(session_id: Any, *, empty_ok: bool = True) -> str:
    """A session id: a str (TypeError otherwise) of valid Unicode text (UsageError), the same in
    both stores. ``empty_ok=False`` (creating a session): ValueError for ``""``."""
    if not isinstance(session_id, str):
        raise TypeError(f"session_id must be a str, got {type(session_id).__name__}")
    if not session_id and not empty_ok:
        raise ValueError("session_id must be a non-empty string")
    if not session_id.isascii():
        _check_text(session_id, "session_id")
    return session_id


def storable_text(text: str) -> str:
    """``text`` made storable: every lone surrogate (``"\\udcff"``, e.g. from
    ``os.fsdecode(b"file-\\xff.txt")``) replaced by its backslash escape (the six characters
    ``\\udcff``); any other text is returned as is (same object).

    Used by the Runner for text chatflow did not get from the caller -- tool output, model
    text, tool-call arguments, error messages -- so such a value never fails a turn: we
    choose ``backslashreplace`` over ``replace`` ("?") because the escape keeps which
    character it was, for the model and for the user reading the log. A *user* message
    with a lone surrogate is still refused (:class:`UsageError`, see :func:`_check_text`).
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _check_text(data: Any, what: str, session_id: str | None = None) -> str:
    """``data`` as compact JSON text that encodes as UTF-8, or :class:`UsageError`.

    A lone surrogate (``"\\ud800"``, e.g. from ``surrogateescape``-decoded bytes) is not
    Unicode text: SQLite cannot store it, and the in-memory store must not accept what
    SQLite refuses. Both stores refuse it the same way, before writing anything (we choose
    refusing over storing an escaped copy: the caller would get back other text than sent).
    """
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("utf-8", "backslashreplace").decode("ascii")
        raise UsageError(
            f"{what} is not valid Unicode text: lone surrogate {bad} at position {exc.start} "
            "(decode the input with errors='replace')",
            session_id=session_id,
        ) from None
    return text


class TurnOwnerDied(Exception):
    """Why a recovered turn left the context window (the ``error_type`` of its ``turn.failed``)."""


def _busy_message(session_id: str, owner: Any) -> str:
    """The :class:`SessionBusyError` text for a session another live run owns."""
    return f"session {session_id!r} is busy: a turn is running in pid {owner.pid} on {owner.host}"


def _check_idempotency_key(key: Any) -> str:
    """An idempotency key: a non-empty str of valid Unicode text (TypeError / UsageError)."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"idempotency_key must be a non-empty str or None, got {key!r}")
    if not key.isascii():
        _check_text(key, "idempotency_key")
    return key


def _check_metadata(value: Any, name: str = "metadata") -> dict[str, Any]:
    """A JSON copy of ``value``: a mapping with str keys and JSON-serialisable values.

    TypeError otherwise (both stores alike); a lone surrogate in a string is a
    :class:`UsageError` (see :func:`_check_text`). The copy is what a JSON round trip
    gives (tuples become lists, nested keys become str), so both stores return the same.
    """
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise TypeError(f"{name} keys must be str, got {key!r}")
    try:
        text = _check_text(dict(value), name)
    except (TypeError, ValueError, RecursionError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise TypeError(f"{name} must hold JSON-serialisable values only: {exc}") from None
    data: dict[str, Any] = json.loads(text)
    return data


def _agent_name(agent: Any) -> str:
    if agent is None:
        return ""
    if isinstance(agent, str):
        return agent
    return str(getattr(agent, "name", agent))


def _plain_usage(usage: Any) -> dict[str, Any]:
    if usage is None:
        return {}
    if isinstance(usage, Mapping):
        return dict(usage)
    if hasattr(usage, "to_dict"):
        return dict(usage.to_dict())
    if is_dataclass(usage) and not isinstance(usage, type):
        return asdict(usage)
    return dict(vars(usage))


def _fallback_agent(name: str) -> Any:
    """An agent with this name, no instructions and no tools (seed 000 "agente de fallback")."""
    from .agents import Agent

    return Agent(name=name, instructions="")


def _sha256(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------
# Owner of a running turn
# ----------------------------------------------------------------------------------------


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
    """Who runs a session's current turn: the lease record of a ``running`` session (seed 003).

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

    def alive(self) -> bool:
        """True while the owning process runs.

        Owners on another host cannot be checked and count as alive. A zombie (exited,
        not yet reaped) counts as dead; so does a process whose start time differs from
        the recorded one (the pid was reused).
        """
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


# ----------------------------------------------------------------------------------------
# Inbound message ids (webhook de-duplication)
# ----------------------------------------------------------------------------------------


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
#: when the turn completes (and frees it when the turn fails), so the seed's
#: ``mark_message_processed(id)`` then ``run_async(...)`` is safe as written.
_CLAIM: contextvars.ContextVar[tuple[int, str, str] | None] = contextvars.ContextVar("chatflow_claim", default=None)


def _check_wait(wait: Any) -> float:
    """A wait in seconds: a real number >= 0 (ValueError/TypeError otherwise)."""
    if isinstance(wait, bool) or not isinstance(wait, (int, float)):
        raise TypeError(f"wait must be a number of seconds, got {type(wait).__name__}")
    if not wait >= 0:
        raise ValueError(f"wait must be >= 0 seconds, got {wait!r}")
    return float(wait)


def take_context_claim(store: Any) -> tuple[str, str] | None:
    """(message id, owner token) of the claim made last in this context on ``store``, once."""
    claim = _CLAIM.get()
    if claim is None or claim[0] != id(store):
        return None
    _CLAIM.set(None)
    return claim[1], claim[2]


# ----------------------------------------------------------------------------------------
# Value objects
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of the context window: its user-visible ``number`` and its messages (USER first)."""

    number: int
    messages: tuple[Message, ...]


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


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A row of ``list_sessions``. ``status`` is effective: a dead owner's ``running`` shows ``idle``.

    Times are UTC epoch seconds; ``preview`` is the first live user message, at most 80 characters.
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


#: Outcomes of a first attempt that produced no result: the same idempotency key with the
#: same message runs the turn again (see :class:`TurnStart`).
_RETRYABLE_OUTCOMES = frozenset({"failed", "interrupted", "rolled_back"})


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


@dataclass(frozen=True, slots=True)
class _Op:
    """One journal entry: the change (``kind``) and the event that records it."""

    kind: str  # message | rollback | turn_failed | status | agent | metadata | event
    type: str
    payload: dict[str, Any]
    turn: int = 0
    message: Message | None = None


_MESSAGE_EVENT = {
    Role.USER: EventType.MESSAGE_USER.value,
    Role.MODEL: EventType.MESSAGE_MODEL.value,
    Role.SYSTEM: EventType.MESSAGE_SYSTEM.value,
    Role.TOOL: EventType.TOOL_RESULT.value,
}

#: (first_turn, last_turn) -> {turn: [messages]} of live stored turns; raises SessionDeletedError.
TurnLoader = Callable[[int, int], dict[int, list[Message]]]


# ----------------------------------------------------------------------------------------
# SessionContext
# ----------------------------------------------------------------------------------------


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


def _split_turns(messages: Sequence[Message]) -> tuple[list[Message], list[Message], list[list[Message]]]:
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

    ``SessionContext(session_id, initial_agent, max_turns=40, metadata=None)`` (seed 000).
    ``max_turns`` must be an int > 0: ``TypeError`` for anything else that is not an
    int (``bool`` included), ``ValueError`` for ``<= 0`` — at once (0.4.0rc1).

    ``history`` is a read-only tuple: change it only through :meth:`add_message`,
    :meth:`_prune_history` and :meth:`rollback_to` (seed 000 "Fatiar o Histórico
    Manualmente"). A context made by hand keeps pruned turns in memory, so
    :meth:`rollback_to` can reach them; one loaded from a store asks the store.
    A context with no store keeps its own events (``events``), seq 1, 2, 3…
    """

    def __init__(
        self,
        session_id: str,
        initial_agent: Any,
        max_turns: int = DEFAULT_MAX_TURNS,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        _check_session_id(session_id)
        self._max_turns = _check_max_turns(max_turns)
        self.session_id = session_id
        self._agent = initial_agent
        self.metadata: dict[str, Any] = _check_metadata(metadata) if metadata is not None else {}
        self._saved_metadata: dict[str, Any] = copy.deepcopy(self.metadata)
        # (status, owner token, agent name) of the stored row this context was loaded from
        # or last saved to; a status or handoff change from another base is refused.
        self._base: tuple[SessionStatus, str | None, str] | None = None
        self._lease: str | None = None  # owner token of the run begin_turn gave this context
        self._messages: list[Message] = []
        self._turn_offset = 0
        self._turn_count = 0  # number of the last live turn
        self._call_ids: set[str] | None = None  # tool-call ids in the window; None: recount
        self._archive: dict[int, tuple[Message, ...]] = {}
        self._loader: TurnLoader | None = None
        self._journal: list[_Op] = []
        self._status = SessionStatus.IDLE
        self._local_events: list[Event] | None = []  # None once bound to a store
        self._incarnation: str | None = None  # the store's creation id once bound
        self._store_id: int | None = None

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
        _, _, turns = _split_turns(self._messages)
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
    def events(self) -> tuple[Event, ...]:
        """A store-less context's own events; for a stored session, use ``store.events()``."""
        return tuple(self._local_events or ())

    # -- journal -----------------------------------------------------------------------
    def _record(self, op: _Op) -> None:
        if self._status is SessionStatus.TERMINATED and self._local_events is not None:
            raise SessionTerminatedError(f"session {self.session_id} is terminated", session_id=self.session_id)
        self._journal.append(op)
        if self._local_events is not None:
            seq = len(self._local_events) + 1
            self._local_events.append(Event(self.session_id, seq, op.type, op.payload, time.time()))

    def _take_journal(self) -> list[_Op]:
        if self.metadata != self._saved_metadata:  # changed in place: journal it like update_metadata
            self.update_metadata({})
        return list(self._journal)

    def _metadata_saved(self, stored: Mapping[str, Any]) -> None:
        """After a save: ``metadata`` (same dict object) becomes the stored, merged metadata."""
        if self.metadata != stored:
            self.metadata.clear()
            self.metadata.update(copy.deepcopy(dict(stored)))
        self._saved_metadata = copy.deepcopy(self.metadata)

    def _journal_saved(self, count: int) -> None:
        del self._journal[:count]
        self._saved_metadata = copy.deepcopy(self.metadata)

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
        _check_text(msg.to_dict(), f"{msg.role.value} message", self.session_id)
        if msg.role is Role.SYSTEM:
            lead = 0
            while lead < len(self._messages) and self._messages[lead].role is Role.SYSTEM:
                lead += 1
            self._messages.insert(lead, msg)
            self._record(_Op("message", _MESSAGE_EVENT[msg.role], self._message_payload(0, msg), 0, msg))
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
        if msg.tool_calls and self._call_ids is not None:
            self._call_ids.update(call.id for call in msg.tool_calls)
        self._record(_Op("message", _MESSAGE_EVENT[msg.role], self._message_payload(turn, msg), turn, msg))

    def _current_turn(self) -> int:
        """The turn new messages belong to: the last live turn (0 before the first USER message)."""
        return self._turn_count

    @staticmethod
    def _message_payload(turn: int, msg: Message) -> dict[str, Any]:
        return {"turn": turn, "message": msg.to_dict()}

    def _prune_history(self) -> None:
        """Seed 000's pruning: SYSTEM messages first, in order; then the newest ``max_turns`` whole turns.

        Non-system messages before the first USER message are dropped. The clean-up runs
        even when no turn has to go. A no-op while tool calls wait for results.
        """
        if self.pending_tool_calls:
            return
        systems, _preamble, turns = _split_turns(self._messages)
        dropped = turns[: max(0, len(turns) - self._max_turns)]
        for k, msgs in enumerate(dropped, start=self._turn_offset + 1):
            self._archive[k] = tuple(msgs)
        self._turn_offset += len(dropped)
        kept = turns[len(dropped) :]
        self._messages = systems + [m for msgs in kept for m in msgs]
        self._call_ids = None

    def _rebuild(self, last_turn: int) -> tuple[list[Message], int]:
        """The window holding the newest ``max_turns`` of turns 1..last_turn, and its offset."""
        systems, _, window_turns = _split_turns(self._messages)
        first = max(1, last_turn - self._max_turns + 1)
        have: dict[int, tuple[Message, ...]] = {
            k: tuple(v) for k, v in self._archive.items() if first <= k <= last_turn
        }
        for k, msgs in enumerate(window_turns, start=self._turn_offset + 1):
            if first <= k <= last_turn:
                have[k] = tuple(msgs)
        missing = [k for k in range(first, last_turn + 1) if k not in have]
        if missing:
            if self._loader is None:
                raise ValueError(f"turns {missing[0]}..{missing[-1]} of session {self.session_id} are not available")
            loaded = self._loader(missing[0], missing[-1])
            for k in missing:
                if k not in loaded:
                    raise ValueError(f"turn {k} of session {self.session_id} is not in the store")
                have[k] = tuple(loaded[k])
        messages = list(systems)
        for k in range(first, last_turn + 1):
            messages.extend(have[k])
        return messages, first - 1

    def rollback_to(self, turn: int) -> None:
        """Keep turns 1..``turn`` (0 keeps only the SYSTEM messages); all or nothing.

        Raises ``ValueError`` (and changes nothing) unless ``0 <= turn <= turn_count``.
        Turns pruned out of the window are brought back. Journals a ``rollback`` event
        ``{"to_turn": n, "removed_turns": [...]}``; the next new turn is ``turn + 1``.
        """
        if isinstance(turn, bool) or not isinstance(turn, int):
            raise TypeError(f"turn must be an int, got {type(turn).__name__}")
        count = self.turn_count
        if not 0 <= turn <= count:
            raise ValueError(f"cannot roll back to turn {turn}: session {self.session_id} has turns 0..{count}")
        messages, offset = self._rebuild(turn)
        self._messages, self._turn_offset, self._turn_count, self._call_ids = messages, offset, turn, None
        self._archive = {k: v for k, v in self._archive.items() if k <= turn}
        self._record(
            _Op(
                "rollback",
                EventType.ROLLBACK.value,
                {"to_turn": turn, "removed_turns": list(range(turn + 1, count + 1))},
            )
        )

    def set_active_agent(self, agent: Any, *, tool_call_id: str | None = None) -> None:
        """Make ``agent`` the active agent; journals one ``handoff`` event when it changes."""
        old = _agent_name(self._agent)
        self._agent = agent
        new = _agent_name(agent)
        if new != old:
            payload = {"turn": self.turn_count, "from_agent": old, "to_agent": new, "tool_call_id": tool_call_id or ""}
            self._record(_Op("agent", EventType.HANDOFF.value, payload))

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
        self._record(_Op("metadata", EventType.METADATA_UPDATED.value, payload))

    def set_status(self, status: SessionStatus | str, reason: str = "", **extra: Any) -> None:
        """Journal a ``status`` event; ``terminated`` is final (seed 003)."""
        status = SessionStatus(status)
        if self._status is SessionStatus.TERMINATED:
            raise SessionTerminatedError(f"session {self.session_id} is terminated", session_id=self.session_id)
        self._status = status
        self._record(_Op("status", EventType.STATUS.value, {"status": status.value, "reason": reason, **extra}))

    def record_event(self, type: EventType | str, payload: Mapping[str, Any] | None = None) -> None:
        """Journal an event with no other effect (e.g. ``tool.pending``).

        Custom types are accepted. Of the reserved types (see ``RESERVED_EVENT_PREFIXES``)
        only those that change no stored state may be recorded here (``tool.pending``,
        ``tool.result_submitted``, ``turn.completed``, ``turn.interrupted``,
        ``session.recovered``); the others raise :class:`UsageError` naming the method that
        makes the change, so the log never contradicts the session.
        """
        kind = _event_type(type)
        if _is_reserved(kind) and kind not in _RECORDABLE:
            raise UsageError(
                f"event type {kind!r} is reserved: use {_use_instead(kind)}", session_id=self.session_id
            )
        self._record(_Op("event", kind, dict(payload or {})))

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
        payload: dict[str, Any] = {"turn": turn, "error": storable_text(str(error)), "error_type": error_type}
        if agent is not None:
            before, after = _agent_name(self._agent), _agent_name(agent)
            payload["active_agent"] = after
            if before != after:
                payload["reverted_from_agent"] = before
                self._agent = agent
        self._record(_Op("turn_failed", EventType.TURN_FAILED.value, payload, turn))

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
            name = _agent_name(agent if agent is not None else self._agent) or None
            self.add_message(Message.model(partial_text or "", agent=name, interrupted=True,
                                           reasoning=partial_reasoning or None))
        payload = {"turn": self._current_turn(), "tool_use_ids": [c.id for c in open_calls], "reason": reason}
        self._record(_Op("event", EventType.TURN_INTERRUPTED.value, payload))
        self._prune_history()

    def complete_turn(self, content: str | None, agent: Any = None, usage: Any = None,
                      finish_reason: str | None = None) -> None:
        """Journal ``turn.completed`` ``{"turn", "agent", "content", "usage"}`` (plus
        ``"finish_reason"`` when given: ``"stop"``, or ``"length"``/``"content_filter"`` for
        a reply that was cut), then prune.

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
            "agent": _agent_name(agent if agent is not None else self._agent),
            "content": content or "",
            "usage": _plain_usage(usage),
        }
        if finish_reason is not None:
            payload["finish_reason"] = str(finish_reason)
        self._record(_Op("event", EventType.TURN_COMPLETED.value, payload))
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
        systems, _preamble, turns = _split_turns(self._messages)
        kept = [(k, msgs) for k, msgs in enumerate(turns, start=self._turn_offset + 1) if k >= first]
        if kept and kept[-1][0] != turn_count:
            return False
        self._messages = systems + [m for _, msgs in kept for m in msgs]
        self._turn_offset = kept[0][0] - 1 if kept else turn_count
        self._call_ids = None
        self._archive = {}
        return True

    @classmethod
    def _restore(
        cls,
        session_id: str,
        agent: Any,
        max_turns: int,
        metadata: dict[str, Any],
        status: SessionStatus,
        window: list[tuple[int, Message]],
        turn_count: int,
        incarnation: str,
        store_id: int,
    ) -> SessionContext:
        ctx = cls(session_id, agent, max_turns, metadata)
        ctx._messages = [msg for _, msg in window]
        numbers = sorted({turn for turn, _ in window if turn > 0})
        ctx._turn_offset = (numbers[0] - 1) if numbers else turn_count
        ctx._turn_count = turn_count
        ctx._status = status
        ctx._local_events = None
        ctx._incarnation = incarnation
        ctx._store_id = store_id
        return ctx

    def __repr__(self) -> str:
        return (
            f"SessionContext(session_id={self.session_id!r}, agent={_agent_name(self._agent)!r}, "
            f"turns={self.turn_count}, window={len(self._messages)} messages, status={self._status.value})"
        )


# ----------------------------------------------------------------------------------------
# Stores
# ----------------------------------------------------------------------------------------


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

    def latest_session_id(self) -> str | None:
        raise NotImplementedError

    def next_seq(self, session_id: str) -> int:
        """MAX(seq) + 1 for the session, read inside the current transaction."""
        raise NotImplementedError

    def insert_event(self, event: Event, turn: int | None) -> None:
        raise NotImplementedError

    def events(self, session_id: str, after_seq: int, limit: int | None) -> list[Event]:
        raise NotImplementedError

    def last_event(self, session_id: str, type: str, turn: int | None = None, after_seq: int = 0) -> Event | None:
        raise NotImplementedError

    def events_of_type(self, session_id: str, type: str, after_seq: int) -> list[Event]:
        raise NotImplementedError

    def insert_message(self, session_id: str, turn: int, message: Message, seq: int) -> None:
        raise NotImplementedError

    def remove_turns(self, session_id: str, first: int, last: int | None, reason: str, seq: int) -> None:
        """Mark live messages of turns first..last (None: no upper bound), turn >= 1, as removed."""
        raise NotImplementedError

    def window(self, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        """Live SYSTEM messages of turn 0, then live messages of turns >= first_turn, in order."""
        raise NotImplementedError

    def window_dicts(self, session_id: str, first_turn: int) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`window` as ``Message.to_dict()`` dicts; a backend that stores JSON may
        return it parsed, without building messages."""
        return [(turn, msg.to_dict()) for turn, msg in self.window(session_id, first_turn)]

    def turn_messages(
        self, session_id: str, first: int, last: int | None, include_removed: bool
    ) -> list[_StoredMessage]:
        """Messages of turns first..last in (turn, insertion) order; turn 0 only its SYSTEM messages."""
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


class BaseSessionStore:
    """The session rules, shared by every store (seed 000 ``BaseSessionStore``).

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
        tools, and a warning is logged (seed 000 "Ausência de Resolvedores de Agentes").
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
    ) -> Event:
        # Every event (messages ride in their events' payloads) is checked here, the same for
        # both stores, before anything of it is written.
        if not type.isascii():
            _check_text(type, "event type", session_id)
        if key is not None:
            _check_idempotency_key(key)
        _check_text(payload, f"{type} event", session_id)
        event = Event(session_id, tx.next_seq(session_id), type, payload, self.clock(), key)
        tx.insert_event(event, turn)
        return event

    def _context(
        self, tx: _Tx, row: _SessionRow, default_agent: Any = None, quiet: bool = False, effective: bool = False,
        last_turns: int | None = None,
    ) -> SessionContext:
        """The row's context. ``effective``: a dead owner's ``running`` shows ``idle`` (reads for
        callers); the store's own writes keep the stored status. ``last_turns``: hold only the
        newest N turns (a context for an edit that needs no more; older turns still load on
        demand, for a rollback)."""
        window_turns = row.max_turns if last_turns is None else min(row.max_turns, last_turns)
        first = max(1, row.turn_count - window_turns + 1)
        window = tx.window(row.session_id, first)
        agent = self._resolve_agent(row.active_agent_name, default_agent, quiet)
        ctx = SessionContext._restore(
            row.session_id,
            agent,
            window_turns,
            dict(row.metadata),
            self._effective_status(row) if effective else row.status,
            window,
            row.turn_count,
            row.incarnation,
            id(self),
        )
        ctx._base = self._base_of(row)
        # Inside the transaction, pruned turns come from the same transaction; _detach()
        # switches to the store's own reads before the context leaves the store.
        ctx._loader = lambda first, last: self._group_live(tx.turn_messages(row.session_id, first, last, False))
        return ctx

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
        base = session._base
        if base is None or base == self._base_of(row):
            return
        lease = row.owner.token if row.owner is not None and row.status is SessionStatus.RUNNING else None
        if lease is not None and session._lease == lease:
            return
        raise SessionBusyError(
            f"session {row.session_id!r} is busy: it changed since it was loaded (status {base[0].value} -> "
            f"{row.status.value}, agent {base[2]!r} -> {row.active_agent_name!r}); load it again",
            session_id=row.session_id,
        )

    def _detach(self, ctx: SessionContext) -> SessionContext:
        assert ctx._incarnation is not None
        ctx._loader = partial(self._load_live_turns, ctx.session_id, ctx._incarnation)
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
            event = self._append(tx, row.session_id, op.type, payload, turn)
            events.append(event)
            holder = row.owner.token if row.owner is not None else None
            if turn is not None and op.kind == "event":
                if op.type in (EventType.TURN_COMPLETED.value, EventType.TOOL_PENDING.value):
                    tx.processed_finish_turn(row.session_id, turn, holder, now)
                elif op.type == EventType.TURN_INTERRUPTED.value:
                    tx.processed_drop_turn(row.session_id, turn, holder)
            if op.kind == "message":
                assert op.message is not None
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
                tx.insert_message(row.session_id, op.turn, op.message, event.seq)
                row.turn_count = max(row.turn_count, op.turn)
            elif op.kind == "rollback":
                to_turn = int(op.payload["to_turn"])
                tx.remove_turns(row.session_id, to_turn + 1, None, "rolled_back", event.seq)
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
        """
        ops = session._take_journal()
        with self._write() as tx:
            row = tx.get_row(session.session_id)
            events: list[Event] = []
            if session._incarnation is not None:
                if row is None or row.incarnation != session._incarnation:
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
        session._journal_saved(len(ops))
        session._metadata_saved(row.metadata)
        session._base = self._base_of(row)
        session._incarnation = row.incarnation
        session._store_id = id(self)
        session._local_events = None
        if session._loader is None:
            session._loader = partial(self._load_live_turns, row.session_id, row.incarnation)
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
        store read or write (0.4.0rc1).
        """
        _check_session_id(session_id)
        with self._write() as tx:
            return tx.delete_row(session_id)

    def rollback(self, session_id: str, to_turn: int) -> list[Event]:
        """``rollback_to(to_turn)`` on the stored session in one transaction (``chatflow rollback``).

        Raises SessionNotFoundError, ValueError (turn out of range), SessionBusyError (a live
        owner runs it), SessionTerminatedError.
        """
        _check_session_id(session_id)
        with self._write() as tx:
            row = self._require(tx, session_id)
            self._refuse_terminated(row)
            if row.status is SessionStatus.RUNNING and row.owner is not None and row.owner.alive():
                raise SessionBusyError(_busy_message(session_id, row.owner), session_id=session_id)
            ctx = self._context(tx, row, quiet=True)
            ctx.rollback_to(to_turn)
            return self._apply(tx, row, ctx._take_journal())

    def list_sessions(
        self, limit: int | None = None, agent: str | None = None, status: SessionStatus | str | None = None
    ) -> list[SessionSummary]:
        """Sessions, most recently updated first, with their effective status.

        ``agent``: an agent name (str) or None; ``status``: a SessionStatus value or None.
        """
        if agent is not None:
            if not isinstance(agent, str):
                raise TypeError(f"agent must be a str or None, got {type(agent).__name__}")
            _check_text(agent, "agent")
        wanted = SessionStatus(status) if status is not None else None
        out: list[SessionSummary] = []
        with self._read() as tx:
            for row in tx.list_rows(agent):
                effective = self._effective_status(row)
                if wanted is not None and effective is not wanted:
                    continue
                out.append(
                    SessionSummary(
                        row.session_id,
                        row.active_agent_name,
                        effective,
                        row.turn_count,
                        row.max_turns,
                        row.created_at,
                        row.updated_at,
                        tx.preview(row.session_id)[:_PREVIEW_CHARS],
                        dict(row.metadata),
                    )
                )
                if limit is not None and len(out) >= limit:
                    break
        return out

    @staticmethod
    def _effective_status(row: _SessionRow) -> SessionStatus:
        if row.status is SessionStatus.RUNNING and (row.owner is None or not row.owner.alive()):
            return SessionStatus.IDLE
        return row.status

    def latest_session_id(self) -> str | None:
        """The most recently updated session's id, or None when the store is empty."""
        with self._read() as tx:
            return tx.latest_session_id()

    def load_turns(
        self, session_id: str, first: int = 1, last: int | None = None, include_rolled_back: bool = False
    ) -> list[TurnRecord]:
        """Stored turns first..last (for ``sessions show``); SessionNotFoundError when absent."""
        _check_session_id(session_id)
        with self._read() as tx:
            row = self._require(tx, session_id)
            stored = tx.turn_messages(session_id, first, last, include_rolled_back)
        window_first = max(1, row.turn_count - row.max_turns + 1)
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
            journal = ctx._take_journal()
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
            ctx._journal_saved(len(journal))
            ctx._metadata_saved(row.metadata)
            if not ctx._as_stored(row.turn_count, row.status):
                ctx = self._context(tx, row, default_agent)
            ctx._base = self._base_of(row)
            ctx._lease = owner.token  # this run holds the lease: its status changes are never stale
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
        return self._apply(tx, row, ctx._take_journal())

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
        sets for a regular tool's error result recorded beside custom calls (seed 003).
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
        """Claim ``message_id`` for this caller, as :meth:`claim_message` does (the seed's
        name): the next Runner turn this thread or asyncio task starts completes the claim
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
        last turn then costs the same however long the session is.

        Raises:
            SessionBusyError: a live run owns the session (its turn is running).
            SessionTerminatedError: the session is terminated.
        """
        _check_session_id(session_id)
        if idempotency_key is not None:
            _check_idempotency_key(idempotency_key)
        if max_turns is not None:
            _check_max_turns(max_turns)
        if metadata is not None:
            metadata = _check_metadata(metadata)
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
            events += self._apply(tx, row, ctx._take_journal())
            last_seq = events[-1].seq if events else before[1]
            if idempotency_key is not None:
                tx.idempotency_put(session_id, idempotency_key, digest, None, last_seq, self.clock())
        return EditResult(value, events, position=(row.incarnation, last_seq), before=before)

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

    async def arollback(self, session_id: str, to_turn: int) -> list[Event]:
        return await self._run_blocking(self.rollback, session_id, to_turn)

    async def alist_sessions(
        self, limit: int | None = None, agent: str | None = None, status: SessionStatus | str | None = None
    ) -> list[SessionSummary]:
        return await self._run_blocking(self.list_sessions, limit, agent, status)

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


# ----------------------------------------------------------------------------------------
# In-memory store
# ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _MemSession:
    row: _SessionRow
    messages: list[list[Any]] = field(default_factory=list)  # [turn, Message, removed, removed_at_seq]
    events: list[Event] = field(default_factory=list)
    event_turns: list[int | None] = field(default_factory=list)
    keys: dict[str, tuple[str, int | None, int]] = field(default_factory=dict)
    endpoint: tuple[str | None, str | None] | None = None


class _MemoryTx(_Tx):
    """Dict-backed primitives; writes log an undo step so a failed transaction leaves no trace."""

    def __init__(self, store: SessionStore, writable: bool) -> None:
        self._s = store
        self._writable = writable
        self.undo: list[Callable[[], object]] = []  # called for their effect; results ignored

    def _session(self, session_id: str) -> _MemSession:
        return self._s._sessions[session_id]

    def get_row(self, session_id: str) -> _SessionRow | None:
        entry = self._s._sessions.get(session_id)
        return None if entry is None else copy.deepcopy(entry.row)

    def insert_row(self, row: _SessionRow) -> None:
        self._s._sessions[row.session_id] = _MemSession(copy.deepcopy(row))
        self.undo.append(lambda: self._s._sessions.pop(row.session_id, None))

    def update_row(self, row: _SessionRow) -> None:
        entry = self._session(row.session_id)
        old = entry.row
        entry.row = copy.deepcopy(row)
        self.undo.append(lambda: setattr(entry, "row", old))

    def delete_row(self, session_id: str) -> bool:
        entry = self._s._sessions.pop(session_id, None)
        if entry is None:
            return False
        self.undo.append(lambda: self._s._sessions.__setitem__(session_id, entry))
        return True

    def list_rows(self, agent: str | None) -> list[_SessionRow]:
        rows = [
            copy.deepcopy(e.row)
            for e in self._s._sessions.values()
            if agent is None or e.row.active_agent_name == agent
        ]
        rows.sort(key=lambda r: (-r.updated_at, r.session_id))
        return rows

    def latest_session_id(self) -> str | None:
        rows = self.list_rows(None)
        return rows[0].session_id if rows else None

    def next_seq(self, session_id: str) -> int:
        entry = self._s._sessions.get(session_id)
        return (entry.events[-1].seq if entry and entry.events else 0) + 1

    def insert_event(self, event: Event, turn: int | None) -> None:
        entry = self._session(event.session_id)
        if entry.events and entry.events[-1].seq >= event.seq:
            raise ChatflowError(f"event seq {event.seq} already used in session {event.session_id}")
        entry.events.append(event)
        entry.event_turns.append(turn)

        def undo() -> None:
            entry.events.pop()
            entry.event_turns.pop()

        self.undo.append(undo)

    def events(self, session_id: str, after_seq: int, limit: int | None) -> list[Event]:
        entry = self._s._sessions.get(session_id)
        if entry is None:
            return []
        out = [e for e in entry.events if e.seq > after_seq]
        return out if limit is None else out[:limit]

    def last_event(self, session_id: str, type: str, turn: int | None = None, after_seq: int = 0) -> Event | None:
        entry = self._session(session_id)
        for event, event_turn in zip(reversed(entry.events), reversed(entry.event_turns)):
            if event.seq <= after_seq:
                return None
            if event.type == type and (turn is None or event_turn == turn):
                return event
        return None

    def events_of_type(self, session_id: str, type: str, after_seq: int) -> list[Event]:
        return [e for e in self._session(session_id).events if e.seq > after_seq and e.type == type]

    def insert_message(self, session_id: str, turn: int, message: Message, seq: int) -> None:
        entry = self._session(session_id)
        entry.messages.append([turn, message, None, None])
        self.undo.append(entry.messages.pop)

    def remove_turns(self, session_id: str, first: int, last: int | None, reason: str, seq: int) -> None:
        entry = self._session(session_id)
        changed = [
            item
            for item in entry.messages
            if item[2] is None and item[0] >= max(1, first) and (last is None or item[0] <= last)
        ]
        for item in changed:
            item[2], item[3] = reason, seq

        def undo() -> None:
            for item in changed:
                item[2], item[3] = None, None

        self.undo.append(undo)

    def window(self, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        entry = self._session(session_id)
        system = [(0, m) for t, m, r, _ in entry.messages if t == 0 and r is None and m.role is Role.SYSTEM]
        turns = [(t, m) for t, m, r, _ in entry.messages if t >= first_turn and t > 0 and r is None]
        turns.sort(key=lambda item: item[0])  # stable: keeps insertion order inside a turn
        return system + turns

    def turn_messages(
        self, session_id: str, first: int, last: int | None, include_removed: bool
    ) -> list[_StoredMessage]:
        entry = self._session(session_id)
        out = [
            _StoredMessage(t, m, r, s)
            for t, m, r, s in entry.messages
            if t >= first
            and (last is None or t <= last)
            and (include_removed or r is None)
            and (t > 0 or m.role is Role.SYSTEM)
        ]
        out.sort(key=lambda item: item.turn)
        return out

    def preview(self, session_id: str) -> str:
        failed = ""
        for t, m, r, _ in self._session(session_id).messages:
            if t == 1 and r is None and m.role is Role.USER:
                return m.content or ""
            if r == "failed" and m.role is Role.USER:
                failed = m.content or ""
        return failed

    def idempotency_get(self, session_id: str, key: str) -> tuple[str, int | None, int] | None:
        return self._session(session_id).keys.get(key)

    def idempotency_put(self, session_id: str, key: str, digest: str, turn: int | None, seq: int, now: float) -> None:
        keys = self._session(session_id).keys
        old = keys.get(key)
        keys[key] = (digest, turn, seq)
        self.undo.append(lambda: keys.pop(key, None) if old is None else keys.__setitem__(key, old))

    def idempotency_turn_keyed(self, session_id: str, turn: int) -> bool:
        return any(t == turn for _, t, _ in self._session(session_id).keys.values())

    def processed_get(self, message_id: str) -> _MessageRecord | None:
        return self._s._processed.records.get(message_id)

    def processed_put(self, message_id: str, record: _MessageRecord) -> None:
        processed = self._s._processed
        old = processed.records.get(message_id)
        processed.put(message_id, record)
        self.undo.append(lambda: processed.restore(message_id, old))

    def processed_turn_claimed(self, session_id: str, turn: int) -> bool:
        processed = self._s._processed
        return any(
            processed.records[m].state == "in_progress" for m in processed.by_turn.get((session_id, turn), ())
        )

    def _turn_claims(self, session_id: str, turn: int, holder: str | None) -> list[str]:
        processed = self._s._processed
        out = []
        for message_id in list(processed.by_turn.get((session_id, turn), ())):
            record = processed.records[message_id]
            if record.state == "in_progress" and (
                holder is None or (record.holder is not None and record.holder.token == holder)
            ):
                out.append(message_id)
        return out

    def processed_finish_turn(self, session_id: str, turn: int, holder: str | None, now: float) -> None:
        for message_id in self._turn_claims(session_id, turn, holder):
            self.processed_put(message_id, _MessageRecord("completed", now, None, session_id, turn))

    def processed_drop_turn(self, session_id: str, turn: int, holder: str | None) -> None:
        for message_id in self._turn_claims(session_id, turn, holder):
            self.processed_release(message_id)

    def processed_purge(self, now: float, ttl_s: float) -> None:
        # Not undone: an expired id is not a duplicate, so dropping it changes no answer.
        self._s._processed.purge(now, ttl_s)

    def processed_release(self, message_id: str) -> bool:
        processed = self._s._processed
        old = processed.records.get(message_id)
        if old is None:
            return False
        processed.restore(message_id, None)
        self.undo.append(lambda: processed.restore(message_id, old))
        return True

    def endpoint_get(self, session_id: str) -> tuple[str | None, str | None] | None:
        return self._session(session_id).endpoint

    def endpoint_put(self, session_id: str, model: str | None, base_url: str | None, now: float) -> None:
        entry = self._session(session_id)
        old = entry.endpoint
        entry.endpoint = (model, base_url)
        self.undo.append(lambda: setattr(entry, "endpoint", old))

    def queue_add(self, session_id: str, owner: Owner, now: float) -> int:
        store = self._s
        store._tickets += 1
        ticket = store._tickets
        waiters = store._queues.setdefault(session_id, {})
        waiters[ticket] = owner
        self.undo.append(lambda: waiters.pop(ticket, None))
        return ticket

    def queue_list(self, session_id: str) -> list[tuple[int, Owner]]:
        return sorted(self._s._queues.get(session_id, {}).items())

    def queue_remove(self, session_id: str, ticket: int) -> None:
        waiters = self._s._queues.get(session_id)
        if waiters is None or ticket not in waiters:
            return
        owner = waiters.pop(ticket)
        if not waiters:
            self._s._queues.pop(session_id, None)
        self.undo.append(lambda: self._s._queues.setdefault(session_id, {}).__setitem__(ticket, owner))


class _ProcessedIds:
    """Processed message ids for :class:`SessionStore`: O(1) amortized mark and purge.

    ``at`` maps id -> processed-at time; ``_queue`` holds ``(time, id)`` in marking order.
    While the clock never goes back the queue is sorted by time, so a purge pops expired
    entries from its front and stops at the first live one. An entry whose id was marked
    again later is stale and is dropped when it reaches the front. If the clock goes back
    (an injected test clock, a wall-clock step) the queue is marked unsorted; a full sweep
    that rebuilds it sorted then runs after as many purges as there were ids at that moment
    (still O(1) amortized, plus the sort). ``scanned`` counts queue entries examined by
    purges and sweeps. ``records`` holds each id's :class:`_MessageRecord` (``at`` is its
    time), ``by_turn`` the ids whose claim started a (session, turn).
    """

    __slots__ = ("_calls", "_queue", "_sorted", "_sweep_after", "at", "by_turn", "records", "scanned")

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.records: dict[str, _MessageRecord] = {}
        self.by_turn: dict[tuple[str, int], set[str]] = {}
        self._queue: deque[tuple[float, str]] = deque()
        self._sorted = True
        self._calls = 0
        self._sweep_after = 0
        self.scanned = 0

    def __len__(self) -> int:
        return len(self.at)

    def set(self, message_id: str, at: float) -> None:
        if self._sorted and self._queue and at < self._queue[-1][0]:
            self._sorted = False
            self._calls, self._sweep_after = 0, len(self.at) + 1
        self.at[message_id] = at
        self._queue.append((at, message_id))
        if len(self._queue) > 2 * len(self.at) + 1024:  # many re-marks of live ids: drop the stale entries
            self._rebuild(None, 0.0)

    def put(self, message_id: str, record: _MessageRecord) -> None:
        self._unindex(message_id)
        self.records[message_id] = record
        if record.session_id is not None and record.turn is not None:
            self.by_turn.setdefault((record.session_id, record.turn), set()).add(message_id)
        if self.at.get(message_id) != record.at:
            self.set(message_id, record.at)

    def _unindex(self, message_id: str) -> None:
        old = self.records.get(message_id)
        if old is not None and old.session_id is not None and old.turn is not None:
            ids = self.by_turn.get((old.session_id, old.turn))
            if ids is not None:
                ids.discard(message_id)
                if not ids:
                    del self.by_turn[(old.session_id, old.turn)]

    def _forget(self, message_id: str) -> None:
        self._unindex(message_id)
        self.records.pop(message_id, None)
        self.at.pop(message_id, None)

    def restore(self, message_id: str, old: _MessageRecord | None) -> None:
        """Undo a :meth:`put`: put back the previous record (None: the id was not recorded)."""
        if old is None:
            self._forget(message_id)
        else:
            self.put(message_id, old)

    def purge(self, now: float, ttl_s: float) -> None:
        """Forget ids with ``now >= at + ttl_s``."""
        self._calls += 1
        if not self._sorted and self._calls >= self._sweep_after:
            self._rebuild(now, ttl_s)
            return
        queue, at = self._queue, self.at
        while queue and queue[0][0] + ttl_s <= now:
            when, message_id = queue.popleft()
            self.scanned += 1
            if at.get(message_id) == when:
                self._forget(message_id)
        if not queue:
            self._sorted = True

    def _rebuild(self, now: float | None, ttl_s: float) -> None:
        """Full sweep: drop expired ids (when ``now`` is given) and rebuild the queue sorted."""
        self.scanned += len(self.at)
        if now is not None:
            for k in [k for k, v in self.at.items() if now >= v + ttl_s]:
                self._forget(k)
        self._queue = deque(sorted((v, k) for k, v in self.at.items()))
        self._sorted = True


class SessionStore(BaseSessionStore):
    """Sessions in process memory, safe under threads: one lock serialises every operation.

    ``SessionStore(default_max_turns=40)`` (seed 000 "Armazenamento em Memória"). A
    transaction that raises leaves nothing behind (each write logs its undo step).
    Nothing survives the process.
    """

    _ephemeral = True

    def __init__(self, default_max_turns: int = DEFAULT_MAX_TURNS) -> None:
        super().__init__(default_max_turns)
        self._lock = threading.RLock()
        self._sessions: dict[str, _MemSession] = {}
        self._processed = _ProcessedIds()
        self._queues: dict[str, dict[int, Owner]] = {}  # session id -> ticket -> waiting owner
        self._tickets = 0

    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        with self._lock:
            yield _MemoryTx(self, writable=False)

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        with self._lock:
            tx = _MemoryTx(self, writable=True)
            try:
                yield tx
            except BaseException:
                for step in reversed(tx.undo):
                    step()
                raise
