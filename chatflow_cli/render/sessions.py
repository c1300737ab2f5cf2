"""The one sessions table (``sessions ls`` and the REPL's ``/sessions``) and the agents table.

Both lists come from :func:`sessions_lines`: the same cells (id, active agent, status, turns,
age, the first message's preview, each made safe), laid out as the ``sessions ls`` table, or,
for the REPL, as a compact list that marks the current session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from .lines import Lines
from .shapes import status_name
from .text import format_age, plural, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..core.memory import SessionSummary

__all__ = ["agents_lines", "sessions_lines"]


_LS_HEADERS = ("SESSION", "AGENT", "STATUS", "TURNS", "UPDATED", "TITLE")
_LS_STATUS_STYLES = {"running": "yellow", "rescheduled": "magenta", "terminated": "dim"}
_LS_MIN_PREVIEW = 12  # a preview narrower than this is dropped instead
_LS_MIN_AGENT = 6  # an agent name narrower than this (with its ellipsis) is dropped instead


def _title(s: SessionSummary) -> str:
    """The session's title (set, or the first line of its first message); the preview for
    a summary made without one."""
    return getattr(s, "title", "") or s.preview


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "\u2026"


def sessions_lines(summaries: Sequence[SessionSummary], *, width: int | None = None, now: float | None = None,
                   compact: bool = False, current: str | None = None,
                   depths: dict[str, int] | None = None, prefixes: dict[str, str] | None = None) -> list[Lines]:
    """The ``sessions ls`` table as styled lines, columns two spaces apart.

    ``width`` is the terminal's width in cells; ``None`` (output is not a terminal) means
    no limit: nothing is wrapped or truncated, each line is as long as it needs to be.
    On a narrow terminal the TITLE column shrinks (ellipsis) down to ``_LS_MIN_PREVIEW``
    cells, then AGENT shrinks or goes. When even that does not fit (or the titles would
    have to go), each session becomes a block of lines: id and status, title, then turns,
    age and agent, each clipped to ``width``. SESSION, STATUS, TURNS and UPDATED are never
    truncated in the table.

    ``compact`` (the REPL's ``/sessions``) lays the same cells out as :func:`_marked_lines`
    does: no header, a ``●`` on ``current``, every id whole.

    Args:
        summaries: The sessions, in the order to show.
        width: The terminal's width in cells, or ``None`` for no limit.
        now: The time ages are measured from (epoch seconds; default: now).
        compact: The REPL's list instead of the ``sessions ls`` table.
        current: With ``compact``: the REPL's session, marked.
        depths: ``sessions ls --tree``: session id -> depth; a fork's id is indented under
            its parent with ``└─ `` (two cells a level).
        prefixes: ``sessions ls --tree``: session id -> the tree drawing before its id
            (``├─ ``, ``└─ ``, under ``│  ``); used instead of ``depths`` when given.

    Returns:
        One :class:`Lines` a row, never padded at the end.
    """
    if compact:
        return _marked_lines(summaries, width or 80, current=current, now=now)
    rows: list[list[str]] = []
    statuses: list[str] = []
    for s in summaries:
        status = status_name(s.status)
        statuses.append(status)
        depth = (depths or {}).get(s.session_id, 0)
        if prefixes is not None:
            branch = prefixes.get(s.session_id, "")
        else:
            branch = "  " * (depth - 1) + "\u2514\u2500 " if depth else ""
        rows.append([
            branch + safe_text(s.session_id), safe_text(s.active_agent_name or "-"), status, str(s.turn_count),
            format_age(s.updated_at, now),
            # a session whose only turns failed previews the failed message, marked as such
            # while the failure stands (a later rollback or turn ends it)
            ("(failed) " if s.failed and s.turn_count == 0 and s.preview else "")
            + safe_text(_title(s), one_line=True).strip(),
        ])
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(_LS_HEADERS)]
    columns = list(range(len(_LS_HEADERS)))
    if width is not None:
        def total() -> int:
            return sum(widths[i] for i in columns) + 2 * (len(columns) - 1)

        for col, minimum in ((5, _LS_MIN_PREVIEW), (1, _LS_MIN_AGENT)):
            excess = total() - width
            if excess <= 0:
                break
            if widths[col] - excess >= minimum:
                widths[col] -= excess
            elif col == 5 and any(row[5] for row in rows):
                return _sessions_stacked(rows, statuses, width)  # titles tell sessions apart: keep them
            else:
                columns.remove(col)
        if total() > width:  # even the columns that are never truncated do not fit
            return _sessions_stacked(rows, statuses, width)
    lines: list[Lines] = []
    header = Lines()
    for n, i in enumerate(columns):
        last = n == len(columns) - 1
        text = _LS_HEADERS[i] if last else _LS_HEADERS[i].ljust(widths[i]) if i != 3 else _LS_HEADERS[i].rjust(widths[i])
        header.append(text + ("" if last else "  "), "bold")
    header.rstrip()
    lines.append(header)
    for row, status in zip(rows, statuses):
        line = Lines()
        for n, i in enumerate(columns):
            last = n == len(columns) - 1
            cell = _clip(row[i], widths[i])
            cell = cell.rjust(widths[i]) if i == 3 else (cell if last else cell.ljust(widths[i]))
            style = "cyan" if i == 0 else _LS_STATUS_STYLES.get(status, "") if i == 2 else ""
            line.append(cell, style)
            if not last:
                line.append("  ")
        line.rstrip()
        lines.append(line)
    return lines


def _sessions_stacked(rows: list[list[str]], statuses: list[str], width: int) -> list[Lines]:
    """``sessions ls`` on a terminal too narrow for its columns: a block a session, the id
    and status, then its title (with its ``(failed)`` mark) when it has one, then turns, age
    and agent, indented and clipped to ``width``: the title is what tells sessions apart."""
    lines: list[Lines] = []
    for row, status in zip(rows, statuses):
        sid, agent, _, turns, updated, title = row
        first = Lines(sid, "cyan")
        status_first = len(sid) + 2 + len(status) <= width
        if status_first:
            first.append("  " + status, _LS_STATUS_STYLES.get(status, ""))
        lines.append(first)
        if title:
            lines.append(Lines(_clip("  " + title, width)))
        # an id too long for its status beside it: the status opens the detail line instead
        detail = ("" if status_first else f"{status} · ") + f"{plural(int(turns), 'turn')} · {updated}" \
            + (f" · {agent}" if agent != "-" else "")
        lines.append(Lines(_clip("  " + detail, width), "dim"))
    return lines


def agents_lines(rows: Sequence[dict[str, Any]], *, width: int | None = None) -> list[Lines]:
    """The ``agents ls`` listing as styled lines.

    ``rows`` as :func:`agent_dicts` gives them. A table (AGENT, VERSION, MODEL, HANDOFFS,
    TOOLS, INSTRUCTIONS; ``*`` marks the starting agent) when it fits ``width`` with at least
    :data:`_LS_MIN_PREVIEW` cells of instructions, or when ``width`` is ``None`` (a pipe:
    nothing truncated); otherwise one block an agent, each line wrapped to ``width``.
    """
    def cells(r: dict[str, Any]) -> list[str]:
        tools = ", ".join(t["name"] + (" (custom)" if t["kind"] == "custom" else " (mcp)" if t["kind"] == "mcp" else "")
                          for t in r["tools"])
        first = (r["instructions"] or "").strip().splitlines()[0] if (r["instructions"] or "").strip() else ""
        return [safe_text(r["name"]) + (" *" if r["start"] else ""), safe_text(r.get("version") or "-"),
                safe_text(r["model"] or "(default)"), safe_text(", ".join(r["handoffs"]) or "-"),
                safe_text(tools or "-"), safe_text(first)]

    headers = ("AGENT", "VERSION", "MODEL", "HANDOFFS", "TOOLS", "INSTRUCTIONS")
    table = [cells(r) for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in table]) for i, h in enumerate(headers)]
    fixed = sum(widths[:5]) + 2 * 5
    if width is None or fixed + _LS_MIN_PREVIEW <= width:
        last = widths[5] if width is None else max(0, min(widths[5], width - fixed))
        out = [Lines("  ".join(h.ljust(w) for h, w in zip(headers[:5], widths)) + "  " + headers[5], "bold")]
        for c in table:
            line = Lines(c[0].ljust(widths[0]), "cyan")
            line.append("  " + "  ".join(v.ljust(w) for v, w in zip(c[1:5], widths[1:5])) + "  ")
            line.append(_clip(c[5], last) if width is not None else c[5], "dim")
            line.rstrip()
            out.append(line)
        return out
    import textwrap

    out = []
    for c in table:
        out.append(Lines(_clip(c[0], width), "bold cyan"))
        for label, value in (("version", c[1]), ("model", c[2]), ("handoffs", c[3]), ("tools", c[4]), ("", c[5])):
            if not value or (label and value == "-"):
                continue
            text = f"{label}: {value}" if label else value
            for piece in textwrap.wrap(text, width=max(10, width - 2), break_long_words=True) or [""]:
                out.append(Lines("  " + piece, "dim" if not label else ""))
    return out


def _marked_lines(summaries: Sequence[SessionSummary], width: int, *, current: str | None, now: float | None) -> list[Lines]:
    """The REPL's ``/sessions`` list: one line a session.

    Columns: a ``●`` on ``current``, the session id (never shortened: it is what ``/switch``
    takes), agent, status (only when some session is not idle), turns, last update, and the
    first message's preview in whatever room is left. When ``width`` (columns) is tight the
    preview is shortened (with ``…``) and then dropped, then agent names are shortened to 10
    characters, then the update time, status, agent and turns go, in that order. Lines are
    not padded.
    """
    rows: list[dict[str, Any]] = []
    for s in summaries:
        status = status_name(s.status)
        rows.append(
            {
                "id": safe_text(s.session_id),
                "agent": safe_text(s.active_agent_name),
                "status": status,
                "turns": f"{s.turn_count} turn" + ("" if s.turn_count == 1 else "s"),
                "age": format_age(s.updated_at, now),
                "preview": safe_text(_title(s), one_line=True).strip(),
                "current": s.session_id == current,
            }
        )
    show_status = any(r["status"] != "idle" for r in rows)
    columns = ["id", "agent", *(["status"] if show_status else []), "turns", "age"]
    gap = 2

    def widths(cols: list[str]) -> dict[str, int]:
        return {c: max(len(r[c]) for r in rows) for c in cols}

    def used(w: dict[str, int]) -> int:
        return 2 + sum(w.values()) + gap * (len(w) - 1)

    w = widths(columns)
    if used(w) + gap + 12 > width and w["agent"] > 10:
        w["agent"] = 10
    for optional in ("age", "status", "agent", "turns"):
        if used(w) > width and optional in w:
            del w[optional]
    room = width - used(w) - gap
    preview = room >= 12 and any(r["preview"] for r in rows)
    styles = {"id": "cyan", "status": "yellow", "turns": "", "age": "dim", "agent": ""}
    lines = []
    for r in rows:
        line = Lines("● " if r["current"] else "  ", "bold green")
        for index, col in enumerate(w):
            value = r[col]
            if len(value) > w[col]:
                value = value[: w[col] - 1] + "…"
            if index:
                line.append(" " * gap)
            pad = "" if index == len(w) - 1 and not preview else " " * (w[col] - len(value))
            line.append(value, styles[col])
            line.append(pad)
        if preview and r["preview"]:
            text = r["preview"] if len(r["preview"]) <= room else r["preview"][: room - 1] + "…"
            line.append(" " * gap + text, "dim")
        line.rstrip()
        lines.append(line)
    return lines
