"""Tools the REPL tests configure in config.toml (``tests.repl.tools_for_repl:slow_lookup``)."""

from __future__ import annotations

import threading

#: set when slow_lookup starts; set ``release`` to let it finish
started = threading.Event()
release = threading.Event()


def slow_lookup(query: str) -> str:
    """Look a query up, slowly (until the test releases it, at most 30 s).

    Args:
        query: what to look up.
    """
    started.set()
    release.wait(30)
    return f"found {query}"


def noisy_lookup(query: str) -> str:
    """Look a query up and complain about it in the logs.

    Args:
        query: what to look up.
    """
    import logging

    logging.getLogger("tests.repl.noisy").warning("the cache for %s is cold", query)
    return f"found {query}"


def lookup_agent(tool: str = "slow_lookup") -> str:
    """``config.toml`` with one agent, Helper, whose only tool is ``tool`` of this module."""
    return ('[[agents]]\nname = "Helper"\ninstructions = "You look things up."\n'
            f'tools = ["tests.repl.tools_for_repl:{tool}"]\n')
