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
"""

from __future__ import annotations

import json
import threading

__all__ = ["MIN_VALUE_LEN", "REDACTED", "remember_value", "scrub_values", "values_read"]

#: The shortest vault value chatflow keeps or hands to a tool, in characters.
MIN_VALUE_LEN = 8
#: What a scrubbed value is replaced by.
REDACTED = "[redacted]"

_VALUES: set[str] = set()
_FORMS: list[str] = []  # every value and its JSON-escaped form, longest first
_LOCK = threading.Lock()


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
