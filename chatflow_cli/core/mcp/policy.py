"""The defaults and policies of tool servers, light enough for reading config.toml (no asyncio)."""

from __future__ import annotations

__all__ = ["APPROVAL_POLICIES", "DEFAULT_CALL_TIMEOUT_S", "DEFAULT_START_TIMEOUT_S"]

#: Seconds a tool call may take before it is cancelled and answered with an error result.
DEFAULT_CALL_TIMEOUT_S = 60.0
#: Seconds a server may take to start and answer ``initialize`` and ``tools/list``.
DEFAULT_START_TIMEOUT_S = 30.0
#: Approval policies of a server's tools: run without asking, ask first, never run.
APPROVAL_POLICIES = ("always", "ask", "never")
