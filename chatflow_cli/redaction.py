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
length. So are the arguments of a ``vault`` command and of ``--vault``/``--memory`` that do
not have a name's shape (:func:`remember_arguments`): a value typed where a name was expected
(``vault set work gh_token=ghp_...``) is never printed, even by the argument parser's own
messages ("Got unexpected extra argument ...").
"""

from __future__ import annotations

import logging
import os

from .core.resources.secrets import values_read

__all__ = ["MIN_SECRET_LEN", "PlainLogHandler", "ScrubbingFilter", "ScrubbingFormatter", "install_logging",
           "remember_arguments", "remember_secret", "scrub"]

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


_MOUNT_OPTIONS = ("--vault", "--memory")
_MODES = ("ro", "rw", "read-only", "read-write")
_PATH_OPTIONS = ("--db", "--config")


def _after_command(args: list[str], command: str) -> list[str] | None:
    """The arguments after ``command`` when it is the command of ``args`` (the first argument
    that is neither an option nor a global option's value), else None."""
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in _PATH_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return args[i + 1:] if arg == command else None
    return None


def remember_arguments(args: list[str]) -> None:
    """Record as secrets the command-line arguments that may hold a vault value: every
    argument of the ``vault`` command and the value of ``--vault`` / ``--memory``, unless
    is one a message may show (:func:`~chatflow_cli.core.resources.secrets.may_show`: a name
    of the rule, or an entry's name in uppercase; never one mixing the cases). Of ``NAME=VALUE`` the part
    after ``=`` is recorded too. A command line with neither costs one scan of ``args``."""
    if "vault" not in args and not any(a.startswith(_MOUNT_OPTIONS) for a in args):
        return
    from .core.resources.secrets import NOT_SHOWN, quoted_name

    suspects: list[str] = []
    rest = _after_command(args, "vault")
    if rest is not None:
        # the global options' values are paths, not values (an error naming the database stays readable)
        suspects += [a for i, a in enumerate(rest) if not (i and rest[i - 1] in _PATH_OPTIONS)
                     and not a.startswith(tuple(o + "=" for o in _PATH_OPTIONS))]
    for i, arg in enumerate(args):
        if arg in _MOUNT_OPTIONS and i + 1 < len(args):
            suspects.append(args[i + 1])
        elif arg.startswith(tuple(o + "=" for o in _MOUNT_OPTIONS)):
            suspects.append(arg.partition("=")[2])
    for arg in suspects:
        if arg.startswith("-"):  # an option; of --opt=VALUE, the value
            if "=" not in arg:
                continue
            arg = arg.partition("=")[2]
        name, colon, mode = arg.partition(":")
        if colon and mode.lower() in _MODES and quoted_name(name, entry=True) != NOT_SHOWN:
            continue  # a mount: NAME:ro
        for part in (arg, arg.partition("=")[2], name, mode):
            if part and quoted_name(part, entry=True) == NOT_SHOWN:
                remember_secret(part)


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
