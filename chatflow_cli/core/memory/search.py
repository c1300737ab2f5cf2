"""Full-text search over stored messages: the query language, its two evaluations, the hits.

Query syntax (the same in every store)
======================================

========================  ==============================================================
``deploy failed``         both words, anywhere in the same message (AND is implied)
``"deploy failed"``       the exact phrase (words next to each other, in this order)
``deploy OR rollback``    either word; ``OR`` binds looser than the implied AND
``deploy NOT staging``    ``NOT word`` / ``-word``: messages without the word
``deplo*``                a word starting with ``deplo`` (at least one letter before ``*``)
========================  ==============================================================

Matching ignores case and accents (``Café`` finds ``cafe``); words are runs of letters and
digits, so punctuation separates words (``e-mail`` is the phrase ``"e mail"``). Every
``OR`` branch needs at least one word that is not negated. Anything else -- an unbalanced
``"``, ``AND`` or ``OR`` with nothing on one side, a lone ``*`` or ``NOT``, a query with no
word at all -- is a :class:`~chatflow_cli.core.errors.UsageError` whose message says what
is wrong and how to write it; FTS5 never sees raw user text (:func:`to_fts5` quotes every
word), so no query can reach it as a syntax error.

:func:`parse_query` turns the text into a :class:`Query`; the SQLite store evaluates it
with FTS5 (:func:`to_fts5`) ranked by bm25, the in-memory store with :meth:`Query.score`
(the number of matched word occurrences, more first). Both return :class:`SearchHit`
values, one per turn (the best-ranked message of the turn).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..messages import Message, Role

__all__ = [
    "HIGHLIGHT_END",
    "HIGHLIGHT_START",
    "Query",
    "SearchHit",
    "parse_query",
    "plain_snippet",
    "searchable_texts",
    "to_fts5",
    "words_of",
]

#: Marks around a matched word in :attr:`SearchHit.snippet` (control characters that never
#: occur in stored text; front-ends render them as bold or brackets).
HIGHLIGHT_START = "\x02"
HIGHLIGHT_END = "\x03"
#: Words of context on each side of the first match in a snippet.
SNIPPET_WORDS = 12

_HINT = (
    'search words, "an exact phrase", word OR word, NOT word (or -word), prefix* '
    '(e.g. chatflow sessions search \'"connection reset" OR timeout\')'
)
_WORD = re.compile(r"\w+")


def _fold(text: str) -> str:
    """Lower case without accents: the in-memory equivalent of unicode61 remove_diacritics."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def words_of(text: str) -> list[str]:
    """The folded words of ``text`` (runs of letters, digits and ``_``)."""
    return _WORD.findall(_fold(text))


@dataclass(frozen=True, slots=True)
class _Term:
    words: tuple[str, ...]  # one word, or a phrase's words in order
    prefix: bool = False  # the last word is a prefix


@dataclass(frozen=True, slots=True)
class Query:
    """A parsed query: OR of clauses, each clause ``(positive terms, negated terms)``."""

    text: str
    clauses: tuple[tuple[tuple[_Term, ...], tuple[_Term, ...]], ...]

    def score(self, words: list[str]) -> int:
        """How well a message's folded ``words`` match: 0 for no match, else the number of
        positive term occurrences of the best matching clause (more is better)."""
        best = 0
        for positive, negative in self.clauses:
            if any(_count(term, words) for term in negative):
                continue
            counts = [_count(term, words) for term in positive]
            if all(counts):
                best = max(best, sum(counts))
        return best

    def first_match(self, words: list[str]) -> tuple[int, int] | None:
        """``(index, length)`` in ``words`` of the first positive term occurrence, or None."""
        found: tuple[int, int] | None = None
        for positive, _negative in self.clauses:
            for term in positive:
                for i in range(len(words)):
                    if _at(term, words, i) and (found is None or i < found[0]):
                        found = (i, len(term.words))
                        break
        return found

    def matched_positions(self, words: list[str]) -> set[int]:
        """Indexes in ``words`` covered by any positive term (for highlighting)."""
        out: set[int] = set()
        for positive, _negative in self.clauses:
            for term in positive:
                for i in range(len(words)):
                    if _at(term, words, i):
                        out.update(range(i, i + len(term.words)))
        return out


