"""The secrets registry: API keys this process knows of, removed from everything it prints.

:meth:`chatflow_cli.context.State.settings` records the key it reads (:func:`remember_secret`);
``$OPENAI_API_KEY`` and the variable ``$CHATFLOW_API_KEY_ENV`` names are read on each call.
:func:`scrub` replaces each by ``[redacted]``, as the model client does: defence in depth,
since a provider's error body may echo the key. The error boundary applies it to the error
line, the ``--debug`` traceback (chained causes included) and ``--debug`` log lines; JSON
error objects are scrubbed too.
"""

from __future__ import annotations

import logging
import os

__all__ = ["MIN_SECRET_LEN", "ScrubbingFormatter", "remember_secret", "scrub"]

#: Shorter values are not treated as secrets (replacing them would garble ordinary text).
MIN_SECRET_LEN = 6

_SECRETS: set[str] = set()


def remember_secret(value: str | None) -> None:
    """Record ``value`` as a secret that :func:`scrub` removes from printed text.

    Args:
        value: A secret (an API key); ``None`` or a value shorter than
            :data:`MIN_SECRET_LEN` characters is ignored.
    """
    if value and len(value) >= MIN_SECRET_LEN:
        _SECRETS.add(value)


def _secrets() -> list[str]:
    """Every secret to scrub, longest first (a key containing another is removed whole)."""
    values = set(_SECRETS)
    for name in ("OPENAI_API_KEY", "PGPASSWORD", os.environ.get("CHATFLOW_API_KEY_ENV", "")):
        value = os.environ.get(name) if name else None
        if value and len(value) >= MIN_SECRET_LEN:
            values.add(value)
    return sorted(values, key=len, reverse=True)


def scrub(text: str) -> str:
    """``text`` with every known secret replaced by ``[redacted]``.

    Args:
        text: Text about to be printed or written as JSON.

    Returns:
        The text without any secret this process knows of.
    """
    for value in _secrets():
        if value in text:
            text = text.replace(value, "[redacted]")
    if "postgres" in text.lower() or "password" in text.lower():  # a DSN's password, however short
        from .core.dsn import redact_dsn

        text = redact_dsn(text)
    return text


class ScrubbingFormatter(logging.Formatter):
    """``--debug`` log lines (and the tracebacks they carry) with secrets removed."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))
