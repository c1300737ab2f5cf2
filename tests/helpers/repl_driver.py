"""The REPL run in process: prompt-toolkit pipe input, Rich output into a StringIO, the fake server.

A :class:`Driver` takes a script written as a function of the driver
(``d.type("hello\\r")``, ``d.wait_for(...)``); ``d.run(script)`` runs
:func:`chatflow_cli.repl.run_repl` in this (main) thread while the script types from
another one. The script always ends the REPL with Ctrl-D, even when it fails.
The ``repl_driver`` fixture (tests/repl/conftest.py) builds one on the fake server.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from tests.helpers.vt import Terminal


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

    # -- used by scripts
    def type(self, text: str) -> None:
        self.input.send_text(text)

    def wait_for(self, condition: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}; output so far:\n{self.screen()}")

    def wait_text(self, text: str, count: int = 1, timeout: float = 15.0) -> None:
        self.wait_for(lambda: self.screen().count(text) >= count, timeout, what=repr(text))

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
        from prompt_toolkit.output import DummyOutput

        from chatflow_cli._console import Env
        from chatflow_cli.cli import State
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
            self.exit_code = run_repl(
                state, input=pipe, output=kwargs.pop("output", DummyOutput()), console=self.console, **kwargs
            )
            thread.join(10)
        state.close()
        if self.error is not None:
            raise self.error


def recording_output(d) -> tuple[io.StringIO, Any]:
    """A prompt-toolkit output that records what the prompts draw (and answers cursor queries)."""
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
    return screen, Vt100_Output(screen, lambda: Size(rows=24, columns=80), term="xterm")
