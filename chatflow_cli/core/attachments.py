"""Files in a conversation: what may be attached, how it is read, sent and counted.

An :class:`~chatflow_cli.core.messages.Attachment` is made from bytes by
:func:`attachment_from_bytes` (or from a path by :func:`read_attachment`). What a file *is*
is read from its bytes, never from its name:

* an image when its bytes start as a PNG, JPEG, WebP or GIF file does (its width and height
  are read from the header); sent as a Chat Completions ``image_url`` part holding a base64
  ``data:`` URL;
* a text file when its bytes are UTF-8 with no NUL byte (source, logs, Markdown, CSV, JSON);
  sent as a text part that names the file;
* anything else is refused with a line naming the types accepted.

A file whose name says something else (``notes.png`` holding text, ``photo.jpg`` holding a
PNG) is taken for what its bytes are. The limits (:data:`MAX_IMAGE_BYTES`,
:data:`MAX_TEXT_BYTES`, :data:`MAX_ATTACHMENTS`) are checked before anything is sent or
stored; over them is an :class:`~chatflow_cli.core.errors.AttachmentError` (exit 2).

:func:`image_tokens` is OpenAI's published rule for the tokens of an image.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .inert import one_line
from .errors import AttachmentError, ChatflowError

__all__ = [
    "ACCEPTED",
    "Attachment",
    "DataURL",
    "FILES_FOLDER",
    "MAX_ATTACHMENTS",
    "MAX_IMAGE_BYTES",
    "MAX_TEXT_BYTES",
    "LOCAL_TAKES_NO_IMAGES",
    "attachment_from_bytes",
    "attachment_line",
    "attachment_tokens",
    "check_count",
    "file_name",
    "image_size",
    "image_tokens",
    "read_attachment",
    "refuse_images_to_a_text_only_model",
    "refuses_images",
    "unreadable_image",
    "sniff_image",
    "wire_content",
]

#: The largest image attached (20 MB, OpenAI's limit for an image input).
MAX_IMAGE_BYTES = 20 * 1000 * 1000
#: The largest text file attached (1 MB of UTF-8).
MAX_TEXT_BYTES = 1000 * 1000
#: The largest side of an image, in pixels: what JPEG, GIF and WebP can say at most; a PNG
#: whose header claims more is broken or hostile (no provider decodes it).
MAX_IMAGE_SIDE = 65_535
#: The most files one message carries.
MAX_ATTACHMENTS = 10

#: What may be attached, as the refusal says it.
ACCEPTED = "images (PNG, JPEG, WebP, GIF) and UTF-8 text files (source, logs, Markdown, CSV, JSON)"

#: The folder beside a Markdown export that holds its attachments (``attachments/<sha256>.<ext>``).
FILES_FOLDER = "attachments"

_EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp", "image/gif": ".gif",
               "text/markdown": ".md", "text/csv": ".csv", "application/json": ".json"}

_HEX_DIGITS = "0123456789abcdef"

_TEXT_TYPES = {".md": "text/markdown", ".markdown": "text/markdown", ".csv": "text/csv", ".json": "application/json",
               ".jsonl": "application/json"}


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file a USER message carries: an image or a UTF-8 text file
    (:func:`attachment_from_bytes` makes one, :func:`wire_content` sends it).

    Fields:
        sha256: the hex SHA-256 of the bytes: a store keeps the bytes once under it.
        media_type: what the bytes are (read from them, not from the name): ``image/png``,
            ``image/jpeg``, ``image/webp``, ``image/gif``, or a text type (``text/plain``,
            ``text/markdown``, ``text/csv``, ``application/json``).
        size: the number of bytes.
        name: the file's name as given (no directory), or None.
        width, height: an image's size in pixels, read from its header; None for text.
        data: the bytes, when at hand (a new message, an import); None when only the
            metadata was read (a message loaded from a store). Not part of equality or of
            :meth:`to_dict`: the store keeps the bytes apart, by hash.
    """

    sha256: str
    media_type: str
    size: int
    name: str | None = None
    width: int | None = None
    height: int | None = None
    data: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def is_image(self) -> bool:
        return self.media_type.startswith("image/")

    def to_dict(self) -> dict[str, Any]:
        """The metadata as JSON-ready data (never the bytes)."""
        data: dict[str, Any] = {"sha256": self.sha256, "media_type": self.media_type, "size": self.size}
        if self.name is not None:
            data["name"] = self.name
        if self.width is not None:
            data["width"] = self.width
        if self.height is not None:
            data["height"] = self.height
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attachment:
        """The inverse of :meth:`to_dict`. ``ValueError`` for data of another shape."""
        # loading a window parses every attachment of it: kept lean (C-level checks only)
        if type(data) is not dict:
            raise ValueError(f"an attachment is a JSON object, got {type(data).__name__}")
        get = data.get
        digest, media_type, size = get("sha256"), get("media_type"), get("size")
        if type(digest) is not str or len(digest) != 64 or digest.strip(_HEX_DIGITS) \
                or type(media_type) is not str or type(size) is not int or size < 0:
            raise ValueError("an attachment needs sha256 (64 lowercase hex digits), media_type and size")
        width, height, name = get("width"), get("height"), get("name")
        return cls(digest, media_type, size, name if name is None or type(name) is str else str(name),
                   width if type(width) is int else None, height if type(height) is int else None)

    def without_data(self) -> Attachment:
        return self if self.data is None else Attachment(self.sha256, self.media_type, self.size, self.name,
                                                         self.width, self.height)


