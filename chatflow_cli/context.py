"""The floor every command stands on: the run's :class:`State` and its terminals
(:class:`Env`), notices, confirmation, stdin, session ids, and how the run ends (errors as
JSON too, the signal that stopped it).

One low module, imported by every command and by the REPL, that imports no command: the
global options (``--db``, ``--config``, ``--debug``, ``--no-color``) become a :class:`State`,
whose :class:`Env` says which streams are terminals. Commands print one-line notes with
:func:`notice`, ask with :func:`confirm` and read piped input with :func:`read_stdin_text`,
so terminal-versus-pipe behaviour is decided here and nowhere else. Every front-end checks a
session id with :func:`validate_session_id` and makes a new one with :func:`new_session_id`.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Mapping

from .core.errors import UsageError
from .redaction import remember_secret

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from .config import Settings
    from .core.memory import BaseSessionStore

__all__ = ["SESSION_ID_MAX", "Env", "State", "confirm", "interrupted_code", "new_session_id", "notice",
           "read_stdin_text", "set_json_errors", "silence_broken_pipe", "state_of", "stopped_text", "terminal_width",
           "stderr_line", "stream_width", "validate_session_id", "wrap_at_spaces", "write_lines"]


# ---------------------------------------------------------------------------------------
# the terminals: streams, whether each is a terminal, colour
# ---------------------------------------------------------------------------------------
# Commands never look at ``sys.stdout.isatty()`` themselves; they ask :class:`Env`, so that
# terminal-versus-pipe behaviour is decided in one place and tests can inject it.
#
# Colour and Live display only on a terminal: ``color`` is false when stdout is not a
# terminal, when ``NO_COLOR`` is set to anything non-empty (https://no-color.org), or with
# ``--no-color``. ``TERM=dumb`` also turns colour off.
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


# ---------------------------------------------------------------------------------------
# the run's state
# ---------------------------------------------------------------------------------------
@dataclass
class State:
    """What the global options set up, shared by every command of one run (``ctx.obj``).

    Attributes:
        db: ``--db``: the SQLite file or ``postgresql://`` URL, or ``None`` (``$CHATFLOW_DB``,
            config.toml's ``db``, else the data directory's ``chatflow.db``).
        config: ``--config``: the config file, or ``None`` for the default place.
        debug: ``--debug``: tracebacks and debug logs on errors.
        no_color: ``--no-color``.
        env: The run's streams and whether each is a terminal.
    """

    db: str | None = None
    config: str | None = None
    debug: bool = False
    no_color: bool = False
    env: Env = field(default_factory=Env.from_sys)
    _settings: dict[tuple[str | None, str | None], Settings] = field(default_factory=dict)
    _stores: list[BaseSessionStore] = field(default_factory=list)

    def settings(self, *, model: str | None = None, base_url: str | None = None) -> Settings:
        """The settings in effect with ``model`` and ``base_url`` as flags (read once each).

        The API key read is recorded as a secret (:func:`chatflow_cli.redaction.remember_secret`).

        Raises:
            ConfigError: The config file is malformed or invalid.
        """
        key = (model, base_url)
        if key not in self._settings:
            from .config import load_settings

            self._settings[key] = load_settings(db=self.db, config=self.config, model=model, base_url=base_url)
            remember_secret(self._settings[key].api_key)
            remember_secret(_url_password(self._settings[key].base_url))
        return self._settings[key]

    def forget_settings(self) -> None:
        """Drop the settings read so far (``--config`` was given after the command)."""
        self._settings.clear()

    def db_location(self) -> str:
        """The database: ``--db``, ``$CHATFLOW_DB``, config.toml's ``db`` or the data directory's
        ``chatflow.db`` -- a SQLite path or a ``postgresql://`` URL. A URL's password, and
        ``$PGPASSWORD``, are recorded as secrets (never printed).

        Raises:
            ConfigError: The config file is malformed or invalid.
        """
        from .config import database_location
        from .core.dsn import dsn_password, is_postgres_url, normalize_url, raw_url_password, url_problem

        location = database_location(self.db, self.config)
        if is_postgres_url(location):
            location = normalize_url(location)
            remember_secret(os.environ.get("PGPASSWORD"))
            remember_secret(raw_url_password(location))  # as written, even when malformed
            problem = url_problem(location)  # a malformed URL is bad input (exit 2), said without the URL
            if problem is not None:
                raise UsageError(problem)
            remember_secret(dsn_password(location))
        return location

    def store(self, *, create: bool = True) -> BaseSessionStore | None:
        """The session store -- PostgreSQL for a ``postgresql://`` URL, else SQLite -- or ``None``
        when ``create=False`` and no SQLite file exists yet.

        Read-only commands pass ``create=False`` so that looking creates nothing. Every
        store opened is closed by :meth:`close`.

        Raises:
            StoreError: The database cannot be opened (corrupt, unreadable, newer schema; a
                PostgreSQL server that refuses the connection or the credentials).
        """
        from .core.dsn import is_postgres_url

        location = self.db_location()
        store: BaseSessionStore
        if is_postgres_url(location):
            from .core.memory.postgres import PostgresSessionStore

            store = PostgresSessionStore(location)
        else:
            path = Path(location)
            if not create and not path.exists():
                return None
            if create and not self.db:
                from .config import ensure_private_dir

                ensure_private_dir(path.parent)
            from .core.sqlite_store import SQLiteSessionStore

            store = SQLiteSessionStore(str(path))
        self._stores.append(store)
        return store

    def open_store(self) -> BaseSessionStore:
        """The session store, created when it does not exist yet."""
        store = self.store()
        assert store is not None  # create=True always opens one
        return store

    def close(self) -> None:
        """Close every store this run opened; a failure to close never hides the outcome."""
        for store in self._stores:
            try:
                store.close()
            except Exception:  # pragma: no cover - closing never hides the real outcome
                pass
        self._stores.clear()

    def out(self) -> Console:
        """The ``rich`` console on stdout."""
        return self.env.console()

    def err(self) -> Console:
        """The ``rich`` console on stderr."""
        return self.env.console(stderr=True)


def _url_password(url: str | None) -> str | None:
    """The password of ``url``'s ``user:password@`` (as written), or None."""
    if not url or "@" not in url:
        return None
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).password
    except ValueError:
        return None


