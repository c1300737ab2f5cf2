"""The REPL's terminal: raw mode for the whole run, SIGHUP, and library warnings as REPL lines.

:class:`TerminalModes` is mixed into :class:`~chatflow_cli.repl.app.Repl`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

from ..render import safe_text
from .host import ReplHost, TurnLines

__all__ = ["HANGUP_WAIT_S", "TerminalModes"]

#: After SIGHUP, how long the REPL waits for an interrupted turn still closing before it exits.
HANGUP_WAIT_S = 15.0


class TerminalModes(ReplHost):
    """Raw and cooked terminal modes, the hang-up handler and the warnings queue of
    :class:`~chatflow_cli.repl.app.Repl`."""

    @contextlib.contextmanager
    def _raw_terminal(self) -> Iterator[None]:
        """Keep the terminal in raw mode for the whole run, also between prompts and turns.

        In the terminal's cooked mode, Ctrl-D is not a key but an end-of-file that the line
        discipline swallows when raw mode comes back: a Ctrl-D pressed right as a reply ends
        (or while a command prints) would be lost. Raw mode only changes how keys are read
        (output is processed as before); the editor runs in cooked mode.
        """
        with _mode(self.input.raw_mode):
            yield

    @contextlib.contextmanager
    def _cooked_terminal(self) -> Iterator[None]:
        """The terminal's cooked mode for as long as the block runs (the editor)."""
        with _mode(self.input.cooked_mode):
            yield

    @contextlib.contextmanager
    def _hangup_handler(self) -> Iterator[None]:
        """SIGHUP (the terminal closed) and SIGTERM are handled like Ctrl-C during a turn, then
        the REPL leaves.

        A running turn is cancelled and the Runner stores it as interrupted with the partial
        reply (not left ``running`` for the next command to recover); a prompt on screen ends
        as Ctrl-D would. After SIGHUP output goes nowhere (the terminal is gone) and the REPL
        exits 129; after SIGTERM it says ``terminated (SIGTERM)`` and exits 143: the codes of
        a one-shot ``chat`` stopped by the same signals (128 + the signal's number). The
        handlers are the REPL's only while it runs; the previous ones are put back after.
        """
        loop = asyncio.get_running_loop()
        handlers = [(sig, handler) for sig, handler in ((getattr(signal, "SIGHUP", None), self._hang_up),
                                                        (getattr(signal, "SIGTERM", None), self._terminate))
                    if sig is not None]
        installed: list[tuple[signal.Signals, Any]] = []
        try:
            for sig, handler in handlers:
                previous = signal.getsignal(sig)
                loop.add_signal_handler(sig, handler)
                installed.append((sig, previous))
        except (NotImplementedError, RuntimeError, ValueError, TypeError):  # not the main thread
            pass
        try:
            yield
        finally:
            for sig, previous in installed:
                loop.remove_signal_handler(sig)
                if previous is not None:
                    signal.signal(sig, previous)

    def _terminate(self) -> None:
        """SIGTERM: stop the turn as Ctrl-C does (its partial reply kept), then leave (exit 143)."""
        from .. import context

        context.terminated_by = signal.SIGTERM
        self.terminated = True
        self._stop_and_leave()

    def _hang_up(self) -> None:
        """SIGHUP: stop the turn as Ctrl-C does (its partial reply kept), then leave without a word (exit 129)."""
        self.hung_up = True
        if self._devnull is None:
            self._devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - closed when run() ends
            self.console.file = self._devnull
        self._stop_and_leave()

    def _stop_and_leave(self) -> None:
        self.done = True
        if self._turn_interrupt is not None:
            self._turn_interrupt()
            return
        for session in (self.prompt_session, self._ask_session):
            app = session.app
            if app.is_running and app.future is not None and not app.future.done():
                app.exit(exception=EOFError())

    async def _let_the_turn_close(self) -> None:
        """After a hang-up: wait (at most :data:`HANGUP_WAIT_S`) for an interrupted turn still closing."""
        thread = self._closing
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, HANGUP_WAIT_S)

    @contextlib.contextmanager
    def _log_notes(self) -> Iterator[None]:
        """Show library warnings as REPL lines instead of raw stderr writes.

        Without ``--debug``, the root's :class:`~chatflow_cli.redaction.PlainLogHandler`
        would write warnings straight to stderr, in the middle of the live reply; it is
        taken off while the REPL runs. Records are queued (they may come from
        worker threads) and printed by the loop: above the live tail during a turn, or
        before the next prompt.
        """
        from ..redaction import PlainLogHandler, ScrubbingFilter

        root = logging.getLogger()
        plain = [h for h in root.handlers if isinstance(h, PlainLogHandler)]  # queued instead, while the REPL runs
        if any(_writes_to_terminal(h) for h in root.handlers if h not in plain):  # --debug logging: leave it as it is
            yield
            return
        handler = _QueueHandler(self._notes)
        handler.setLevel(logging.WARNING)
        handler.addFilter(ScrubbingFilter())  # a queued record holds no secret either
        for h in plain:
            root.removeHandler(h)
        root.addHandler(handler)
        try:
            yield
        finally:
            root.removeHandler(handler)
            for h in plain:
                root.addHandler(h)
            self._print_notes()

    def _print_notes(self, view: TurnLines | None = None) -> None:
        from rich.text import Text

        while self._notes:
            record = self._notes.popleft()
            line = Text(f"{record.levelname.lower()}: {safe_text(record.getMessage())}", style="yellow")
            if view is not None:
                view.line(line)
            else:
                self.console.print(line)


def _writes_to_terminal(handler: logging.Handler) -> bool:
    import sys

    stream = getattr(handler, "stream", None)
    return stream is not None and stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)


class _QueueHandler(logging.Handler):
    """A logging handler that only queues records; the REPL loop prints them."""

    def __init__(self, queue: collections.deque[logging.LogRecord]) -> None:
        super().__init__()
        self.queue = queue

    def emit(self, record: logging.LogRecord) -> None:
        self.queue.append(record)


@contextlib.contextmanager
def _mode(make: Callable[[], Any]) -> Iterator[None]:
    """The terminal mode ``make()`` gives (a context manager) while the block runs; none when
    the input is no terminal. Leaving the mode never raises."""
    try:
        mode = make()
        mode.__enter__()
    except Exception:  # noqa: BLE001 - not a terminal: nothing to keep
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            mode.__exit__(None, None, None)
