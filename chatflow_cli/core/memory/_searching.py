"""Full-text search over the stored sessions (the query language is in ``search``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ._checks import _check_session_id
from ._core import _StoreCore
from ._port import SearchFilter
from ._twins import async_twin

if TYPE_CHECKING:  # pragma: no cover
    from .search import SearchHit


class _Searching(_StoreCore):
    """Search over every session's stored text, one hit per turn."""

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        agent: str | None = None,
        since: float | None = None,
        limit: int = 20,
        include_tools: bool = False,
        include_removed: bool = False,
    ) -> list[SearchHit]:
        """Full-text search over stored user and model text, one hit per turn, best first.

        ``query`` uses the syntax of :mod:`chatflow_cli.core.memory.search`. Turn 0 (SYSTEM
        messages) is never searched. The SQLite store ranks by bm25 over an FTS5 index the
        store keeps in step with the messages in the same transaction; the in-memory store
        scans its messages and ranks by the number of matched word occurrences.

        Args:
            session_id: only this session.
            agent: only sessions whose active agent has this name.
            since: only messages stored at or after this UTC epoch second.
            limit: at most this many hits (1..10,000).
            include_tools: also search tool results and tool-call names and arguments.
            include_removed: also find rolled-back and failed turns (their hits carry
                ``removed``).

        Returns:
            :class:`SearchHit` items, best first (ties: newest first). A hit in a turn a fork
            copied from its source carries ``forked_from`` (the source session and turn).

        Raises:
            UsageError: the query cannot be parsed (the message says how to write it).
            TypeError: an argument of the wrong type.
            ValueError: ``limit`` outside 1..10,000.
        """
        from .search import parse_query

        parsed = parse_query(query)
        if session_id is not None:
            _check_session_id(session_id)
        if agent is not None and not isinstance(agent, str):
            raise TypeError(f"agent must be a str or None, got {type(agent).__name__}")
        if since is not None and (isinstance(since, bool) or not isinstance(since, (int, float))):
            raise TypeError(f"since must be epoch seconds (a number) or None, got {type(since).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {type(limit).__name__}")
        if not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be between 1 and 10000, got {limit}")
        where = SearchFilter(session_id, agent, None if since is None else float(since), limit,
                             bool(include_tools), bool(include_removed))
        self._before_search()
        with self._read() as tx:
            hits = tx.search(parsed, where)
            origins: dict[str, dict[str, Any] | None] = {}
            out: list[SearchHit] = []
            for hit in hits:
                if hit.session_id not in origins:
                    row = tx.get_row(hit.session_id)
                    origins[hit.session_id] = row.forked_from if row is not None else None
                origin = origins[hit.session_id]
                if origin is not None and isinstance(origin.get("turn"), int) and hit.turn <= origin["turn"]:
                    hit = dataclasses.replace(hit, forked_from={"session_id": origin.get("session_id"), "turn": hit.turn})
                out.append(hit)
            return out

    asearch = async_twin(search)

    def _before_search(self) -> None:
        """Bring the store's search index up to date (a store that indexes on write: nothing)."""
