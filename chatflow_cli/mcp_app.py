"""``chatflow mcp …``: the typer group of the MCP server commands.

Each command parses its options and calls one function of :mod:`chatflow_cli.commands.mcp`
(imported inside the command, so ``--help`` compiles none of it). :mod:`chatflow_cli.cli` adds
this group to the root app.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .context import state_of
from .options import command_group, complete_mcp_server

__all__ = ["mcp_app"]

mcp_app = command_group(
    "MCP servers: tools for the agents from Model Context Protocol servers (see docs/mcp.md).",
    "Example: chatflow mcp ls",
)


@mcp_app.command("ls", epilog="\b\nExamples:\n  chatflow mcp ls\n  chatflow mcp ls time --json")
def mcp_ls(
    ctx: typer.Context,
    names: Annotated[Optional[list[str]], typer.Argument(metavar="[NAME]...", help="Only these servers.", show_default=False, autocompletion=complete_mcp_server)] = None,
    json_: Annotated[bool, typer.Option("--json", help="As JSON: each server with whether it starts, its error and its tools.")] = False,
) -> None:
    """List the declared MCP servers: each is started (all at once), its tools listed with their
    descriptions and approval policies, then stopped. Exit 0 even when one does not start."""
    from .commands.mcp import list_servers

    list_servers(state_of(ctx), list(names or ()), as_json=json_)
