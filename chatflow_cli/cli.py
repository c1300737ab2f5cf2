"""The ``chatflow`` command line: a thin typer shell over :mod:`chatflow_cli.core`.

Each command opens the store, calls the library, and formats the result. Heavy modules
(``openai``, ``prompt_toolkit``, ``rich.markdown``, ``llama_cpp``) are imported only inside
the commands that need them, so ``chatflow --help``, ``sessions ls`` and ``sessions show``
(into a pipe) start fast; a test checks ``sys.modules`` after each.

Layout: this module holds the typer app, the thin commands and :func:`main`; nothing else in
the package imports it. The ``sessions`` group is :mod:`chatflow_cli.sessions_app`; option
choices and completion callbacks are :mod:`chatflow_cli.options`, the parsing of option values
and the shape of the command line :mod:`chatflow_cli._typer_adapter`. A command parses its
options and calls one function of :mod:`chatflow_cli.commands`, which stands on
:mod:`chatflow_cli.context` (the run's state and terminals, notices, confirmation, stdin,
session ids) and :mod:`chatflow_cli.redaction`; :mod:`chatflow_cli.assembly` builds agents,
model client and Runner from the settings for ``chat``, ``replay --rerun`` and the REPL.

Errors: :func:`main` is the one error boundary; its guards (one-line and JSON errors, closed
and broken streams, SIGTERM and SIGHUP, arguments that are not UTF-8) sit just above it. A
:class:`~chatflow_cli.core.errors.ChatflowError` becomes one line on stderr, ``chatflow:
error: <message>``, and the process exits with the error's code; ``--debug`` (or
``CHATFLOW_DEBUG=1``) shows the traceback instead, and logs chatflow's own debug lines on
stderr (other libraries' loggers, httpx, openai, asyncio, prompt_toolkit..., stay at WARNING:
they would flood the screen). Ctrl-C exits 130. A reader that closes stdout early (``chatflow sessions show ID | head -1``,
``chatflow replay ID --json | head -c 10``), or a stdout closed before the start (``>&-``), ends
every command quietly with exit 0: nothing on stderr, the rest of the output dropped (a ``chat``
whose reader left stops its turn, kept as interrupted). A gone reader never hides an outcome:
an error still prints its line on stderr and exits with its code, a cut reply still exits 10.

Exit codes: :class:`chatflow_cli.core.errors.ExitStatus`, with what each means in
:data:`~chatflow_cli.core.errors.EXIT_MEANINGS` (the manual's table is generated from it).
"""

# No ``from __future__ import annotations`` here: typer reads every command's annotations
# on each run, and text annotations cost it a compile and an eval each (about 10 ms a run).

import errno
import os
import sys
from typing import Annotated, Any, Optional, cast

import typer

