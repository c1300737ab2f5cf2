"""The REPL run in process: prompt-toolkit pipe input, Rich output into a StringIO, the fake server.

A :class:`Driver` takes a script written as a function of the driver
(``d.type("hello\\r")``, ``d.wait_for(...)``); ``d.run(script)`` runs
:func:`chatflow_cli.repl.run_repl` in this (main) thread while the script types from
another one. The script always ends the REPL with Ctrl-D, even when it fails.

What the REPL prints goes to a Rich console (``d.screen()``); what its prompts draw goes to a
recording prompt-toolkit output (``d.drawn_text()``). A prompt turns bracketed paste on when it
starts reading keys and off when it ends, so ``d.prompt_active()`` tells whether the REPL
waits for keys: scripts wait for that, never for a fixed time, before keys that only a
prompt understands (Ctrl-R, Esc-Enter, the answer to a question).
The ``repl_driver`` fixture (tests/repl/conftest.py) builds one on the fake server.
"""

from __future__ import annotations

import io
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from tests.helpers.vt import Terminal
from tests.helpers.wait import wait_until

#: What prompt-toolkit writes when a prompt starts and stops reading keys.
PASTE_ON, PASTE_OFF = "\x1b[?2004h", "\x1b[?2004l"
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Driver:
    def __init__(self, server: Any, home: Path, config: Path) -> None:
        self.server = server
        self.home = home
        self.config = config
        self.out = io.StringIO()
        self.console = Console(file=self.out, width=80, height=24, force_terminal=True, color_system=None)
        self.input: Any = None
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self.kwargs: dict[str, Any] = {}
        self.drawn: io.StringIO | None = None

    # -- used by tests and scripts
    def write_config(self, text: str) -> None:
        """Write ``config.toml`` where ``CHATFLOW_CONFIG`` points; the REPL reads it when it starts."""
        assert os.environ["CHATFLOW_CONFIG"] == str(self.config)
        self.config.write_text(text, encoding="utf-8")

    def type(self, text: str) -> None:
        self.input.send_text(text)

    def wait_for(self, condition: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
        try:
            return wait_until(condition, timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; output so far:\n{self.screen()}") from None

    def wait_text(self, text: str, count: int = 1, timeout: float = 15.0) -> None:
        self.wait_for(lambda: self.screen().count(text) >= count, timeout, what=repr(text))

    def drawn_text(self) -> str:
        """Everything the prompts drew so far, escape sequences included."""
        return self.drawn.getvalue() if self.drawn is not None else ""

    def prompt_active(self) -> bool:
        """True while a prompt (the message prompt or a question) reads keys."""
        drawn = self.drawn_text()
        return drawn.count(PASTE_ON) > drawn.count(PASTE_OFF)

    def wait_prompt(self, timeout: float = 15.0) -> None:
        """Wait until a prompt reads keys (the turn or command before it has ended)."""
        self.wait_for(self.prompt_active, timeout, what="a prompt reading keys")

    def wait_drawn(self, text: str, *, after: int = 0, timeout: float = 15.0) -> None:
        """Wait until a prompt draws ``text`` (escape sequences left out), looking only past
        offset ``after`` of :meth:`drawn_text` (take it with ``len(d.drawn_text())`` before the keys)."""
        self.wait_for(lambda: text in _ESCAPES.sub("", self.drawn_text()[after:]), timeout,
                      what=f"the prompt to draw {text!r}")

    def requests(self) -> list[Any]:
        return [r for r in self.server.requests if isinstance(r, dict) and "messages" in r]

    def screen(self) -> str:
        term = Terminal(80, 24)
        term.feed(self.out.getvalue())
        return "\n".join(term.logical_lines())

    def store(self) -> Any:
        from chatflow_cli.core.sqlite_store import SQLiteSessionStore

        return SQLiteSessionStore(str(self.home / "chatflow.db"))

    # -- running
    def run(self, script: Callable[[Driver], None], **kwargs: Any) -> None:
        from prompt_toolkit.input import create_pipe_input

        from chatflow_cli.context import Env, State
        from chatflow_cli.repl import run_repl

        def drive() -> None:
            try:
                script(self)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
                self.error = exc
            finally:
                for _ in range(3):
                    try:
                        self.type("\x03\x04")
                    except Exception:  # noqa: BLE001 - the input may be closed already
                        break
                    time.sleep(0.1)

        state = State(env=Env(stdin_isatty=True, stdout_isatty=True))
        with create_pipe_input() as pipe:
            self.input = pipe
            thread = threading.Thread(target=drive, daemon=True)
            thread.start()
            output = kwargs.pop("output", None)
            if output is None:
                _, output = recording_output(self)
            self.exit_code = run_repl(state, input=pipe, output=output, console=self.console, **kwargs)
            thread.join(10)
        state.close()
        if self.error is not None:
            raise self.error


def recording_output(d: Driver) -> tuple[io.StringIO, Any]:
    """A prompt-toolkit output that records what the prompts draw (and answers cursor queries).

    It becomes ``d.drawn``; :meth:`Driver.run` makes one when no ``output`` is given.
    """
    from prompt_toolkit.data_structures import Size
    from prompt_toolkit.output.vt100 import Vt100_Output

    class Recording(io.StringIO):
        encoding = "utf-8"

        def isatty(self) -> bool:
            return True

        def write(self, data: str) -> int:
            if "\x1b[6n" in data:
                d.type("\x1b[1;1R")
            return super().write(data)

    screen = Recording()
    d.drawn = screen
    return screen, Vt100_Output(screen, lambda: Size(rows=24, columns=80), term="xterm")


def turn_done(d: Driver, text: str) -> None:
    """Wait for ``text`` of a reply, then for the next prompt: keys typed while a turn runs
    are type-ahead (printable text only), not keys for the next prompt."""
    d.wait_text(text)
    d.wait_prompt()
