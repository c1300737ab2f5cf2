"""``chatflow sessions …``: the typer group of the session commands.

Each command parses its options and calls one function of :mod:`chatflow_cli.commands`
(imported inside the command, so ``--help`` compiles none of them). :mod:`chatflow_cli.cli`
adds this group to the root app.
"""

# No ``from __future__ import annotations`` here: typer reads every command's annotations
# on each run, and text annotations cost it a compile and an eval each (about 10 ms a run).

from typing import Annotated, Optional

import typer

from ._typer_adapter import parse_duration, parse_metadata
from .context import set_json_errors, state_of, validate_session_id
from .core.errors import UsageError
from .options import (
    ExportFormat,
    ImportFormat,
    OutputOption,
    command_group,
    complete_agent_name,
    complete_archived_session_id,
    complete_session_id,
    complete_status,
    output_format,
)

__all__ = ["sessions_app"]

sessions_app = command_group(
    "List, show, roll back and delete stored sessions.",
    "Example: chatflow sessions ls --limit 10",
)

# ---------------------------------------------------------------------------------------
# sessions
# ---------------------------------------------------------------------------------------
@sessions_app.command(
    "ls",
    epilog="\b\nExamples:\n  chatflow sessions ls\n  chatflow sessions ls --status running --json\n"
    "  chatflow sessions ls --metadata ticket=T-42 --json\n  chatflow sessions ls --since 7d --title invoice\n"
    "  chatflow sessions ls -n 50 --after \"$(chatflow sessions ls -n 50 --json | jq -r '.[-1].cursor')\"\n"
    "  chatflow sessions ls --tree\n  chatflow sessions ls --archived",
)
def sessions_ls(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, metavar="N", help="At most this many, newest first (0: all).")] = 50,
    agent: Annotated[Optional[str], typer.Option("--agent", "-a", metavar="NAME", help="Only sessions whose active agent is this.", autocompletion=complete_agent_name)] = None,
    status: Annotated[Optional[str], typer.Option("--status", metavar="STATUS", help="Only this status: idle, running, rescheduled, terminated.", autocompletion=complete_status)] = None,
    metadata: Annotated[Optional[list[str]], typer.Option("--metadata", "-m", metavar="KEY=VALUE", help="Only sessions whose metadata has KEY=VALUE (repeatable: all must match).")] = None,
    since: Annotated[Optional[str], typer.Option("--since", metavar="WHEN", help="Only sessions updated since: a duration back (30m, 12h, 7d, 2w) or a date (2026-01-31).")] = None,
    until: Annotated[Optional[str], typer.Option("--until", metavar="WHEN", help="Only sessions last updated before: a duration back or a date.")] = None,
    title: Annotated[Optional[str], typer.Option("--title", "--grep", metavar="TEXT", help="Only sessions whose title contains TEXT (any case).")] = None,
    after: Annotated[Optional[str], typer.Option("--after", metavar="ID|CURSOR", help="The page after this session id, or after this cursor (the 'cursor' of the last row of --json).")] = None,
    archived: Annotated[bool, typer.Option("--archived", help="List archived sessions (only those).")] = False,
    tree: Annotated[bool, typer.Option("--tree", help="Show forks under the session they were forked from.")] = False,
    output: OutputOption = None,
    json_: Annotated[bool, typer.Option("--json", help="Same as --output json: a JSON array (each row has its 'cursor').")] = False,
) -> None:
    """List stored sessions: id, active agent, status, turns, last update, title."""
    from .commands.sessions import list_sessions

    list_sessions(state_of(ctx), limit=limit, agent=agent, status=status, output=output_format(output, json_),
                  metadata=parse_metadata(metadata), since=since, until=until, title=title, after=after,
                  archived=archived, tree=tree)


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
    turn: Annotated[Optional[int], typer.Option("--turn", "-t", min=0, metavar="N", help="Only turn N (as 'sessions search' names it).")] = None,
) -> None:
    """Show a session as numbered turns: messages, tool calls, handoffs."""
    from .commands.sessions import show_session

    fmt = output_format(output, json_)
    show_session(state_of(ctx), session_id, include_rolled_back=all_, full=full, output=fmt, pager=not no_pager,
                 turn=turn)


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
    from .commands.interrupt import interrupt_session

    interrupt_session(state_of(ctx), session_id, wait=wait, as_json=json_)


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
    from .commands.rollback import rollback_session

    if (to is None) == (last is None):
        raise UsageError("give exactly one of --to N or --last K")
    rollback_session(state_of(ctx), session_id, to=to, last=last, yes=yes)


