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
from ..lookup import read_session, store_or_missing
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
    session = read_session(store, session_id)
    count = session.turn_count
    target = to if to is not None else count - (last or 0)
    if to is not None and to > count:
        raise UsageError(f"--to {to} is beyond the last turn of {session_id} ({count}); nothing changed")
    if target < 0:
        raise UsageError(f"--last {last}: {session_id} has only {plural(count, 'turn')}; nothing changed")
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
    try:
        store.rollback(session_id, target)
    except ValueError as exc:
        raise UsageError(f"cannot roll back {session_id}: {exc}; nothing changed") from None
    notice(state, f"rolled back {session_id} to turn {target} ({plural(count - target, 'turn')} removed)")
