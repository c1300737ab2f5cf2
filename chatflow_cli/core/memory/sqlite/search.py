"""What the SQLite store adds to full-text search: the index's columns of a stored message,
a hit's snippet and the best hit of each turn (the query language is
:mod:`chatflow_cli.core.memory.search`; the FTS5 query, :func:`~..search.to_fts5`)."""

from __future__ import annotations

from typing import Any

from ...messages import Message, Role
from ..search import Query, memory_snippet, searchable_texts, words_of


def _fts_columns(message_json: str) -> tuple[str | None, str | None]:
    """The full-text index's ``(body, tools)`` of a stored message: the words of its user
    and model text, and of its tool results and tool calls ("name arguments"), as
    :func:`~.search.words_of` gives them, one space between words. Read by Python, which
    accepts the bare ``NaN``/``Infinity`` an older chatflow wrote; text Python cannot read
    is indexed as nothing, so one bad row never fails a search."""
    try:
        message = Message.from_json(message_json)
    except (ValueError, TypeError, KeyError):
        return None, None
    body = message.content if message.role in (Role.USER, Role.MODEL) else None
    tools = None
    if message.role is Role.TOOL:
        tools = message.content
    elif message.role is Role.MODEL and message.tool_calls:
        tools = " ".join(f"{call.name} {call.arguments}" for call in message.tool_calls)
    return (" ".join(words_of(body)) or None if body else None), (" ".join(words_of(tools)) or None if tools else None)


def _snippet(query: Query, message_json: str | None, include_tools: bool) -> str:
    """The snippet of the searched text of ``message_json`` that matches ``query`` best (as
    the other stores make it)."""
    try:
        message = Message.from_json(message_json or "")
    except (ValueError, TypeError, KeyError):
        return ""
    texts = searchable_texts(message, include_tools)
    text = max(texts, key=lambda t: query.score(words_of(t)), default="")
    return memory_snippet(query, text)


def _best_per_turn(ranked: list[tuple[float, tuple[Any, ...]]], limit: int) -> list[tuple[float, tuple[Any, ...]]]:
    """The best-ranked row of each (session, turn, removal), best first (ties: newest first)."""
    ranked.sort(key=lambda item: (item[0], -item[1][5], item[1][0], item[1][1], item[1][3]))
    seen: set[tuple[Any, ...]] = set()
    out = []
    for rank, row in ranked:
        key = (row[0], row[1], row[2])
        if key not in seen:
            seen.add(key)
            out.append((rank, row))
            if len(out) >= limit:
                break
    return out
