"""A server that ignored ``"stream": true`` and answered with one JSON completion.

Its body is read as one streamed chunk, so the same
:class:`~chatflow_cli.core.stream.StreamAccumulator` folds it; any other body (an HTML
page, plain text, JSON that is not a completion) is a :class:`ProviderResponseError`.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..errors import ProviderResponseError
from .errors import describe_body, looks_like_html, one_line

__all__ = ["plain_chunk"]


def plain_chunk(body: str, content_type: str, url: str) -> dict[str, Any]:
    """The streamed-chunk form (``{"choices": [{"index", "finish_reason", "delta"}], "usage"}``)
    of a whole Chat Completions answer.

    Args:
        body: the answer's text.
        content_type: its ``Content-Type`` (lower case), which says whether it is JSON.
        url: the server's URL without credentials, for the message.

    Raises:
        ProviderResponseError: the body is not a Chat Completions answer (the message says
            what it is, and asks whether the base URL is the API root).
    """
    data: Any = None
    if "json" in content_type or body.lstrip().startswith("{"):
        try:
            data = json.loads(body)
        except ValueError:
            data = None
    if not isinstance(data, Mapping) or not isinstance(data.get("choices"), list):
        what = describe_body(body, fallback="an empty body")
        if not looks_like_html(body):
            what = f"{what!r}" if len(what) < 80 else "text that is not an API reply"
        raise ProviderResponseError(one_line(
            f"the server at {url} answered with {what}, not an OpenAI-compatible stream "
            "(is the base URL the API root, usually ending in /v1?)"
        ))
    chunk: dict[str, Any] = {"choices": [], "usage": data.get("usage")}
    for choice in data["choices"]:
        if isinstance(choice, Mapping):
            message = choice.get("message") or {}
            calls = [dict(c, index=i) for i, c in enumerate(message.get("tool_calls") or []) if isinstance(c, dict)]
            chunk["choices"].append({
                "index": choice.get("index", 0),
                "finish_reason": choice.get("finish_reason"),
                "delta": {"content": message.get("content"), "tool_calls": calls,
                          "reasoning_content": message.get("reasoning_content") or message.get("reasoning")},
            })
    return chunk
