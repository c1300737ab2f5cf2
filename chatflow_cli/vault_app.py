"""``chatflow vault …``: the typer group of the vault commands.

Each command parses its options and calls one function of :mod:`chatflow_cli.commands.vaults`
(imported inside the command, so ``--help`` compiles none of it). :mod:`chatflow_cli.cli` adds
this group to the root app.
"""

# No ``from __future__ import annotations`` here: typer reads every command's annotations
# on each run, and text annotations cost it a compile and an eval each (about 10 ms a run).

from typing import Annotated, Optional

import typer

from .context import state_of
from .core.errors import UsageError
from .options import command_group

__all__ = ["vault_app"]

vault_app = command_group(
    "Vaults: secrets that tools use and the model never sees (values in the keyring or an owner-only file).",
    "Example: chatflow vault create work && chatflow vault set work github_token",
)


def _json_errors() -> None:
    """With --json an error is a JSON object on stdout too, as chat's and the listings' are."""
    from .context import set_json_errors

    set_json_errors("json")


@vault_app.command("create", epilog="\b\nExample:\n  chatflow vault create work")
def vault_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The vault's name: 1-64 characters of a-z, 0-9, '_', '.', '-', starting with a letter or a digit (the rule of memory stores too).")],
) -> None:
    """Create an empty vault."""
    from .commands.vaults import create_vault

    create_vault(state_of(ctx), name)


@vault_app.command(
    "set",
    epilog="\b\nExamples:\n  chatflow vault set work github_token            (typed at a prompt, not shown)\n"
    "  pass show github | head -n 1 | chatflow vault set work github_token\n"
    "  chatflow vault set work deploy_key --multiline < key.pem\n"
    "  chatflow vault set work github_token --env GITHUB_TOKEN",
)
def vault_set(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The vault.")],
    entry: Annotated[str, typer.Argument(metavar="ENTRY", help="The entry's name (what a tool's Secret(...) asks for).")],
    value: Annotated[Optional[str], typer.Argument(metavar="", hidden=True, show_default=False)] = None,
    env: Annotated[Optional[str], typer.Option("--env", metavar="VAR", help="Record a reference to this environment variable instead of a value (read each time a tool needs it).")] = None,
    keyring: Annotated[bool, typer.Option("--keyring", help="Store the value in the OS keyring (the default when one is usable).")] = False,
    file: Annotated[bool, typer.Option("--file", help="Store the value in the owner-only file in the data directory (the default when no keyring is usable).")] = False,
    multiline: Annotated[bool, typer.Option("--multiline", help="Keep a value of several lines (a PEM key): all of stdin, or at a terminal every line up to Ctrl-D. Without it a value is one line.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the entry as JSON (name, location, where, updated_at).")] = False,
) -> None:
    """Set an entry: its value is typed at a prompt without echo, or read from stdin.

    A value is never taken from the command line. It is one line: all of stdin with one
    trailing newline dropped (a value with more lines is refused unless --multiline). It
    lives in the OS keyring when one is usable, else in an owner-only file in the data
    directory; --env records a variable's name instead. The database holds only the names
    and where each value lives.
    """
    if json_:
        _json_errors()
    if keyring and file:
        raise UsageError("--keyring and --file exclude each other")
    from .commands.vaults import set_entry

    set_entry(state_of(ctx), name, entry, given=value, env=env,
              location="keyring" if keyring else "file" if file else None, as_json=json_, multiline=multiline)


@vault_app.command("ls", epilog="\b\nExamples:\n  chatflow vault ls\n  chatflow vault ls work --json")
def vault_ls(
    ctx: typer.Context,
    name: Annotated[Optional[str], typer.Argument(metavar="[NAME]", help="Only this vault.", show_default=False)] = None,
    json_: Annotated[bool, typer.Option("--json", help="As JSON: vaults with their entries' names and locations.")] = False,
) -> None:
    """List vaults and their entries: names and where each value lives, never a value."""
    if json_:
        _json_errors()
    from .commands.vaults import list_vaults

    list_vaults(state_of(ctx), name, as_json=json_)


@vault_app.command("rm", epilog="\b\nExamples:\n  chatflow vault rm work github_token\n  chatflow vault rm work --yes")
def vault_rm(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The vault.")],
    entry: Annotated[Optional[str], typer.Argument(metavar="[ENTRY]", help="Only this entry (default: the whole vault).", show_default=False)] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before removing a vault with entries.")] = False,
) -> None:
    """Remove an entry, or a whole vault; values are deleted from the keyring or file too."""
    from .commands.vaults import remove_vault

    remove_vault(state_of(ctx), name, entry, yes=yes)
