"""Configuration shared by tests: agent tables for ``config.toml``.

``CUSTOM_TOOLS`` is one agent, Support, with two custom tools (``approve_refund`` taking an
``order_id`` and ``notify`` taking nothing): their results come from the user
(``--tool-result``), so a turn that calls them waits.
"""

from __future__ import annotations

CUSTOM_TOOLS = """
[[agents]]
name = "Support"
instructions = "Help."
tools = [
  { name = "approve_refund", description = "Ask a human.", parameters = { type = "object", properties = { order_id = { type = "string" } } } },
  { name = "notify", description = "Tell someone.", parameters = { type = "object", properties = {} } },
]
"""
