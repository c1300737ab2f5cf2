"""What the PostgreSQL store adds to full-text search: a message's ``tsvector`` (the same
folded words every store searches) and a parsed query's ``tsquery``."""

from __future__ import annotations

from typing import Any

from ...messages import Message, Role
from ..search import UNSEARCHABLE, Query, words_of


#: Bytes of lexemes a message's vector holds at most (PostgreSQL refuses a tsvector over 1 MB);
#: words first seen after that are not indexed.
_MAX_VECTOR_BYTES = 768 * 1024


def _search_vector(message: Message) -> str | None:
    """The ``tsvector`` literal of ``message``: its folded words (the same words the other
    stores search) with positions, weight A for user and model text, B for tool text; the
    tool text starts two positions after the body so no phrase spans the two. None when
    the message has no searchable text."""
    body = message.content if message.role in (Role.USER, Role.MODEL) and message.content else ""
    tools = ""
    if message.role is Role.TOOL and message.content:
        tools = message.content
    elif message.role is Role.MODEL and message.tool_calls:
        tools = " ".join(f"{c.name} {c.arguments}" for c in message.tool_calls)
    positions: dict[str, list[str]] = {}
    size = 0
    pos = 0
    for text, weight in ((body, "A"), (tools, "B")):
        if weight == "B":
            pos += 1
        for word in words_of(text):
            pos += 1
            if word == UNSEARCHABLE or pos > 16383:  # PostgreSQL's largest position
                continue
            seen = positions.get(word)
            if seen is None:
                size += len(word.encode()) + 8
                if size > _MAX_VECTOR_BYTES:
                    continue
                positions[word] = seen = []
            if len(seen) < 255:  # PostgreSQL keeps at most 256 positions of a lexeme
                seen.append(f"{pos}{weight}")
    if not positions:
        return None
    return " ".join(f"'{_quote_lexeme(w)}':{','.join(p)}" for w, p in positions.items())


def _quote_lexeme(word: str) -> str:
    return word.replace("\\", "\\\\").replace("'", "''")


def _ts_term(term: Any, weights: str) -> str:
    words = [f"'{_quote_lexeme(w)}':" + ("*" if term.prefix and i == len(term.words) - 1 else "") + weights
             for i, w in enumerate(term.words)]
    return "(" + " <-> ".join(words) + ")"


def to_tsquery(query: Query, include_tools: bool) -> str:
    """The ``tsquery`` literal of ``query``: every word quoted (no syntax error is possible),
    limited to user and model text (weight A) unless ``include_tools``."""
    weights = "AB" if include_tools else "A"
    parts = []
    for positive, negative in query.clauses:
        expr = " & ".join(_ts_term(t, weights) for t in positive)
        if negative:  # flat, as to_fts5: one nesting level, not one per word
            expr = f"({expr}) & !(" + " | ".join(_ts_term(t, weights) for t in negative) + ")"
        parts.append(f"({expr})")
    return " | ".join(parts)
