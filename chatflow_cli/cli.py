"""The ``chatflow`` command line: a thin typer shell over :mod:`chatflow_cli.core`.

Each command opens the store, calls the library, and formats the result. Heavy modules
(``openai``, ``prompt_toolkit``, ``rich.markdown``, ``llama_cpp``) are imported only inside
the commands that need them, so ``chatflow --help``, ``sessions ls`` and ``sessions show``
(into a pipe) start fast; a test checks ``sys.modules`` after each (issue 5).

Errors: :func:`main` is the one error boundary. A :class:`~chatflow_cli.core.errors.ChatflowError`
becomes one line on stderr, ``chatflow: error: <message>``, and the process exits with the
error's code; ``--debug`` (or ``CHATFLOW_DEBUG=1``) shows the traceback instead. Ctrl-C
exits 130. A reader that closes stdout early (``chatflow sessions show ID | head -1``,
``chatflow replay ID --json | head -c 10``), or a stdout closed before the start (``>&-``), ends
every command quietly with exit 0: nothing on stderr, the rest of the output dropped (a ``chat``
whose reader left stops its turn, kept as interrupted). A gone reader never hides an outcome:
an error still prints its line on stderr and exits with its code, a cut reply still exits 10.

Exit codes (the README has the same table; values from
:class:`chatflow_cli.core.errors.ExitStatus`):

====  ============  ======================================================================
code  name          when
====  ============  ======================================================================
0     SUCCESS       done (also: a duplicate ``--message-id``, which is skipped on purpose)
1     ERROR         an unexpected error (a bug: please report it with ``--debug`` output);
                    also: stdout cannot be written (``> /dev/full``, disk full, I/O error)
2     USAGE         bad arguments or input: unknown flag, invalid session id, empty or
                    non-UTF-8 message, malformed ``--input jsonl`` line, bad ``--tool-result``
3     NOT_FOUND     the session (or agent) does not exist
4     SESSION_BUSY  another process is running a turn on the session (see ``--wait``), or
                    the session is terminated
5     PROVIDER      the model server refused or failed: 401/403, unknown model, 400,
                    invalid reply, tool-round limit, local model server failed to start
                    or crashed
6     NETWORK       connection refused/reset, DNS failure, timeout
7     RATE_LIMITED  429/5xx after retries; the session is marked rescheduled
8     STORE         the database cannot be opened, read or written (corrupt, read-only,
                    disk full, newer schema)
9     CONFIG        a bad config file, or no model configured
10    INCOMPLETE    the reply was cut by the token limit or a content filter
                    (``finish_reason`` ``length``/``content_filter``); the turn is stored, marked
130   INTERRUPTED   Ctrl-C; an interrupted turn is kept as interrupted
====  ============  ======================================================================
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterator, Optional

import typer

from . import __version__
from ._console import Env
from .core.errors import ChatflowError, ExitStatus, NotFoundError, SessionNotFoundError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from .config import Settings

__all__ = ["app", "main"]

PROG = "chatflow"
COMPLETE_VAR = "_CHATFLOW_COMPLETE"

app = typer.Typer(
    name=PROG,
    help="Chat with OpenAI-compatible models from the terminal; sessions are kept in SQLite.",
    epilog=("--db, --config, --debug and --no-color may also follow the command.\n\n"
            "Example: chatflow chat \"What is the capital of France?\""),
    rich_markup_mode=None,  # plain help: fast, and no rich.markdown import
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    no_args_is_help=False,
    invoke_without_command=True,
)
sessions_app = typer.Typer(
    help="List, show, roll back and delete stored sessions.",
    epilog="Example: chatflow sessions ls --limit 10",
    rich_markup_mode=None,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
agents_app = typer.Typer(
    help="The agents configured in config.toml.",
    epilog="Example: chatflow agents ls",
    rich_markup_mode=None,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
config_app = typer.Typer(
    help="Where the config file is, and the settings in effect.",
    epilog="Example: chatflow config show",
    rich_markup_mode=None,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(sessions_app, name="sessions")
app.add_typer(agents_app, name="agents")
local_app = typer.Typer(
    help="The local model's warm llama.cpp server: whether one runs, and stopping it.",
    epilog="Example: chatflow local status",
    rich_markup_mode=None,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(config_app, name="config")
app.add_typer(local_app, name="local")


# ---------------------------------------------------------------------------------------
# per-invocation state
# ---------------------------------------------------------------------------------------
@dataclass
class State:
    """What the global options set up, shared by every command (``ctx.obj``)."""

    db: str | None = None
    config: str | None = None
    debug: bool = False
    no_color: bool = False
    env: Env = field(default_factory=Env.from_sys)
    _settings: dict[tuple[Any, ...], Settings] = field(default_factory=dict)
    _stores: list[Any] = field(default_factory=list)

    def settings(self, *, model: str | None = None, base_url: str | None = None) -> Settings:
        key = (model, base_url)
        if key not in self._settings:
            from .config import load_settings

            self._settings[key] = load_settings(db=self.db, config=self.config, model=model, base_url=base_url)
            remember_secret(self._settings[key].api_key)
        return self._settings[key]

    def db_location(self) -> str:
        """The database: ``--db``, ``$CHATFLOW_DB``, config.toml's ``db`` or the data directory's
        ``chatflow.db`` -- a SQLite path or a ``postgresql://`` URL (its password, and
        ``$PGPASSWORD``, are then registered as secrets the error boundary scrubs)."""
        from .config import database_location
        from .core._dsn import dsn_password, is_postgres_url

        location = database_location(self.db, self.config)
        if is_postgres_url(location):
            remember_secret(dsn_password(location))
            remember_secret(os.environ.get("PGPASSWORD"))
        return location

    def store(self, *, create: bool = True) -> Any:
        """The session store: PostgreSQL for a ``postgresql://`` URL, else SQLite -- or ``None``
        when ``create=False`` and no SQLite file exists yet.

        Read-only commands pass ``create=False`` so that looking creates nothing.
        """
        from .core._dsn import is_postgres_url

        location = self.db_location()
        store: Any
        if is_postgres_url(location):
            from .core.postgres_store import PostgresSessionStore

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

    def close(self) -> None:
        for store in self._stores:
            close = getattr(store, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # pragma: no cover - closing never hides the real outcome
                    pass
        self._stores.clear()

    def out(self) -> Any:
        return self.env.console()

    def err(self) -> Any:
        return self.env.console(stderr=True)


def _state(ctx: typer.Context) -> State:
    obj = ctx.find_root().obj
    if not isinstance(obj, State):
        obj = State()
        ctx.find_root().obj = obj
    return obj


def _notice(state: State, text: str) -> None:
    """A one-line note for the person at the terminal, on stderr."""
    from .render import safe_text

    state.env.stderr.write(f"chatflow: {safe_text(text)}\n")
    state.env.stderr.flush()


# ---------------------------------------------------------------------------------------
# input validation
# ---------------------------------------------------------------------------------------
_SESSION_ID_MAX = 128


def validate_session_id(session_id: str) -> str:
    """A session id chatflow will create: 1-128 letters, digits and ``. _ - : @ + =``, not
    starting with ``-`` and not ``.`` or ``..``.

    Ids are database keys, never paths, but spaces, quotes, slashes and control
    characters make ids hard to type and to pass around safely, so they are refused
    (issue 7) with :class:`UsageError` (exit 2).
    """
    import re

    # The first character is not '-' (it would read as an option) and '.'/'..' are refused.
    if (
        not session_id
        or len(session_id) > _SESSION_ID_MAX
        or not re.fullmatch(r"[A-Za-z0-9._:@+=][A-Za-z0-9._:@+=-]*", session_id)
        or session_id in {".", ".."}
    ):
        from .render import safe_text

        shown = safe_text(session_id[:40]) + ("…" if len(session_id) > 40 else "")
        raise UsageError(
            f"invalid session id {shown!r}: use 1-{_SESSION_ID_MAX} letters, digits, '.', '_', '-', ':', '@', '+' or '='"
        )
    return session_id


def new_session_id() -> str:
    """A fresh, sortable session id: ``YYYYMMDD-HHMMSS-<6 hex>``."""
    import secrets
    import time

    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def read_stdin_text(state: State, *, what: str = "message") -> str:
    """All of stdin as text. Invalid UTF-8 -> :class:`UsageError` naming the byte offset."""
    stream = state.env.stdin
    buffer = getattr(stream, "buffer", None)
    raw = buffer.read() if buffer is not None else stream.read()
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"the {what} on stdin is not valid UTF-8 (bad byte at offset {exc.start})") from None


def parse_metadata(items: list[str] | None) -> dict[str, str] | None:
    """``["k=v", ...]`` -> ``{"k": "v"}``; a missing ``=`` or empty key -> :class:`UsageError`."""
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--metadata {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def parse_duration(text: str) -> float:
    """``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``, ``"2w"`` (or a bare number of days) -> seconds."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not m:
        raise UsageError(f"invalid duration {text!r}: use a number with s, m, h, d or w (like 30d)")
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "": 86400}[m.group(2)]
    return float(m.group(1)) * unit


