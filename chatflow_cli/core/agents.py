"""Agents: a name, instructions, a model, tools, and the agents it may hand the conversation to.

::

    billing = Agent(name="Billing", instructions="Billing specialist", model="gpt-4o")
    support = Agent(name="Support", instructions="Support", handoffs=[billing], model="gpt-4o")

Each handoff target is offered to the model as a tool named ``transfer_to_<name in snake
case>`` with no parameters: ``Billing`` -> ``transfer_to_billing``,
``OrderTrackingAgent`` -> ``transfer_to_order_tracking_agent``. Calling it makes the target
the session's active agent.

Agents compare and hash by identity. ``tools`` and ``handoffs`` are stored as tuples; they
may be reassigned after construction (so two agents can hand off to each other), and
plain functions in ``tools`` are wrapped with :func:`~chatflow_cli.core.tools.tool`.
Names are unique within a Runner: :func:`reachable_agents` raises
:class:`AgentDefinitionError` when two different agents share one.

An agent's *version* (:attr:`Agent.version`, :func:`agent_version`) names its definition:
the first 12 hex digits of the sha256 of a canonical JSON of its instructions, model, own
tools (name, description and JSON schema of the parameters) and handoff target names.
Any change of those is a new version; the Runner stores the version with every reply the
agent gives, so a session can say when its agent changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from .errors import UsageError
from .tools import Tool, ToolDefinitionError, tool

__all__ = ["Agent", "AgentDefinitionError", "HandoffTool", "agent_version", "handoff_tool_name", "reachable_agents",
           "snake_case"]

#: Hex digits of an agent version (of the sha256 of its definition).
VERSION_HEX = 12


class AgentDefinitionError(UsageError):
    """Two agents share a name, or an agent's tool names collide."""