@dataclass(frozen=True, slots=True)
class DataURL:
    """The base64 ``data:`` URL of an image kept as ASCII bytes: what
    :func:`wire_content` puts in an ``image_url`` part with ``data_urls=True``, for a
    transport that writes the bytes straight into the request body (the http transport) so
    the URL never becomes a str (each copy of a 7 MB buffer is milliseconds in a new
    process). ``str()`` of it is the URL.

    Fields:
        media_type: the image's type (``image/png``...).
        base64: the base64 of the image's bytes (no newline).
    """

    media_type: str
    base64: bytes = field(repr=False)

    @property
    def prefix(self) -> bytes:
        """``data:<media_type>;base64,`` as bytes."""
        return b"data:" + self.media_type.encode("ascii") + b";base64,"

    def __str__(self) -> str:
        return f"data:{self.media_type};base64,{self.base64.decode('ascii')}"


def sniff_image(data: bytes) -> str | None:
    """The media type of an image from its first bytes (PNG, JPEG, WebP, GIF), else None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    n = len(data)
    while i + 9 < n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return width, height
        i += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def image_size(media_type: str, data: bytes) -> tuple[int, int] | None:
    """(width, height) in pixels from an image's header, or None when the header is broken."""
    try:
        if media_type == "image/png":
            if data[12:16] != b"IHDR":
                return None
            width, height = struct.unpack(">II", data[16:24])
            return width, height
        if media_type == "image/gif":
            width, height = struct.unpack("<HH", data[6:10])
            return width, height
        if media_type == "image/jpeg":
            return _jpeg_size(data)
        if media_type == "image/webp":
            return _webp_size(data)
    except struct.error:
        return None
    return None


def _png_cut_short(data: bytes) -> bool:
    i = 8
    while i + 8 <= len(data):
        (length,) = struct.unpack(">I", data[i:i + 4])
        if data[i + 4:i + 8] == b"IEND":
            return False
        i += 12 + length
    return True  # no IEND chunk: the chunks run past the end of the file


def _jpeg_cut_short(data: bytes) -> bool:
    i = 2
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return False  # not a walk chatflow follows: left to the provider
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker == 0xD9:
            return False
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if marker == 0xDA:  # the scan: in its data 0xFF 0xD9 is only the end-of-image marker
            return data.find(b"\xff\xd9", i + 2 + length) < 0
        i += 2 + length
    return True  # the segments run past the end of the file


