"""The secrets registry: API keys and vault values this process knows of, removed from
everything it prints.

:meth:`chatflow_cli.context.State.settings` records the key it reads (:func:`remember_secret`);
``$OPENAI_API_KEY`` and the variable ``$CHATFLOW_API_KEY_ENV`` names are read on each call.
:func:`scrub` replaces each by ``[redacted]``, as the model client does: defence in depth,
since a provider's error body may echo the key. The error boundary applies it to the error
line and the ``--debug`` traceback (chained causes included); every log handler chatflow
installs (:func:`install_logging`, the REPL's) scrubs each record, a tool's own log lines
included, with or without ``--debug``; JSON error objects are scrubbed too. Vault values read or written by this process
(:func:`chatflow_cli.core.resources.secrets.values_read`) are secrets too, whatever their
length.
"""

from __future__ import annotations

import logging
import os

from .core.resources.secrets import values_read

__all__ = ["MIN_SECRET_LEN", "PlainLogHandler", "ScrubbingFilter", "ScrubbingFormatter", "install_logging",
           "remember_secret", "scrub"]

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
    values = set(_SECRETS) | values_read()
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
    """Log lines (and the tracebacks they carry) with secrets removed."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


class ScrubbingFilter(logging.Filter):
    """Takes the secrets out of a log record's message before any handler formats it: on
    every handler chatflow installs, so a record a tool's own ``logging`` makes (a tool that
    logs the token it was given) is printed or queued without them, whatever the format."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record: logging reports it when formatting
            return True
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True


class PlainLogHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler without ``--debug``: what Python's last resort would print (a
    warning or error of a logger with no handler of its own in its chain: a tool's own, a
    library's), message only, on stderr, with every secret removed (:class:`ScrubbingFilter`,
    :class:`ScrubbingFormatter`). Being on the root, it also keeps a tool's
    ``logging.warning(...)`` from setting up an unscrubbed handler of its own
    (``logging.basicConfig`` does nothing once the root has one). A logger that has a
    handler (psycopg's pool, given a ``NullHandler`` to keep its reconnection noise off
    stderr) is left to it, as the last resort would be."""

    def __init__(self) -> None:
        super().__init__()
        self.setLevel(logging.WARNING)
        self.setFormatter(ScrubbingFormatter("%(message)s"))
        self.addFilter(ScrubbingFilter())

    def handle(self, record: logging.LogRecord) -> bool:
        logger: logging.Logger | None = logging.getLogger(record.name) if record.name != "root" else None
        while logger is not None and logger is not logging.root:
            if logger.handlers:  # handled below the root: the last resort would not print it
                return False
            logger = logger.parent
        return bool(super().handle(record))


def install_logging(debug: bool) -> None:
    """The log handlers of a chatflow process, every one scrubbing secrets from what it prints.

    ``debug`` (``--debug``): chatflow's own debug lines and other libraries' warnings,
    ``chatflow: LEVEL name: message``. Otherwise :class:`PlainLogHandler` on the root, and
    chatflow's own loggers silent.
    """
    if debug:  # chatflow's own debug lines; other libraries (httpx, openai, asyncio...) stay at WARNING
        handler = logging.StreamHandler()
        handler.setFormatter(ScrubbingFormatter("chatflow: %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(ScrubbingFilter())
        logging.basicConfig(level=logging.WARNING, handlers=[handler])
        logging.getLogger("chatflow_cli").setLevel(logging.DEBUG)
        return
    logging.basicConfig(level=logging.WARNING, handlers=[PlainLogHandler()])
    logging.getLogger("chatflow_cli").addHandler(logging.NullHandler())
    logging.getLogger("chatflow_cli").propagate = False