def state_of(ctx: Any) -> State:
    """The run's :class:`State` from a click/typer context (made on first use).

    Args:
        ctx: Any context of the run; its root context carries the state as ``obj``.
    """
    root = ctx.find_root()
    if not isinstance(root.obj, State):
        root.obj = State()
    return root.obj


def notice(state: State, text: str) -> None:
    """A one-line note for the person at the terminal, ``chatflow: <text>`` on stderr.

    On a terminal a note longer than its width is wrapped at spaces (continuation lines
    indented by two), never inside a word; a single word longer than a line (a path, a URL)
    is left whole for the terminal to fold. Into a pipe it stays one line.

    Args:
        state: The run.
        text: The note; control characters are made inert.
    """
    from .render import safe_text

    state.env.stderr.write(wrap_at_spaces(f"chatflow: {safe_text(text)}", _stderr_width(state)) + "\n")
    state.env.stderr.flush()


def wrap_at_spaces(text: str, width: int | None, *, indent: str = "  ") -> str:
    """``text`` wrapped at spaces to ``width`` columns (``None``: as it is), continuation
    lines indented by ``indent``; never inside a word: a word longer than a line (a path,
    a URL) is left whole for the terminal to fold. Each line of ``text`` is wrapped apart."""
    if width is None or len(text) <= width:
        return text
    import textwrap

    return "\n".join("\n".join(textwrap.wrap(part, width, subsequent_indent=indent, break_long_words=False,
                                             break_on_hyphens=False)) or part
                     for part in text.split("\n"))


def _stderr_width(state: State) -> int | None:
    """The width of the terminal stderr writes to, or ``None`` when it is no terminal."""
    if not state.env.stderr_isatty:
        return None
    return stream_width(state.env.stderr)


def stream_width(stream: Any) -> int | None:
    """The width in columns of the terminal ``stream`` writes to, or ``None`` when it is no
    terminal (a pipe, a file) or narrower than 20 columns (then lines are left whole)."""
    try:
        if not stream.isatty():
            return None
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None
    return columns if columns >= 20 else None


def stderr_line(text: str) -> str:
    """``text`` as chatflow writes a line to stderr: wrapped at spaces on a terminal
    (:func:`wrap_at_spaces`), whole into a pipe. Notices and error lines both go through it."""
    return wrap_at_spaces(text, stream_width(sys.stderr))


def terminal_width(state: State) -> int | None:
    """The terminal's width in cells, or ``None`` into a pipe (no width limit)."""
    return state.out().width if state.env.stdout_isatty else None