def confirm(state: State, question: str, *, assume_yes: bool) -> bool:
    """Ask on a terminal; ``--yes`` answers yes. Not on a terminal: the caller decides."""
    if assume_yes:
        return True
    if not state.env.stdin_isatty:
        return True
    state.env.stderr.write(f"{question} [y/N] ")
    state.env.stderr.flush()
    answer = state.env.stdin.readline()
    return answer.strip().lower() in {"y", "yes"}


# ---------------------------------------------------------------------------------------
# completion of session ids (from the store)
# ---------------------------------------------------------------------------------------
def complete_session_id(ctx: typer.Context, incomplete: str) -> list[str]:
    try:
        db = ctx.find_root().params.get("db")
        state = State(db=db)
        store = state.store(create=False)
        if store is None:
            return []
        ids = [s.session_id for s in store.list_sessions(limit=500)]
        state.close()
        return [i for i in ids if i.startswith(incomplete)]
    except Exception:
        return []


STATUSES = ("idle", "running", "rescheduled", "terminated")
SHELLS = ("bash", "zsh", "fish")


def complete_agent_name(ctx: typer.Context, incomplete: str) -> list[str]:
    """The configured agents' names (the default agent's when none are configured)."""
    try:
        from .config import DEFAULT_AGENT_NAME, load_settings

        params = ctx.find_root().params
        settings = load_settings(db=params.get("db"), config=params.get("config"))
        names = [a.name for a in settings.agents] or [DEFAULT_AGENT_NAME]
        return [n for n in names if n.startswith(incomplete)]
    except Exception:
        return []


def complete_status(incomplete: str) -> list[str]:
    return [s for s in STATUSES if s.startswith(incomplete)]


def complete_shell(incomplete: str) -> list[str]:
    return [s for s in SHELLS if s.startswith(incomplete)]


