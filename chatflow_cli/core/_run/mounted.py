"""The tools a turn offers from the resources mounted on its session: the memory tools of
each mounted memory store, added beside the agent's own tools."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..agents import Agent
    from ..memory.context import SessionContext
    from ..tools import Tool

__all__ = ["turn_tools"]


def turn_tools(store: Any, session: SessionContext, turn: int, agent: Agent) -> dict[str, Tool]:
    """The agent's tools, with the memory tools of the memory stores mounted on ``session``
    (the agent's own tool of the same name wins); writes are recorded as turn ``turn``'s."""
    tools = agent.all_tools()
    mounts = [m for m in session.resources if m.kind == "memory_store"]
    if not mounts:
        return tools
    from ..resources.documents import Author
    from ..resources.memory_tools import memory_tools

    extra = {t.name: t for t in memory_tools(store, mounts, Author(session.session_id, turn, agent.name))}
    return {**extra, **tools}