def _at(term: _Term, words: list[str], i: int) -> bool:
    n = len(term.words)
    if i + n > len(words):
        return False
    for k, want in enumerate(term.words):
        have = words[i + k]
        if term.prefix and k == n - 1:
            if not have.startswith(want):
                return False
        elif have != want:
            return False
    return True


def _count(term: _Term, words: list[str]) -> int:
    return sum(1 for i in range(len(words)) if _at(term, words, i))


def _tokens(text: str) -> list[tuple[str, str]]:
    """``(kind, value)`` tokens: ``phrase`` (quoted text), ``word`` (anything else)."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch == '"':
            end = text.find('"', i + 1)
            if end < 0:
                raise UsageError(f"search query {text!r} has an unbalanced '\"': close the phrase; {_HINT}")
            star = end + 1 < n and text[end + 1] == "*"
            out.append(("phrase*" if star else "phrase", text[i + 1 : end]))
            i = end + (2 if star else 1)
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] != '"':
                j += 1
            out.append(("word", text[i:j]))
            i = j
    return out


def _term(kind: str, value: str, query: str) -> _Term:
    prefix = kind == "phrase*" or (kind == "word" and value.endswith("*"))
    raw = value.rstrip("*") if kind == "word" else value
    if kind == "word" and "*" in raw:
        raise UsageError(f"search query {query!r}: '*' may only end a word (deplo*); {_HINT}")
    words = tuple(words_of(raw))
    if not words:
        what = "an empty phrase" if kind.startswith("phrase") else repr(value)
        raise UsageError(f"search query {query!r}: {what} has no letters or digits to search for; {_HINT}")
    return _Term(words, prefix)


def parse_query(text: str) -> Query:
    """Parse the query syntax of this module's docstring.

    Raises:
        TypeError: ``text`` is not a str.
        UsageError: the query is empty or cannot be parsed (the message carries a hint).
    """
    if not isinstance(text, str):
        raise TypeError(f"query must be a str, got {type(text).__name__}")
    if not text.strip():
        raise UsageError(f"empty search query; {_HINT}")
    clauses: list[tuple[tuple[_Term, ...], tuple[_Term, ...]]] = []
    positive: list[_Term] = []
    negative: list[_Term] = []
    negate = False
    last_operator: str | None = "start"

    def close(where: str) -> None:
        nonlocal positive, negative
        if negate:
            raise UsageError(f"search query {text!r}: NOT must be followed by a word; {_HINT}")
        if not positive:
            if negative:
                raise UsageError(
                    f"search query {text!r}: every part needs a word to find, not only NOT words; {_HINT}"
                )
            raise UsageError(f"search query {text!r}: {where} needs words on both sides; {_HINT}")
        clauses.append((tuple(positive), tuple(negative)))
        positive, negative = [], []

    for kind, value in _tokens(text):
        if kind == "word" and value == "OR":
            close("OR")
            last_operator = "OR"
            continue
        if kind == "word" and value == "AND":
            if last_operator is not None:
                raise UsageError(f"search query {text!r}: AND needs words on both sides; {_HINT}")
            last_operator = "AND"
            continue
        if kind == "word" and value == "NOT":
            if negate:
                raise UsageError(f"search query {text!r}: NOT NOT is not a query; {_HINT}")
            negate = True
            last_operator = "NOT"
            continue
        if kind == "word" and value.startswith("-") and len(value) > 1 and not negate:
            negative.append(_term(kind, value[1:], text))
        else:
            (negative if negate else positive).append(_term(kind, value, text))
        negate = False
        last_operator = None
    if last_operator == "AND":
        raise UsageError(f"search query {text!r}: AND needs words on both sides; {_HINT}")
    close("OR" if clauses else "the query")
    return Query(text, tuple(clauses))


def _fts_term(term: _Term) -> str:
    phrase = '"' + " ".join(term.words) + '"'
    return phrase + ("*" if term.prefix else "")


def to_fts5(query: Query, columns: tuple[str, ...] | None = None) -> str:
    """The FTS5 MATCH expression of ``query``: every word quoted (no FTS5 syntax error is
    possible), limited to ``columns`` when given (``{body tools} : (...)``)."""
    parts = []
    for positive, negative in query.clauses:
        expr = " AND ".join(_fts_term(t) for t in positive)
        for term in negative:
            expr = f"({expr}) NOT {_fts_term(term)}"
        parts.append(f"({expr})")
    body = " OR ".join(parts)
    if columns:
        return "{" + " ".join(columns) + "} : (" + body + ")"
    return body


def plain_snippet(snippet: str, start: str = "[", end: str = "]") -> str:
    """``snippet`` with the highlight marks replaced by ``start`` / ``end``."""
    return snippet.replace(HIGHLIGHT_START, start).replace(HIGHLIGHT_END, end)


def memory_snippet(query: Query, text: str) -> str:
    """A snippet of ``text`` around its first match, matched words between highlight marks,
    ``…`` where text was cut (the in-memory counterpart of FTS5 ``snippet()``)."""
    spans = [(m.start(), m.end(), _fold(m.group())) for m in _WORD.finditer(text)]
    words = [w for _s, _e, w in spans]
    first = query.first_match(words)
    if not spans:
        return text[: SNIPPET_WORDS * 8]
    centre = first[0] if first else 0
    lo = max(0, centre - SNIPPET_WORDS // 2)
    hi = min(len(spans), lo + SNIPPET_WORDS)
    lo = max(0, hi - SNIPPET_WORDS)
    marked = query.matched_positions(words)
    out = ["…" if lo > 0 else ""]
    pos = spans[lo][0] if lo > 0 else 0
    for i in range(lo, hi):
        s, e, _w = spans[i]
        out.append(text[pos:s])
        piece = text[s:e]
        out.append(f"{HIGHLIGHT_START}{piece}{HIGHLIGHT_END}" if i in marked else piece)
        pos = e
    if hi < len(spans):
        out.append(text[pos : spans[hi][0]].rstrip() + "…")
    else:
        out.append(text[pos:])
    return "".join(out)


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One turn that matched a search.

    ``session_id``, ``turn``: where (``sessions show ID --turn N`` jumps there).
    ``snippet``: words around the match, matched words between :data:`HIGHLIGHT_START` and
    :data:`HIGHLIGHT_END`, ``…`` where text was cut. ``role``: the role of the best message
    (``user``, ``model``, ``tool``). ``created_at``: UTC epoch seconds the message was
    stored. ``rank``: lower is better (SQLite: bm25; PostgreSQL: minus ts_rank_cd; in memory:
    minus the match count).
    ``removed``: None for a live turn, else ``"rolled_back"`` or ``"failed"`` (only with
    ``include_removed=True``). ``agent``: the session's active agent.
    ``forked_from``: None, or for a turn a fork copied from its source, ``{"session_id",
    "turn"}`` of the turn it is a copy of (the same text is also a hit of the source).
    """

    session_id: str
    turn: int
    snippet: str
    role: str
    created_at: float
    rank: float
    agent: str
    removed: str | None = None
    forked_from: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; the snippet's highlight marks become ``[`` and ``]``."""
        return {
            "session_id": self.session_id,
            "turn": self.turn,
            "snippet": plain_snippet(self.snippet),
            "role": self.role,
            "created_at": self.created_at,
            "rank": self.rank,
            "agent": self.agent,
            "removed": self.removed,
            "forked_from": dict(self.forked_from) if self.forked_from is not None else None,
        }


def searchable_texts(message: Message, include_tools: bool) -> list[str]:
    """The texts of ``message`` a search looks at: user and model text; with
    ``include_tools`` also tool results and the model's tool calls ("name arguments")."""
    out: list[str] = []
    if message.role in (Role.USER, Role.MODEL) and message.content:
        out.append(message.content)
    if include_tools:
        if message.role is Role.TOOL and message.content:
            out.append(message.content)
        if message.role is Role.MODEL and message.tool_calls:
            out.append(" ".join(f"{c.name} {c.arguments}" for c in message.tool_calls))
    return out
