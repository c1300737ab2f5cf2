"""chatflow: a terminal chat tool for OpenAI-compatible models, on a SQLite session store.

The public API of the session library (seed 000)::

    from chatflow_cli import Agent, Runner, SessionStore, SQLiteSessionStore, tool

Names are resolved on first use, so that ``import chatflow_cli`` (and so ``chatflow
--help``) stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Agent": "chatflow_cli.core.agents",
    "ChatflowError": "chatflow_cli.core.errors",
    "Message": "chatflow_cli.core.messages",
    "Role": "chatflow_cli.core.messages",
    "RunResult": "chatflow_cli.core.runner",
    "Runner": "chatflow_cli.core.runner",
    "SQLiteSessionStore": "chatflow_cli.core.sqlite_store",
    "SessionContext": "chatflow_cli.core.memory",
    "SessionStore": "chatflow_cli.core.memory",
    "ToolCall": "chatflow_cli.core.messages",
    "tool": "chatflow_cli.core.tools",
}

__all__ = [
    "Agent",
    "ChatflowError",
    "Message",
    "Role",
    "RunResult",
    "Runner",
    "SQLiteSessionStore",
    "SessionContext",
    "SessionStore",
    "ToolCall",
    "__version__",
    "tool",
]

if TYPE_CHECKING:  # pragma: no cover
    from .core.agents import Agent
    from .core.errors import ChatflowError
    from .core.memory import SessionContext, SessionStore
    from .core.messages import Message, Role, ToolCall
    from .core.runner import Runner, RunResult
    from .core.sqlite_store import SQLiteSessionStore
    from .core.tools import tool


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chatflow_cli' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
