"""A tool server's result as the text the model sees.

:func:`result_text` keeps what the server said: every text block, the structured content
(as JSON, when no text block already says the same), an embedded text resource's text, a
resource link's address. Images and audio cannot reach the model through chatflow yet: each
becomes a placeholder naming its type and size (``[image image/png, 1234 bytes: not shown to
the model]``). An ``isError`` result is an error result for the model (the Runner flags it).

:func:`cut` keeps the first :data:`MAX_RESULT_CHARS` characters of a longer text and says so;
the Runner stores the whole text in the session's log (an ``mcp.output`` event).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_RESULT_CHARS", "cut", "result_text"]

#: The longest tool-server result sent to the model, in characters (about 5,000 tokens); a
#: longer one is cut with a note, and stored whole.
MAX_RESULT_CHARS = 20_000


def _size(data: Any) -> int:
    """Bytes of base64 ``data``."""
    text = data if isinstance(data, str) else ""
    return len(text) * 3 // 4 - text.count("=", max(0, len(text) - 2))


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(getattr(block, "text", ""))
    if kind in ("image", "audio"):
        mime = getattr(block, "mime_type", None) or "unknown type"
        return f"[{kind} {mime}, {_size(getattr(block, 'data', ''))} bytes: not shown to the model]"
    if kind == "resource_link":
        name = getattr(block, "name", "") or ""
        return f"[resource link: {getattr(block, 'uri', '')}{' ' + name if name else ''}]"
    if kind == "resource":
        resource = getattr(block, "resource", None)
        uri = getattr(resource, "uri", "")
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return f"[resource {uri}]\n{text}"
        mime = getattr(resource, "mime_type", None) or "unknown type"
        return f"[resource {uri}, {mime}, {_size(getattr(resource, 'blob', ''))} bytes: not shown to the model]"
    return f"[{kind or 'unknown'} content: not shown to the model]"


def _said(blocks: list[Any], structured: Any) -> bool:
    """Whether a text block already says ``structured`` (as JSON), or the value of a
    ``{"result": value}`` wrapper (what SDK servers make of a function returning a plain value)."""
    values = [structured]
    if isinstance(structured, dict) and list(structured) == ["result"]:
        values.append(structured["result"])
    for block in blocks:
        if getattr(block, "type", None) != "text":
            continue
        text = str(getattr(block, "text", ""))
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if any(parsed == value or text == value for value in values):
            return True
    return False


def result_text(result: Any) -> tuple[str, bool]:
    """``(text, is_error)`` of a ``CallToolResult``: its content blocks in order, one a
    paragraph, then its structured content as JSON unless a text block holds the same."""
    blocks = list(getattr(result, "content", None) or ())
    parts = [_block_text(b) for b in blocks]
    structured = getattr(result, "structured_content", None)
    if structured is not None and not _said(blocks, structured):
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n\n".join(parts), bool(getattr(result, "is_error", False))


def cut(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """``text``, or its first ``limit`` characters and a note when it is longer."""
    if len(text) <= limit:
        return text
    return (f"{text[:limit]}\n[cut: the result has {len(text):,} characters and only the first {limit:,} are "
            "shown; the whole result is kept in the session's log]")
