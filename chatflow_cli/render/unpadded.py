"""Rich output without the spaces Rich pads lines with: :func:`print_unpadded`, and the
segment helpers the Markdown stream prints its lines with."""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.segment import ControlType, Segment, Segments
from rich.style import Style

from .styles import OwnStyles

__all__ = ["Line", "fill_segments", "print_unpadded"]

#: One rendered line: Rich segments, no newline.
Line = list[Segment]


def _unpad(line: Line) -> tuple[Line, Style | None]:
    """``line`` without its trailing blank cells, and the background they had (if any).

    Rich pads left-justified text and code blocks with spaces to the full width; printed
    as they are, those spaces end up in the scrollback, in copied text, and as blank rows
    when the terminal reflows to a narrower width.
    """
    segments = list(line)
    fill: Style | None = None
    while segments:
        seg = segments[-1]
        if seg.control:
            break
        stripped = seg.text.rstrip(" ")
        if seg.style is not None and seg.style.bgcolor is not None and stripped != seg.text:
            fill = fill or Style(bgcolor=seg.style.bgcolor)
        if stripped:
            if stripped != seg.text:
                segments[-1] = Segment(stripped, seg.style)
            break
        segments.pop()
    return segments, fill


def fill_segments(line: Line, width: int, fill_ok: bool, styles: OwnStyles | None = None) -> list[Segment]:
    """``line`` unpadded; a background its padding had is drawn to the edge by an erase
    to end of line in that colour (not when the line fills the row: with the cursor in
    the last column a terminal would erase the last character). With ``styles``, the
    segments carry its private copies of their styles (see :class:`OwnStyles`)."""
    segments, fill = _unpad(line)
    if fill is not None and fill_ok and Segment.get_line_length(segments) < width:
        segments.append(Segment("\x1b[K", fill, [(ControlType.ERASE_IN_LINE, 0)]))
    if styles is not None:
        segments = list(styles.own(segments))
    return segments


def print_unpadded(console: Console, *renderables: RenderableType) -> None:
    """``console.print`` each renderable without the spaces Rich pads lines with.

    For REPL output that is not streamed (``/show``, ``/help``): what lands in the
    scrollback, and in copied text, has no trailing padding.
    """
    width = console.size.width
    fill_ok = console.is_terminal and console.color_system is not None
    segments: list[Segment] = []
    styles = OwnStyles()
    for renderable in renderables:
        for line in console.render_lines(renderable, console.options, pad=False):
            segments.extend(fill_segments(line, width, fill_ok, styles))
            segments.append(Segment.line())
    if segments:
        console.print(Segments(segments), end="", crop=False, soft_wrap=True, highlight=False)
