"""``chatflow chat --attach FILE`` (``-f FILE``, repeatable): the files of the user message.

Imported only when a file is attached, so a plain ``chatflow chat hi`` never calls it. Each
file is read and checked (:func:`~chatflow_cli.core.attachments.read_attachment`) before
anything is stored or sent; ``-f -`` reads stdin as a file (named ``stdin``), and the message
then comes from the MESSAGE argument only. A message with attachments needs no text (its content is then ``""``).
The message itself is put together by :func:`chatflow_cli.commands.chat.attached_message`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.attachments import (MAX_IMAGE_BYTES, Attachment, attachment_from_bytes, check_count, read_attachment,
                                refuses_images, unreadable_image)
from ..core.errors import AttachmentError, BadRequestError, ImagesNotAcceptedError

if TYPE_CHECKING:  # pragma: no cover
    from ..config import ModelChoice
    from ..context import State
    from ..core.messages import Message

__all__ = ["images_refused", "read_attachments", "text_only_check"]


def _read_stdin(state: State) -> Attachment:
    if state.env.stdin_isatty:
        raise AttachmentError("cannot attach -: stdin is a terminal (pipe the file in: chatflow chat -f - MESSAGE < FILE)")
    stream = state.env.stdin
    source = getattr(stream, "buffer", None)
    if source is None:  # a text stream (tests): its text as UTF-8
        data = stream.read().encode("utf-8")
    else:
        data = source.read(MAX_IMAGE_BYTES + 1)  # no further: a larger file is said as "more than" the limit
    return attachment_from_bytes(data, "stdin", stream=True)


def read_attachments(state: State, paths: list[str] | tuple[str, ...]) -> tuple[Attachment, ...]:
    """Every ``--attach`` file, read and checked, in the order given.

    Raises:
        AttachmentError: a file cannot be attached, or there are too many (exit 2).
    """
    check_count(len(paths))
    if list(paths).count("-") > 1:
        raise AttachmentError("-f - is given twice: stdin can be attached once")
    return tuple(_read_stdin(state) if path == "-" else read_attachment(path) for path in paths)


def text_only_check(choice: ModelChoice, message: Message) -> None:
    """The local model reads text only: refuse a message with an image before sending."""
    if choice.local and any(a.is_image for a in message.attachments):
        # said before the local server starts; the Runner checks every message again
        from ..core.attachments import LOCAL_TAKES_NO_IMAGES

        raise ImagesNotAcceptedError(LOCAL_TAKES_NO_IMAGES)


def images_refused(exc: BaseException, message: Message, model: str) -> None:
    """A provider's 400 to a request with an image becomes one line when it is about images:
    the model does not accept images, or the provider could not read an image (named, what
    the provider said kept). The user message stays for a retry."""
    if not isinstance(exc, BadRequestError):
        return
    if refuses_images(exc, message.attachments):
        exc.message = (f"model {model} does not accept images (the provider said: {exc.message}); "
                       "the message is kept: send it again to a vision model (-m MODEL)")
    else:
        unreadable = unreadable_image(exc, message.attachments)
        if unreadable is None:
            return
        exc.message = f"{unreadable}; check that the file is a whole image"
    exc.args = (exc.message,)
