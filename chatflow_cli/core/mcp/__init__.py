"""Tools from MCP servers (the Model Context Protocol), through the official ``mcp`` SDK.

::

    from chatflow_cli import Agent, MCPServerStdio

    time = MCPServerStdio({"command": "uvx", "args": ["mcp-server-time"]}, name="time", approval="always")
    agent = Agent("Clock", "Tell the time.", mcp_servers=[time])

An agent's ``mcp_servers`` start on the first turn that needs them (several at once), and
their tools are offered to the model as ``SERVER__TOOL`` (:func:`~.tools.tool_name`). A server
given a ``tools_cache`` directory keeps the tools it lists there (:mod:`.cache`): later runs
offer them without starting it, and it starts when the model calls one of them. Each
call follows the tool's approval policy (``always``, ``ask``, ``never``; ``ask`` by default):
see :class:`~chatflow_cli.core.runner.Runner`. The ``mcp`` package is imported when a server
first starts, never by importing this module.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "APPROVAL_POLICIES": "policy",
    "DEFAULT_CALL_TIMEOUT_S": "policy",
    "DEFAULT_START_TIMEOUT_S": "policy",
    "MAX_RESULT_CHARS": "results",
    "MCPServer": "servers",
    "MCPServerError": "errors",
    "MCPServerSelection": "servers",
    "MCPServerStdio": "servers",
    "MCPServerStreamableHttp": "servers",
    "MCPTool": "tools",
    "start_all": "servers",
    "tool_name": "tools",
}

if TYPE_CHECKING:  # pragma: no cover
    from .errors import MCPServerError
    from .policy import APPROVAL_POLICIES, DEFAULT_CALL_TIMEOUT_S, DEFAULT_START_TIMEOUT_S
    from .results import MAX_RESULT_CHARS
    from .servers import MCPServer, MCPServerSelection, MCPServerStdio, MCPServerStreamableHttp, start_all
    from .tools import MCPTool, tool_name

__all__ = [
    "APPROVAL_POLICIES",
    "DEFAULT_CALL_TIMEOUT_S",
    "DEFAULT_START_TIMEOUT_S",
    "MAX_RESULT_CHARS",
    "MCPServer",
    "MCPServerError",
    "MCPServerSelection",
    "MCPServerStdio",
    "MCPServerStreamableHttp",
    "MCPTool",
    "start_all",
    "tool_name",
]


def __getattr__(name: str) -> Any:
    """The names above, each imported on first use (reading config.toml imports no asyncio)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
