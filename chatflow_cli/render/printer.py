"""The reply printer of ``chatflow chat``: a reply shown as it streams."""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any

from .text import TextSanitizer, fold, pretty_json_text, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

__all__ = ["ReplyPrinter"]


# ---------------------------------------------------------------------------------------
# chat: the streamed reply
# ---------------------------------------------------------------------------------------
class ReplyPrinter:
    """Shows a reply as it streams.

    On a terminal (``live=True``) the text is rendered as Markdown as it arrives, through
    :class:`chatflow_cli.render.markdown_stream.MarkdownStream` (complete blocks printed once,
    only the tail redrawn); tool calls and handoffs are printed above the live tail. Into a
    pipe the text is written as it arrives, plain and made safe, and notes about tool calls
    go to stderr only when stderr is a terminal, so stdout holds the answer and nothing else.
    """

    #: Seconds between two redraws of the spinner while nothing else arrives.
    TICK_S = 0.1

    def __init__(self, out_console: Console | None, err_console: Console | None, *, live: bool,
                 file: IO[str] | None = None) -> None:
        import threading

        self.out = out_console
        self.err = err_console
        self.live_enabled = live and out_console is not None
        self._stream: Any = None
        self._text = ""
        self._printed_any = False
        if file is None:
            if out_console is None:
                raise TypeError("ReplyPrinter writes to out_console's file or to file: give one")
            file = out_console.file
        self._file = file
        # The spinner moves on its own: a ticker thread redraws the live tail every TICK_S
        # seconds while the main thread waits on the model. Every use of the stream holds
        # the lock, since MarkdownStream itself is not thread-safe.
        self._lock = threading.RLock()
        # (what, until: monotonic s or None, what once the countdown is over)
        self._waiting: tuple[str, float | None, str] = ("thinking", None, "thinking")
        self._stop = threading.Event()
        self._ticker: Any = None
        self._segment_text = False  # text of the current segment is live (no spinner then)
        self._sanitizer = TextSanitizer()
        if self.live_enabled and out_console is not None:
            from .markdown_stream import MarkdownStream

            self._stream = MarkdownStream(out_console, live=True)
            self._stream.set_status("thinking")
            self._ticker = threading.Thread(target=self._tick, name="chatflow-spinner", daemon=True)
            self._ticker.start()

    # -- the spinner ----------------------------------------------------------------------
    def waiting(self, what: str, seconds: float | None = None, then: str | None = None) -> None:
        """Say what the reply waits for (any thread): ``what`` beside the spinner. With
        ``seconds``, ``{seconds}`` in ``what`` counts down ("rate limited, retrying in 3 s
        (2/3)") and ``then`` is shown once it reaches 0."""
        import time

        with self._lock:
            until = time.monotonic() + seconds if seconds is not None else None
            self._waiting = (what, until, then or what)
            self._show_waiting()

    def _status_text(self) -> str:
        import math
        import time

        what, until, then = self._waiting
        if until is None:
            return what
        left = until - time.monotonic()
        return what.format(seconds=math.ceil(left)) if left > 0 else then

    def _show_waiting(self) -> None:
        if self._stream is not None:
            self._stream.set_status(self._status_text(), refresh=False)

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_S):
            with self._lock:
                if self._stream is None:
                    return
                if self._segment_text:  # text is streaming: its own redraws suffice
                    continue
                self._show_waiting()
                self._stream.refresh()

    def _stop_ticker(self) -> None:
        self._stop.set()
        ticker, self._ticker = self._ticker, None
        if ticker is not None and ticker.is_alive():
            import threading

            if ticker is not threading.current_thread():
                ticker.join(timeout=1.0)

    # -- text ---------------------------------------------------------------------------
    def delta(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            self._text += text
            self._printed_any = True
            self._segment_text = True
            self._waiting = ("thinking", None, "thinking")
            if self._stream is not None:
                self._stream.feed(text)
            else:
                self._file.write(self._sanitizer.feed(text))
                self._file.flush()

    def _end_segment(self) -> None:
        """Close the current text segment (before a tool call line, or at the end)."""
        if self._stream is not None:
            self._stream.end_text()
        elif self._text and not self._text.endswith("\n"):
            self._file.write(self._sanitizer.flush())
            self._file.write("\n")
            self._file.flush()
        self._text = ""

    # -- notes --------------------------------------------------------------------------
    def note(self, text: Any) -> None:
        """A line about a tool call or handoff: above the live tail, or on a terminal stderr."""
        with self._lock:
            self._segment_text = False  # after a tool or handoff line the spinner shows again
            if self._stream is not None:
                self._stream.print(text)
                return
            self._end_segment()
            if self.err is not None:
                self.err.print(text)

    def tool_started(self, agent: str | None, name: str, arguments: str | None) -> None:
        from rich.text import Text

        line = Text()
        line.append(f"{safe_text(agent or 'model')} called ", style="dim")
        line.append(safe_text(name), style="bold yellow")
        line.append(" " + safe_text(pretty_json_text(arguments)), style="dim")
        self.note(line)

    def tool_finished(self, name: str, output: str | None, is_error: bool = False,
                      attachments: Any = ()) -> None:
        """A tool's result; ``attachments``: the images it returned (``Attachment.to_dict()``
        dicts), each shown as an ``attached:`` line."""
        from rich.text import Text

        line = Text("  error: " if is_error else "  result: ", style="red" if is_error else "dim")
        line.append(safe_text(fold(pretty_json_text(output), max_lines=3, max_chars=300)), style="dim")
        for shown in attached_lines(attachments):
            line.append("\n" + shown, style="dim")
        self.note(line)

    def handoff(self, from_agent: str | None, to_agent: str | None) -> None:
        from rich.text import Text

        self.note(Text(f"handoff: {safe_text(from_agent)} -> {safe_text(to_agent)}", style="bold magenta"))

    def finish(self, final_text: str | None = None) -> None:
        """End the reply. ``final_text`` is printed when nothing was streamed (a replayed turn)."""
        if final_text and not self._printed_any:
            self.delta(final_text)
        self._stop_ticker()
        with self._lock:
            if self._stream is not None:
                self._stream.finish()
                self._stream = None
            else:
                self._end_segment()

    def abort(self) -> None:
        self._stop_ticker()
        with self._lock:
            if self._stream is not None:
                try:
                    self._stream.finish()
                finally:
                    self._stream = None
            else:
                self._end_segment()


def attached_lines(attachments: Any) -> list[str]:
    """``  attached: NAME (TYPE, SIZE, WxH)`` for each attachment of a ``tool.call_finished``
    event (``Attachment.to_dict()`` dicts: the images a tool returned); a malformed one is skipped."""
    from ..core.attachments import Attachment, attachment_line

    out: list[str] = []
    for item in attachments or ():
        try:
            out.append(f"  attached: {safe_text(attachment_line(Attachment.from_dict(item)))}")
        except ValueError:
            continue
    return out
