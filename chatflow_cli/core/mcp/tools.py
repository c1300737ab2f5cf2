"""A tool server's tools as chatflow tools (:class:`MCPTool`), with names every provider takes.

A tool ``get_current_time`` of the server ``time`` is offered to the model as
``time__get_current_time`` (:func:`tool_name`): the server's name first, so two servers with
a tool of the same name never collide, and a name does not change when another server is
added. ``SERVER__TOOL`` is kept as it is only when it can be read back one way: it follows the
providers' rule (``^[a-zA-Z0-9_-]{1,64}$``) and its ``__`` is the only run of underscores
longer than one (neither name holds ``__``, the server's does not end with ``_`` and the
tool's does not start with one), so no two tools of any servers share it. Any other name
(server ``a`` with a tool ``x__echo`` and server ``a__x`` with a tool ``echo`` would both be
``a__x__echo``) has every character outside the rule replaced by ``_``, is cut to 55
characters and gets ``_`` and 8 hex digits of the sha256 of the server's and the tool's
names: the same tool gets the same name every time, whatever other servers declare.
"""

from __future__ import annotations

import asyncio
import collections.abc
import hashlib
import re
from typing import Any

from ..tools import Tool, ToolCallFailed, ToolText
from .results import cut, result_content

__all__ = ["MCPTool", "tool_name", "tools_of"]

_SAFE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_UNDERSCORES_RE = re.compile(r"__+")


def tool_name(server: str, tool: str) -> str:
    """The name the model sees for the tool ``tool`` of the server ``server``."""
    raw = f"{server}__{tool}"
    if _SAFE_RE.match(raw) and _UNDERSCORES_RE.findall(raw) == ["__"]:
        return raw
    digest = hashlib.sha256(f"{server}\0{tool}".encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', raw)[:55]}_{digest}"


def _schema(listed: Any) -> dict[str, Any]:
    schema = getattr(listed, "input_schema", None)
    if not isinstance(schema, dict):
        return {"type": "object", "properties": {}}
    schema = dict(schema)
    schema.setdefault("type", "object")
    if schema.get("type") != "object":
        return {"type": "object", "properties": {}}
    return schema


class MCPTool(Tool):
    """One tool of an MCP server, offered to the model under :func:`tool_name`.

    Attributes:
        server: the :class:`~chatflow_cli.core.mcp.servers.MCPServer` it belongs to.
        remote_name: its name on the server.
        approval: its approval policy (``always``, ``ask`` or ``never``).
    """

    def __init__(self, server: Any, listed: Any) -> None:
        super().__init__(tool_name(server.name, str(listed.name)), str(getattr(listed, "description", None) or ""),
                         _schema(listed), None)
        self.server = server
        self.remote_name = str(listed.name)
        self.approval = server.policy_for(self.remote_name)

    @property
    def is_custom(self) -> bool:  # run by the Runner, through the server
        return False

    def __repr__(self) -> str:
        return f"MCPTool(name={self.name!r}, server={self.server.name!r})"

    def _text(self, result: Any) -> ToolText:
        text, is_error, images = result_content(result, self.remote_name)
        if is_error:  # an error's text only: its images, if any, stay placeholders
            text, images = result_content(result, None)[0], ()
        shown = cut(text)
        if is_error:
            raise ToolCallFailed(f"{self.remote_name} (MCP server {self.server.name!r}) returned an error: {shown}")
        return ToolText(shown, text if shown != text else None, images)

    def invoke(self, arguments: str | dict[str, Any] | None, *, loop: asyncio.AbstractEventLoop | None = None,
               secrets: collections.abc.Mapping[str, str] | None = None) -> str:
        """Call the tool on its server: the result's text (a
        :class:`~chatflow_cli.core.tools.ToolText`, cut at
        :data:`~chatflow_cli.core.mcp.results.MAX_RESULT_CHARS`, with the images it returned). Raises ToolArgumentsError
        (not a JSON object), ToolCallFailed (an error result, or the server failed)."""
        data = self.parse_arguments(arguments)
        return self._text(self.server.call_tool_sync(self.remote_name, data))

    async def ainvoke(self, arguments: str | dict[str, Any] | None, *,
                      secrets: collections.abc.Mapping[str, str] | None = None) -> str:
        """Async twin of :meth:`invoke`."""
        data = self.parse_arguments(arguments)
        return self._text(await self.server.call_tool(self.remote_name, data))

    def cancel_calls(self) -> None:
        """Cancel this server's calls running now (an interrupted turn)."""
        self.server.cancel_calls()


def tools_of(server: Any, listed: list[Any]) -> dict[str, MCPTool]:
    """``{offered name: MCPTool}`` of the tools ``listed`` by ``server``; a tool listed twice
    (the same name) is offered once."""
    tools: dict[str, MCPTool] = {}
    for item in listed:
        made = MCPTool(server, item)
        tools.setdefault(made.name, made)
    return tools
