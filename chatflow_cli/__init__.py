"""chatflow: a terminal chat tool for OpenAI-compatible models, on a SQLite session store.

The public API of the session library::

    from chatflow_cli import Agent, Runner, SessionStore, SQLiteSessionStore, tool
    from chatflow_cli import PostgresSessionStore   # pip install 'chatflow-cli[postgres]'

and the errors a bot catches (``SessionBusyError``, ``ProviderError``, ``NetworkError``,
``RateLimitedError``…; all derive from ``ChatflowError``). The package is typed
(``py.typed``). Names are resolved on first use, so that ``import chatflow_cli`` (and so
``chatflow --help``) stays cheap.
"""

from __future__ import annotations

import logging
from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# a library's loggers get a handler that drops their records: an application that set up no
# logging does not see chatflow's warnings on stderr through Python's last-resort handler;
# one that set up logging (and ``chatflow --debug``) still gets them
logging.getLogger("chatflow_cli").addHandler(logging.NullHandler())

_EXPORTS = {
    "Agent": "chatflow_cli.core.agents",
    "Author": "chatflow_cli.core.resources.documents",
    "ChatflowError": "chatflow_cli.core.errors",
    "ChatflowSession": "chatflow_cli.core.sdk_session",
    "DocumentNotFoundError": "chatflow_cli.core.errors",
    "DocumentTooLargeError": "chatflow_cli.core.errors",
    "IdempotencyConflictError": "chatflow_cli.core.errors",
    "ImportFormatError": "chatflow_cli.core.errors",
    "InvalidToolCallError": "chatflow_cli.core.errors",
    "MCPServerStdio": "chatflow_cli.core.mcp",
    "MCPServerStreamableHttp": "chatflow_cli.core.mcp",
    "MemoryConflictError": "chatflow_cli.core.errors",
    "MemoryStoreNotFoundError": "chatflow_cli.core.errors",
    "Message": "chatflow_cli.core.messages",
    "MessageState": "chatflow_cli.core.memory.values",
    "Mount": "chatflow_cli.core.resources.mounts",
    "NetworkError": "chatflow_cli.core.errors",
    "NotFoundError": "chatflow_cli.core.errors",
    "PendingToolCallsError": "chatflow_cli.core.errors",
    "PostgresSessionStore": "chatflow_cli.core.memory.postgres",
    "ProviderError": "chatflow_cli.core.errors",
    "RateLimitedError": "chatflow_cli.core.errors",
    "Role": "chatflow_cli.core.messages",
    "RunInterrupted": "chatflow_cli.core.errors",
    "RunResult": "chatflow_cli.core.runner",
    "Runner": "chatflow_cli.core.runner",
    "Secret": "chatflow_cli.core.tools",
    "SQLiteSessionStore": "chatflow_cli.core.memory.sqlite",
    "SessionBusyError": "chatflow_cli.core.errors",
    "SessionContext": "chatflow_cli.core.memory.context",
    "SessionDeletedError": "chatflow_cli.core.errors",
    "SessionNotFoundError": "chatflow_cli.core.errors",
    "SessionStore": "chatflow_cli.core.memory.inmemory",
    "SessionTerminatedError": "chatflow_cli.core.errors",
    "StoreError": "chatflow_cli.core.errors",
    "StreamBrokenError": "chatflow_cli.core.errors",
    "ToolCall": "chatflow_cli.core.messages",
    "ToolResultError": "chatflow_cli.core.errors",
    "UsageError": "chatflow_cli.core.errors",
    "Vaults": "chatflow_cli.core.resources.vaults",
    "tool": "chatflow_cli.core.tools",
}

__all__ = [
    "Agent",
    "Author",
    "ChatflowError",
    "ChatflowSession",
    "DocumentNotFoundError",
    "DocumentTooLargeError",
    "IdempotencyConflictError",
    "ImportFormatError",
    "InvalidToolCallError",
    "MCPServerStdio",
    "MCPServerStreamableHttp",
    "MemoryConflictError",
    "MemoryStoreNotFoundError",
    "Message",
    "MessageState",
    "Mount",
    "NetworkError",
    "NotFoundError",
    "PendingToolCallsError",
    "PostgresSessionStore",
    "ProviderError",
    "RateLimitedError",
    "Role",
    "RunInterrupted",
    "RunResult",
    "Runner",
    "SQLiteSessionStore",
    "Secret",
    "SessionBusyError",
    "SessionContext",
    "SessionDeletedError",
    "SessionNotFoundError",
    "SessionStore",
    "SessionTerminatedError",
    "StoreError",
    "StreamBrokenError",
    "ToolCall",
    "ToolResultError",
    "UsageError",
    "Vaults",
    "__version__",
    "tool",
]

if TYPE_CHECKING:  # pragma: no cover
    from .core.agents import Agent
    from .core.errors import (
        ChatflowError,
        DocumentNotFoundError,
        DocumentTooLargeError,
        IdempotencyConflictError,
        ImportFormatError,
        InvalidToolCallError,
        MemoryConflictError,
        MemoryStoreNotFoundError,
        NetworkError,
        NotFoundError,
        PendingToolCallsError,
        ProviderError,
        RateLimitedError,
        RunInterrupted,
        SessionBusyError,
        SessionDeletedError,
        SessionNotFoundError,
        SessionTerminatedError,
        StoreError,
        StreamBrokenError,
        ToolResultError,
        UsageError,
    )
    from .core.mcp import MCPServerStdio, MCPServerStreamableHttp
    from .core.memory.context import SessionContext
    from .core.memory.inmemory import SessionStore
    from .core.memory.values import MessageState
    from .core.messages import Message, Role, ToolCall
    from .core.memory.postgres import PostgresSessionStore
    from .core.runner import RunResult, Runner
    from .core.sdk_session import ChatflowSession
    from .core.memory.sqlite import SQLiteSessionStore
    from .core.resources.documents import Author
    from .core.resources.mounts import Mount
    from .core.resources.vaults import Vaults
    from .core.tools import Secret, tool


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chatflow_cli' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