# ---------------------------------------------------------------------------------------
# the root command
# ---------------------------------------------------------------------------------------
def _version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"chatflow {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def root(
    ctx: typer.Context,
    db: Annotated[Optional[str], typer.Option("--db", help="SQLite database file or postgresql:// URL (default: $CHATFLOW_DB, config.toml's db, else chatflow.db in the data dir).", metavar="PATH|URL")] = None,
    config: Annotated[Optional[str], typer.Option("--config", help="config.toml to read (default: $CHATFLOW_CONFIG or the platform config dir).", metavar="PATH")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs on errors.")] = False,
    no_color: Annotated[bool, typer.Option("--no-color", help="No colours (NO_COLOR is honoured too).")] = False,
    session: Annotated[Optional[str], typer.Option("--session", "-s", metavar="ID", help="With no command: the REPL (or the piped message) on this session, created when new.", autocompletion=complete_session_id)] = None,
    continue_: Annotated[bool, typer.Option("--continue", "-c", help="With no command: the REPL (or the piped message) on the most recently updated session.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """Chat with OpenAI-compatible models from the terminal; sessions are kept in SQLite.

    With no command: the REPL on a terminal; otherwise the message is read from stdin.
    --db, --config, --debug and --no-color may also follow the command.
    """
    state = State(db=db, config=config, debug=debug, no_color=no_color, env=Env.from_sys(no_color=no_color))
    ctx.obj = state
    ctx.call_on_close(state.close)
    if ctx.invoked_subcommand is not None:
        if session is not None or continue_:
            flag = "--session" if session is not None else "--continue"
            raise UsageError(f"{flag} before a command opens the REPL; give it to the command instead "
                             f"(chatflow {ctx.invoked_subcommand} {flag} ...)")
        return
    env = state.env
    if env.interactive:
        _start_repl(ctx, state, session_id=session, continue_last=continue_)
        return
    if env.stdin_isatty:
        raise UsageError("stdout is not a terminal: pass the message, e.g. chatflow chat \"hello\" > reply.txt")
    from .chat import ChatOptions, run_chat

    run_chat(state, ChatOptions(session=session, continue_=continue_))


def _start_repl(ctx: typer.Context, state: State, **options: Any) -> None:
    """Open the REPL (chatflow_cli.repl, which alone imports prompt-toolkit)."""
    try:
        from .repl import run_repl
    except ImportError as exc:  # pragma: no cover - the REPL ships with chatflow
        raise UsageError(f"the REPL is not available ({exc}); use chatflow chat MESSAGE") from None
    code = run_repl(state, **options)
    if code:
        raise typer.Exit(code)


# ---------------------------------------------------------------------------------------
# chat
# ---------------------------------------------------------------------------------------
class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    jsonl = "jsonl"


#: ``--output`` of the listing commands, beside their ``--json``.
OutputOption = Annotated[Optional[OutputFormat], typer.Option(
    "--output", "-o", metavar="text|json|jsonl", case_sensitive=False,
    help="text (a table on a terminal), json (one document) or jsonl (one JSON object a line).")]


def _output_format(output: Optional[OutputFormat], json_: bool) -> str:
    """``--output`` and ``--json`` as one format name; both, disagreeing: a usage error.

    In json/jsonl mode an error is also printed as a JSON object on stdout (see :func:`main`)."""
    global _JSON_ERRORS
    if json_ and output not in (None, OutputFormat.json):
        raise UsageError(f"--json means --output json; it cannot go with --output {output.value}")
    fmt = "json" if json_ else (output.value if output is not None else "text")
    _JSON_ERRORS = fmt if fmt != "text" else None
    return fmt


def _terminal_width(state: State) -> int | None:
    """The terminal's width in cells, or ``None`` into a pipe (no width limit)."""
    return state.out().width if state.env.stdout_isatty else None


def _write_lines(state: State, lines: list[Any]) -> None:
    colors = None
    if state.env.stdout_isatty:
        console = state.out()
        colors = None if console.no_color else console.color_system
    state.env.stdout.write("".join(line.ansi(colors) + "\n" for line in lines))


class MessageIdScope(str, Enum):
    global_ = "global"
    session = "session"


class InputFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


@app.command(
    epilog=(
        "\b\nExamples:\n"
        "  chatflow chat \"What is the capital of France?\"\n"
        "  chatflow chat -s support-42 --output json \"Where is my order?\"\n"
        "  git diff | chatflow chat \"review this\"      (the message, a blank line, then stdin)\n"
        "  chatflow chat -s s1 --tool-result call_1 '{\"approved\": true}' --tool-result call_2 no"
    )
)
def chat(
    ctx: typer.Context,
    message: Annotated[Optional[str], typer.Argument(metavar="MESSAGE", help="The message; '-' (or no message with piped stdin) reads stdin.", show_default=False)] = None,
    session: Annotated[Optional[str], typer.Option("--session", "-s", metavar="ID", help="Session id (created when new; a new id is generated and printed to stderr when absent).", autocompletion=complete_session_id)] = None,
    continue_: Annotated[bool, typer.Option("--continue", "-c", help="Continue the most recently updated session.")] = False,
    system: Annotated[Optional[str], typer.Option("--system", metavar="TEXT", help="System prompt for a new session.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", help="Model name ('local' for the embedded llama.cpp model); overrides CHATFLOW_MODEL and config.")] = None,
    base_url: Annotated[Optional[str], typer.Option("--base-url", metavar="URL", help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1; overrides OPENAI_BASE_URL.")] = None,
    agent: Annotated[Optional[str], typer.Option("--agent", "-a", metavar="NAME", help="Start with this configured agent (on an existing session: switch to it).", autocompletion=complete_agent_name)] = None,
    max_turns: Annotated[Optional[int], typer.Option("--max-turns", min=1, metavar="N", help="Turns kept in the context window of a new session.")] = None,
    metadata: Annotated[Optional[list[str]], typer.Option("--metadata", help="KEY=VALUE stored on the session (repeatable).", metavar="KEY=VALUE")] = None,
    message_id: Annotated[Optional[str], typer.Option("--message-id", metavar="ID", help="Webhook message id: an id seen in the last 192 h is skipped (exit 0).")] = None,
    message_id_scope: Annotated[Optional[MessageIdScope], typer.Option("--message-id-scope", metavar="global|session", case_sensitive=False, help="global: an id is one message across all sessions (WhatsApp-style ids); session: ids are per session (Telegram-style chat ids). Default: config message_id_scope, else global.")] = None,
    idempotency_key: Annotated[Optional[str], typer.Option("--idempotency-key", metavar="KEY", help="Resending with the same key returns the stored turn instead of a new one.")] = None,
    tool_result: Annotated[Optional[tuple[str, str]], typer.Option("--tool-result", help="Answer a pending custom tool call with OUTPUT (JSON or plain text, sent as given); repeat it for several calls.", metavar="TOOL_USE_ID OUTPUT")] = None,
    wait: Annotated[float, typer.Option("--wait", min=0, help="Seconds to wait for a busy session before giving up.", metavar="SECONDS")] = 0.0,
    output: Annotated[OutputFormat, typer.Option("--output", "-o", metavar="text|json|jsonl", help="text (rendered on a terminal), json (one object) or jsonl (events).", case_sensitive=False)] = OutputFormat.text,
    json_: Annotated[bool, typer.Option("--json", help="Same as --output json.")] = False,
    input_: Annotated[InputFormat, typer.Option("--input", metavar="text|jsonl", help="jsonl: read user messages and tool results, one JSON object a line, from stdin.", case_sensitive=False)] = InputFormat.text,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the model server.", metavar="SECONDS")] = 60.0,
) -> int | None:
    """Send one message (or several with --input jsonl) and print the reply.

    With no message on a terminal, the REPL opens on the session (-s/-c) instead.
    """
    state = _state(ctx)
    if message is None and not tool_result and input_ is InputFormat.text and state.env.interactive:
        _start_repl(ctx, state, session_id=session, continue_last=continue_, model=model, agent=agent,
                    base_url=base_url, max_turns=max_turns, system=system)
        return
    from .chat import ChatOptions, run_chat

    opts = ChatOptions(
        message=message,
        session=session,
        continue_=continue_,
        system=system,
        model=model,
        base_url=base_url,
        agent=agent,
        max_turns=max_turns,
        metadata=parse_metadata(metadata),
        message_id=message_id,
        message_id_scope=message_id_scope.value if message_id_scope is not None else None,
        idempotency_key=idempotency_key,
        tool_results=[(str(a), str(b)) for a, b in tool_result] if tool_result else None,
        wait=wait,
        output="json" if json_ else output.value,
        input=input_.value,
        timeout=timeout,
    )
    return run_chat(state, opts)


# ---------------------------------------------------------------------------------------
# sessions
# ---------------------------------------------------------------------------------------
@sessions_app.command("ls", epilog="\b\nExamples:\n  chatflow sessions ls\n  chatflow sessions ls --status running --json")
def sessions_ls(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, metavar="N", help="At most this many, newest first (0: all).")] = 50,
    agent: Annotated[Optional[str], typer.Option("--agent", "-a", metavar="NAME", help="Only sessions whose active agent is this.", autocompletion=complete_agent_name)] = None,
    status: Annotated[Optional[str], typer.Option("--status", metavar="STATUS", help="Only this status: idle, running, rescheduled, terminated.", autocompletion=complete_status)] = None,
    output: OutputOption = None,
    json_: Annotated[bool, typer.Option("--json", help="Same as --output json: a JSON array.")] = False,
) -> None:
    """List stored sessions: id, active agent, status, turns, last update, preview."""
    fmt = _output_format(output, json_)
    state = _state(ctx)
    if status is not None and status not in STATUSES:
        raise UsageError(f"--status {status!r}: use idle, running, rescheduled or terminated")
    store = state.store(create=False)
    summaries = [] if store is None else store.list_sessions(limit=limit or None, agent=agent, status=status)
    if fmt != "text":
        from .render import dumps, summary_dict

        rows = [summary_dict(s) for s in summaries]
        text = dumps(rows, indent=2) + "\n" if fmt == "json" else "".join(dumps(r) + "\n" for r in rows)
        state.env.stdout.write(text)
        return
    if not summaries:
        filters = [f"--{name} {value}" for name, value in (("status", status), ("agent", agent)) if value]
        if filters and store is not None and store.latest_session_id() is not None:
            _notice(state, f"no sessions match {' '.join(filters)}")
        else:
            _notice(state, "no sessions yet: start one with chatflow chat \"hello\"")
        return
    from .render import sessions_lines

    _write_lines(state, sessions_lines(summaries, width=_terminal_width(state)))


@sessions_app.command(
    "show",
    epilog="\b\nExamples:\n  chatflow sessions show support-42\n  chatflow sessions show support-42 --all --full\n  chatflow sessions show support-42 --json | jq '.turns[-1]'",
)
def sessions_show(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(metavar="ID", help="Session id.", autocompletion=complete_session_id)],
    all_: Annotated[bool, typer.Option("--all", help="Also show rolled-back turns.")] = False,
    full: Annotated[bool, typer.Option("--full", help="Do not fold long tool arguments and results.")] = False,
    output: OutputOption = None,
    json_: Annotated[bool, typer.Option("--json", help="Same as --output json: {\"session\": ..., \"turns\": [...]}.")] = False,
    no_pager: Annotated[bool, typer.Option("--no-pager", help="Never page, even on a terminal.")] = False,
) -> None:
    """Show a session as numbered turns: messages, tool calls, handoffs."""
    from .show import show_session

    fmt = _output_format(output, json_)
    show_session(_state(ctx), session_id, include_rolled_back=all_, full=full, output=fmt, pager=not no_pager)


@sessions_app.command(
    "interrupt",
    epilog="\b\nExamples:\n  chatflow sessions interrupt support-42\n  chatflow sessions interrupt support-42 --wait 0 --json",
)
def sessions_interrupt(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(metavar="ID", help="Session id.", autocompletion=complete_session_id)],
    wait: Annotated[float, typer.Option("--wait", min=0, metavar="SECONDS", help="How long to wait for the turn to stop (0: only ask).")] = 10.0,
    json_: Annotated[bool, typer.Option("--json", help="One JSON object: session_id, turn, requested, outcome.")] = False,
) -> None:
    """Stop the turn a session is running, in this or any other process or host.

    The turn stops at its next chunk or tool boundary and keeps its partial reply; open
    tool calls get a result saying their side effects are unknown; the session is idle.
    """
    from .show import interrupt_session

    interrupt_session(_state(ctx), session_id, wait=wait, as_json=json_)


@sessions_app.command(
    "rollback",
    epilog="\b\nExamples:\n  chatflow sessions rollback support-42 --to 3\n  chatflow sessions rollback support-42 --last 1 --yes",
)
def sessions_rollback(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(metavar="ID", help="Session id.", autocompletion=complete_session_id)],
    to: Annotated[Optional[int], typer.Option("--to", min=0, metavar="N", help="Keep turns 1..N (N as 'sessions show' numbers them).")] = None,
    last: Annotated[Optional[int], typer.Option("--last", min=1, metavar="K", help="Remove the last K turns.")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Remove the newest turns of a session (all or nothing)."""
    from .show import rollback_session

    if (to is None) == (last is None):
        raise UsageError("give exactly one of --to N or --last K")
    rollback_session(_state(ctx), session_id, to=to, last=last, yes=yes)


@sessions_app.command(
    "delete",
    epilog="\b\nExamples:\n  chatflow sessions delete support-42 old-1\n  chatflow sessions delete --older-than 30d --yes\n  chatflow sessions delete --all",
)
def sessions_delete(
    ctx: typer.Context,
    session_ids: Annotated[Optional[list[str]], typer.Argument(metavar="ID...", help="Session ids.", autocompletion=complete_session_id, show_default=False)] = None,
    older_than: Annotated[Optional[str], typer.Option("--older-than", help="Sessions not updated for this long (30d, 12h, 2w).", metavar="DURATION")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every session.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Delete sessions with their messages and events."""
    from .show import delete_sessions

    chosen = sum(bool(x) for x in (session_ids, older_than, all_))
    if chosen != 1:
        raise UsageError("give session ids, --older-than DURATION, or --all (one of them)")
    delete_sessions(
        _state(ctx),
        list(session_ids or []),
        older_than=parse_duration(older_than) if older_than else None,
        all_=all_,
        yes=yes,
    )


# ---------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------
@app.command(
    epilog=(
        "\b\nExamples:\n  chatflow replay support-42 --since 10\n  chatflow replay support-42 --follow --json\n"
        "  chatflow replay support-42 --rerun -m gpt-4o --into support-42-gpt4o"
    )
)
def replay(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(metavar="ID", help="Session id.", autocompletion=complete_session_id)],
    since: Annotated[int, typer.Option("--since", min=0, help="Only events after this seq.", metavar="SEQ")] = 0,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")] = False,
    output: OutputOption = None,
    json_: Annotated[bool, typer.Option("--json", help="One JSON event a line (as --output jsonl).")] = False,
    rerun: Annotated[bool, typer.Option("--rerun", help="Send the user messages again, one turn each, into a new session.")] = False,
    into: Annotated[Optional[str], typer.Option("--into", metavar="ID", help="With --rerun: the new session's id.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", help="With --rerun: the model to use.")] = None,
    base_url: Annotated[Optional[str], typer.Option("--base-url", metavar="URL", help="With --rerun: the endpoint.")] = None,
    agent: Annotated[Optional[str], typer.Option("--agent", "-a", metavar="NAME", help="With --rerun: the starting agent.", autocompletion=complete_agent_name)] = None,
) -> int | None:
    """Print a session's event log in seq order, or re-run its user messages."""
    if json_ and output not in (None, OutputFormat.jsonl):
        raise UsageError(f"--json means --output jsonl for replay; it cannot go with --output {output.value}")
    fmt = _output_format(OutputFormat.jsonl if json_ else output, False)
    state = _state(ctx)
    if rerun:
        from .chat import rerun_session

        return rerun_session(state, session_id, into=into, model=model, base_url=base_url, agent=agent, output=fmt)
    if follow and fmt == "json":
        raise UsageError("--follow streams events: use --output jsonl (one JSON event a line) instead of json")
    if into or model or base_url or agent:
        raise UsageError("--into, --model, --base-url and --agent go with --rerun")
    from .show import replay_events

    replay_events(state, session_id, since=since, follow=follow, output=fmt)


# ---------------------------------------------------------------------------------------
# agents, config, completion
# ---------------------------------------------------------------------------------------
@agents_app.command("ls", epilog="\b\nExamples:\n  chatflow agents ls\n  chatflow agents ls --json | jq '.[].name'")
def agents_ls(
    ctx: typer.Context,
    output: OutputOption = None,
    json_: Annotated[bool, typer.Option("--json", help="Same as --output json: a JSON array.")] = False,
) -> None:
    """List the configured agents (one default agent when none are configured).

    Every tool module is imported, as chat does: one that does not import is a config
    error (exit 9) naming the file and line.
    """
    from .config import DEFAULT_AGENT_NAME, DEFAULT_INSTRUCTIONS, AgentSpec, build_agents
    from .render import agents_lines, dumps

    fmt = _output_format(output, json_)
    state = _state(ctx)
    settings = state.settings()
    _, built = build_agents(settings)
    specs = list(settings.agents) or [AgentSpec(DEFAULT_AGENT_NAME, DEFAULT_INSTRUCTIONS)]
    start = settings.default_agent or specs[0].name
    rows = []
    for spec in specs:
        agent = built.get(spec.name)
        tools = []
        for tool_spec, tool in zip(spec.tools, getattr(agent, "tools", None) or ()):
            entry = {"name": tool.name, "kind": "custom" if tool_spec.ref is None else "python"}
            if tool_spec.ref is not None:
                entry["ref"] = tool_spec.ref
            tools.append(entry)
        rows.append({
            "name": spec.name,
            "start": spec.name == start,
            "model": spec.model or settings.model,
            "handoffs": list(spec.handoffs),
            "tools": tools,
            "instructions": spec.instructions,
        })
    if fmt == "json":
        state.env.stdout.write(dumps(rows, indent=2) + "\n")
        return
    if fmt == "jsonl":
        state.env.stdout.write("".join(dumps(r) + "\n" for r in rows))
        return
    _write_lines(state, agents_lines(rows, width=_terminal_width(state)))


@config_app.command("path", epilog="\b\nExample:\n  $EDITOR \"$(chatflow config path)\"")
def config_path_cmd(ctx: typer.Context) -> None:
    """Print the path of the config file (it may not exist yet)."""
    from .config import config_path

    state = _state(ctx)
    state.env.stdout.write(f"{config_path(state.config)}\n")


@config_app.command("show", epilog="\b\nExample:\n  chatflow config show --json")
def config_show(
    ctx: typer.Context,
    json_: Annotated[bool, typer.Option("--json", help="As JSON.")] = False,
) -> None:
    """Print the settings in effect and where each comes from; API keys are masked."""
    from .config import mask_secret
    from .render import dumps, safe_text

    from .config import LOCAL_MODEL, resolve_model
    from .core.errors import ConfigError

    state = _state(ctx)
    s = state.settings()
    # The model and endpoint requests actually use (a default filled in, or the local model),
    # not only what was configured; a configuration that cannot send anything says why.
    model, base_url, problem = s.model, s.base_url, None
    try:
        choice = resolve_model(s)
    except ConfigError as exc:
        problem = exc.message
    else:
        model = choice.model
        base_url = "(the local llama.cpp server chatflow starts)" if choice.local else (
            choice.base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1")
    model_source = s.sources.get("model") if s.model else ("default" if model != LOCAL_MODEL else "default (local)")
    data = {
        "config_file": str(s.config_path),
        "config_loaded": s.config_loaded,
        "data_dir": str(s.data_dir),
        "db_path": s.db,
        "db_source": s.sources.get("db_path"),
        "model": model,
        "model_source": model_source,
        "base_url": base_url,
        "base_url_source": s.sources.get("base_url"),
        "api_key_env": s.api_key_env,
        "api_key": mask_secret(s.api_key),
        "default_agent": s.default_agent,
        "max_turns": s.max_turns,
        "local_keep_alive": s.local_keep_alive,
        "local_keep_alive_source": s.sources.get("local_keep_alive"),
        "agents": [a.name for a in s.agents],
    }
    if problem:
        data["problem"] = problem
    if json_:
        state.env.stdout.write(dumps(data, indent=2) + "\n")
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, list):
            value = ", ".join(value) or "-"
        elif value is None:
            value = "-"
        state.env.stdout.write(f"{key:<{width}}  {safe_text(str(value))}\n")


@local_app.command("status", epilog="\b\nExamples:\n  chatflow local status\n  chatflow local status --json")
def local_status(
    ctx: typer.Context,
    json_: Annotated[bool, typer.Option("--json", help="A JSON array instead of lines.")] = False,
) -> None:
    """Show the warm local model server (pid, URL, uptime).

    Each server found in the data directory is health-checked with its token; one that does
    not answer is shown as stale (the next call replaces it).
    """
    from .core.local import local_servers
    from .render import dumps, safe_text

    state = _state(ctx)
    settings = state.settings()
    servers = local_servers(settings.data_dir)
    if json_:
        state.env.stdout.write(dumps([s.to_dict() for s in servers], indent=2) + "\n")
        return
    if not servers:
        _notice(state, f"no warm local model server (keep-alive {settings.local_keep_alive:g} s)")
        return
    import time

    for s in servers:
        age = max(0, int(time.time() - s.started_at))
        health = "running" if s.healthy else "not answering (stale: replaced on next use)"
        state.env.stdout.write(safe_text(
            f"pid {s.pid}  {s.base_url}  {health}  up {age} s  keep-alive {s.keep_alive:g} s  "
            f"chatflow {s.version}  {Path(s.model).name}") + "\n")


@local_app.command("stop", epilog="\b\nExamples:\n  chatflow local stop\n  chatflow local stop --json")
def local_stop(
    ctx: typer.Context,
    json_: Annotated[bool, typer.Option("--json", help="As JSON: {\"stopped\": [pids]}.")] = False,
) -> None:
    """Stop the warm local model server now.

    The next call on the local model starts a new one. Only processes that are verifiably
    chatflow's servers are signalled (SIGTERM, then SIGKILL after 5 s).
    """
    from .core.local import stop_local_servers
    from .render import dumps

    state = _state(ctx)
    stopped = stop_local_servers(state.settings().data_dir)
    if json_:
        state.env.stdout.write(dumps({"stopped": stopped}) + "\n")
    elif stopped:
        _notice(state, "stopped the local model server (pid " + ", ".join(map(str, stopped)) + ")")
    else:
        _notice(state, "no warm local model server was running")


@app.command(epilog="\b\nExamples:\n  chatflow completion bash > ~/.local/share/bash-completion/completions/chatflow\n  chatflow completion fish > ~/.config/fish/completions/chatflow.fish")
def completion(
    shell: Annotated[str, typer.Argument(metavar="SHELL", help="bash, zsh or fish.", autocompletion=complete_shell)],
) -> None:
    """Print the shell completion script (session ids complete from the store)."""
    sys.stdout.write(completion_script(shell) + "\n")


def completion_script(shell: str) -> str:
    """The completion script for ``shell`` (what ``completions/`` holds; a test checks drift)."""
    if shell not in {"bash", "zsh", "fish"}:
        raise UsageError(f"unsupported shell {shell!r}: use bash, zsh or fish")
    from typer._completion_shared import get_completion_script

    return get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell)


