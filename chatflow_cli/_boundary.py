"""The error boundary's tools: one-line errors, JSON errors, closed and broken streams.

:func:`chatflow_cli.cli.main` is the one place where errors become a line on stderr and an
exit code; the pieces it uses live here so that the command module holds commands. Every
line printed is scrubbed of secrets (:func:`chatflow_cli.redaction.scrub`) and made inert
for a terminal (:func:`chatflow_cli.render.safe_text`).
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from .core.errors import UsageError
from .redaction import scrub

__all__ = ["OUTPUT_ERRNOS", "ReaderGone", "Stopped", "check_utf8_args", "error_line", "fill_closed_standard_streams",
           "interrupted_code", "json_error", "print_traceback", "reader_gone_is_ours", "set_json_errors",
           "stop_signals_interrupt", "stopped_text", "terminated_by"]

#: ``json``/``jsonl`` while a command prints JSON: an error is then also printed as a JSON
#: object on stdout (``{"schema", "type": "error", "is_error": true, ...}``), as ``chat --json`` does.
json_errors: str | None = None
json_error_event = "error"


#: The signal that stopped this run first (SIGTERM or SIGHUP), or None: Ctrl-C, or nothing.
terminated_by: int | None = None


def stop_signals_interrupt() -> None:
    """Take SIGTERM (``timeout 30 chatflow chat ...``, ``kill PID``) and SIGHUP (the terminal
    closed, an ssh session dropped) as Ctrl-C is taken.

    The first such signal does what a first Ctrl-C does: a turn going on stops and keeps its
    partial reply as an interrupted turn (even when SIGINT is ignored, as in a background
    job); with no turn going on, ``KeyboardInterrupt`` ends the command. The boundary then
    says ``terminated (SIGTERM)`` or ``hung up (SIGHUP)`` (:func:`stopped_text`) and exits
    128 + the signal's number, 143 or 129, instead of 130 (:func:`interrupted_code`). A second
    one stops at once, as a second Ctrl-C does. Only from the main thread. (The REPL puts its
    own handlers in place while it runs, with the same exit codes.)
    """
    import signal

    def on_stop(signum: int, frame: Any) -> None:
        global terminated_by
        from .core._run.cancel import cancel_main_thread_runs

        if terminated_by is None:
            terminated_by = signum
        if not cancel_main_thread_runs():  # no turn to stop (or asked already): stop here
            raise KeyboardInterrupt

    for name in ("SIGTERM", "SIGHUP"):
        try:
            signal.signal(getattr(signal, name), on_stop)
        except (AttributeError, ValueError, OSError):  # pragma: no cover - not the main thread, or no SIGHUP
            pass


def interrupted_code() -> int:
    """The exit code of an interrupted run: 143 after SIGTERM, 129 after SIGHUP, else 130 (Ctrl-C)."""
    from .core.errors import ExitStatus

    if terminated_by is None:
        return int(ExitStatus.INTERRUPTED)
    return int(ExitStatus.HUNG_UP) if terminated_by == _sighup() else int(ExitStatus.TERMINATED)


def stopped_text() -> str:
    """What the boundary says of the signal that stopped the run: ``terminated (SIGTERM)``,
    ``hung up (SIGHUP)``, or ``interrupted`` (Ctrl-C)."""
    if terminated_by is None:
        return "interrupted"
    return "hung up (SIGHUP)" if terminated_by == _sighup() else "terminated (SIGTERM)"


def _sighup() -> int | None:
    import signal

    return getattr(signal, "SIGHUP", None)


def set_json_errors(mode: str | None, *, event: str = "error") -> None:
    """Print errors as JSON on stdout too (``json`` or ``jsonl``), or not (``None``/``text``).
    ``event``: the type of the jsonl event that carries the error (``chat`` ends its stream
    with a ``result`` event, failed or not)."""
    global json_errors, json_error_event
    json_errors = mode if mode != "text" else None
    json_error_event = event


def print_traceback() -> None:
    """The current exception's traceback (chained causes included) on stderr, scrubbed of
    secrets and with terminal control characters made inert."""
    import traceback

    from .render import safe_text

    try:
        sys.stderr.write(safe_text(scrub(traceback.format_exc())))
        sys.stderr.flush()
    except (BrokenPipeError, OSError):  # pragma: no cover
        pass


def json_error(message: str, error_type: str, code: int, session_id: str | None) -> None:
    """In a JSON output mode (:data:`json_errors`), the error as JSON on stdout too: the
    ``chat --output json`` error object, or for jsonl an ``error`` event."""
    if json_errors is None:
        return
    from .render import dumps, event_json

    err = {"error": scrub(message), "error_type": error_type, "exit_code": int(code), "session_id": session_id,
           "is_error": True}
    obj = err if json_errors == "json" else event_json(json_error_event, session_id, err)
    try:
        sys.stdout.write(dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):  # pragma: no cover
        pass


def error_line(message: str, *, prefix: str = "chatflow: error: ") -> None:
    """The error line on stderr: the first line of ``message``, scrubbed of secrets, made inert
    for a terminal, and on a terminal wrapped at spaces as notices are (one line into a pipe)."""
    from .context import stderr_line
    from .render import safe_text

    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    try:
        sys.stderr.write(stderr_line(f"{prefix}{safe_text(scrub(first))}") + "\n")
        sys.stderr.flush()
    except (BrokenPipeError, OSError):  # pragma: no cover
        pass


class _ClosedStdout:
    """Stands for a stdout that was closed before chatflow started (``chatflow … >&-``): every
    write fails as a write into a pipe whose reader has gone, so it takes the same path."""

    encoding = "utf-8"
    errors = "strict"

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "stdout is closed")

    def flush(self) -> None:
        """Nothing is ever buffered."""

    def fileno(self) -> int:
        return 1

    def isatty(self) -> bool:
        return False


def fill_closed_standard_streams() -> None:
    """A standard stream closed at start (Python sets it to ``None``): give its file
    descriptor ``/dev/null``, so no file chatflow opens (the database) can take fd 0, 1 or 2;
    stdout becomes :class:`_ClosedStdout`, stdin reads nothing, stderr is dropped."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
        except OSError:
            try:
                devnull = os.open(os.devnull, os.O_RDWR)
                if devnull != fd:
                    os.dup2(devnull, fd)
                    os.close(devnull)
            except OSError:  # pragma: no cover - /dev/null missing
                pass
        if name == "stdout":
            sys.stdout = _ClosedStdout()
        else:
            setattr(sys, name, open(os.devnull, "r" if fd == 0 else "w", encoding="utf-8"))