from . import __version__, context
from ._typer_adapter import parse_metadata
from .context import (
    Env,
    State,
    interrupted_code,
    set_json_errors,
    silence_broken_pipe,
    state_of,
    stderr_line,
    stopped_text,
)
from .core.errors import ChatflowError, ExitStatus, UsageError
from .redaction import install_logging, remember_arguments, scrub
from .options import (
    InputFormat,
    MessageIdScope,
    OutputFormat,
    OutputOption,
    command_group,
    complete_agent_name,
    complete_approval_call,
    complete_custom_call,
    complete_session_id,
    complete_shell,
    output_format,
)
from .memory_app import memory_app
from .sessions_app import sessions_app
from .vault_app import vault_app
from .mcp_app import mcp_app

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
agents_app = command_group(
    "The agents configured in config.toml.",
    "Example: chatflow agents ls",
)
config_app = command_group(
    "Where the config file is, and the settings in effect.",
    "Example: chatflow config show",
)
app.add_typer(sessions_app, name="sessions")
app.add_typer(agents_app, name="agents")
local_app = command_group(
    "The local model's warm llama.cpp server: whether one runs, and stopping it.",
    "Example: chatflow local status",
)
app.add_typer(config_app, name="config")
app.add_typer(local_app, name="local")
app.add_typer(memory_app, name="memory")
app.add_typer(vault_app, name="vault")
app.add_typer(mcp_app, name="mcp")


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
    continue_: Annotated[bool, typer.Option("--continue", "-c", help="With no command: the REPL (or the piped message) on the most recently updated session that is not archived.")] = False,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", help="With no command: as chat --model.")] = None,
    base_url: Annotated[Optional[str], typer.Option("--base-url", metavar="URL", help="With no command: as chat --base-url.")] = None,
    agent: Annotated[Optional[str], typer.Option("--agent", "-a", metavar="NAME", help="With no command: as chat --agent.", autocompletion=complete_agent_name)] = None,
    system: Annotated[Optional[str], typer.Option("--system", metavar="TEXT", help="With no command: as chat --system.")] = None,
    max_turns: Annotated[Optional[int], typer.Option("--max-turns", min=1, metavar="N", help="With no command: as chat --max-turns.")] = None,
    max_context_tokens: Annotated[Optional[int], typer.Option("--max-context-tokens", min=2, metavar="N", help="With no command: as chat --max-context-tokens.")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """Chat with OpenAI-compatible models from the terminal; sessions are kept in SQLite.

    With no command: the REPL on a terminal; otherwise the message is read from stdin. The
    chat options -s, -c, -m, --base-url, -a, --system, --max-turns and --max-context-tokens
    apply to it.
    --db, --config, --debug and --no-color may also follow the command.
    """
    state = State(db=db, config=config, debug=debug, no_color=no_color, env=Env.from_sys(no_color=no_color))
    ctx.obj = state
    ctx.call_on_close(state.close)
    chat_options: dict[str, Any] = {"model": model, "base_url": base_url, "agent": agent, "system": system,
                                    "max_turns": max_turns, "max_context_tokens": max_context_tokens}
    if ctx.invoked_subcommand is not None:
        given = [name for name, value in (("--session", session), ("--continue", continue_ or None),
                                          *((f"--{k.replace('_', '-')}", v) for k, v in chat_options.items()))
                 if value is not None]
        if given:
            flag = given[0]
            raise UsageError(f"{flag} before a command opens the REPL; give it to the command instead "
                             f"(chatflow {ctx.invoked_subcommand} {flag} ...)")
        return
    env = state.env
    if env.interactive:
        _start_repl(ctx, state, session_id=session, continue_last=continue_, **chat_options)
        return
    if env.stdin_isatty:
        raise UsageError("stdout is not a terminal: pass the message, e.g. chatflow chat \"hello\" > reply.txt")
    from .commands.chat import ChatOptions, run_chat

    run_chat(state, ChatOptions(session=session, continue_=continue_, **chat_options))


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
@app.command(
    epilog=(
        "\b\nExamples:\n"
        "  chatflow chat \"What is the capital of France?\"\n"
        "  chatflow chat -s support-42 --output json \"Where is my order?\"\n"
        "  git diff | chatflow chat \"review this\"      (the message, a blank line, then stdin)\n"
        "  chatflow chat -s s1 --tool-result call_1 '{\"approved\": true}' --tool-result call_2 no\n"
        "  chatflow chat -s s1 --approve call_3"
    )
)
def chat(
    ctx: typer.Context,
    message: Annotated[Optional[str], typer.Argument(metavar="MESSAGE", help="The message; '-' (or no message with piped stdin) reads stdin.", show_default=False)] = None,
    session: Annotated[Optional[str], typer.Option("--session", "-s", metavar="ID", help="Session id (created when new; a new id is generated and printed to stderr when absent).", autocompletion=complete_session_id)] = None,
    continue_: Annotated[bool, typer.Option("--continue", "-c", help="Continue the most recently updated session that is not archived.")] = False,
    system: Annotated[Optional[str], typer.Option("--system", metavar="TEXT", help="System prompt for a new session.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", help="Model name ('local' for the embedded llama.cpp model); overrides CHATFLOW_MODEL and config.")] = None,
    base_url: Annotated[Optional[str], typer.Option("--base-url", metavar="URL", help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1; overrides OPENAI_BASE_URL.")] = None,
    agent: Annotated[Optional[str], typer.Option("--agent", "-a", metavar="NAME", help="Start with this configured agent (on an existing session: switch to it).", autocompletion=complete_agent_name)] = None,
    max_turns: Annotated[Optional[int], typer.Option("--max-turns", min=1, metavar="N", help="Turns kept in the context window of a new session.")] = None,
    max_context_tokens: Annotated[Optional[int], typer.Option("--max-context-tokens", min=2, metavar="N", help="The model's context size in tokens (default: config, the local model's, or a table of common models); requests carry the newest whole turns that fit.")] = None,
    metadata: Annotated[Optional[list[str]], typer.Option("--metadata", help="KEY=VALUE stored on the session (repeatable).", metavar="KEY=VALUE")] = None,
    message_id: Annotated[Optional[str], typer.Option("--message-id", metavar="ID", help="Webhook message id: an id seen in the last 192 h is skipped (exit 0).")] = None,
    message_id_scope: Annotated[Optional[MessageIdScope], typer.Option("--message-id-scope", metavar="global|session", case_sensitive=False, help="global: an id is one message across all sessions (WhatsApp-style ids); session: ids are per session (Telegram-style chat ids). Default: config message_id_scope, else global.")] = None,
    idempotency_key: Annotated[Optional[str], typer.Option("--idempotency-key", metavar="KEY", help="Resending with the same key returns the stored turn instead of a new one.")] = None,
    tool_result: Annotated[Optional[tuple[str, str]], typer.Option("--tool-result", help="Answer a pending custom tool call with OUTPUT (JSON or plain text, sent as given); repeat it for several calls.", metavar="TOOL_USE_ID OUTPUT", autocompletion=complete_custom_call)] = None,
    wait: Annotated[float, typer.Option("--wait", min=0, help="Seconds to wait for a busy session before giving up.", metavar="SECONDS")] = 0.0,
    output: Annotated[OutputFormat, typer.Option("--output", "-o", metavar="text|json|jsonl", help="text (rendered on a terminal), json (one object) or jsonl (events).", case_sensitive=False)] = OutputFormat.text,
    json_: Annotated[bool, typer.Option("--json", help="Same as --output json.")] = False,
    input_: Annotated[InputFormat, typer.Option("--input", metavar="text|jsonl", help="jsonl: read user messages and tool results, one JSON object a line, from stdin.", case_sensitive=False)] = InputFormat.text,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the model server.", metavar="SECONDS")] = 60.0,
    title: Annotated[Optional[str], typer.Option("--title", metavar="TITLE", help="The session's title (default: the first line of its first message).")] = None,
    memory: Annotated[Optional[list[str]], typer.Option("--memory", metavar="NAME[:ro]", help="Mount a memory store on the session (read-write; NAME:ro read-only): the agent gets memory tools (repeatable; see chatflow memory).")] = None,
    vault: Annotated[Optional[list[str]], typer.Option("--vault", metavar="NAME", help="Mount this vault: tools' secrets come from it (repeatable; the first vault holding an entry wins).")] = None,
    attach: Annotated[Optional[list[str]], typer.Option("--attach", "-f", metavar="FILE", help="Attach a file to the message: an image (PNG, JPEG, WebP, GIF) or a UTF-8 text file (repeatable, at most 10; '-' reads stdin as the file).")] = None,
    approve: Annotated[Optional[list[str]], typer.Option("--approve", metavar="TOOL_USE_ID", help="Approve a tool call waiting for an approval (an MCP tool whose policy is ask): it runs, and the turn continues (repeatable).", autocompletion=complete_approval_call)] = None,
    deny: Annotated[Optional[list[str]], typer.Option("--deny", metavar="TOOL_USE_ID", help="Deny a tool call waiting for an approval: the model is told the user declined it, and the turn continues (repeatable).", autocompletion=complete_approval_call)] = None,
) -> int | None:
    """Send one message (or several with --input jsonl) and print the reply.

    With no message on a terminal, the REPL opens on the session (-s/-c) instead.
    """
    state = state_of(ctx)
    if message is None and not tool_result and not approve and not deny and not attach \
            and input_ is InputFormat.text and state.env.interactive:
        _start_repl(ctx, state, session_id=session, continue_last=continue_, model=model, agent=agent,
                    base_url=base_url, max_turns=max_turns, system=system, max_context_tokens=max_context_tokens)
        return None
    from .commands.chat import ChatOptions, run_chat

    opts = ChatOptions(
        message=message,
        session=session,
        continue_=continue_,
        system=system,
        model=model,
        base_url=base_url,
        agent=agent,
        max_turns=max_turns,
        max_context_tokens=max_context_tokens,
        metadata=parse_metadata(metadata),
        message_id=message_id,
        message_id_scope=message_id_scope.value if message_id_scope is not None else None,
        idempotency_key=idempotency_key,
        # repeatable: a list of (TOOL_USE_ID, OUTPUT) pairs (see _typer_adapter.repeatable_pairs)
        tool_results=[(str(a), str(b)) for a, b in cast("list[tuple[str, str]]", tool_result)] if tool_result else None,
        wait=wait,
        output="json" if json_ else output.value,
        input=input_.value,
        timeout=timeout,
        title=title,
        memory=list(memory) if memory else None,
        vaults=tuple(vault or ()),
        attachments=tuple(attach or ()),
        approvals=[(i, True) for i in approve or ()] + [(i, False) for i in deny or ()] or None,
    )
    return run_chat(state, opts)


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
    fmt = output_format(OutputFormat.jsonl if json_ else output, False)
    state = state_of(ctx)
    if rerun:
        from .commands.replay import rerun_session

        return rerun_session(state, session_id, into=into, model=model, base_url=base_url, agent=agent, output=fmt)
    if follow and fmt == "json":
        raise UsageError("--follow streams events: use --output jsonl (one JSON event a line) instead of json")
    if into or model or base_url or agent:
        raise UsageError("--into, --model, --base-url and --agent go with --rerun")
    from .commands.replay import replay_events

    replay_events(state, session_id, since=since, follow=follow, output=fmt)
    return None


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
    from .commands.agents import list_agents

    list_agents(state_of(ctx), output=output_format(output, json_))


@config_app.command("path", epilog="\b\nExample:\n  $EDITOR \"$(chatflow config path)\"")
def config_path_cmd(ctx: typer.Context) -> None:
    """Print the path of the config file (it may not exist yet)."""
    from .config import config_path

    state = state_of(ctx)
    state.env.stdout.write(f"{config_path(state.config)}\n")


@config_app.command("show", epilog="\b\nExample:\n  chatflow config show --json")
def config_show(
    ctx: typer.Context,
    json_: Annotated[bool, typer.Option("--json", help="As JSON.")] = False,
) -> None:
    """Print the settings in effect and where each comes from; API keys are masked."""
    from .commands.config import show_config

    show_config(state_of(ctx), as_json=json_)


@local_app.command("status", epilog="\b\nExamples:\n  chatflow local status\n  chatflow local status --json")
def local_status(
    ctx: typer.Context,
    json_: Annotated[bool, typer.Option("--json", help="A JSON array instead of lines.")] = False,
) -> None:
    """Show the warm local model server (pid, URL, uptime).

    Each server found in the data directory is health-checked with its token; one that does
    not answer is shown as stale (the next call replaces it).
    """
    from .commands.local import local_status as status

    status(state_of(ctx), as_json=json_)


@local_app.command("stop", epilog="\b\nExamples:\n  chatflow local stop\n  chatflow local stop --json")
def local_stop(
    ctx: typer.Context,
    json_: Annotated[bool, typer.Option("--json", help="As JSON: {\"stopped\": [pids]}.")] = False,
) -> None:
    """Stop the warm local model server now.

    The next call on the local model starts a new one. Only processes that are verifiably
    chatflow's servers are signalled (SIGTERM, then SIGKILL after 5 s).
    """
    from .commands.local import local_stop as stop

    stop(state_of(ctx), as_json=json_)


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
    from ._typer_adapter import completion_script as typer_completion_script

    return typer_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell)


# ---------------------------------------------------------------------------------------
# the error boundary's guards: one-line errors, JSON errors, closed and broken streams,
# SIGTERM and SIGHUP, arguments that are not UTF-8
# ---------------------------------------------------------------------------------------
# Every line printed is scrubbed of secrets (:func:`chatflow_cli.redaction.scrub`) and made
# inert for a terminal (:func:`chatflow_cli.render.safe_text`).
def stop_signals_interrupt() -> None:
    """Take SIGTERM (``timeout 30 chatflow chat ...``, ``kill PID``) and SIGHUP (the terminal
    closed, an ssh session dropped) as Ctrl-C is taken.

    The first such signal does what a first Ctrl-C does: a turn going on stops and keeps its
    partial reply as an interrupted turn (even when SIGINT is ignored, as in a background
    job); with no turn going on, ``KeyboardInterrupt`` ends the command. The boundary then
    says ``terminated (SIGTERM)`` or ``hung up (SIGHUP)``
    (:func:`~chatflow_cli.context.stopped_text`) and exits 128 + the signal's number, 143 or
    129, instead of 130 (:func:`~chatflow_cli.context.interrupted_code`). A second one stops
    at once, as a second Ctrl-C does. Only from the main thread. (The REPL puts its own
    handlers in place while it runs, with the same exit codes.)
    """
    import signal

    def on_stop(signum: int, frame: Any) -> None:
        from .core.cancel import cancel_main_thread_runs

        if context.terminated_by is None:
            context.terminated_by = signum
        if not cancel_main_thread_runs():  # no turn to stop (or asked already): stop here
            raise KeyboardInterrupt

    for name in ("SIGTERM", "SIGHUP"):
        try:
            signal.signal(getattr(signal, name), on_stop)
        except (AttributeError, ValueError, OSError):  # pragma: no cover - not the main thread, or no SIGHUP
            pass


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
    """In a JSON output mode (:data:`chatflow_cli.context.json_errors`), the error as JSON on
    stdout too: the ``chat --output json`` error object, or for jsonl an ``error`` event."""
    if context.json_errors is None:
        return
    from .render import dumps, event_json

    err = {"error": scrub(message), "error_type": error_type, "exit_code": int(code), "session_id": session_id,
           "is_error": True}
    obj = err if context.json_errors == "json" else event_json(context.json_error_event, session_id, err)
    try:
        sys.stdout.write(dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):  # pragma: no cover
        pass


def error_line(message: str, *, prefix: str = "chatflow: error: ") -> None:
    """The error line on stderr: the first line of ``message``, scrubbed of secrets, made inert
    for a terminal, and on a terminal wrapped at spaces as notices are (one line into a pipe)."""
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


def build_command() -> Any:
    """The click command of :data:`app` as chatflow runs it (global options on every
    command, repeated single-value options refused, plain argument help). Each subcommand
    is built when it is first looked up: a run builds the commands it invokes (``--help``
    lists a group's commands, so it builds them)."""
    from ._typer_adapter import lazy_group, shape

    command = lazy_group(app, lambda sub, group: shape(sub, group, command))
    shape(command, None, command)
    return command


def _interrupted() -> int:
    """A command stopped by Ctrl-C, SIGTERM or SIGHUP with nothing of its own to say: ``chatflow:
    interrupted`` (130), ``chatflow: terminated (SIGTERM)`` (143) or ``chatflow: hung up
    (SIGHUP)`` (129) on stderr, after a line break (the terminal's ``^C`` may be on the line)."""
    code = interrupted_code()
    text = f"chatflow: {stopped_text()}"
    try:
        sys.stderr.write("\n" + text + "\n")
    except OSError:  # pragma: no cover
        pass
    return code


def main(argv: list[str] | None = None) -> None:
    """Run chatflow and exit with the code of :class:`ExitStatus` that fits the outcome."""
    import gc

    # What is loaded now (typer, the command modules: about 19,000 objects, no garbage) lives
    # as long as the process: the cycle collector need not walk it again, neither in the
    # collections of the older generations a run makes nor in the interpreter's collections
    # at exit. Objects made from here on, the command's, are collected as always.
    gc.freeze()
    from ._typer_adapter import click_exceptions

    click_errors = click_exceptions()
    set_json_errors(None)

    args = list(sys.argv[1:] if argv is None else argv)
    remember_arguments(args)  # a vault value typed where a name was expected is never printed
    debug = "--debug" in args or os.environ.get("CHATFLOW_DEBUG", "") not in ("", "0")
    fill_closed_standard_streams()
    install_logging(debug)  # every line a log handler prints is scrubbed of secrets, a tool's own too
    if os.environ.get(COMPLETE_VAR):
        from ._typer_adapter import completion_init

        completion_init()
    code: int = ExitStatus.SUCCESS
    stop_signals_interrupt()
    try:
        check_utf8_args(args)
        command = build_command()
        reader_gone_is_ours(command)
        rv = command.main(args=args, prog_name=PROG, complete_var=COMPLETE_VAR, standalone_mode=False)
        code = rv if isinstance(rv, int) else ExitStatus.SUCCESS
        sys.stdout.flush()
    except ChatflowError as exc:
        if debug:
            print_traceback()
        code = exc.exit_code
        if exc.exit_code == ExitStatus.INTERRUPTED:  # Ctrl-C (or SIGTERM, SIGHUP) is not an error: a plain notice
            code = interrupted_code()
            stopped = f"{stopped_text()}: " if code != exc.exit_code else ""
            error_line(exc.message, prefix=f"chatflow: {stopped}")
        else:
            error_line(exc.message)
        json_error(exc.message, type(exc).__name__, code, getattr(exc, "session_id", None))
    except click_errors.NoArgsIsHelpError as exc:
        sys.stderr.write(exc.format_message().rstrip("\n") + "\n")
        code = ExitStatus.USAGE
    except click_errors.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see: {exc.ctx.command_path} --help)"
        error_line(exc.format_message() + hint)
        code = ExitStatus.USAGE
        json_error(exc.format_message(), "UsageError", code, None)
    except click_errors.ClickException as exc:
        error_line(exc.format_message())
        code = exc.exit_code or ExitStatus.ERROR
    except typer.Abort:
        error_line("aborted")
        code = ExitStatus.INTERRUPTED
    except (KeyboardInterrupt, Stopped):
        code = _interrupted()
    except (BrokenPipeError, ReaderGone):
        silence_broken_pipe()
        code = ExitStatus.SUCCESS
    except SystemExit:
        raise
    except Exception as exc:  # a bug: one line, unless --debug
        if debug:
            print_traceback()
        if isinstance(exc, OSError) and exc.errno in OUTPUT_ERRNOS and exc.filename is None:
            error_line(f"cannot write the output: {exc.strerror or exc}")
            code = ExitStatus.ERROR
            silence_broken_pipe()
        else:
            error_line(f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)")
            code = ExitStatus.ERROR
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_broken_pipe()
    except (OSError, ValueError):
        pass
    sys.exit(int(code))


if __name__ == "__main__":  # pragma: no cover
    main()
