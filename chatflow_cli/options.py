"""The command line's option choices: choice enums, ``--output``, command groups and completion
callbacks. Parsing option values (``KEY=VALUE``, durations) is
:mod:`chatflow_cli._typer_adapter`'s.

A low module every typer command module imports (:mod:`chatflow_cli.cli`,
:mod:`chatflow_cli.sessions_app`); it imports typer and the run's state only, so ``--help``
stays fast.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from .context import State, set_json_errors
from .core.errors import UsageError
from .core.events import SessionStatus

__all__ = [
    "STATUSES", "SHELLS", "command_group", "ExportFormat", "ImportFormat", "InputFormat", "MessageIdScope", "OutputFormat",
    "OutputOption", "complete_agent_name", "complete_approval_call", "complete_archived_session_id",
    "complete_custom_call", "complete_session_id", "complete_shell", "complete_status",
    "output_format",
]

# ---------------------------------------------------------------------------------------
# completion of session ids (from the store)
# ---------------------------------------------------------------------------------------
def _complete_ids(ctx: typer.Context, incomplete: str, archived: bool) -> list[str]:
    try:
        db = ctx.find_root().params.get("db")
        state = State(db=db)
        store = state.store(create=False)
        if store is None:
            return []
        ids = [s.session_id for s in store.list_sessions(limit=500, archived=archived)]
        state.close()
        return [i for i in ids if i.startswith(incomplete)]
    except Exception:
        return []


def complete_session_id(ctx: typer.Context, incomplete: str) -> list[str]:
    """The ids of the 500 most recently updated sessions that are not archived."""
    return _complete_ids(ctx, incomplete, archived=False)


def complete_archived_session_id(ctx: typer.Context, incomplete: str) -> list[str]:
    """The ids of the 500 most recently updated archived sessions (``sessions unarchive``)."""
    return _complete_ids(ctx, incomplete, archived=True)


def _words_before() -> list[str] | None:
    """The words of the command line being completed before the word completed (after
    ``chatflow``), as the shell handed them to typer's completion (``COMP_WORDS`` and
    ``COMP_CWORD`` from bash, ``_TYPER_COMPLETE_ARGS`` from zsh, fish and PowerShell); None
    outside a completion. Typer hands its completion callbacks no such list."""
    import os

    from click.shell_completion import split_arg_string

    if "COMP_WORDS" in os.environ and "COMP_CWORD" in os.environ:
        return split_arg_string(os.environ["COMP_WORDS"])[1:int(os.environ["COMP_CWORD"])]
    line = os.environ.get("_TYPER_COMPLETE_ARGS")
    if line is None:
        return None
    words = split_arg_string(line)[1:]
    if os.environ.get("_TYPER_COMPLETE_WORD_TO_COMPLETE") or (words and not line.endswith(" ")):
        return words[:-1]
    return words


def _option_in(words: list[str], names: tuple[str, ...]) -> str | None:
    """The value given to the last of the options ``names`` in ``words`` (``-s ID``, ``--session=ID``)."""
    found = None
    for index, word in enumerate(words):
        if word in names and index + 1 < len(words):
            found = words[index + 1]
        elif word.startswith("--") and word.partition("=")[0] in names:
            found = word.partition("=")[2]
    return found


def _open_call_ids(ctx: typer.Context, incomplete: str, approval: bool) -> list[str]:
    """The ids of the calls still without a result in the session ``chat`` continues (its
    ``-s``/``--session``, or the latest session with ``-c``/``--continue``): those waiting for
    an approval (``approval``) or those waiting for a custom tool's result."""
    try:
        from .lookup import open_calls

        words = _words_before() or []
        root = ctx.find_root().params
        session_id = ctx.params.get("session") or _option_in(words, ("-s", "--session"))
        state = State(db=root.get("db"), config=root.get("config"))
        store = state.store(create=False)
        if store is None:
            return []
        try:
            if not session_id and (ctx.params.get("continue_") or {"-c", "--continue"} & set(words)):
                latest = store.list_sessions(limit=1, archived=False)
                session_id = latest[0].session_id if latest else None
            if not session_id:
                return []
            calls, asking = open_calls(state, store, session_id)
        finally:
            state.close()
        return [c.id for c in calls if (c.id in asking) == approval and c.id.startswith(incomplete)]
    except Exception:
        return []


def complete_approval_call(ctx: typer.Context, incomplete: str) -> list[str]:
    """``--approve``/``--deny``: the ids of the continued session's calls waiting for an approval."""
    return _open_call_ids(ctx, incomplete, approval=True)


def complete_custom_call(ctx: typer.Context, incomplete: str) -> list[str]:
    """``--tool-result ID OUTPUT``: the ids of the continued session's custom tool calls still
    without a result, for ID only (its OUTPUT is the user's to write)."""
    words = _words_before()
    if words is not None and (not words or words[-1] != "--tool-result"):
        return []
    return _open_call_ids(ctx, incomplete, approval=False)


#: The statuses ``sessions ls --status`` takes.
STATUSES = tuple(status.value for status in SessionStatus)
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
# choices
# ---------------------------------------------------------------------------------------
class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    jsonl = "jsonl"


#: ``--output`` of the listing commands, beside their ``--json``.
OutputOption = Annotated[Optional[OutputFormat], typer.Option(
    "--output", "-o", metavar="text|json|jsonl", case_sensitive=False,
    help="text (a table on a terminal), json (one document) or jsonl (one JSON object a line).")]


def output_format(output: Optional[OutputFormat], json_: bool) -> str:
    """``--output`` and ``--json`` as one format name; both, disagreeing: a usage error.

    In json/jsonl mode an error is also printed as a JSON object on stdout (see :func:`chatflow_cli.cli.main`)."""
    if json_ and output not in (None, OutputFormat.json):
        raise UsageError(f"--json means --output json; it cannot go with --output {output.value}")
    fmt = "json" if json_ else (output.value if output is not None else "text")
    set_json_errors(fmt)
    return fmt


class MessageIdScope(str, Enum):
    global_ = "global"
    session = "session"


class InputFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


class ExportFormat(str, Enum):
    chatflow = "chatflow"
    md = "md"
    openai = "openai"
    json = "json"


class ImportFormat(str, Enum):
    chatflow = "chatflow"
    md = "md"
    openai = "openai"
    llm = "llm"
    claude_code = "claude-code"


def complete_mcp_server(ctx: typer.Context, incomplete: str) -> list[str]:
    """The declared MCP servers' names (config.toml and its mcp_config files)."""
    try:
        from .config import load_settings

        params = ctx.find_root().params
        settings = load_settings(db=params.get("db"), config=params.get("config"))
        return [s.name for s in settings.mcp_servers if s.name.startswith(incomplete)]
    except Exception:
        return []


def command_group(help: str, epilog: str) -> typer.Typer:
    """A group of subcommands (``chatflow sessions``, ``memory``, ...) as every group is made:
    plain help (no Rich markup: fast, and no ``rich.markdown`` import), help when called with
    no command, ``-h`` beside ``--help``; ``epilog`` is the group's example line."""
    return typer.Typer(help=help, epilog=epilog, rich_markup_mode=None, no_args_is_help=True,
                       context_settings={"help_option_names": ["-h", "--help"]})
