"""``sessions rollback``: remove the newest turns of a session, all or nothing.

On a terminal the turns that go are listed and the user is asked first (``--yes`` skips the
question); scripts (stdin not a terminal) are not asked. Rolled-back turns stay in the store,
marked, and ``sessions show --all`` still shows them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..context import confirm, notice
from ..core.errors import UsageError
from ..core.messages import Role
from ..core.memory import rollback_target
from ..lookup import read_summary, store_or_missing
from ..render import plural, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State

__all__ = ["rollback_session"]


def rollback_session(state: State, session_id: str, *, to: int | None, last: int | None, yes: bool) -> None:
    """Remove the newest turns of a session, all or nothing, after listing what goes.

    Args:
        state: The run.
        session_id: The session.
        to: Keep turns 1..``to`` (as ``sessions show`` numbers them).
        last: Remove the last ``last`` turns (give ``to`` or ``last``).
        yes: ``--yes``: do not ask.

    Raises:
        SessionNotFoundError: No such session.
        UsageError: ``to`` is past the last turn, ``last`` is more than there are, or the
            store refused the rollback; nothing changed.
    """
    store = store_or_missing(state, session_id)
    count = read_summary(store, session_id).turn_count
    flag = f"--to {to}" if to is not None else f"--last {last}"
    try:  # what the store will remove, for the question; the store decides again as it writes
        target = rollback_target(count, to_turn=to, last=last, session_id=session_id)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}; nothing changed") from None
    if target == count:
        notice(state, f"nothing to roll back: {session_id} ends at turn {count}")
        return
    going = store.load_turns(session_id, first=target + 1, last=count)
    env = state.env
    err = env.console(stderr=True)
    from rich.text import Text

    err.print(Text(f"Rolling back {session_id} to turn {target}; these turns go:", style="bold"))
    for record in going:
        first_user = next((m for m in record.messages if m.role == Role.USER), None)
        preview = safe_text((first_user.content or "") if first_user else "", one_line=True)
        err.print(Text(f"  turn {record.number}: {preview[:70]}"))
    if env.stdin_isatty and not yes and not confirm(state, "Roll back?", assume_yes=False):
        notice(state, "nothing changed")
        return
    try:  # --last K counts the turns stored when the rollback runs
        events = store.rollback(session_id, to, last=last)
    except ValueError as exc:  # the session changed since the question
        raise UsageError(f"cannot roll back {session_id}: {exc}; nothing changed") from None
    done = next(e.payload for e in events if e.type == "rollback")
    removed = len(done["removed_turns"])
    notice(state, f"rolled back {session_id} to turn {done['to_turn']} ({plural(removed, 'turn')} removed)")
