"""Tool servers as a user declares them: ``[mcp_servers.NAME]`` tables of config.toml and the
``mcpServers`` JSON of Claude Desktop, Claude Code (``.mcp.json``) and Cursor; and the secret
references their ``env`` and ``headers`` values may hold.

A server is a command (``command``, ``args``, ``env``, ``cwd``) or a URL (``url``,
``headers``; ``type = "http"`` in the JSON files, which also say ``"streamable-http"``), with
chatflow's own keys: ``timeout`` and ``start_timeout`` (seconds), ``approval`` (``always``,
``ask``, ``never``), ``tool_approval`` (``{tool: policy}``) and ``tools`` (only these).
Unknown keys of a JSON file are ignored (each client adds its own); in config.toml they are
errors.

References (:func:`~chatflow_cli.core.mcp.refs.resolve`), read each time the server starts and never written anywhere:

* ``vault:VAULT/ENTRY`` or ``env:VAR`` as the whole value (``env`` and ``headers``);
* ``${vault:VAULT/ENTRY}``, ``${env:VAR}``, ``${VAR}`` or ``${VAR:-default}`` inside a value
  (the form Claude Code expands in ``.mcp.json``), in ``env``, ``headers``, ``command``,
  ``args`` and ``url``.

Every value read is remembered for scrubbing (:mod:`chatflow_cli.core.resources.secrets`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .policy import APPROVAL_POLICIES, DEFAULT_CALL_TIMEOUT_S, DEFAULT_START_TIMEOUT_S

if TYPE_CHECKING:  # pragma: no cover
    from .servers import MCPServer

__all__ = ["ServerSpec", "read_mcp_json", "spec_from_table"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_TOML_KEYS = {"command", "args", "env", "cwd", "url", "headers", "type", "timeout", "start_timeout", "approval",
              "tool_approval", "tools"}


@dataclass(frozen=True)
class ServerSpec:
    """One declared server; :meth:`build` makes the server object."""

    name: str
    transport: str  # "stdio", "http" or "sse" (refused when it starts)
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_CALL_TIMEOUT_S
    start_timeout: float = DEFAULT_START_TIMEOUT_S
    approval: str = "ask"
    tool_approval: dict[str, str] = field(default_factory=dict)
    tools: tuple[str, ...] | None = None
    source: str = ""  # where it was declared

    def build(self, vaults: Any = None, *, tools_cache: str | os.PathLike[str] | None = None) -> MCPServer:
        """The server object (not started); ``tools_cache``: see :class:`~.servers.MCPServer`."""
        from .servers import MCPServerStdio, MCPServerStreamableHttp

        options: dict[str, Any] = {"name": self.name, "timeout": self.timeout, "start_timeout": self.start_timeout,
                                   "approval": self.approval, "tool_approval": self.tool_approval,
                                   "tools": self.tools, "vaults": vaults, "tools_cache": tools_cache}
        if self.transport == "stdio":
            return MCPServerStdio({"command": self.command, "args": list(self.args), "env": dict(self.env),
                                   "cwd": self.cwd}, **options)
        server = MCPServerStreamableHttp({"url": self.url, "headers": dict(self.headers)}, **options)
        if self.transport == "sse":
            server.transport = "sse"
        return server


def _strings(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{what} must be a table of strings")
    return dict(value)


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{what} must be a number of seconds above 0")
    return float(value)


def spec_from_table(name: str, table: Any, *, source: str, strict: bool = True) -> ServerSpec:
    """A server from its table (config.toml) or object (a JSON file).

    Raises:
        ValueError: the problem, in words (the caller adds the file and line).
    """
    if not _NAME_RE.match(name):
        raise ValueError(f"MCP server name {name!r}: use 1-64 letters, digits, '_', '-' or '.'")
    if not isinstance(table, dict):
        raise ValueError(f"MCP server {name!r} must be a table")
    if strict:
        unknown = sorted(set(table) - _TOML_KEYS)
        if unknown:
            raise ValueError(f"MCP server {name!r}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_TOML_KEYS))})")
    kind = table.get("type")
    if "command" in table and "url" in table:
        raise ValueError(f"MCP server {name!r}: give a command or a url, not both")
    where = f"MCP server {name!r}"
    options: dict[str, Any] = {"name": name, "source": source}
    for key, default in (("timeout", DEFAULT_CALL_TIMEOUT_S), ("start_timeout", DEFAULT_START_TIMEOUT_S)):
        options[key] = _seconds(table[key], f"{where}: {key}") if key in table else default
    approval = table.get("approval", "ask")
    policies = _strings(table.get("tool_approval", {}), f"{where}: tool_approval")
    for policy in (approval, *policies.values()):
        if policy not in APPROVAL_POLICIES:
            raise ValueError(f"{where}: approval {policy!r}: use always, ask or never")
    options["approval"], options["tool_approval"] = approval, policies
    if "tools" in table:
        tools = table["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools):
            raise ValueError(f"{where}: tools must be a list of tool names")
        options["tools"] = tuple(tools)
    if "command" in table:
        command = table["command"]
        args = table.get("args", [])
        if not isinstance(command, str) or not command.strip():
            raise ValueError(f"{where}: command must be a non-empty string")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"{where}: args must be a list of strings")
        cwd = table.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError(f"{where}: cwd must be a string")
        return ServerSpec(transport="stdio", command=command, args=tuple(args),
                          env=_strings(table.get("env", {}), f"{where}: env"), cwd=cwd, **options)
    if "url" in table:
        url = table["url"]
        if not isinstance(url, str) or not re.match(r"^(https?://|\$\{)", url):
            raise ValueError(f"{where}: url must be an http:// or https:// URL")
        transport = "sse" if kind == "sse" else "http"
        return ServerSpec(transport=transport, url=url, headers=_strings(table.get("headers", {}), f"{where}: headers"),
                          **options)
    raise ValueError(f"{where}: give a command (a local server) or a url (a remote one)")


def read_mcp_json(path: Path) -> list[ServerSpec]:
    """The servers of an ``mcpServers`` JSON file (Claude Desktop, ``.mcp.json``, Cursor).

    Raises:
        ConfigError: the file cannot be read, is not JSON, has no ``mcpServers`` object, or
            declares a server badly (naming the file and the server).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"MCP servers file {path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"MCP servers file {path}: not JSON ({exc})") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(f"MCP servers file {path}: no \"mcpServers\" object (the shape Claude Desktop and "
                          ".mcp.json use: {\"mcpServers\": {\"NAME\": {\"command\": ...}}})")
    specs = []
    for name, table in servers.items():
        try:
            specs.append(spec_from_table(str(name), table, source=str(path), strict=False))
        except ValueError as exc:
            raise ConfigError(f"MCP servers file {path}: {exc}") from None
    return specs