# ---------------------------------------------------------------------------------------
# the error boundary
# ---------------------------------------------------------------------------------------
#: ``json``/``jsonl`` while a command prints JSON: an error is then also printed as a JSON
#: object on stdout (``{"schema", "type": "error", "is_error": true, ...}``), as ``chat --json`` does.
_JSON_ERRORS: str | None = None

#: Secret values this process has read (the API key named by ``api_key_env``, recorded by
#: :meth:`State.settings`): the error boundary removes them from everything it prints.
_SECRETS: set[str] = set()
#: Shorter values are not treated as secrets (replacing them would garble ordinary text).
_MIN_SECRET_LEN = 6


def remember_secret(value: str | None) -> None:
    """Record ``value`` as a secret that :func:`_scrub` removes from printed text."""
    if value and len(value) >= _MIN_SECRET_LEN:
        _SECRETS.add(value)


def _secrets() -> list[str]:
    """Every secret to scrub, longest first (a key containing another is removed whole)."""
    values = set(_SECRETS)
    for name in ("OPENAI_API_KEY", "PGPASSWORD", os.environ.get("CHATFLOW_API_KEY_ENV", "")):
        value = os.environ.get(name) if name else None
        if value and len(value) >= _MIN_SECRET_LEN:
            values.add(value)
    return sorted(values, key=len, reverse=True)


