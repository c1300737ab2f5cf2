"""Search hits as styled lines (``chatflow sessions search`` and the REPL's ``/search``).

Two lines a hit: where (session id, turn -- ``(copy)`` after it for a turn a fork copied from
its source --, age, agent, and ``rolled back`` / ``failed`` for a removed turn), then the snippet indented, its matched words highlighted. On a terminal
(``width`` given) every line fits ``width`` cells: the first line drops the agent, then the
age, before it wraps (the id and turn number always show); the snippet is word-wrapped
under its indent.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from .lines import Lines
from .text import format_age, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..core.memory import SearchHit

__all__ = ["search_hit_lines"]

_REMOVED = {"rolled_back": "rolled back", "failed": "failed"}


def _snippet(hit: SearchHit) -> Lines:
    """The snippet, indented two cells, matched words highlighted; each piece made safe."""
    from ..core.memory.search import HIGHLIGHT_END, HIGHLIGHT_START

    line = Lines("  ")
    marked = False
    for piece in re.split(f"({HIGHLIGHT_START}|{HIGHLIGHT_END})", hit.snippet):
        if piece in (HIGHLIGHT_START, HIGHLIGHT_END):
            marked = piece == HIGHLIGHT_START
        elif piece:
            line.append(safe_text(piece, one_line=True), "bold yellow" if marked else "")
    line.rstrip()
    return line


def search_hit_lines(hits: Sequence[SearchHit], *, width: int | None = None, now: float | None = None) -> list[Lines]:
    """Two styled lines a hit, best hit first.

    Args:
        hits: The hits, in the order to show.
        width: The terminal's width in cells, or ``None`` (a pipe: no limit, no wrapping).
        now: The time ages are measured from (epoch seconds; default: now).

    Returns:
        :class:`Lines` items, none wider than ``width`` when it is given.
    """
    out: list[Lines] = []
    for hit in hits:
        sid = safe_text(hit.session_id, one_line=True)
        turn = f"turn {hit.turn}" + (" (copy)" if hit.forked_from else "")
        optional = [(format_age(hit.created_at, now), "dim"), (safe_text(hit.agent, one_line=True), "dim")]
        removed = _REMOVED.get(hit.removed or "")
        own_line = False  # the removal mark on a line of its own when it does not fit beside the turn
        if width is not None:  # the id and turn always show; the agent goes first, then the age
            own_line = removed is not None and len(sid) + len(turn) + len(removed) + 6 > width
            budget = width - len(sid) - len(turn) - 3 - (len(removed) + 3 if removed and not own_line else 0)
            while optional and sum(len(t) + 3 for t, _ in optional) > budget:
                optional.pop()
        head = Lines(sid, "cyan").append(" · ", "dim").append(turn, "bold")
        if removed and not own_line:
            head.append(" · ", "dim").append(removed, "magenta")
        for text, style in optional:
            head.append(" · ", "dim").append(text, style)
        out.append(head.wrapped(width) if width is not None else head)
        if own_line and removed is not None:
            out.append(Lines("  " + removed, "magenta"))
        snippet = _snippet(hit)
        out.append(snippet.wrapped(width) if width is not None else snippet)
    return out
