"""The one error of the MCP layer: a tool server that failed, as a tool error the model sees."""

from __future__ import annotations

from ..tools import ToolCallFailed

__all__ = ["MCPServerError"]


class MCPServerError(ToolCallFailed):
    """A tool server failed (did not start, exited, timed out, answered garbage or an error);
    ``str()`` is one line naming the server and what happened, written for the model."""