def _scrub(text: str) -> str:
    """``text`` with every API key chatflow knows of (``$OPENAI_API_KEY``, the variable the
    config's ``api_key_env`` names) replaced by ``[redacted]``, as the model client does.

    Defence in depth, since a provider error body may echo the key (issue 7): :func:`main`
    applies it to the error line, the ``--debug`` traceback (chained causes included) and
    ``--debug`` log lines.
    """
    for value in _secrets():
        if value in text:
            text = text.replace(value, "[redacted]")
    if "postgres" in text.lower() or "password" in text.lower():
        from .core._dsn import redact_dsn

        text = redact_dsn(text)
    return text


class _ScrubbingFormatter(logging.Formatter):
    """``--debug`` log lines (and the tracebacks they carry) with secrets removed."""

    def format(self, record: logging.LogRecord) -> str:
        return _scrub(super().format(record))


def _print_traceback() -> None:
    """The current exception's traceback (chained causes included) on stderr, scrubbed of
    secrets and with terminal control characters made inert."""
    import traceback

    from .render import safe_text

    try:
        sys.stderr.write(safe_text(_scrub(traceback.format_exc())))
        sys.stderr.flush()
    except (BrokenPipeError, OSError):  # pragma: no cover
        pass


def _json_error(message: str, error_type: str, code: int, session_id: str | None) -> None:
    """In a JSON output mode (:data:`_JSON_ERRORS`), the error as JSON on stdout too: the
    ``chat --output json`` error object, or for jsonl an ``error`` event."""
    if _JSON_ERRORS is None:
        return
    from .render import dumps, event_json

    err = {"error": _scrub(message), "error_type": error_type, "exit_code": int(code), "session_id": session_id,
           "is_error": True}
    obj = err if _JSON_ERRORS == "json" else event_json("error", session_id, err)
    try:
        sys.stdout.write(dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):  # pragma: no cover
        pass


