"""The one terminal sanitizer, and the small text helpers every renderer uses.

Text that comes from a model, a tool or the database is passed through :func:`safe_text`
before it reaches a terminal *or* a plain-text pipe, so escape sequences (screen clear,
title change, OSC 52 clipboard writes, hyperlinks), other C0/C1 control characters and
bidirectional overrides are shown inert, as visible symbols. It is printed as
``rich.text.Text`` (never parsed as Rich markup). Only ``--output json``/``jsonl`` carry the
text verbatim, JSON-escaped by :func:`dumps` (control characters become ``\\u001b`` and so
on, which no terminal executes). :class:`TextSanitizer` is the same rule for text that
arrives in pieces (a streamed reply).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from ..core.inert import BIDI_CONTROLS, LINE_SEPARATORS, LINE_TABLE as _LINE_TABLE, TEXT_TABLE as _TEXT_TABLE

__all__ = ["BIDI_CONTROLS", "FOLD_CHARS", "FOLD_LINES", "LINE_SEPARATORS", "TextSanitizer", "dumps", "fold", "format_age", "plural", "pretty_json_text", "safe_text"]


FOLD_LINES = 8
FOLD_CHARS = 600

# -- the terminal sanitizer ---------------------------------------------------------------
# The tables (the rule) live in a leaf, so the core shows a path by the same rule (one_line).

_C1_JSON_RE = re.compile("[\x7f-\x9f\u2028\u2029]")


def safe_text(text: str | None, *, one_line: bool = False) -> str:
    """``text`` made safe for a terminal or a line-oriented pipe: the one sanitizer of chatflow.

    Every character that could control a terminal becomes a visible, inert stand-in, so
    text from a model, a tool or the database can never clear the screen, set the title,
    write the clipboard (OSC 52), hide a link (OSC 8) or reorder what is shown. By class:

    ==========================================  ==================================================
    ``\n`` and tab                               kept (``one_line``: a space each)
    CR LF                                       ``\n`` (``one_line``: a space); a lone CR ``␍``
    other C0 controls (ESC, BEL, VT, FF, ...)   their control pictures: ``␛`` ``␇`` ``␋`` ``␌``
    DEL                                         ``␡``
    C1 controls U+0080–U+009F (NEL, CSI ...)    ``<U+0085>``, ``<U+009B>``
    U+2028 line / U+2029 paragraph separator    ``\n`` (``one_line``: a space)
    bidi controls: ALM, LRM, RLM, U+202A–E,
    U+2066–9                                    ``<U+202E>`` and so on
    lone surrogates (invalid in UTF-8)          ``\ufffd``
    everything else (letters, emoji with their
    ZWJ and variation selectors, tags, other
    format characters such as U+200B, U+00AD)   kept: a terminal prints them, never obeys them
    ==========================================  ==================================================

    ``one_line=True`` is for one-row fields (``sessions ls`` previews, names): no character
    of the result makes a terminal or ``str.splitlines`` start a new line. ``None`` -> ``""``.
    Pure, O(len(text)).
    """
    if not text:
        return ""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    return text.translate(_LINE_TABLE if one_line else _TEXT_TABLE)


class TextSanitizer:
    """:func:`safe_text` over a stream of deltas: a CR at the end of a delta waits for the
    next one, so CR LF split across two deltas still becomes one ``\n``."""

    def __init__(self) -> None:
        self._carry = ""

    def feed(self, text: str) -> str:
        text = self._carry + text
        self._carry = ""
        if text.endswith("\r"):
            self._carry, text = "\r", text[:-1]
        return safe_text(text)

    def flush(self) -> str:
        text, self._carry = self._carry, ""
        return safe_text(text)


def dumps(obj: Any, *, indent: int | None = None) -> str:
    """JSON for chatflow's ``--json``/``jsonl`` output: UTF-8 text kept readable, but every
    control character (C0 by ``json`` itself, DEL and C1 here) escaped, so the line is
    inert on a terminal and loads back to the verbatim text. Strict JSON: a float NaN or
    Infinity (only a database written by an older chatflow holds one) is a ``StoreError``
    (``NonFiniteNumberError``) rather than a bare ``NaN`` strict readers refuse."""
    from ..core.messages import strict_dumps

    text = strict_dumps(obj, ensure_ascii=False, indent=indent, separators=None if indent else (",", ":"), default=str)
    return _C1_JSON_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def fold(text: str, *, full: bool = False, max_lines: int = FOLD_LINES, max_chars: int = FOLD_CHARS) -> str:
    """``text`` cut to ``max_lines`` lines and ``max_chars`` characters, with a note of what was left out."""
    if full:
        return text
    lines = text.splitlines()
    cut = "\n".join(lines[:max_lines])
    if len(cut) > max_chars:
        cut = cut[:max_chars]
    if len(cut) >= len(text.rstrip("\n")):
        return text
    hidden_lines = len(lines) - cut.count("\n") - 1
    more = f"{hidden_lines} more lines" if hidden_lines > 0 else f"{len(text) - len(cut)} more characters"
    return f"{cut}… ({more}; --full shows all)"


def pretty_json_text(raw: str | None, *, full: bool = False) -> str:
    """Tool arguments or results for display: JSON compacted (or indented when long), else as is."""
    if raw is None:
        return ""
    try:
        data = json.loads(raw)
    except (ValueError, TypeError):
        return fold(raw, full=full)
    if isinstance(data, str):
        return fold(data, full=full)
    compact = json.dumps(data, ensure_ascii=False)
    if len(compact) <= 100:
        return compact
    return fold(json.dumps(data, ensure_ascii=False, indent=2), full=full)


def plural(count: int, word: str, words: str | None = None) -> str:
    """``"1 turn"``, ``"0 turns"``, ``"3 turns"``: a count with its noun agreeing."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def format_age(timestamp: float | None, now: float | None = None) -> str:
    """``"12s ago"``, ``"5m ago"``, ``"3h ago"``, ``"2d ago"``, or a date past 30 days."""
    if not timestamp:
        return "-"
    now = time.time() if now is None else now
    delta = max(0.0, now - timestamp)
    if delta < 60:
        return f"{int(delta)}s ago"
    if delta < 3600:
        return f"{int(delta // 60)}m ago"
    if delta < 86400:
        return f"{int(delta // 3600)}h ago"
    if delta < 30 * 86400:
        return f"{int(delta // 86400)}d ago"
    return time.strftime("%Y-%m-%d", time.localtime(timestamp))