def snake_case(name: str) -> str:
    """``"OrderTrackingAgent"`` -> ``"order_tracking_agent"``; ``"Billing Team"`` -> ``"billing_team"``."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name.strip())
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", text)
    text = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()
    return text or "agent"


def handoff_tool_name(agent_name: str) -> str:
    """The tool name offered for a handoff to ``agent_name`` (at most 64 characters)."""
    return ("transfer_to_" + snake_case(agent_name))[:64]


class HandoffTool(Tool):
    """The ``transfer_to_<target>`` tool; ``target`` is the :class:`Agent` it hands off to."""

    def __init__(self, target: Agent) -> None:
        summary = (target.instructions or "").strip().splitlines()[0] if (target.instructions or "").strip() else ""
        description = f"Hand the conversation over to the {target.name} agent."
        if summary:
            description += f" {target.name}: {summary[:200]}"
        super().__init__(
            handoff_tool_name(target.name),
            description,
            {"type": "object", "properties": {}, "additionalProperties": False},
            None,
        )
        self.target = target

    @property
    def is_custom(self) -> bool:  # answered by the Runner itself, never by submit_tool_result
        return False


def _as_tool(item: Any) -> Tool:
    if isinstance(item, Tool):
        return item
    if callable(item):
        return tool(item)
    raise ToolDefinitionError(f"agent tools must be Tool objects or functions, got {item!r}")


class Agent:
    """An agent: ``Agent(name, instructions, model=None, tools=(), handoffs=())``.

    Args:
        name: unique within a Runner; stored as the session's ``active_agent_name``.
        instructions: sent first, as a system message, on every request this agent makes.
        model: the model name; ``None`` uses the Runner's ``default_model``.
        tools: :class:`Tool` objects (or plain functions, wrapped with ``@tool``).
        handoffs: agents this one may transfer the conversation to.
        tool_choice: Chat Completions ``tool_choice`` for the first request of a turn
            (``"auto"``, ``"required"``, ``"none"`` or a tool name); later requests in the
            same turn use the server's default, so a forced tool cannot loop forever.
        max_context_tokens: the context size (tokens) of this agent's model, when the
            model table of :mod:`chatflow_cli.core.tokens` does not know it or is wrong;
            ``None``: the Runner's ``max_context_tokens``, else the table.
        version: what names this definition of the agent in the turns it runs (a non-empty
            str); ``None`` (the default): :func:`agent_version` of the agent, computed from
            its fields each time it is read, so any change of them is a new version.
        mcp_servers: MCP servers (:class:`~chatflow_cli.core.mcp.MCPServerStdio`,
            :class:`~chatflow_cli.core.mcp.MCPServerStreamableHttp`, or ``server.only(...)``
            for some of its tools) whose tools the agent is offered; they start on the first
            turn that needs them (:mod:`chatflow_cli.core.mcp`).
    """

    __slots__ = ("_tool_cache", "_version", "_version_cache", "handoffs", "instructions", "max_context_tokens",
                 "mcp_servers", "model", "name", "tool_choice", "tools")

    name: str
    instructions: str
    model: str | None
    tool_choice: str | dict[str, Any] | None
    tools: tuple[Tool, ...]  # any iterable assigned becomes a tuple of Tool (functions wrapped)
    handoffs: tuple[Agent, ...]
    mcp_servers: tuple[Any, ...]  # MCP servers (chatflow_cli.core.mcp) whose tools the agent is offered
    max_context_tokens: int | None
    _tool_cache: tuple[tuple[tuple[Tool, ...], tuple[Agent, ...]], dict[str, Tool]] | None
    _version: str | None
    _version_cache: tuple[Any, str] | None

    def __init__(
        self,
        name: str,
        instructions: str = "",
        model: str | None = None,
        tools: Iterable[Any] = (),
        handoffs: Iterable[Agent] = (),
        *,
        tool_choice: str | dict[str, Any] | None = None,
        max_context_tokens: int | None = None,
        version: str | None = None,
        mcp_servers: Iterable[Any] = (),
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise AgentDefinitionError(f"agent name must be a non-empty string, got {name!r}")
        if max_context_tokens is not None and (isinstance(max_context_tokens, bool)
                                               or not isinstance(max_context_tokens, int) or max_context_tokens < 2):
            raise AgentDefinitionError(f"max_context_tokens must be an int >= 2, got {max_context_tokens!r}")
        if version is not None and (not isinstance(version, str) or not version.strip()):
            raise AgentDefinitionError(f"version must be a non-empty str or None, got {version!r}")
        self.max_context_tokens = max_context_tokens
        self._version = version
        self._version_cache = None
        self.name = name
        self.instructions = instructions or ""
        self.model = model
        self.tool_choice = tool_choice
        self.tools = tools  # type: ignore[assignment]
        self.handoffs = handoffs  # type: ignore[assignment]
        self.mcp_servers = mcp_servers  # type: ignore[assignment]

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "tools":
            value = tuple(_as_tool(item) for item in value)
        elif key == "handoffs":
            value = tuple(value)
            for target in value:
                if not isinstance(target, Agent):
                    raise AgentDefinitionError(f"handoffs must be Agent objects, got {target!r}")
        elif key == "mcp_servers":
            value = tuple(value)
            names = [getattr(item, "name", None) for item in value]
            if not all(isinstance(n, str) and hasattr(item, "agent_tools") for n, item in zip(names, value)):
                raise AgentDefinitionError("mcp_servers must be MCP servers (MCPServerStdio, MCPServerStreamableHttp)")
            if len(set(names)) != len(names):
                raise AgentDefinitionError(f"agent {self.name!r}: two MCP servers share a name")
        if key in ("tools", "handoffs"):
            object.__setattr__(self, "_tool_cache", None)
        object.__setattr__(self, key, value)

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, model={self.model!r}, tools={[t.name for t in self.tools]}, " \
               f"handoffs={[a.name for a in self.handoffs]})"

    @property
    def version(self) -> str:
        """The version given to the constructor (or assigned), else :func:`agent_version` of
        the agent as it is now."""
        if self._version is not None:
            return self._version
        key = (self.instructions, self.model, self.tools, tuple(a.name for a in self.handoffs),
               tuple(_server_key(s) for s in self.mcp_servers))
        cached = self._version_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        computed = agent_version(self)
        object.__setattr__(self, "_version_cache", (key, computed))
        return computed

    @version.setter
    def version(self, value: str | None) -> None:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise AgentDefinitionError(f"version must be a non-empty str or None, got {value!r}")
        object.__setattr__(self, "_version", value)

    def clone(self, **changes: Any) -> Agent:
        """A copy with some fields changed (a new identity, so give it a new ``name`` if both run together)."""
        fields: dict[str, Any] = {"name": self.name, "instructions": self.instructions, "model": self.model, "tools": self.tools,
                  "handoffs": self.handoffs, "tool_choice": self.tool_choice,
                  "max_context_tokens": self.max_context_tokens, "version": self._version,
                  "mcp_servers": self.mcp_servers}
        fields.update(changes)
        return Agent(**fields)

    def all_tools(self) -> dict[str, Tool]:
        """Every tool offered to the model, by name: own tools first, then one handoff tool per target.

        Raises :class:`AgentDefinitionError` when two names collide.
        """
        cache = self._tool_cache
        if cache is not None and cache[0] == (self.tools, self.handoffs):
            return cache[1]
        table: dict[str, Tool] = {}
        for item in (*self.tools, *(HandoffTool(target) for target in self.handoffs)):
            if item.name in table:
                raise AgentDefinitionError(f"agent {self.name!r}: two tools are named {item.name!r}")
            table[item.name] = item
        object.__setattr__(self, "_tool_cache", ((self.tools, self.handoffs), table))
        return table

    def wire_tools(self) -> list[dict[str, Any]] | None:
        """The Chat Completions ``tools`` list, or ``None`` when the agent has none."""
        tools = self.all_tools()
        return [t.to_wire() for t in tools.values()] or None


def agent_version(agent: Agent) -> str:
    """The short hash of what defines ``agent``: 12 hex digits of the sha256 of the compact,
    key-sorted JSON of ``{"instructions", "model", "tools": [{"name", "description",
    "parameters"}, ...], "handoffs": [target names]}`` (tools and handoffs in their order),
    plus ``"mcp_servers": [[name, chosen tools or null], ...]`` when the agent has some (the
    servers' tools are listed when they start, so they are not part of it).

    The model is the agent's own (``None`` when it uses the Runner's default); the name,
    ``tool_choice`` and ``max_context_tokens`` are not part of it. A handoff counts by its
    target's name only, so changing the target's instructions changes the target's version,
    not this one's.
    """
    tools = []
    for item in agent.tools:
        wire = item.to_wire().get("function", {})
        tools.append({"name": item.name, "description": wire.get("description", ""),
                      "parameters": wire.get("parameters")})
    definition: dict[str, Any] = {"instructions": agent.instructions, "model": agent.model, "tools": tools,
                                  "handoffs": [target.name for target in agent.handoffs]}
    if agent.mcp_servers:  # only when there are some: the versions of agents without any stay as they were
        definition["mcp_servers"] = [_server_key(server) for server in agent.mcp_servers]
    text = json.dumps(definition, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:VERSION_HEX]


def _server_key(server: Any) -> Any:
    """What names an MCP server in an agent's version: its name and the tools chosen of it."""
    chosen = getattr(server, "tool_names", None)
    return [server.name, sorted(chosen) if chosen else None]


def reachable_agents(start: Agent) -> dict[str, Agent]:
    """Every agent reachable from ``start`` through handoffs (``start`` included), by name.

    Raises :class:`AgentDefinitionError` when two different agents share a name.
    """
    found: dict[str, Agent] = {}
    stack = [start]
    while stack:
        agent = stack.pop()
        known = found.get(agent.name)
        if known is not None:
            if known is not agent:
                raise AgentDefinitionError(
                    f"two different agents are named {agent.name!r}; agent names must be unique within a Runner"
                )
            continue
        found[agent.name] = agent
        stack.extend(reversed(agent.handoffs))
    for agent in found.values():
        agent.all_tools()  # surface tool-name collisions at Runner construction
    return found