def _error_line(message: str, *, prefix: str = "chatflow: error: ") -> None:
    from .render import safe_text

    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    try:
        sys.stderr.write(f"{prefix}{safe_text(_scrub(first))}\n")
        sys.stderr.flush()
    except (BrokenPipeError, OSError):  # pragma: no cover
        pass


def _silence_broken_pipe() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover
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


def _fill_closed_standard_streams() -> None:
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
            sys.stdout = _ClosedStdout()  # type: ignore[assignment]
        else:
            setattr(sys, name, open(os.devnull, "r" if fd == 0 else "w", encoding="utf-8"))


#: errno values of a stdout that cannot take the output (``> /dev/full``, a full disk, I/O error).
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG})


class _ReaderGone(Exception):
    """stdout was closed by its reader (EPIPE) while a command wrote to it."""


def _reader_gone_is_ours(command: Any) -> None:
    """Make a closed stdout reach :func:`main` as :class:`_ReaderGone`.

    click's ``main`` turns an EPIPE raised inside it into ``sys.exit(1)``; wrapping the root
    command's ``make_context`` (parsing, where ``--help`` prints) and ``invoke`` (which runs
    every subcommand) hands it to chatflow's boundary instead, so every command ends the
    same quiet way.
    """

    def guard(method: Any) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except BrokenPipeError:
                raise _ReaderGone() from None

        return guarded

    command.make_context = guard(command.make_context)
    command.invoke = guard(command.invoke)


