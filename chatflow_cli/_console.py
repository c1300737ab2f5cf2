"""The terminal environment of one command: streams, whether each is a terminal, colour.

Commands never look at ``sys.stdout.isatty()`` themselves; they ask :class:`Env`, so that
terminal-versus-pipe behaviour is decided in one place and tests can inject it.

Colour and Live display only on a terminal: ``color`` is false when stdout is
not a terminal, when ``NO_COLOR`` is set to anything non-empty (https://no-color.org), or
with ``--no-color``. ``TERM=dumb`` also turns colour off.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

__all__ = ["Env"]


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


@dataclass
class Env:
    stdin: IO[Any] = field(default_factory=lambda: sys.stdin)
    stdout: IO[Any] = field(default_factory=lambda: sys.stdout)
    stderr: IO[Any] = field(default_factory=lambda: sys.stderr)
    stdin_isatty: bool = False
    stdout_isatty: bool = False
    stderr_isatty: bool = False
    color: bool = False
    no_color_flag: bool = False
    _consoles: dict[str, Console] = field(default_factory=dict, repr=False)

    @classmethod
    def from_sys(cls, *, no_color: bool = False, environ: Mapping[str, str] | None = None) -> "Env":
        environ = os.environ if environ is None else environ
        env = cls(
            stdin=sys.stdin,
            stdout=sys.stdout,
            stderr=sys.stderr,
            stdin_isatty=_isatty(sys.stdin),
            stdout_isatty=_isatty(sys.stdout),
            stderr_isatty=_isatty(sys.stderr),
        )
        env.no_color_flag = no_color
        env.color = (
            env.stdout_isatty
            and not no_color
            and not environ.get("NO_COLOR")
            and environ.get("TERM", "") != "dumb"
        )
        return env

    @property
    def interactive(self) -> bool:
        """Both stdin and stdout are terminals: prompts, pagers and the REPL are allowed."""
        return self.stdin_isatty and self.stdout_isatty

    def console(self, *, stderr: bool = False, file: IO[Any] | None = None, terminal: bool | None = None) -> Console:
        """A ``rich.console.Console`` on stdout (or stderr, or ``file``).

        Markup, emoji codes and highlighting are off: all text chatflow prints is either
        its own or made safe by :func:`chatflow_cli.render.safe_text`, and is printed as
        ``rich.text.Text``, never parsed as markup.
        """
        key = "err" if stderr else ("out" if file is None else f"file{id(file)}")
        if key in self._consoles:
            return self._consoles[key]
        stream = file if file is not None else (self.stderr if stderr else self.stdout)
        is_tty = terminal if terminal is not None else (self.stderr_isatty if stderr else self.stdout_isatty)
        colour = is_tty and not self.no_color_flag and not os.environ.get("NO_COLOR")
        console: Console = _console_class()(
            file=stream,
            force_terminal=is_tty,
            no_color=not colour,
            color_system="auto" if colour else None,
            markup=False,
            emoji=False,
            highlight=False,
            soft_wrap=False,
        )
        self._consoles[key] = console
        return console


_CONSOLE_CLASS: Any = None


def _console_class() -> Any:
    """``rich.console.Console`` whose broken-pipe handling raises ``BrokenPipeError``.

    Rich's own handler exits with status 1; chatflow's error boundary ends quietly with 0
    instead (``chatflow sessions ls | head -1`` is not an error).
    """
    global _CONSOLE_CLASS
    if _CONSOLE_CLASS is None:
        from rich.console import Console

        class _Console(Console):
            def on_broken_pipe(self) -> None:
                self.quiet = True
                raise BrokenPipeError

        _CONSOLE_CLASS = _Console
    return _CONSOLE_CLASS