@sessions_app.command(
    "compact",
    epilog="\b\nExamples:\n  chatflow sessions compact support-42\n"
           "  chatflow sessions compact support-42 --through 30 --instructions \"keep the order ids\"",
)
def sessions_compact(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(metavar="ID", help="Session id.", autocompletion=complete_session_id)],
    through: Annotated[Optional[int], typer.Option("--through", min=1, metavar="N", help="Summarise turns 1..N (default: every turn but the newest).")] = None,
    instructions: Annotated[Optional[str], typer.Option("--instructions", metavar="TEXT", help="What the summary should keep or focus on.")] = None,
    output: OutputOption = None,
    json_: Annotated[bool, typer.Option("--json", help="Same as --output json.")] = False,
) -> None:
    """Summarise the older turns of a session into one message; nothing is deleted."""
    from .commands.compact import compact_command

    mode = output_format(output, json_)
    compact_command(state_of(ctx), session_id, through=through, instructions=instructions, output=mode)


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
    from .commands.delete import delete_sessions

    chosen = sum(bool(x) for x in (session_ids, older_than, all_))
    if chosen != 1:
        raise UsageError("give session ids, --older-than DURATION, or --all (one of them)")
    delete_sessions(
        state_of(ctx),
        list(session_ids or []),
        older_than=parse_duration(older_than) if older_than else None,
        all_=all_,
        yes=yes,
    )


@sessions_app.command(
    "search",
    epilog="\b\nQuery syntax: words (all must match), \"an exact phrase\", word OR word,\n"
    "NOT word (or -word), prefix*. Case and accents are ignored.\n\b\nExamples:\n"
    "  chatflow sessions search deploy\n  chatflow sessions search '\"connection reset\" OR timeout' --since 7d\n"
    "  chatflow sessions search invoice --agent Support --json\n  chatflow sessions search zebra42 --tools --all",
)
def sessions_search(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What to find (syntax below).")],
    session: Annotated[Optional[str], typer.Option("--session", "-s", metavar="ID", help="Only this session.", autocompletion=complete_session_id)] = None,
    agent: Annotated[Optional[str], typer.Option("--agent", "-a", metavar="NAME", help="Only sessions whose active agent is this.", autocompletion=complete_agent_name)] = None,
    since: Annotated[Optional[str], typer.Option("--since", metavar="WHEN", help="Only messages since: a duration back (30m, 12h, 7d, 2w) or a date (2026-01-31).")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=10000, metavar="N", help="At most this many hits, best first.")] = 20,
    tools: Annotated[bool, typer.Option("--tools", help="Also search tool-call arguments and tool results.")] = False,
    all_: Annotated[bool, typer.Option("--all", help="Also rolled-back and failed turns (marked).")] = False,
    output: OutputOption = None,
    json_: Annotated[bool, typer.Option("--json", help="Same as --output json: a JSON array of hits.")] = False,
) -> None:
    """Search the text of every session; one hit per turn: session, turn, age, snippet."""
    from .commands.search import search_sessions

    search_sessions(state_of(ctx), query, session_id=session, agent=agent, since=since, limit=limit, tools=tools,
                    include_removed=all_, output=output_format(output, json_))


@sessions_app.command(
    "fork",
    epilog="\b\nExamples:\n  chatflow sessions fork support-42 --at 3\n  chatflow sessions fork support-42 --at 3 --into support-42-b\n"
    "  chatflow chat -s \"$(chatflow sessions fork support-42 --at 3)\" 'try another way'",
)
def sessions_fork(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(metavar="ID", help="Session to fork (not changed).", autocompletion=complete_session_id)],
    at: Annotated[Optional[int], typer.Option("--at", metavar="N", help="Copy turns 1..N (default: every completed turn).")] = None,
    into: Annotated[Optional[str], typer.Option("--into", metavar="NEW", help="The new session's id (default: ID-fork-<hex>).")] = None,
    metadata: Annotated[Optional[list[str]], typer.Option("--metadata", "-m", metavar="KEY=VALUE", help="Metadata of the new session (repeatable); the source's is not copied.")] = None,
    output: OutputOption = None,
    json_: Annotated[bool, typer.Option("--json", help="Same as --output json: the new session's row.")] = False,
) -> None:
    """Copy turns 1..N of a session into a new session (nothing is re-run); print its id."""
    from .commands.search import fork_session

    fork_session(state_of(ctx), session_id, at=at, into=validate_session_id(into) if into is not None else None,
                 output=output_format(output, json_), metadata=parse_metadata(metadata) or None)


