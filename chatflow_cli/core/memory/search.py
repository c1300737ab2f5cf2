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

Matching ignores case, accents of Latin, Greek, Cyrillic, Arabic and Hebrew letters
(``Café`` finds ``cafe``) and compatibility forms (full-width ``ＡＢＣ`` is ``abc``,
half-width ``ｶﾞ`` is ``ガ``); Hangul, kana with voiced marks and the vowel signs of Indic
scripts are kept as written. Words are runs of letters, digits, marks and ``_``, so
punctuation, emoji and NUL separate words (``e-mail`` is the phrase ``"e mail"``).
Chinese and Japanese are written without spaces, so there a query finds any stretch of
characters: ``確認`` finds ``uuid_1234を確認する``, as ``uuid_1234`` does (a run of
those characters is its own word, also when letters or digits touch it); one character
finds every run holding it. Korean words are whole words (``서울*`` finds ``서울에서``).
A word over :data:`MAX_WORD_CHARS` characters is never found; a query of more than
:data:`MAX_QUERY_WORDS` words (a Chinese or Japanese stretch counts its characters) is a
:class:`~chatflow_cli.core.errors.UsageError`. Every
``OR`` branch needs at least one word that is not negated. Anything else -- an unbalanced
``"``, ``AND`` or ``OR`` with nothing on one side, a lone ``*`` or ``NOT``, a query with no
word at all -- is a :class:`~chatflow_cli.core.errors.UsageError` whose message says what
is wrong and how to write it; FTS5 never sees raw user text (:func:`to_fts5` quotes every
word), so no query can reach it as a syntax error.

:func:`parse_query` turns the text into a :class:`Query`. Every store indexes the words
:func:`words_of` gives (one folding, one word splitting for all), so every store finds
the same turns: the SQLite store evaluates the query with FTS5 (:func:`to_fts5`) over
those words ranked by bm25, PostgreSQL with a ``tsquery`` over a ``tsvector`` of them,
the in-memory store with :meth:`Query.score` (the number of matched word occurrences,
more first). All return :class:`SearchHit` values, one per turn (the best-ranked message
of the turn), with snippets made by the same function.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..messages import Message, Role