def _cut_short(media_type: str, data: bytes) -> bool:
    """Whether an image's bytes end before the structure its header declares does: a PNG's
    chunks with no IEND, a JPEG with no end-of-image marker after its scan, a WebP shorter
    than its RIFF size. Cheap (a walk of the headers, one search), and sound: a file with
    bytes after its end passes. GIF is not checked."""
    if media_type == "image/png":
        return _png_cut_short(data)
    if media_type == "image/jpeg":
        return _jpeg_cut_short(data)
    if media_type == "image/webp":
        return len(data) < 8 + int.from_bytes(data[4:8], "little")
    return False


def _text_type(name: str | None) -> str:
    return _TEXT_TYPES.get(os.path.splitext(name or "")[1].lower(), "text/plain")


def attachment_from_bytes(data: bytes, name: str | None, *, stream: bool = False) -> Attachment:
    """An :class:`Attachment` of ``data`` (its bytes kept in ``data``), named ``name``.
    ``stream``: ``data`` was read from a stream that stops one byte past the image limit, so
    a size over a limit is said as "more than" it.

    Raises:
        AttachmentError: empty, over the limit of its kind, an image whose header cannot be
            read, or neither an accepted image nor UTF-8 text.
    """
    label = one_line(name) or "the attachment"  # one inert line, whatever the name holds
    if not data:
        raise AttachmentError(f"cannot attach {label}: the file is empty")
    media_type = sniff_image(data)
    width = height = None
    if media_type is not None:
        if len(data) > MAX_IMAGE_BYTES:
            raise AttachmentError(f"cannot attach {label}: {_over(len(data), MAX_IMAGE_BYTES, stream)} "
                                  f"for an image")
        size = image_size(media_type, data)
        if size is None or not all(size):
            raise AttachmentError(f"cannot attach {label}: it starts as {media_type} but its header is broken")
        width, height = size
        if max(size) > MAX_IMAGE_SIDE:
            raise AttachmentError(f"cannot attach {label}: its header says {width:,}x{height:,} pixels, over "
                                  f"{MAX_IMAGE_SIDE:,} a side: the image is broken")
        if _cut_short(media_type, data):
            raise AttachmentError(f"cannot attach {label}: the {media_type} image is cut short "
                                  f"(its {len(data):,} bytes end before its data does)")
    else:
        if b"\x00" in data:
            raise AttachmentError(f"cannot attach {label}: not a file chatflow sends; it accepts {ACCEPTED}")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise AttachmentError(f"cannot attach {label}: not a file chatflow sends; it accepts {ACCEPTED}") from None
        if len(data) > MAX_TEXT_BYTES:
            raise AttachmentError(f"cannot attach {label}: {_over(len(data), MAX_TEXT_BYTES, stream)} "
                                  f"for a text file")
        media_type = _text_type(name)
    import hashlib

    return Attachment(hashlib.sha256(data).hexdigest(), media_type, len(data), name, width, height, data)


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _limit(limit: int) -> str:
    """``1,000,000 bytes (1 MB)``: a limit in exact decimal bytes."""
    return f"{limit:,} bytes ({limit // 1_000_000} MB)"


def _over(size: int, limit: int, stream: bool = False) -> str:
    """``1,000,001 bytes, over the limit of 1,000,000 bytes (1 MB)``; from a stream read no
    further than one byte past the image limit, ``more than 20,000,000 bytes, ...``."""
    cut = stream and size > MAX_IMAGE_BYTES
    said = f"more than {MAX_IMAGE_BYTES:,} bytes" if cut else f"{size:,} bytes"
    return f"{said}, over the limit of {_limit(limit)}"


