"""What the resources mounted on a session give its turn: the memory tools of each mounted
memory store, added beside the agent's own tools, and the vaults that fill the ``Secret``
parameters of its tools, in mount order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..agents import Agent
    from ..memory.context import SessionContext
    from ..messages import ToolCall
    from ..resources.vaults import SessionSecrets, Vaults
    from ..tools import Tool

__all__ = ["turn_secrets", "turn_tools"]


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


def turn_secrets(vaults: Vaults | None, session: SessionContext,
                 runnable: list[tuple[ToolCall, Tool]]) -> SessionSecrets | None:
    """The secrets of this round's tool calls: the vaults mounted on ``session`` now, in the
    order they were mounted (the first vault holding an entry wins), read through ``vaults``
    (None: none can be read, a secret is missing). None when no tool of the round has a
    ``Secret`` parameter."""
    if not any(found.secrets for _, found in runnable):
        return None
    from ..resources.vaults import SessionSecrets

    return SessionSecrets(vaults, [m.name for m in session.resources if m.kind == "vault"])