__all__ = [
    "HIGHLIGHT_END",
    "HIGHLIGHT_START",
    "MAX_QUERY_WORDS",
    "MAX_WORD_CHARS",
    "Query",
    "SearchHit",
    "parse_query",
    "plain_snippet",
    "searchable_texts",
    "to_fts5",
    "word_spans",
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
#: Longest searchable word, in characters: a longer run of letters (a base64 blob) takes its
#: place in the text but no query finds it (PostgreSQL refuses a lexeme over 2047 bytes, so
#: every store draws the line at the same place).
MAX_WORD_CHARS = 500
#: What :func:`words_of` gives for a word over :data:`MAX_WORD_CHARS`: a token no query word
#: equals or starts with (query words hold only letters, digits, marks and ``_``).
UNSEARCHABLE = "\u00a0"
#: At most this many words (after splitting runs of Chinese and Japanese characters) in one
#: query; a longer query is a UsageError (every store evaluates it in one bounded expression).
MAX_QUERY_WORDS = 256


def _is_cjk(ch: str) -> bool:
    """A Chinese or Japanese character: written without spaces between words."""
    o = ord(ch)
    return (
        0x3040 <= o <= 0x30FF  # hiragana, katakana (with the prolonged sound mark)
        or 0x3005 <= o <= 0x3007  # 々 〆 〇
        or 0x31F0 <= o <= 0x31FF  # katakana phonetic extensions
        or 0x3400 <= o <= 0x4DBF  # CJK extension A
        or 0x4E00 <= o <= 0x9FFF  # CJK unified ideographs
        or 0xF900 <= o <= 0xFAFF  # CJK compatibility ideographs
        or 0x20000 <= o <= 0x3FFFF  # CJK extensions B and later
    )


#: :func:`_is_cjk` as a regular expression class.
_CJK_CLASS = "\u3005-\u3007\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff"


#: A run of Chinese and Japanese characters (group 1), or of other letters, digits and ``_``.
_RUN = re.compile(f"([{_CJK_CLASS}]+)|([^\\W{_CJK_CLASS}]+)")
#: A letter followed by what may be a mark (not a letter, space, ASCII or CJK or general
#: punctuation): only then does a word need :func:`_fast_runs` to take its marks along.
_MARK_AFTER_WORD = re.compile("\\w[^\\w\\s\\x00-\\x7f\\u2000-\\u206f\\u3000-\\u303f\\uff00-\\uffef]")
#: Letters of the scripts whose accents matching ignores (Latin, Greek, Cyrillic, Hebrew,
#: Arabic), and the combining marks (accents, Hebrew points, Arabic vowel signs) that are
#: dropped after them.
_STRIP_LETTERS = (
    "A-Za-z\u00c0-\u024f\u0370-\u03ff\u0400-\u052f\u0590-\u05ff\u0600-\u06ff\u0750-\u077f"
    "\u08a0-\u08ff\u1e00-\u1fff\u2c60-\u2c7f\ua720-\ua7ff\uab30-\uab6f\ufb00-\ufdff\ufe70-\ufeff"
)
_STRIP_MARKS = (
    "\u0300-\u036f\u0483-\u0489\u0591-\u05bd\u05bf\u05c1\u05c2\u05c4\u05c5\u05c7\u0610-\u061a"
    "\u064b-\u065f\u0670\u06d6-\u06dc\u06df-\u06e4\u06e7\u06e8\u06ea-\u06ed\u08d3-\u08ff"
    "\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
)
_MARKS_AFTER_LETTER = re.compile(f"([{_STRIP_LETTERS}])[{_STRIP_MARKS}]+")
#: A precomposed letter that may carry an accent (looked up in :func:`_without_accents`).
_ACCENTED = re.compile(f"[{_STRIP_LETTERS.removeprefix('A-Za-z')}]")
_LETTER_RANGES = [(0xC0, 0x24F), (0x370, 0x52F), (0x590, 0x6FF), (0x750, 0x77F), (0x8A0, 0x8FF), (0x1E00, 0x1FFF),
                  (0x2C60, 0x2C7F), (0xA720, 0xA7FF), (0xAB30, 0xAB6F), (0xFB00, 0xFDFF), (0xFE70, 0xFEFF)]


@functools.lru_cache(maxsize=1)
def _without_accents() -> dict[int, str]:
    """Each precomposed letter of those scripts (by code point) without its marks; built on
    first use (a few thousand letters)."""
    table: dict[int, str] = {}
    for low, high in _LETTER_RANGES:
        for code in range(low, high + 1):
            decomposed = unicodedata.normalize("NFD", chr(code))
            bare = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
            if bare != chr(code) and bare:
                table[code] = unicodedata.normalize("NFC", bare)
    return table


def _is_mark(ch: str) -> bool:
    return unicodedata.category(ch)[0] == "M"


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _clusters(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each base character with the combining marks (and half-width
    voiced sound marks) that follow it."""
    out: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        j = i + 1
        while j < n and (_is_mark(text[j]) or text[j] in "\uff9e\uff9f"):
            j += 1
        out.append((i, j))
        i = j
    return out


def _fold(text: str) -> str:
    """Lower case without accents, compatibility forms unified (NFKC); Hangul, kana voiced
    marks and the vowel signs of Indic scripts are kept. The one folding of every store:
    NFKC and case folding (to a fixed point), then the combining marks of Latin, Greek,
    Cyrillic, Hebrew and Arabic letters dropped."""
    if text.isascii():
        return text.lower()
    out = text
    for _ in range(3):
        again = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", out).casefold())
        if again == out:
            break
        out = again
    table = _without_accents()
    out = _ACCENTED.sub(lambda m: table.get(ord(m.group()), m.group()), out)
    return _MARKS_AFTER_LETTER.sub(r"\1", out)


#: A stretch of text between spaces, controls and ASCII punctuation (``_`` excepted): no
#: word crosses one, so each is folded and split on its own.
_CHUNK = re.compile(r"[^\x00-\x2f\x3a-\x40\x5b-\x5e\x60\x7b-\x7f\s]+")


def _runs(chars: Iterable[tuple[str, int, int]]) -> list[tuple[str, bool, list[tuple[int, int]]]]:
    """The runs of folded ``chars`` (``(char, start, end)``: each folded character and where
    it came from): ``(run, cjk, spans)`` where a run is a maximal stretch of letters, digits,
    marks and ``_`` (``cjk`` false) or of Chinese and Japanese characters (``cjk`` true), and
    ``spans[k]`` is where the run's k-th character came from."""
    out: list[tuple[str, bool, list[tuple[int, int]]]] = []
    run: list[str] = []
    spans: list[tuple[int, int]] = []
    kind: bool | None = None  # None: between runs
    for ch, s, e in chars:
        if _is_cjk(ch):
            this: bool | None = True
        elif _is_word_char(ch) or (kind is False and _is_mark(ch)):
            this = False
        else:
            this = None
        if this != kind:
            if run:
                out.append(("".join(run), bool(kind), spans))
            run, spans, kind = [], [], this
        if this is not None:
            run.append(ch)
            spans.append((s, e))
    if run:
        out.append(("".join(run), bool(kind), spans))
    return out


def _fast_runs(folded: str, start: int) -> list[tuple[str, bool, list[tuple[int, int]] | int]]:
    """:func:`_runs` of ``folded``, whose k-th character came from position ``start + k``."""
    out: list[tuple[str, bool, list[tuple[int, int]] | int]] = []
    n = len(folded)
    last_end = -1  # where the last letter run (with its marks) ended
    for m in _RUN.finditer(folded):
        s, e = m.span()
        if m.group(1) is not None:
            out.append((m.group(), True, start + s))
            continue
        while e < n and not folded[e].isascii() and _is_mark(folded[e]) and not _is_cjk(folded[e]):
            e += 1  # marks continue a word
        if s == last_end:  # only marks between: the same word
            run, _cjk, where = out.pop()
            out.append((run + folded[s:e], False, where))
        else:
            out.append((folded[s:e], False, start + s))
        last_end = e
    return out


def _chunk_runs(text: str, start: int, end: int) -> list[tuple[str, bool, list[tuple[int, int]] | int]]:
    chunk = text[start:end]
    folded = _fold(chunk)
    if len(folded) == len(chunk):  # one folded character for each: positions carry over
        return _fast_runs(folded, start)
    # else fold each base character with its marks apart, to know where each came from
    return list(_runs((ch, start + s, start + e) for s, e in _clusters(chunk) for ch in _fold(chunk[s:e])))


def _run_words(run: str, cjk: bool, where: list[tuple[int, int]] | int) -> list[tuple[str, int, int]]:
    """The words of a run and their spans; ``where`` is the run's first position when each
    of its characters came from one character of the text, else the span of each."""
    n = len(run)
    if isinstance(where, int):
        first, last = where, where + n
    else:
        first, last = where[0][0], where[-1][1]
    if not cjk:
        return [(run if n <= MAX_WORD_CHARS else UNSEARCHABLE, first, last)]
    # Chinese and Japanese: each character with the next (overlapping bigrams), the last alone,
    # so that any stretch of two or more characters is a phrase of consecutive bigrams
    words = _pairs(run)
    if isinstance(where, int):
        return list(zip(words, range(where, where + n), [*range(where + 2, where + n + 1), where + n]))
    return [(words[k], where[k][0], where[min(k + 1, n - 1)][1]) for k in range(n)]


def _pairs(run: str) -> list[str]:
    """A run of Chinese and Japanese characters as its words: each character with the next,
    and the last alone."""
    words = [a + b for a, b in zip(run, run[1:])]
    words.append(run[-1])
    return words


def _text_runs(text: str) -> list[tuple[str, bool, list[tuple[int, int]] | int]]:
    """The runs of ``text`` (see :func:`_runs`): of the whole text folded at once when that
    keeps its length (each folded character then stands where it was), else chunk by chunk."""
    if not text.isascii():
        folded = _fold(text)
        if len(folded) == len(text):
            return _fast_runs(folded, 0)
    out: list[tuple[str, bool, list[tuple[int, int]] | int]] = []
    for m in _CHUNK.finditer(text):
        s, e = m.span()
        if m.group().isascii():  # letters, digits and _ only: one word
            out.append((m.group().lower(), False, s))
        else:
            out.extend(_chunk_runs(text, s, e))
    return out


def word_spans(text: str) -> list[tuple[str, int, int]]:
    """:func:`words_of` with where each word is in ``text``: ``(word, start, end)``; the
    spans of a run of Chinese and Japanese characters overlap."""
    if text.isascii():  # the common case: each run is one word, lower case, where it was
        return [(w if len(w) <= MAX_WORD_CHARS else UNSEARCHABLE, m.start(), m.end())
                for m in _CHUNK.finditer(text.lower()) for w in (m.group(),)]
    return [w for run in _text_runs(text) for w in _run_words(*run)]


def words_of(text: str) -> list[str]:
    """The searchable words of ``text``, in order: what every store indexes.

    ``text`` is folded (:func:`_fold`) and cut into runs of letters, digits, marks and
    ``_``; each run is a word, except that a run of Chinese and Japanese characters becomes
    its overlapping pairs of characters and its last character (``確認する`` ->
    ``確認 認す する る``) so that a query finds any stretch of it. A word over
    :data:`MAX_WORD_CHARS` becomes :data:`UNSEARCHABLE`.
    """
    folded = text.lower() if text.isascii() else _fold(text)
    out: list[str] = []
    if len(folded) == len(text) and not _MARK_AFTER_WORD.search(folded):
        # the common case, found by one expression: what _text_runs would give
        for cjk, word in _RUN.findall(folded):
            if cjk:
                out.extend(_pairs(cjk))
            else:
                out.append(word if len(word) <= MAX_WORD_CHARS else UNSEARCHABLE)
        return out
    for run, cjk, _where in _text_runs(text):
        if cjk:
            out.extend(_pairs(run))
        else:
            out.append(run if len(run) <= MAX_WORD_CHARS else UNSEARCHABLE)
    return out


def _query_words(text: str) -> tuple[tuple[str, ...], bool]:
    """The words a query word (or phrase) asks for, and whether its last is a prefix.

    The same runs as :func:`words_of`, but a run of Chinese and Japanese characters at the
    end may continue in the text: it asks for its pairs only, or for one character as a
    prefix (``確`` finds ``確認``). Where a word or a space follows a run, the run ends in
    the text too, so it asks for its last character alone as :func:`words_of` stores it.
    """
    runs = _text_runs(text)
    words: list[str] = []
    prefix = False
    for n, (run, cjk, spans) in enumerate(runs):
        got = [w for w, _s, _e in _run_words(run, cjk, spans)]
        if cjk and n == len(runs) - 1:
            if len(run) == 1:
                prefix = True
            else:
                got = got[:-1]
        words.extend(got)
    return tuple(words), prefix


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
                at = _positions(term, words)
                if at and (found is None or at[0] < found[0]):
                    found = (at[0], len(term.words))
        return found

    def matched_positions(self, words: list[str]) -> set[int]:
        """Indexes in ``words`` covered by any positive term (for highlighting)."""
        out: set[int] = set()
        for positive, _negative in self.clauses:
            for term in positive:
                for i in _positions(term, words):
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


def _positions(term: _Term, words: list[str]) -> list[int]:
    """Every index of ``words`` where ``term`` occurs, in order: the places its first word
    is, found by one comparison each, then :func:`_at` at those only."""
    if not term.words:
        return list(range(len(words)))
    first = term.words[0]
    if len(term.words) == 1:
        if term.prefix:
            return [i for i, w in enumerate(words) if w.startswith(first)]
        return [i for i, w in enumerate(words) if w == first]
    return [i for i, w in enumerate(words) if w == first and _at(term, words, i)]


def _count(term: _Term, words: list[str]) -> int:
    return len(_positions(term, words))


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
                raise UsageError(f"search query {_short(text)} has an unbalanced '\"': close the phrase; {_HINT}")
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
        raise UsageError(f"search query {_short(query)}: '*' may only end a word (deplo*); {_HINT}")
    words, cjk_prefix = _query_words(raw)
    if not words:
        what = "an empty phrase" if kind.startswith("phrase") else _short(value)
        raise UsageError(f"search query {_short(query)}: {what} has no letters or digits to search for; {_HINT}")
    if UNSEARCHABLE in words:
        raise UsageError(
            f"search query {_short(query)}: a word over {MAX_WORD_CHARS} characters is never found; {_HINT}"
        )
    return _Term(words, prefix or cjk_prefix)


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
            raise UsageError(f"search query {_short(text)}: NOT must be followed by a word; {_HINT}")
        if not positive:
            if negative:
                raise UsageError(
                    f"search query {_short(text)}: every part needs a word to find, not only NOT words; {_HINT}"
                )
            raise UsageError(f"search query {_short(text)}: {where} needs words on both sides; {_HINT}")
        clauses.append((tuple(positive), tuple(negative)))
        positive, negative = [], []

    for kind, value in _tokens(text):
        if kind == "word" and value == "OR":
            close("OR")
            last_operator = "OR"
            continue
        if kind == "word" and value == "AND":
            if last_operator is not None:
                raise UsageError(f"search query {_short(text)}: AND needs words on both sides; {_HINT}")
            last_operator = "AND"
            continue
        if kind == "word" and value == "NOT":
            if negate:
                raise UsageError(f"search query {_short(text)}: NOT NOT is not a query; {_HINT}")
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
        raise UsageError(f"search query {_short(text)}: AND needs words on both sides; {_HINT}")
    close("OR" if clauses else "the query")
    count = sum(len(term.words) for positive, negative in clauses for term in (*positive, *negative))
    if count > MAX_QUERY_WORDS:
        raise UsageError(
            f"search query {_short(text)} has {count} words, more than {MAX_QUERY_WORDS}: search for fewer; {_HINT}"
        )
    return Query(text, tuple(clauses))


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77]) + "..."


