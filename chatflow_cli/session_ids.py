"""The session-id policy of the front-ends: which ids chatflow creates, and fresh ids.

Ids are database keys, never paths, but spaces, quotes, slashes and control characters make
ids hard to type and to pass around safely, so every front-end (``chat``, ``sessions``,
``replay``, the REPL's ``/switch``) refuses them with the same rule. A session stored by a
library user under any other id can still be read: commands check an id against this policy
only once a look-up for it failed.
"""

from __future__ import annotations

import re

from .core.errors import UsageError

__all__ = ["SESSION_ID_MAX", "new_session_id", "validate_session_id"]

#: The longest session id chatflow creates, in characters.
SESSION_ID_MAX = 128

# The first character is not '-' (it would read as an option); '.' and '..' are refused apart.
_SESSION_ID_RE = re.compile(r"[A-Za-z0-9._:@+=][A-Za-z0-9._:@+=-]*")


def validate_session_id(session_id: str) -> str:
    """Check ``session_id`` against the policy and return it unchanged.

    A valid id has 1-128 letters, digits and ``. _ - : @ + =``, does not start with ``-``
    and is not ``.`` or ``..``.

    Args:
        session_id: The id as the user typed it.

    Returns:
        ``session_id``.

    Raises:
        UsageError: The id breaks the policy (exit 2); the message shows at most 40 of its
            characters, made safe for a terminal.
    """
    if (
        not session_id
        or len(session_id) > SESSION_ID_MAX
        or not _SESSION_ID_RE.fullmatch(session_id)
        or session_id in {".", ".."}
    ):
        from .render import safe_text

        shown = safe_text(session_id[:40]) + ("…" if len(session_id) > 40 else "")
        raise UsageError(
            f"invalid session id {shown!r}: use 1-{SESSION_ID_MAX} letters, digits, '.', '_', '-', ':', '@', '+' or '='"
        )
    return session_id


def new_session_id() -> str:
    """A fresh, sortable session id: ``YYYYMMDD-HHMMSS-<6 hex>`` (local time, 24 random bits)."""
    import secrets
    import time

    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
