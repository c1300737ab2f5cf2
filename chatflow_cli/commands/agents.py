"""``agents ls``: the configured agents, their tools and handoffs.

Every tool module is imported, as ``chat`` does (:func:`chatflow_cli.assembly.build_agents`):
one that does not import is a config error (exit 9) naming the file and line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..assembly import build_agents, vault_reader
from ..config import DEFAULT_AGENT_NAME, DEFAULT_INSTRUCTIONS, AgentSpec
from ..context import terminal_width, write_lines
from ..render import agents_lines, dumps

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State

__all__ = ["list_agents"]


def list_agents(state: State, *, output: str) -> None:
    """Print the configured agents (one default agent when none are configured).

    Args:
        state: The run.
        output: ``text`` (a table), ``json`` (one array) or ``jsonl`` (one object a line);
            each agent as ``{"name", "start", "model", "handoffs", "tools", "instructions",
            "version"}`` (``version``: the short hash of its definition,
            :func:`chatflow_cli.core.agents.agent_version`, which each turn it runs records).

    Raises:
        ConfigError: The config file is bad, or a tool module cannot be imported.
    """
    settings = state.settings()
    _, built = build_agents(settings, vaults=vault_reader(settings, state.store(create=False)) if settings.mcp_servers
                            else None)
    servers = {id(s.server): s.server for a in built.values() for s in a.mcp_servers}
    try:
        _list(state, settings, built, output, servers)
    finally:
        if servers:
            from ..core.mcp.servers import stop_all

            stop_all(servers.values())


def _list(state: State, settings: Any, built: dict[str, Any], output: str, servers: dict[int, Any]) -> None:
    failed: dict[str, str] = {}
    if servers:  # their tools are listed when they start: all at once
        from ..core.mcp import start_all

        failed = start_all(servers.values())
        if output == "text":
            from ..context import notice

            for error in failed.values():
                notice(state, error)
    specs = list(settings.agents) or [AgentSpec(DEFAULT_AGENT_NAME, DEFAULT_INSTRUCTIONS)]
    start = settings.default_agent or specs[0].name
    rows = []
    for spec in specs:
        agent = built.get(spec.name)
        tools: list[dict[str, Any]] = []
        for tool_spec, tool in zip(spec.tools, getattr(agent, "tools", None) or ()):
            entry = {"name": tool.name, "kind": "custom" if tool_spec.ref is None else "python"}
            if tool_spec.ref is not None:
                entry["ref"] = tool_spec.ref
            tools.append(entry)
        for server in getattr(agent, "mcp_servers", None) or ():
            if server.name in failed:
                tools.append({"name": f"{server.name}__*", "kind": "mcp", "server": server.name,
                              "error": failed[server.name]})
                continue
            tools.extend({"name": t.name, "kind": "mcp", "server": server.name, "approval": t.approval}
                         for t in server.agent_tools().values())
        rows.append({
            "name": spec.name,
            "start": spec.name == start,
            "model": spec.model or settings.model,
            "handoffs": list(spec.handoffs),
            "tools": tools,
            "instructions": spec.instructions,
            "version": agent.version if agent is not None else None,
        })
    if output == "json":
        state.env.stdout.write(dumps(rows, indent=2) + "\n")
        return
    if output == "jsonl":
        state.env.stdout.write("".join(dumps(r) + "\n" for r in rows))
        return
    write_lines(state, agents_lines(rows, width=terminal_width(state)))