def read_attachment(path: str) -> Attachment:
    """The file at ``path`` as an :class:`Attachment` named by its base name.

    Raises:
        AttachmentError: no such file, a directory, a FIFO or other special file, not
            readable, empty, over the limit, or of a type not accepted.
    """
    shown = one_line(path)  # the path as the user gave it, on one inert line
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise AttachmentError(f"cannot attach {shown}: no such file") from None
    except OSError as exc:
        raise AttachmentError(f"cannot attach {shown}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise AttachmentError(f"cannot attach {shown}: it is a directory (attach its files one by one)")
    if not stat.S_ISREG(info.st_mode):
        raise AttachmentError(f"cannot attach {shown}: not a regular file (a FIFO, socket or device)")
    if info.st_size == 0:
        raise AttachmentError(f"cannot attach {shown}: the file is empty")
    if info.st_size > MAX_IMAGE_BYTES:
        raise AttachmentError(f"cannot attach {shown}: {_over(info.st_size, MAX_IMAGE_BYTES)} for an image "
                              f"(and {_limit(MAX_TEXT_BYTES)} for a text file)")
    try:
        with open(path, "rb") as handle:
            # the size stat() gave, and one byte more to see a file that grew since: a
            # buffer of the limit's size would cost more than the read (its pages, its shrink)
            data = handle.read(info.st_size + 1)
            if len(data) > info.st_size:
                data += handle.read(MAX_IMAGE_BYTES + 1 - len(data))
    except PermissionError:
        raise AttachmentError(f"cannot attach {shown}: permission denied (it is not readable)") from None
    except OSError as exc:
        raise AttachmentError(f"cannot attach {shown}: {exc.strerror or exc}") from None
    attachment = attachment_from_bytes(data, os.path.basename(path) or path)
    return attachment


def file_name(attachment: Attachment) -> str:
    """The name a file is written under outside the store: its hash and an extension of its
    type (``<sha256>.png``; ``.txt`` for plain text)."""
    return attachment.sha256 + _EXTENSIONS.get(attachment.media_type, ".txt")


def check_count(count: int) -> None:
    """Raise :class:`AttachmentError` when a message would carry more than :data:`MAX_ATTACHMENTS`."""
    if count > MAX_ATTACHMENTS:
        raise AttachmentError(f"{count} attachments: a message carries at most {MAX_ATTACHMENTS}")


def _fence(text: str) -> str:
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def wire_content(content: str | None, attachments: Sequence[Attachment],
                 blobs: Mapping[str, bytes], *, data_urls: bool = False) -> list[dict[str, Any]]:
    """The Chat Completions content parts of a message with attachments: its text, then
    each attachment (an image as an ``image_url`` part with a base64 ``data:`` URL, a text
    file as a text part that names it). The bytes come from the attachment or ``blobs``.
    ``data_urls``: an image's URL is a :class:`DataURL` (bytes) instead of a str.

    Raises:
        ChatflowError: the bytes of an attachment are neither at hand nor in ``blobs``.
    """
    import binascii

    parts: list[dict[str, Any]] = []
    if content:
        parts.append({"type": "text", "text": content})
    for attachment in attachments:
        data = attachment.data if attachment.data is not None else blobs.get(attachment.sha256)
        if data is None:
            raise ChatflowError(f"the bytes of attachment {attachment.name or attachment.sha256[:12]} "
                                f"(sha256 {attachment.sha256}) are not in the store")
        if attachment.is_image:
            url = DataURL(attachment.media_type, binascii.b2a_base64(data, newline=False))
            parts.append({"type": "image_url", "image_url": {"url": url if data_urls else str(url)}})
        else:
            text = data.decode("utf-8", errors="replace")
            fence = _fence(text)
            parts.append({"type": "text",
                          "text": f"File {attachment.name or 'attached'}:\n{fence}\n{text.rstrip(chr(10))}\n{fence}"})
    return parts


#: What providers say in a 400 when the model takes no images (OpenAI, Azure, vLLM,
#: llama.cpp's server, Ollama, LiteLLM, Groq, Mistral...), lower case.
_NO_IMAGES = ("does not support image", "image input is not supported", "images are not supported",
              "image_url is only supported by certain models", "does not support vision",
              "vision is not supported", "not a multimodal model", "not support multimodal",
              "image input not supported", "cannot read images", "does not accept image",
              "model does not support images", "image inputs are not supported")


def refuses_images(exc: BaseException, attachments: Sequence[Attachment]) -> bool:
    """Whether ``exc`` is a provider's 400 (:class:`~chatflow_cli.core.errors.BadRequestError`)
    saying the model takes no images, to a request whose new message carries ``attachments``
    with an image (front-ends say so in one line). A 400 about an image the provider could
    not read (invalid, corrupt) is not this: see :func:`unreadable_image`."""
    from .errors import BadRequestError, ImagesNotAcceptedError

    if not isinstance(exc, BadRequestError) or isinstance(exc, ImagesNotAcceptedError):
        return False
    said = exc.message.lower()
    return any(a.is_image for a in attachments) and any(words in said for words in _NO_IMAGES)


def unreadable_image(exc: BaseException, attachments: Sequence[Attachment]) -> str | None:
    """When ``exc`` is a provider's 400 about an image it could not read (invalid, corrupt,
    of an unsupported format) to a message with ``attachments`` that has images: one line
    naming them and keeping what the provider said; else None."""
    from .errors import BadRequestError

    images = [a for a in attachments if a.is_image]
    if not isinstance(exc, BadRequestError) or not images or refuses_images(exc, attachments):
        return None
    said = exc.message.lower()
    if "image" not in said:
        return None
    names = ", ".join(a.name or a.sha256[:12] for a in images)
    which = f"image {names}" if len(images) == 1 else f"one of the images {names}"
    return f"the provider could not read {which} (the provider said: {exc.message})"


def image_tokens(width: int, height: int) -> int:
    """OpenAI's published count for an image sent at ``detail: high`` (what ``auto`` picks
    for a large image; chatflow counts every image so, erring high): fit the image in 2048 x
    2048, then scale it down so its shorter side is at most 768; 170 tokens for each 512 x
    512 tile it covers, plus 85."""
    import math

    if width <= 0 or height <= 0:
        return 85
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    shrink = min(1.0, 768 / min(w, h))
    w, h = w * shrink, h * shrink
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)


