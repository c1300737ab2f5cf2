"""Attachments: the type and size read from the bytes (images made by Pillow), the refusals,
the wire parts and OpenAI's image-token rule."""

from __future__ import annotations

import base64
import io

import pytest

from chatflow_cli.core.attachments import (
    MAX_TEXT_BYTES,
    attachment_from_bytes,
    image_tokens,
    wire_content,
)
from chatflow_cli.core.errors import AttachmentError
from chatflow_cli.core.messages import Message, Role, stored_message
from chatflow_cli.core.tokens import estimate_tokens

Image = pytest.importorskip("PIL.Image")


def image_bytes(fmt: str, size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    mode = "P" if fmt == "GIF" else "RGB"
    Image.new(mode, size).save(buffer, format=fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    return buffer.getvalue()


@pytest.mark.parametrize("fmt,media_type,extra", [
    ("PNG", "image/png", {}), ("JPEG", "image/jpeg", {}), ("GIF", "image/gif", {}),
    ("WEBP", "image/webp", {"lossless": True}), ("WEBP", "image/webp", {"lossless": False}),
])
def test_an_image_is_known_by_its_bytes_and_its_header_gives_its_size(fmt: str, media_type: str,
                                                                       extra: dict[str, bool]) -> None:
    buffer = io.BytesIO()
    Image.new("P" if fmt == "GIF" else "RGB", (123, 45)).save(buffer, format=fmt, **extra)
    # the name says text: the bytes decide
    attachment = attachment_from_bytes(buffer.getvalue(), "notes.txt")
    assert (attachment.media_type, attachment.width, attachment.height) == (media_type, 123, 45)
    assert attachment.size == len(buffer.getvalue())


def test_text_files_and_refusals() -> None:
    assert attachment_from_bytes(b'{"a": 1}\n', "data.json").media_type == "application/json"
    assert attachment_from_bytes(b"a,b\n1,2\n", "t.csv").media_type == "text/csv"
    assert attachment_from_bytes("# Título\n".encode(), "README.md").media_type == "text/markdown"
    # a .png that holds text is sent as the text it is
    assert attachment_from_bytes(b"not a picture\n", "fake.png").media_type == "text/plain"
    for data, words in [(b"", "empty"), (b"%PDF-1.7\n\x00\x01binary", "PNG, JPEG, WebP, GIF"),
                        (b"\xff\xfe\xfdlatin", "UTF-8 text"), (b"a" * (MAX_TEXT_BYTES + 1), "over the limit"),
                        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 4, "header is broken")]:
        with pytest.raises(AttachmentError, match=words):
            attachment_from_bytes(data, "x.bin")


def test_wire_parts_and_token_estimate() -> None:
    png = image_bytes("PNG", (1024, 1024))
    image = attachment_from_bytes(png, "a.png")
    code = attachment_from_bytes(b"print('```')\n", "a.py")
    message = Message.user("look", [image, code])
    parts = wire_content(message.content, message.attachments, {})
    assert parts[0] == {"type": "text", "text": "look"}
    assert parts[1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}
    assert parts[2]["text"].startswith("File a.py:\n````\n")  # a fence longer than any run of backticks inside
    # loaded from a store: the metadata only; the bytes come from the store's blobs
    loaded = Message.from_json(message.to_json())
    assert loaded == message and loaded.attachments[0].data is None
    assert loaded.to_wire({image.sha256: png, code.sha256: code.data or b""})["content"] == parts
    # OpenAI's published examples: 1024x1024 at high detail is 765 tokens, 2048x4096 is 1105
    assert image_tokens(1024, 1024) == 765 and image_tokens(2048, 4096) == 1105 and image_tokens(100, 100) == 255
    assert estimate_tokens(message) - estimate_tokens(Message.user("look")) >= 765


def test_stored_attachments_are_read_when_first_asked_for() -> None:
    """A store reads a message with :func:`stored_message`: the text of the attachments
    (written last) is kept and parsed on the first read, whatever their names hold; text that
    is not chatflow's (the key not last, nested in items) still reads the same."""
    odd = attachment_from_bytes(b"x\n", 'a],"attachments":[{"b":"\u00e9}]}')
    png = attachment_from_bytes(image_bytes("PNG", (3, 2)), None)
    for message in [Message.user("one", [odd, png]), Message.user("none"),
                    Message(Role.USER, "i", items=({"attachments": [{"x": "]}"}]},), attachments=(png,)),
                    Message(Role.USER, "nested only", items=({"attachments": []},))]:
        loaded = Message.from_json(message.to_json(), lazy_attachments=True)
        assert loaded == message and loaded.items == message.items and loaded.to_dict() == message.to_dict()
    first = stored_message({"role": "user", "attachments": [{"sha256": png.sha256, "media_type": "image/png",
                                                             "size": 1}], "content": "key first"})
    assert first.attachments[0].sha256 == png.sha256 and first.content == "key first"
    broken = stored_message('{"role":"user","content":"x","attachments":[{"sha256":"no"}]}')
    assert broken.content == "x"
    with pytest.raises(ValueError, match="sha256"):
        broken.attachments  # noqa: B018 - the read that parses them
    with pytest.raises(ValueError, match="an attachment needs sha256"):
        Message.from_json('{"role":"user","attachments":[{"sha256":"no"}]}')  # eager: at once


def test_a_stored_message_behaves_as_the_message_it_is() -> None:
    """Until its attachments are read a stored message is a Message of a private subclass;
    equality (either side), hashing, repr, copies, pickling and dataclasses.replace read them
    and give what the Message itself gives."""
    import copy
    import dataclasses
    import pickle

    message = Message.user("look", [attachment_from_bytes(b"12:00 boom\n", "app.log")])

    def stored() -> Message:
        return stored_message(message.to_json())

    assert type(stored()) is not Message and isinstance(stored(), Message)
    assert stored() == message and message == stored() and not stored() != message and not message != stored()
    assert stored() == stored() and hash(stored()) == hash(message) and len({stored(), message}) == 1
    assert repr(stored()) == repr(message)
    for made in (copy.copy(stored()), copy.deepcopy(stored()), pickle.loads(pickle.dumps(stored())),
                 dataclasses.replace(stored(), content="look")):
        assert type(made) is Message and made == message
    other = dataclasses.replace(stored(), attachments=())
    assert other.attachments == () and other == Message.user("look")
    read = stored()
    assert read.attachments == message.attachments and type(read) is Message
