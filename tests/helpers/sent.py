"""What chatflow sent to the fake server: the user messages of recorded chat requests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def user_texts(request: dict[str, Any]) -> list[str]:
    """The contents of the user messages of one chat request, in order."""
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


def sent(requests: Iterable[Any]) -> list[str]:
    """The last user message of every chat request in ``requests`` (``FakeServer.requests``
    or ``Driver.requests()``), in the order the server got them."""
    return [user_texts(r)[-1] for r in requests if isinstance(r, dict) and "messages" in r]