def attachment_tokens(attachment: Attachment, estimate_text: Any) -> int:
    """The tokens an attachment adds to its message: :func:`image_tokens` for an image; for a
    text file ``estimate_text`` of its text (about a quarter of its size when the bytes are
    not at hand), plus the line that names it."""
    if attachment.is_image:
        return image_tokens(attachment.width or 0, attachment.height or 0)
    if attachment.data is not None:
        return 8 + int(estimate_text(attachment.data.decode("utf-8", errors="replace")))
    return 8 + (attachment.size + 3) // 4


def attachment_line(attachment: Attachment) -> str:
    """One line for people: ``name (image/png, 1.2 MB, 800x600)``; the name inert and on one
    line (:func:`~chatflow_cli.core.inert.one_line`), whatever it holds."""
    size = attachment.size
    shown = f"{size} B" if size < 1000 else f"{size / 1000:.1f} kB" if size < 1_000_000 else _mb(size)
    dims = f", {attachment.width}x{attachment.height}" if attachment.width and attachment.height else ""
    return f"{one_line(attachment.name) or attachment.sha256[:12]} ({attachment.media_type}, {shown}{dims})"


#: What a message with an image to the embedded model gets, before anything is sent or stored.
LOCAL_TAKES_NO_IMAGES = ("the local model (SmolLM2) reads text only: it cannot see images; "
                         "attach text files, or use a vision model (-m gpt-4o)")


def refuse_images_to_a_text_only_model(client: object, message: Any, session_id: str | None = None) -> None:
    """Refuse ``message`` when it carries an image and ``client`` is the embedded model, which
    reads text only: every way a message reaches the model (``chat -f``, the REPL's ``/attach``
    and ``/retry``, the library) meets this one check before the turn begins, so nothing is
    sent and nothing stored.

    Raises:
        ImagesNotAcceptedError: (exit 5) the message has an image and the model is local.
    """
    if getattr(client, "local", False) is True and any(a.is_image for a in message.attachments):
        from .errors import ImagesNotAcceptedError

        raise ImagesNotAcceptedError(LOCAL_TAKES_NO_IMAGES, session_id=session_id)