#: errno values of a stdout that cannot take the output (``> /dev/full``, a full disk, I/O error).
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG})


class ReaderGone(Exception):
    """stdout was closed by its reader (EPIPE) while a command wrote to it."""


class Stopped(BaseException):
    """Ctrl-C or SIGTERM (a ``KeyboardInterrupt``) stopped a command that had nothing of its
    own to say about it; a ``BaseException`` that typer's ``main`` lets through."""


def reader_gone_is_ours(command: Any) -> None:
    """Make a closed stdout reach :func:`main` as :class:`ReaderGone`, and a
    ``KeyboardInterrupt`` as :class:`Stopped`.

    click's ``main`` turns an EPIPE raised inside it into ``sys.exit(1)``, and typer's a
    ``KeyboardInterrupt`` into a silent exit 130 (even after SIGTERM); wrapping the root
    command's ``make_context`` (parsing, where ``--help`` prints) and ``invoke`` (which runs
    every subcommand) hands both to chatflow's boundary instead, so every command ends the
    same way: quietly for a gone reader, ``chatflow: interrupted`` (130) or ``chatflow:
    terminated (SIGTERM)`` (143) for a signal.
    """

    def guard(method: Any) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except BrokenPipeError:
                raise ReaderGone() from None
            except KeyboardInterrupt:
                raise Stopped() from None

        return guarded

    command.make_context = guard(command.make_context)
    command.invoke = guard(command.invoke)


def check_utf8_args(args: list[str]) -> None:
    """Bytes that are not UTF-8 in argv arrive as lone surrogates (PEP 383); refuse them (exit 2)."""
    for position, arg in enumerate(args, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UsageError(f"argument {position} is not valid UTF-8 (bad byte at offset {exc.start})") from None
