"""``chatflow memory …``: the typer group of the memory-store commands.

Each command parses its options and calls one function of :mod:`chatflow_cli.commands.memory`
(imported inside the command, so ``--help`` compiles none of it). :mod:`chatflow_cli.cli`
adds this group to the root app.
"""

# No ``from __future__ import annotations`` here: typer reads every command's annotations
# on each run, and text annotations cost it a compile and an eval each (about 10 ms a run).

from typing import Annotated, Optional

import typer

from .context import state_of
from .options import OutputOption, command_group, output_format

__all__ = ["memory_app"]

memory_app = command_group(
    "Memory stores: documents that sessions mount (chat --memory NAME) and that outlive them.",
    "Example: chatflow memory create notes && chatflow chat --memory notes \"remember: I like tea\"",
)

_NAME = typer.Argument(metavar="NAME", help="The memory store's name (a-z 0-9 _ . -, up to 64).")
_JSON = typer.Option("--json", help="Same as --output json.")


@memory_app.command("create", epilog="\b\nExample:\n  chatflow memory create notes --description \"what I told the assistant\"")
def memory_create(
    ctx: typer.Context,
    name: Annotated[str, _NAME],
    description: Annotated[str, typer.Option("--description", "-d", metavar="TEXT", help="What the store is for.")] = "",
    output: OutputOption = None,
    json_: Annotated[bool, _JSON] = False,
) -> None:
    """Create an empty memory store (exit 2 if it exists)."""
    from .commands.memory import create_store

    create_store(state_of(ctx), name, description=description, output=output_format(output, json_))


@memory_app.command("ls", epilog="\b\nExamples:\n  chatflow memory ls\n  chatflow memory ls notes customers/\n  chatflow memory ls --json")
def memory_ls(
    ctx: typer.Context,
    name: Annotated[Optional[str], typer.Argument(metavar="[NAME]", help="List this store's documents.")] = None,
    folder: Annotated[str, typer.Argument(metavar="[FOLDER]", help="Only the documents under this folder.")] = "",
    output: OutputOption = None,
    json_: Annotated[bool, _JSON] = False,
) -> None:
    """List the memory stores, or the documents of one (size, version, age, path)."""
    from .commands.memory import list_memory

    list_memory(state_of(ctx), name, folder, output=output_format(output, json_))


@memory_app.command("show", epilog="\b\nExamples:\n  chatflow memory show notes customers/acme.md\n  chatflow memory show notes customers/acme.md --version 3")
def memory_show(
    ctx: typer.Context,
    name: Annotated[str, _NAME],
    path: Annotated[str, typer.Argument(metavar="PATH", help="The document's path in the store.")],
    version: Annotated[Optional[int], typer.Option("--version", "-v", metavar="N", help="The text write N left (see history).")] = None,
    output: OutputOption = None,
    json_: Annotated[bool, _JSON] = False,
) -> None:
    """Print a memory document's text."""
    from .commands.memory import show

    show(state_of(ctx), name, path, version=version, output=output_format(output, json_))


