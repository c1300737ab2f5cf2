"""``sessions delete``: delete sessions with their messages and events.

Named ids are all or nothing (an unknown id deletes none). Deletion cannot be undone: on a
terminal the user is asked first (``--yes`` skips the question); ``--all`` and
``--older-than`` need ``--yes`` when stdin is not a terminal.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..context import confirm, notice
from ..core.errors import SessionNotFoundError, UsageError
from ..lookup import not_found
from ..render import plural, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State

__all__ = ["delete_sessions"]


def delete_sessions(state: State, ids: list[str], *, older_than: float | None, all_: bool, yes: bool) -> None:
    """Delete sessions with their messages and events.

    Args:
        state: The run.
        ids: Session ids to delete (all or nothing), or empty with ``older_than``/``all_``.
        older_than: Seconds: sessions not updated for this long.
        all_: Every session.
        yes: ``--yes``: do not ask.

    Raises:
        SessionNotFoundError: A named id has no session (nothing is deleted).
        UsageError: ``--all``/``--older-than`` without ``--yes`` when stdin is not a terminal.
    """
    store = state.store(create=False)
    if store is None:
        if ids:
            raise not_found(ids[0])
        notice(state, "no sessions")
        return
    if ids:
        # All or nothing: a command that fails (an unknown id) deletes nothing.
        missing = [sid for sid in ids if store.get(sid) is None]
        if missing:
            raise not_found(missing[0]) if len(missing) == 1 else SessionNotFoundError(
                f"no sessions {', '.join(repr(safe_text(m[:60])) for m in missing)}: nothing was deleted")
        # Deletion cannot be undone: on a terminal, ask first (as --all and rollback do);
        # --yes skips the question, and scripts (stdin not a terminal) are not asked.
        if not yes and state.env.stdin_isatty:
            what = f"session {safe_text(ids[0])}" if len(ids) == 1 else plural(len(ids), "session") + f" ({', '.join(safe_text(i) for i in ids)})"
            if not confirm(state, f"Delete {what} with its messages and events? This cannot be undone.", assume_yes=False):
                notice(state, "nothing deleted")
                return
        deleted = sum(1 for sid in ids if store.delete(sid))
        notice(state, f"deleted {plural(deleted, 'session')}")
        return
    summaries = store.list_sessions()
    if older_than is not None:
        cutoff = time.time() - older_than
        summaries = [s for s in summaries if (s.updated_at or 0) < cutoff]
    if not summaries:
        notice(state, "no sessions match: nothing deleted")
        return
    what = f"ALL {plural(len(summaries), 'session')}" if all_ else plural(len(summaries), "session") + " not updated since " + time.strftime(
        "%Y-%m-%d %H:%M", time.localtime(time.time() - (older_than or 0)))
    if not yes:
        if not state.env.stdin_isatty:
            raise UsageError(f"deleting {what} needs --yes when not on a terminal")
        if not confirm(state, f"Delete {what}?", assume_yes=False):
            notice(state, "nothing deleted")
            return
    deleted = sum(1 for s in summaries if store.delete(s.session_id))
    notice(state, f"deleted {plural(deleted, 'session')}")