@sessions_app.command(
    "rename",
    epilog="\b\nExamples:\n  chatflow sessions rename support-42 'Refund for order 1234'\n  chatflow sessions rename support-42 ''",
)
def sessions_rename(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(metavar="ID", help="Session id.", autocompletion=complete_session_id)],
    title: Annotated[str, typer.Argument(metavar="TITLE", help="The new title ('' goes back to the first message's first line).")],
) -> None:
    """Set a session's title."""
    from .commands.search import rename_session

    rename_session(state_of(ctx), session_id, title)


@sessions_app.command(
    "archive",
    epilog="\b\nExamples:\n  chatflow sessions archive old-1 old-2\n  chatflow sessions ls --archived",
)
def sessions_archive(
    ctx: typer.Context,
    session_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="Session ids.", autocompletion=complete_session_id)],
) -> None:
    """Hide sessions from 'sessions ls' and completion, keeping them; they take no new turns."""
    from .commands.search import archive_sessions

    archive_sessions(state_of(ctx), session_ids, archive=True)


@sessions_app.command(
    "unarchive",
    epilog="\b\nExample:\n  chatflow sessions unarchive old-1",
)
def sessions_unarchive(
    ctx: typer.Context,
    session_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="Session ids.", autocompletion=complete_archived_session_id)],
) -> None:
    """Bring archived sessions back to 'sessions ls'; they take new turns again."""
    from .commands.search import archive_sessions

    archive_sessions(state_of(ctx), session_ids, archive=False)
@sessions_app.command(
    "export",
    epilog=(
        "\b\nExamples:\n  chatflow sessions export support-42 > support-42.jsonl\n"
        "  chatflow sessions export support-42 --format md -o support-42.md\n"
        "  chatflow sessions export --all --since 7d --format openai -o evals.jsonl"
    ),
)
def sessions_export(
    ctx: typer.Context,
    session_ids: Annotated[Optional[list[str]], typer.Argument(metavar="ID...", help="Session ids.", autocompletion=complete_session_id, show_default=False)] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every session, archived ones too.")] = False,
    since: Annotated[Optional[str], typer.Option("--since", metavar="DURATION", help="Only sessions updated in the last DURATION (30m, 12h, 7d); alone, of every session (archived ones too).")] = None,
    format_: Annotated[ExportFormat, typer.Option("--format", "-f", metavar="chatflow|md|openai|json", case_sensitive=False, help="chatflow (lossless JSON Lines: a header, then every event), md (a Markdown transcript), openai (Chat Completions {\"messages\": [...]} lines) or json (what 'sessions show --json' prints).")] = ExportFormat.chatflow,
    output_file: Annotated[Optional[str], typer.Option("--output-file", "-o", metavar="FILE", help="Write to FILE (whole or not at all) instead of stdout.")] = None,
    per_turn: Annotated[bool, typer.Option("--per-turn", help="With --format openai: one line per turn, its context window.")] = False,
) -> None:
    """Export sessions: every event losslessly, a Markdown transcript, or Chat Completions lines."""
    from .commands.transfer import export_sessions

    if bool(session_ids) and all_:
        raise UsageError("give session ids or --all, not both")
    if not session_ids and not all_ and since is None:
        raise UsageError("give session ids, --all, or --since DURATION")
    export_sessions(state_of(ctx), list(session_ids or []), all_=all_,
                    since=parse_duration(since) if since else None, fmt=format_.value,
                    output=output_file, per_turn=per_turn)


@sessions_app.command(
    "import",
    epilog=(
        "\b\nExamples:\n  chatflow sessions import ~/.config/io.datasette.llm/logs.db\n"
        "  chatflow sessions import ~/.claude/projects/-home-ana-shop/SESSION.jsonl\n"
        "  chatflow sessions import support-42.jsonl --into support-42-copy\n"
        "  cat evals.jsonl | chatflow sessions import - --from openai --dry-run --json"
    ),
)
def sessions_import(
    ctx: typer.Context,
    path: Annotated[str, typer.Argument(metavar="FILE", help="The file to import, or - for stdin.")],
    from_: Annotated[Optional[ImportFormat], typer.Option("--from", metavar="chatflow|md|openai|llm|claude-code", case_sensitive=False, help="The file's format (default: detected).")] = None,
    into: Annotated[Optional[str], typer.Option("--into", metavar="ID", help="Import into this session (created when new; its own turns come first).", autocompletion=complete_session_id)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the file and say what would be added; write nothing.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print {\"dry_run\", \"format\", \"sessions\": [...]} as JSON.")] = False,
) -> None:
    """Import sessions from chatflow, Markdown, Chat Completions, llm or Claude Code files."""
    from .commands.transfer import import_file

    if json_:
        set_json_errors("json")
    import_file(state_of(ctx), path, fmt=from_.value if from_ is not None else None, into=into, dry_run=dry_run,
                json_=json_)
