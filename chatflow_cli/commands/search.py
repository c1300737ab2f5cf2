"""``sessions search``, ``fork``, ``rename``, ``archive`` and ``unarchive``: find a past turn,
branch from it, keep the list tidy.

``sessions search QUERY`` prints the best-ranked turns (two lines a hit: where, then a
snippet with the matched words highlighted); ``--json`` / ``--output json`` gives an array,
``jsonl`` one hit a line. No hit is not an error: a note on stderr, exit 0. The query syntax
is that of :mod:`chatflow_cli.core.memory.search`; a query it cannot parse is a usage error
(exit 2) whose message says how to write one.

``sessions fork ID --at N [--into NEW]`` copies turns 1..N of ID into a new session (the
source is not changed) and prints the new id on stdout, so ``chatflow chat -s "$(chatflow
sessions fork ID --at 3)" ...`` goes on from there.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..context import notice, terminal_width, write_lines
from ..core.errors import UsageError
from ..lookup import store_or_missing
from ..render import dumps

if TYPE_CHECKING:  # pragma: no cover
    from ..core.memory.protocol import ListingStore
    from ..context import State

__all__ = ["archive_sessions", "fork_session", "parse_since", "rename_session", "search_sessions"]


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``30m``, ``12h``, ``7d``, ``2w``) or a date
    ``YYYY-MM-DD`` (local midnight) -> UTC epoch seconds.

    Raises:
        UsageError: neither form.
    """
    import re

    now = time.time() if now is None else now
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%d"))
    except (ValueError, AttributeError):
        raise UsageError(f"--since {text!r}: use a duration (30m, 12h, 7d, 2w) or a date (2026-01-31)") from None


def search_sessions(
    state: State,
    query: str,
    *,
    session_id: str | None,
    agent: str | None,
    since: str | None,
    limit: int,
    tools: bool,
    include_removed: bool,
    output: str,
) -> None:
    """Print the turns matching ``query``, best first.

    Args:
        state: The run.
        query: The search query.
        session_id: ``--session``: only this session.
        agent: ``--agent``: only sessions whose active agent is this.
        since: ``--since``: only messages stored since (see :func:`parse_since`).
        limit: ``--limit``: at most this many hits.
        tools: ``--tools``: also tool arguments and results.
        include_removed: ``--all``: also rolled-back and failed turns (marked).
        output: ``text``, ``json`` (an array of hits) or ``jsonl`` (one a line).

    Raises:
        UsageError: the query cannot be parsed, or ``--since`` is neither a duration nor a date.
        SessionNotFoundError: ``--session`` names no stored session.
    """
    from ..core.memory.search import parse_query

    parse_query(query)  # a bad query is a usage error even before there is a database
    after = parse_since(since) if since is not None else None
    store: ListingStore | None
    if session_id is not None:
        store = store_or_missing(state, session_id)
        store.session_summary(session_id)  # SessionNotFoundError for an unknown id
    else:
        store = state.store(create=False)
    hits = [] if store is None else store.search(
        query, session_id=session_id, agent=agent, since=after, limit=limit, include_tools=tools,
        include_removed=include_removed,
    )
    if output != "text":
        rows = [dict(h.to_dict(), age_s=round(max(0.0, time.time() - h.created_at), 3)) for h in hits]
        text = dumps(rows, indent=2) + "\n" if output == "json" else "".join(dumps(r) + "\n" for r in rows)
        state.env.stdout.write(text)
        return
    if not hits:
        notice(state, f"no turns match {query!r}" + ("" if include_removed else " (--all also searches rolled-back turns)"))
        return
    from ..render.search import search_hit_lines

    write_lines(state, search_hit_lines(hits, width=terminal_width(state)))


def fork_session(state: State, session_id: str, *, at: int | None, into: str | None, output: str,
                 metadata: dict[str, str] | None = None) -> None:
    """Copy turns 1..``at`` of ``session_id`` into a new session; print the new id.

    The new id is printed on stdout and, with a note, on stderr, so it is reported even when
    stdout cannot be written (the fork exists then; the output error follows).

    Args:
        state: The run.
        session_id: The source session (not changed).
        at: ``--at``: the last turn to copy, 1..K (default: the newest completed turn).
        into: ``--into``: the new session's id (default ``<ID>-fork-<6 hex digits>``).
        output: ``text`` (the id on stdout, a note on stderr) or ``json`` (the new
            session's summary).
        metadata: ``--metadata``: the new session's metadata (the source's is not copied).

    Raises:
        SessionNotFoundError: No such session.
        UsageError: ``at`` < 1 or past the newest completed turn, or ``into`` already exists.
    """
    store = store_or_missing(state, session_id)
    if at is not None and at < 1:
        source = store.session_summary(session_id)  # SessionNotFoundError first
        last = source.turn_count - (1 if source.status.value == "running" else 0)
        raise UsageError(f"--at {at}: N is a turn number 1..{max(1, last)} of session {session_id}; nothing changed")
    try:
        summary = store.fork(session_id, at, into=into, metadata=metadata)
    except ValueError as exc:
        raise UsageError(f"{exc}; nothing changed") from None
    turn = summary.forked_from["turn"] if summary.forked_from else summary.turn_count
    notice(state, f"forked {session_id} at turn {turn} into {summary.session_id}: "
                  f"chatflow chat -s {summary.session_id} \"...\" goes on from there")
    if output != "text":
        from ..render import summary_dict

        state.env.stdout.write(dumps(summary_dict(summary), indent=2 if output == "json" else None) + "\n")
        return
    state.env.stdout.write(summary.session_id + "\n")


def rename_session(state: State, session_id: str, title: str) -> None:
    """Set the session's title (``""``: back to the first message's first line).

    Raises:
        SessionNotFoundError: No such session.
        UsageError: A title over 200 characters.
    """
    store = store_or_missing(state, session_id)
    try:
        store.set_title(session_id, title or None)
    except ValueError as exc:
        raise UsageError(f"{exc}; nothing changed") from None
    shown = store.session_summary(session_id).title
    notice(state, f"{session_id} is titled {shown!r}" if title else f"{session_id} has no title of its own: "
                  f"{shown!r} (its first message) is shown")


def archive_sessions(state: State, session_ids: list[str], *, archive: bool) -> None:
    """Archive (or unarchive) each session; a note for each.

    Every id is checked first: an unknown id changes nothing at all.

    Raises:
        SessionNotFoundError: An id names no session (nothing changed).
    """
    if not session_ids:
        raise UsageError("give the session ids")
    store = store_or_missing(state, session_ids[0])
    for session_id in session_ids:
        store.session_summary(session_id)  # SessionNotFoundError before anything changes
    for session_id in session_ids:
        changed = store.archive(session_id) if archive else store.unarchive(session_id)
        if archive:
            notice(state, f"archived {session_id} (chatflow sessions unarchive {session_id} brings it back)"
                   if changed else f"{session_id} was archived already")
        else:
            notice(state, f"unarchived {session_id}" if changed else f"{session_id} was not archived")