def write_lines(state: State, lines: list[Any]) -> None:
    """Write styled lines (:class:`chatflow_cli.render.Lines`) to stdout in one call:
    coloured on a terminal (unless colour is off), plain into a pipe."""
    colors = None
    if state.env.stdout_isatty:
        console = state.out()
        colors = None if console.no_color else console.color_system
    state.env.stdout.write("".join(line.ansi(colors) + "\n" for line in lines))


def read_stdin_text(state: State, *, what: str = "message") -> str:
    """All of stdin as text.

    Args:
        state: The run, whose ``env.stdin`` is read to its end.
        what: What stdin holds, for the error message.

    Raises:
        UsageError: stdin is not valid UTF-8; the message names the byte offset.
    """
    stream = state.env.stdin
    buffer = getattr(stream, "buffer", None)
    raw: str | bytes = buffer.read() if buffer is not None else stream.read()
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"the {what} on stdin is not valid UTF-8 (bad byte at offset {exc.start})") from None


def confirm(state: State, question: str, *, assume_yes: bool) -> bool:
    """Ask ``question [y/N]`` on stderr and read the answer from stdin.

    Args:
        state: The run.
        question: The question, without the ``[y/N]``.
        assume_yes: ``--yes``: answer yes without asking.

    Returns:
        ``True`` for yes (also when stdin is not a terminal: the caller decides whether a
        script may go ahead), ``False`` for anything but ``y``/``yes``.
    """
    if assume_yes:
        return True
    if not state.env.stdin_isatty:
        return True
    state.env.stderr.write(wrap_at_spaces(f"{question} [y/N]", _stderr_width(state)) + " ")
    state.env.stderr.flush()
    answer = state.env.stdin.readline()
    return answer.strip().lower() in {"y", "yes"}


def silence_broken_pipe() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover
        pass

# ---------------------------------------------------------------------------------------
# session ids: which ids chatflow creates, and fresh ids
# ---------------------------------------------------------------------------------------
# Ids are database keys, never paths, but spaces, quotes, slashes and control characters make
# ids hard to type and to pass around safely, so every front-end (``chat``, ``sessions``,
# ``replay``, the REPL's ``/switch``) refuses them with the same rule. A session stored by a
# library user under any other id can still be read: commands check an id against this policy
# only once a look-up for it failed.

#: The longest session id chatflow creates, in characters.
SESSION_ID_MAX = 128

# The first character is not '-' (it would read as an option); '.' and '..' are refused apart.
_SESSION_ID_RE = re.compile(r"[A-Za-z0-9._:@+=][A-Za-z0-9._:@+=-]*")


def validate_session_id(session_id: str) -> str:
    """Check ``session_id`` against the policy and return it unchanged.

    A valid id has 1-128 letters, digits and ``. _ - : @ + =``, does not start with ``-``
    and is not ``.`` or ``..``.

    Args:
        session_id: The id as the user typed it.

    Returns:
        ``session_id``.

    Raises:
        UsageError: The id breaks the policy (exit 2); the message shows at most 40 of its
            characters, made safe for a terminal.
    """
    if (
        not session_id
        or len(session_id) > SESSION_ID_MAX
        or not _SESSION_ID_RE.fullmatch(session_id)
        or session_id in {".", ".."}
    ):
        from .render import safe_text

        shown = safe_text(session_id[:40]) + ("…" if len(session_id) > 40 else "")
        raise UsageError(
            f"invalid session id {shown!r}: use 1-{SESSION_ID_MAX} letters, digits, '.', '_', '-', ':', '@', '+' or '='"
        )
    return session_id


def new_session_id() -> str:
    """A fresh, sortable session id: ``YYYYMMDD-HHMMSS-<6 hex>`` (local time, 24 random bits)."""
    import secrets
    import time

    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)

# ---------------------------------------------------------------------------------------
# how the run ends: errors as JSON too, the signal that stopped it
# ---------------------------------------------------------------------------------------
# The error boundary (:func:`chatflow_cli.cli.main`) reads these; commands and the REPL set
# them, and nothing imports the command line module, so they live here.

#: ``json``/``jsonl`` while a command prints JSON: an error is then also printed as a JSON
#: object on stdout (``{"schema", "type": "error", "is_error": true, ...}``), as ``chat --json`` does.
json_errors: str | None = None
json_error_event = "error"


#: The signal that stopped this run first (SIGTERM or SIGHUP), or None: Ctrl-C, or nothing.
terminated_by: int | None = None


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
