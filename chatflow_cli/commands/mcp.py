"""``chatflow mcp ls``: the declared MCP servers, whether they start, and their tools.

The servers come from config.toml (``[mcp_servers.NAME]``, ``mcp_config``); each is started
(all in parallel, as a turn would), listed and stopped again. No secret is shown: a stdio
server is its command and arguments (its ``env`` by names only), an HTTP server its URL
without credentials or query, headers by names only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..assembly import build_servers, vault_reader
from ..context import notice
from ..core.errors import NotFoundError
from ..render import dumps, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State

__all__ = ["list_servers", "server_rows"]


def server_rows(state: State, names: list[str]) -> list[dict[str, Any]]:
    """One row a server: ``{"name", "transport", "where", "env", "headers", "approval",
    "starts", "error", "warning", "tools": [{"name", "server_name", "description", "approval"}]}``
    (``warning``: tools its ``tools`` or ``tool_approval`` name that it does not list).

    Raises:
        NotFoundError: a name that is no declared server (exit 3).
    """
    settings = state.settings()
    specs = {s.name: s for s in settings.mcp_servers}
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise NotFoundError(f"no MCP server {safe_text(unknown[0])!r} (declared: {', '.join(specs) or 'none'}; "
                            "see docs/mcp.md)")
    vaults = vault_reader(settings, state.store(create=False))
    servers = {n: s for n, s in build_servers(settings, vaults).items() if not names or n in names}
    from ..core.mcp import start_all
    from ..core.mcp.servers import stop_all, unknown_tools_note

    try:
        errors = start_all(servers.values())
        rows = []
        for name, server in servers.items():
            spec = specs[name]
            tools = [] if name in errors else [
                {"name": t.name, "server_name": t.remote_name, "description": t.description, "approval": t.approval}
                for t in server.agent_tools().values()]
            rows.append({"name": name, "transport": spec.transport, "where": server.describe(),
                         "env": sorted(spec.env), "headers": sorted(spec.headers), "approval": spec.approval,
                         "starts": name not in errors, "error": errors.get(name),
                         "warning": None if name in errors else unknown_tools_note(server), "tools": tools})
        return rows
    finally:
        stop_all(servers.values())


def list_servers(state: State, names: list[str], *, as_json: bool) -> None:
    """Print :func:`server_rows` as text or JSON."""
    rows = server_rows(state, names)
    for row in rows:  # said on stderr, as a chat says it
        if row["warning"]:
            notice(state, safe_text(row["warning"]))
    if as_json:
        state.env.stdout.write(dumps(rows, indent=2) + "\n")
        return
    if not rows:
        state.env.stdout.write("No MCP servers are declared: add [mcp_servers.NAME] to config.toml, or point "
                               "mcp_config at an mcpServers JSON file (docs/mcp.md).\n")
        return
    lines: list[str] = []
    for row in rows:
        state_text = "starts" if row["starts"] else "does not start"
        lines.append(safe_text(f"{row['name']}  {row['transport']}  {row['where']}  approval={row['approval']}  "
                               f"{state_text}, {len(row['tools'])} tool(s)"))
        if row["error"]:
            lines.append("  " + safe_text(row["error"]))
        for tool in row["tools"]:
            description = " ".join(str(tool["description"]).split())
            if len(description) > 100:
                description = description[:99] + "…"
            lines.append(safe_text(f"  {tool['name']}  [{tool['approval']}]  {description}"))
    state.env.stdout.write("".join(line + "\n" for line in lines))