def _check_utf8_args(args: list[str]) -> None:
    """Bytes that are not UTF-8 in argv arrive as lone surrogates (PEP 383); refuse them (exit 2)."""
    for position, arg in enumerate(args, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UsageError(f"argument {position} is not valid UTF-8 (bad byte at offset {exc.start})") from None


# ---------------------------------------------------------------------------------------
# command-line shape: global options anywhere, no silent repeats, plain argument help
# ---------------------------------------------------------------------------------------
#: The root options that every command accepts too, wherever the user types them.
GLOBAL_OPTIONS = ("--db", "--config", "--debug", "--no-color")


def _set_global(ctx: Any, param: Any, value: Any) -> None:
    """A global option given after the command: update the run's :class:`State`."""
    if ctx.resilient_parsing or value in (None, False):
        return
    state = _state(ctx)
    if param.name == "db":
        state.db = value
    elif param.name == "config":
        state.config = value
        state._settings.clear()
    elif param.name == "debug":
        state.debug = True
    elif param.name == "no_color":
        state.no_color = True
        state.env = Env.from_sys(no_color=True)


def _add_global_options(command: Any) -> None:
    """Give every subcommand the root's ``--db``, ``--config``, ``--debug`` and ``--no-color``,
    so ``chatflow sessions ls --db x`` works as ``chatflow --db x sessions ls`` does (they stay
    out of each command's help; the root's help says they may follow the command)."""
    import copy

    root_params = {p.name: p for p in command.params}
    for sub in _walk_commands(command):
        if sub is command:
            continue
        taken = {opt for p in sub.params for opt in (*p.opts, *p.secondary_opts)}
        for flag in GLOBAL_OPTIONS:
            if flag in taken:
                continue
            name = flag.lstrip("-").replace("-", "_")
            option = copy.copy(root_params[name])
            option.expose_value = False
            option.callback = _set_global
            option.hidden = True
            sub.params.append(option)


def _walk_commands(command: Any) -> Iterator[Any]:
    yield command
    for sub in (getattr(command, "commands", None) or {}).values():
        yield from _walk_commands(sub)


def _refuse_repeats(command: Any) -> None:
    """An option that takes one value and is given twice is a usage error (exit 2), never a
    silent "the last one wins": ``--session a --session b`` or ``-m x -m y`` names the option.
    Repeatable options (``--metadata``, ``--tool-result``) and flags are not affected."""
    from typer import _click

    for cmd in _walk_commands(command):
        original = cmd.make_parser

        def make_parser(ctx: Any, _original: Any = original) -> Any:
            parser = _original(ctx)
            parse = parser.parse_args

            def parse_args(args: list[str]) -> Any:
                opts, rest, order = parse(args=args)
                seen: set[int] = set()
                for param in order:
                    if not getattr(param, 'param_type_name', '') == 'option' or param.multiple or param.is_flag or param.count:
                        continue
                    if id(param) in seen and not ctx.resilient_parsing:
                        names = "/".join(sorted(param.opts, key=len, reverse=True))
                        raise _click.exceptions.UsageError(f"{names} was given more than once; it takes one value", ctx=ctx)
                    seen.add(id(param))
                return opts, rest, order

            parser.parse_args = parse_args
            return parser

        cmd.make_parser = make_parser


def _plain_argument_help(command: Any) -> None:
    """Arguments in help as ``ID``, ``[MESSAGE]`` and ``[ID]...``: no Python types
    (``<str>``, ``<list[str]>``) and no ``{ID}`` braces."""
    for cmd in _walk_commands(command):
        for param in cmd.params:
            if getattr(param, "param_type_name", "") != "argument" or not hasattr(param, "_usage_display_name"):
                continue
            name = (param.metavar or param.name.upper()).rstrip(".")

            def usage(_param: Any = param, _name: str = name) -> str:
                shown = _name if _param.required else f"[{_name}]"
                return shown + ("..." if _param.nargs != 1 else "")

            param._usage_display_name = usage
            param.display_type_rich = lambda ctx=None: ""
            param._rich_display_name = lambda _name=name, _param=param: _name + ("..." if _param.nargs != 1 else "")


#: Options taking a pair of values that may be repeated (typer has no list-of-tuples type).
_REPEATABLE_PAIRS = {("chat", "tool_result")}


def _repeatable_pairs(command: Any) -> None:
    """``--tool-result ID OUTPUT`` may be given once per pending call: the value is a list of pairs."""
    from ._typer_fast import _lite_class, _str

    for name, sub in (getattr(command, "commands", None) or {}).items():
        for param in sub.params:
            if (name, param.name) in _REPEATABLE_PAIRS:
                param.multiple = True
                param.default = None

                def pairs(value: Any, p: Any, c: Any) -> Any:
                    return [tuple(_str(v, p, c) for v in pair) for pair in value or ()] or None

                desc = param.type_descriptor
                param._runtime_param = _lite_class()(parameter_info=desc.parameter_info, annotation=desc.annotation,
                                                     fn=pairs)


def build_command() -> Any:
    """The click command of :data:`app` as chatflow runs it (global options on every
    command, repeated single-value options refused, plain argument help)."""
    command = typer.main.get_command(app)
    from ._typer_fast import install

    install(command)
    _repeatable_pairs(command)
    _add_global_options(command)
    _refuse_repeats(command)
    _plain_argument_help(command)
    return command


def main(argv: list[str] | None = None) -> None:
    """Run chatflow and exit with the code of :class:`ExitStatus` that fits the outcome."""
    from typer import _click

    global _JSON_ERRORS
    _JSON_ERRORS = None

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("CHATFLOW_DEBUG", "") not in ("", "0")
    if debug:
        handler = logging.StreamHandler()
        handler.setFormatter(_ScrubbingFormatter("chatflow: %(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=logging.DEBUG, handlers=[handler])
    else:
        logging.getLogger("chatflow_cli").addHandler(logging.NullHandler())
        logging.getLogger("chatflow_cli").propagate = False
    if os.environ.get(COMPLETE_VAR):
        from typer._completion_classes import completion_init

        completion_init()
    code: int = ExitStatus.SUCCESS
    _fill_closed_standard_streams()
    try:
        _check_utf8_args(args)
        command = build_command()
        _reader_gone_is_ours(command)
        rv = command.main(args=args, prog_name=PROG, complete_var=COMPLETE_VAR, standalone_mode=False)
        code = rv if isinstance(rv, int) else ExitStatus.SUCCESS
        sys.stdout.flush()
    except ChatflowError as exc:
        if debug:
            _print_traceback()
        if exc.exit_code == ExitStatus.INTERRUPTED:  # Ctrl-C is not an error: a plain notice
            _error_line(exc.message, prefix="chatflow: ")
        else:
            _error_line(exc.message)
        code = exc.exit_code
        _json_error(exc.message, type(exc).__name__, code, getattr(exc, "session_id", None))
    except _click.exceptions.NoArgsIsHelpError as exc:
        sys.stderr.write(exc.format_message().rstrip("\n") + "\n")
        code = ExitStatus.USAGE
    except _click.exceptions.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see: {exc.ctx.command_path} --help)"
        _error_line(exc.format_message() + hint)
        code = ExitStatus.USAGE
        _json_error(exc.format_message(), "UsageError", code, None)
    except _click.exceptions.ClickException as exc:
        _error_line(exc.format_message())
        code = exc.exit_code or ExitStatus.ERROR
    except typer.Abort:
        _error_line("aborted")
        code = ExitStatus.INTERRUPTED
    except KeyboardInterrupt:
        try:
            sys.stderr.write("\nchatflow: interrupted\n")
        except OSError:  # pragma: no cover
            pass
        code = ExitStatus.INTERRUPTED
    except (BrokenPipeError, _ReaderGone):
        _silence_broken_pipe()
        code = ExitStatus.SUCCESS
    except SystemExit:
        raise
    except Exception as exc:  # a bug: one line, unless --debug
        if debug:
            _print_traceback()
        if isinstance(exc, OSError) and exc.errno in _OUTPUT_ERRNOS and exc.filename is None:
            _error_line(f"cannot write the output: {exc.strerror or exc}")
            code = ExitStatus.ERROR
            _silence_broken_pipe()
        else:
            _error_line(f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)")
            code = ExitStatus.ERROR
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_broken_pipe()
    except (OSError, ValueError):
        pass
    sys.exit(int(code))


if __name__ == "__main__":  # pragma: no cover
    main()
