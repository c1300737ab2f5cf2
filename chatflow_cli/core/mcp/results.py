"""A tool server's result as the text the model sees, and the images it returned.

:func:`result_text` keeps what the server said: every text block, the structured content
(as JSON, when no text block already says the same), an embedded text resource's text, a
resource link's address. :func:`result_content` also makes each image (PNG, JPEG, WebP or
GIF, whole and within the limits of an attached image) an
:class:`~chatflow_cli.core.attachments.Attachment` named after the tool (``photo-1.png``),
which the text names (``[image photo-1.png: image/png, 64x32]``): the Runner stores it with
the result, once by hash, and sends it to a model that takes images. Any other image, audio
and binary resource become a placeholder naming their type and size (``[image image/png,
1234 bytes: not shown to the model]``). An ``isError`` result is an error result for the
model (the Runner flags it).

:func:`cut` keeps the first :data:`MAX_RESULT_CHARS` characters of a longer text and says so;
the Runner stores the whole text in the session's log (an ``mcp.output`` event).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_RESULT_CHARS", "cut", "result_content", "result_text"]

#: The longest tool-server result sent to the model, in characters (about 5,000 tokens); a
#: longer one is cut with a note, and stored whole.
MAX_RESULT_CHARS = 20_000


def _size(data: Any) -> int:
    """Bytes of base64 ``data``."""
    text = data if isinstance(data, str) else ""
    return len(text) * 3 // 4 - text.count("=", max(0, len(text) - 2))


def _image(block: Any, name: str) -> Any:
    """The :class:`~chatflow_cli.core.attachments.Attachment` of an image block, named ``name``
    and an extension of its type, or None when its bytes are not an image chatflow sends."""
    import base64
    import binascii

    from ..attachments import attachment_from_bytes, sniff_image
    from ..errors import AttachmentError

    try:
        data = base64.b64decode(str(getattr(block, "data", "") or ""), validate=True)
    except (binascii.Error, ValueError):
        return None
    kind = sniff_image(data)
    if kind is None:
        return None
    try:
        return attachment_from_bytes(data, f"{name}.{'jpg' if kind == 'image/jpeg' else kind.split('/')[1]}")
    except AttachmentError:  # a broken header, over the size limit
        return None


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
    paragraph, then its structured content as JSON unless a text block holds the same
    (images as placeholders)."""
    text, is_error, _ = result_content(result, None)
    return text, is_error


def result_content(result: Any, tool: str | None) -> tuple[str, bool, tuple[Any, ...]]:
    """``(text, is_error, images)`` of a ``CallToolResult``: as :func:`result_text`, but with
    ``tool`` (the tool's name) each image block chatflow can send is one of ``images`` (an
    :class:`~chatflow_cli.core.attachments.Attachment` named ``TOOL-N.EXT``), which the text
    names where the block was."""
    from ..attachments import attachment_line

    blocks = list(getattr(result, "content", None) or ())
    parts: list[str] = []
    images: list[Any] = []
    for block in blocks:
        made = _image(block, f"{tool}-{len(images) + 1}") \
            if tool is not None and getattr(block, "type", None) == "image" else None
        if made is None:
            parts.append(_block_text(block))
            continue
        images.append(made)
        line = attachment_line(made)  # "photo-1.png (image/png, 70 B, 64x32)"
        parts.append(f"[image {line}]")
    structured = getattr(result, "structured_content", None)
    if structured is not None and not _said(blocks, structured):
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n\n".join(parts), bool(getattr(result, "is_error", False)), tuple(images)


def cut(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """``text``, or its first ``limit`` characters and a note when it is longer."""
    if len(text) <= limit:
        return text
    return (f"{text[:limit]}\n[cut: the result has {len(text):,} characters and only the first {limit:,} are "
            "shown; the whole result is kept in the session's log]")
