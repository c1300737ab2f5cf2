"""The vault values this process has read or written, and scrubbing them out of text.

Every value :class:`~chatflow_cli.core.resources.vaults.Vaults` reads (to fill a tool's
secret parameter) or writes (``chatflow vault set``) is remembered here for the life of the
process. :func:`scrub_values` replaces each, and its JSON-escaped form, by ``[redacted]``:
the Runner applies it to every tool result and tool error before it is stored, sent to the
model or put in an event, and the front-end's redaction (:mod:`chatflow_cli.redaction`) to
every error line, ``--debug`` traceback and log line it prints.

A value shorter than :data:`MIN_VALUE_LEN` characters is never stored or handed to a tool
(:class:`~chatflow_cli.core.resources.vaults.Vaults` refuses it): replacing a short string
everywhere would garble ordinary text, and not replacing it would leak it.

A name typed by the user (a vault, an entry, a memory store) may hold a value by mistake
(``gh_token=ghp_...``, or the token itself where the entry's name was expected). Messages
quote a name only through :func:`quoted_name`, which shows it when it follows the name rule
(``a-z 0-9 _ . -``, starting with a letter or a digit; for an entry's name, its letters may
instead all be uppercase: ``GITHUB_TOKEN``) and does not look like a credential
(:func:`looks_like_secret`), and otherwise says it is not shown. A name mixing uppercase and
lowercase letters (``Zq9SECRETvalue-77``) is never shown, and nothing derived from it either.
"""

from __future__ import annotations

import json
import re
import threading

__all__ = ["MIN_VALUE_LEN", "NOT_SHOWN", "REDACTED", "looks_like_secret", "may_show", "quoted_name",
           "remember_value", "scrub_values", "values_read"]

#: The shortest vault value chatflow keeps or hands to a tool, in characters.
MIN_VALUE_LEN = 8
#: What a scrubbed value is replaced by.
REDACTED = "[redacted]"
#: What a message says instead of a name it does not quote (:func:`quoted_name`).
NOT_SHOWN = "(the name given, not shown)"

# the names a message may show: the name rule (lowercase), and for an entry also all uppercase
_SHOWN_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_SHOWN_ENTRY = re.compile(r"[A-Z0-9][A-Z0-9_.-]{0,63}")
# 20 or more letters and digits in a row, with both: random tokens (ghp_..., AKIA..., sk-...)
_TOKEN_RUN = re.compile(r"[A-Za-z0-9]{20,}")
# the prefixes of well-known credentials (GitHub, GitLab, Slack, OpenAI-style, AWS, Google, JWT)
_TOKEN_PREFIX = re.compile(r"(gh[pousr]_|github_pat_|glpat-|xox[abprs]-|sk-|AKIA|ASIA|AIza|ya29\.|eyJ)")

_VALUES: set[str] = set()
_FORMS: list[str] = []  # every value and its JSON-escaped form, longest first
_LOCK = threading.Lock()


def looks_like_secret(text: str) -> bool:
    """True when ``text`` looks like a credential rather than a name: a run of 20 or more
    letters and digits holding both, or a well-known token prefix followed by 12 or more
    characters. ``github_token``, ``team.crm`` and ``acme-2024`` do not; ``ghp_`` and 36
    characters, ``AKIAIOSFODNN7EXAMPLE`` or ``sk-proj-...`` do."""
    for run in _TOKEN_RUN.findall(text):
        if any(c.isdigit() for c in run) and any(c.isalpha() for c in run):
            return True
    found = _TOKEN_PREFIX.match(text)
    return found is not None and len(text) - found.end() >= 12


def may_show(name: object, *, entry: bool = False) -> bool:
    """True when a message may show ``name``: it follows the name rule (1-64 characters of
    ``a-z 0-9 _ . -``, starting with a letter or a digit; with ``entry``, an entry's name whose
    letters are all uppercase, ``GITHUB_TOKEN``, too) and does not look like a credential.
    A name mixing the cases, or any other, may be a value typed where a name was expected."""
    return (isinstance(name, str) and bool(_SHOWN_NAME.fullmatch(name) or (entry and _SHOWN_ENTRY.fullmatch(name)))
            and not looks_like_secret(name))


def quoted_name(name: object, *, entry: bool = False) -> str:
    """``name`` quoted for a message (``'work'``) when :func:`may_show` allows it; otherwise
    :data:`NOT_SHOWN`, so a value typed where a name was expected is never printed."""
    return repr(name) if may_show(name, entry=entry) else NOT_SHOWN


def remember_value(value: str) -> None:
    """Record ``value`` as a vault value of this process (a no-op for one already known or
    shorter than :data:`MIN_VALUE_LEN`)."""
    if len(value) < MIN_VALUE_LEN or value in _VALUES:
        return
    with _LOCK:
        _VALUES.add(value)
        forms = set(_FORMS)
        forms.add(value)
        escaped = json.dumps(value, ensure_ascii=False)[1:-1]
        forms.add(escaped)
        forms.add(json.dumps(value)[1:-1])  # \\uXXXX escapes, as ensure_ascii=True writes them
        _FORMS[:] = sorted(forms, key=len, reverse=True)


def values_read() -> frozenset[str]:
    """The vault values this process has read or written so far."""
    return frozenset(_VALUES)


def scrub_values(text: str) -> str:
    """``text`` with every vault value of this process (and its JSON-escaped form) replaced
    by ``[redacted]``; the same object when there is nothing to replace."""
    for form in tuple(_FORMS):
        if form in text:
            text = text.replace(form, REDACTED)
    return text
