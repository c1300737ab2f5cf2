"""Finding stored sessions for the front-ends: not-found errors, summaries, interrupted turns.

Shared by the ``sessions`` commands, ``replay``, ``chat`` and the REPL. A look-up that fails
for an id chatflow would never make is a usage error (exit 2), else not found (exit 3); ids
are checked only once the look-up failed, so a session a library user stored under any id
can still be read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .context import validate_session_id
from .core.errors import ChatflowError, SessionNotFoundError, UsageError
from .render import plural, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from .context import State
    from .core.memory import BaseSessionStore
    from collections.abc import Iterable

    from .core.messages import ToolCall
    from .core.memory.protocol import ListingStore, SessionLookup, SessionStoreProtocol, SessionSummary

__all__ = ["InterruptedTurns", "awaiting_approval", "find_session", "not_found", "open_calls", "read_summary",
           "store_or_missing", "unapplied_options"]


def not_found(session_id: str) -> ChatflowError:
    """The error for an id with no session.

    Args:
        session_id: The id looked up.

    Returns:
        A :class:`UsageError` (exit 2) when chatflow would never make such an id, else a
        :class:`SessionNotFoundError` (exit 3) carrying the id.
    """
    try:
        validate_session_id(session_id)
    except UsageError as exc:
        return exc
    shown = safe_text(session_id[:60]) + ("…" if len(session_id) > 60 else "")
    return SessionNotFoundError(f"no session {shown!r} (list them with: chatflow sessions ls)", session_id=session_id)


def store_or_missing(state: State, session_id: str) -> BaseSessionStore:
    """The run's store without creating a database.

    Raises:
        SessionNotFoundError: There is no database yet, so no session ``session_id``.
        UsageError: The same, for an id chatflow would never make.
    """
    store = state.store(create=False)
    if store is None:
        raise not_found(session_id)
    return store


def read_summary(store: SessionLookup, session_id: str) -> SessionSummary:
    """The stored session's summary (one row and its preview: no window, no agent resolved).

    Raises:
        SessionNotFoundError: No such session (or :class:`UsageError` for an invalid id).
    """
    try:
        return store.session_summary(session_id)
    except SessionNotFoundError:
        raise not_found(session_id) from None


def find_session(store: SessionLookup, session_id: str) -> SessionSummary | None:
    """The stored session ``session_id``'s summary (one row: no window loaded, no agent
    resolved, the store left as it was), or ``None`` when there is none."""
    try:
        return store.session_summary(session_id)
    except SessionNotFoundError:
        return None


class InterruptedTurns:
    """Turn numbers of the session's ``turn.interrupted`` events, read on first use only.

    Only a turn that ends with its user message needs them (see
    :func:`chatflow_cli.render.turn_interrupted`), so most readers never scan the log.
    """

    def __init__(self, store: ListingStore, session_id: str) -> None:
        self._store, self._session_id = store, session_id
        self._numbers: set[int] | None = None

    def __contains__(self, number: object) -> bool:
        if self._numbers is None:
            self._numbers = {
                int(e.payload.get("turn") or 0)
                for e in self._store.events(self._session_id)
                if e.type == "turn.interrupted" and e.payload
            }
        return number in self._numbers


class Awaiting(frozenset[str]):
    """The ids of calls waiting for an approval, with ``left_open``: the ids of calls a run
    left without a result when it ended during its tool calls (its process died): they wait
    for nothing; the next turn records them as interrupted."""

    left_open: frozenset[str] = frozenset()


def _announced(store: ListingStore, session_id: str, turn: int) -> dict[str, bool]:
    """``{call id: waits for an approval}`` for each call the ``tool.pending`` events of
    ``turn`` list (a run that stopped to wait for them)."""
    announced: dict[str, bool] = {}
    for event in store.events(session_id):
        if event.type == "tool.pending" and event.payload.get("turn", turn) == turn:
            asking = {str(i) for i in event.payload.get("approval") or ()}
            announced.update((str(i), str(i) in asking) for i in event.payload.get("tool_use_ids") or ())
    return announced


def left_open(store: BaseSessionStore | SessionStoreProtocol, session_id: str, calls: Iterable[ToolCall]) -> frozenset[str]:
    """The ids of ``calls`` (open calls of the session's current turn, none of a custom
    tool) that no ``tool.pending`` lists: a run that ended during its tool calls left them
    without a result; they wait for nothing (the next message records them as interrupted)."""
    calls = list(calls)
    session = store.get(session_id) if calls else None
    if session is None:
        return frozenset()
    announced = _announced(store, session_id, session.turn_count)
    return frozenset(c.id for c in calls if c.id not in announced)


def awaiting_approval(state: State, store: BaseSessionStore, session_id: str) -> Awaiting:
    """The ids of the open turn's calls that wait for an approval (``--approve``/``--deny``):
    those the turn's ``tool.pending`` event lists as such. Calls left without a result that no
    ``tool.pending`` lists (a run that ended during its tool calls) are in ``left_open``
    unless they are calls of a custom tool declared in config.toml."""
    session = store.get(session_id)
    pending = list(session.pending_tool_calls) if session is not None else []
    if session is None or not pending:
        return Awaiting()
    announced = _announced(store, session_id, session.turn_count)
    try:
        custom = {t.name for a in state.settings().agents for t in a.tools if t.ref is None}
    except ChatflowError:  # a config file that does not read: only what the log says
        custom = {c.name for c in pending}
    found = Awaiting(c.id for c in pending if announced.get(c.id, False))
    found.left_open = frozenset(c.id for c in pending if c.id not in announced and c.name not in custom)
    return found


def open_calls(state: State, store: BaseSessionStore, session_id: str) -> tuple[list[ToolCall], frozenset[str]]:
    """The open turn's calls that still have no result (none given with ``--tool-result``,
    ``--approve`` or ``--deny`` either), and the ids of those that wait for an approval
    (:func:`awaiting_approval`); the others wait for a custom tool's ``--tool-result``."""
    session = store.get(session_id)
    if session is None or not session.pending_tool_calls:
        return [], frozenset()
    answered = store.submitted_tool_results(session_id)
    calls = [c for c in session.pending_tool_calls if c.id not in answered]
    if not calls:
        return [], frozenset()
    awaiting = awaiting_approval(state, store, session_id)
    return [c for c in calls if c.id not in awaiting.left_open], awaiting


def unapplied_options(state: State, store: ListingStore, existing: SessionSummary, *, max_turns: int | None,
                      system: str | None) -> None:
    """Say (a notice on stderr, or in the REPL before its banner) that ``--system`` and
    ``--max-turns`` are not applied to ``existing``: they set up a new session, and an existing
    one keeps its window and system prompt. Silent when they match what the session has."""
    from .context import notice

    sid = existing.session_id
    if max_turns is not None and max_turns != existing.max_turns:
        notice(state, f"--max-turns {max_turns} not applied: it sets up a new session, and {sid} keeps "
                      f"its window of {plural(existing.max_turns, 'turn')}")
    if system is not None:
        stored = [m.content for r in store.load_turns(sid, first=0, last=0) for m in r.messages]
        if system not in stored:
            notice(state, f"--system not applied: it sets up a new session, and {sid} keeps its system prompt "
                          f"(start a new session with -s NEW_ID --system ...)")