def _fts_term(term: _Term) -> str:
    phrase = '"' + " ".join(term.words) + '"'
    return phrase + ("*" if term.prefix else "")


def to_fts5(query: Query, columns: tuple[str, ...] | None = None) -> str:
    """The FTS5 MATCH expression of ``query``: every word quoted (no FTS5 syntax error is
    possible), limited to ``columns`` when given (``{body tools} : (...)``)."""
    parts = []
    for positive, negative in query.clauses:
        # flat: (a AND b) NOT (x OR y), never one nesting level per word (FTS5's parser
        # stack overflows at about 90 levels)
        expr = " AND ".join(_fts_term(t) for t in positive)
        if negative:
            expr = f"({expr}) NOT (" + " OR ".join(_fts_term(t) for t in negative) + ")"
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
    ``…`` where text was cut: :data:`SNIPPET_WORDS` words (of :func:`words_of`) of context.
    Every store makes its snippets with this function."""
    spans = word_spans(text)
    if not spans:
        return text[: SNIPPET_WORDS * 8]
    words = [w for w, _s, _e in spans]
    first = query.first_match(words)
    centre = first[0] if first else 0
    lo = max(0, centre - SNIPPET_WORDS // 2)
    hi = min(len(spans), lo + SNIPPET_WORDS)
    lo = max(0, hi - SNIPPET_WORDS)
    start = spans[lo][1] if lo > 0 else 0
    end = max(e for _w, _s, e in spans[lo:hi])
    if hi < len(spans):
        tail = text[end : max(end, spans[hi][1])].rstrip() + "…"
    else:
        tail = text[end:]
    # the matched stretches inside the window, merged (the words of a run of Chinese or
    # Japanese characters overlap)
    marked: list[list[int]] = []
    for a, b in sorted((spans[i][1], spans[i][2]) for i in query.matched_positions(words) if lo <= i < hi):
        if marked and a <= marked[-1][1]:
            marked[-1][1] = max(marked[-1][1], b)
        else:
            marked.append([a, b])
    out = ["…" if lo > 0 else ""]
    pos = start
    for a, b in marked:
        out.append(text[pos:a])
        out.append(f"{HIGHLIGHT_START}{text[a:b]}{HIGHLIGHT_END}")
        pos = b
    out.append(text[pos:end])
    out.append(tail)
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