@memory_app.command("history", epilog="\b\nExamples:\n  chatflow memory history notes\n  chatflow memory history notes customers/acme.md --json")
def memory_history(
    ctx: typer.Context,
    name: Annotated[str, _NAME],
    path: Annotated[Optional[str], typer.Argument(metavar="[PATH]", help="Only the writes of this document.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, metavar="N", help="Only the newest N writes (0: all).")] = 0,
    output: OutputOption = None,
    json_: Annotated[bool, _JSON] = False,
) -> None:
    """Every write of a memory store, oldest first: its number, age, kind, path and who made it."""
    from .commands.memory import history

    history(state_of(ctx), name, path, limit=limit or None, output=output_format(output, json_))


@memory_app.command("revert", epilog="\b\nExamples:\n  chatflow memory revert notes 12\n  chatflow memory revert notes 12-15   (a folder's rm: every document back)")
def memory_revert(
    ctx: typer.Context,
    name: Annotated[str, _NAME],
    writes: Annotated[list[str], typer.Argument(metavar="N[-M]", help="The writes to undo (see history): N, or a range N-M; several are undone together or not at all.")],
    force: Annotated[bool, typer.Option("--force", help="Also when later writes changed the document (they are undone too, a later rename included; the history keeps them).")] = False,
    output: OutputOption = None,
    json_: Annotated[bool, _JSON] = False,
) -> None:
    """Undo write N (or several) with new writes: each document goes back to what it held before."""
    from .commands.memory import revert

    revert(state_of(ctx), name, writes, force=force, output=output_format(output, json_))


@memory_app.command("write", epilog="\b\nExample:\n  chatflow memory write notes customers/acme.md < acme.md")
def memory_write(
    ctx: typer.Context,
    name: Annotated[str, _NAME],
    path: Annotated[str, typer.Argument(metavar="PATH", help="The document's path in the store.")],
    expected: Annotated[Optional[int], typer.Option("--if-version", metavar="N", help="Only if the document is at version N (0: only if it does not exist).")] = None,
    output: OutputOption = None,
    json_: Annotated[bool, _JSON] = False,
) -> None:
    """Write a memory document's whole text, read from stdin."""
    from .commands.memory import write

    write(state_of(ctx), name, path, expected_version=expected, output=output_format(output, json_))


@memory_app.command("rm", epilog="\b\nExamples:\n  chatflow memory rm notes customers/acme.md\n  chatflow memory rm notes --yes")
def memory_rm(
    ctx: typer.Context,
    name: Annotated[str, _NAME],
    path: Annotated[Optional[str], typer.Argument(metavar="[PATH]", help="A document or folder to delete (a new write; revert brings it back).")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before deleting a whole store.")] = False,
) -> None:
    """Delete a document or folder of a memory store, or (no PATH) the store with its history."""
    from .commands.memory import delete

    delete(state_of(ctx), name, path, yes=yes)


@memory_app.command("export", epilog="\b\nExample:\n  chatflow memory export notes -o notes.jsonl")
def memory_export(
    ctx: typer.Context,
    name: Annotated[str, _NAME],
    output_file: Annotated[Optional[str], typer.Option("--output-file", "-o", metavar="FILE", help="Write to FILE instead of stdout.")] = None,
) -> None:
    """Write a memory store's documents as JSON lines (import reads them back)."""
    from .commands.memory import export_store

    export_store(state_of(ctx), name, output_file=output_file)


@memory_app.command("import", epilog="\b\nExample:\n  chatflow memory import notes.jsonl --into notes-copy")
def memory_import(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(metavar="FILE", help="A memory export (- for stdin).")],
    into: Annotated[Optional[str], typer.Option("--into", metavar="NAME", help="The store to write (default: the export's).")] = None,
    output: OutputOption = None,
    json_: Annotated[bool, _JSON] = False,
) -> None:
    """Write an export's documents into a memory store (created if missing); unchanged ones are skipped."""
    from .commands.memory import import_store

    import_store(state_of(ctx), source, into=into, output=output_format(output, json_))


@memory_app.command("search", epilog="\b\nExamples:\n  chatflow memory search acme\n  chatflow memory search '\"on fridays\" OR deploy' --store notes --json")
def memory_search(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(metavar="QUERY", help="Words, \"a phrase\", OR, NOT, prefix* (as sessions search).")],
    store: Annotated[Optional[list[str]], typer.Option("--store", "-s", metavar="NAME", help="Only this store (repeatable).")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, metavar="N", help="At most N documents.")] = 20,
    output: OutputOption = None,
    json_: Annotated[bool, _JSON] = False,
) -> None:
    """Search the documents of every memory store (or of --store) with the full-text search of sessions."""
    from .commands.memory import search

    search(state_of(ctx), query, stores=store, limit=limit, output=output_format(output, json_))
