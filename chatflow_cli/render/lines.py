"""Styled lines: :class:`Lines`, plain text with style spans, for a pipe or a terminal.

Building ``rich.text.Text`` for every line of a long listing costs more than the listing;
:class:`Lines` keeps the text and its spans, gives ``plain`` for a pipe, word-wraps itself,
and writes its own ANSI codes (:meth:`Lines.ansi`). Rich is imported only when a line is
turned into ``rich.text.Text`` or coloured.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["Lines"]


class Lines:
    """Styled text built piece by piece; ``plain`` for a pipe, :meth:`to_text` for Rich.

    Cheaper than appending to ``rich.text.Text`` (which scans every piece for control
    codes again): chatflow's pieces are already made safe by :func:`safe_text`. Nothing
    from Rich is imported until :meth:`to_text`, so ``sessions show`` into a pipe does not
    load Rich at all.
    """

    __slots__ = ("parts",)

    def __init__(self, text: str = "", style: str = "") -> None:
        self.parts: list[tuple[str, str]] = [(text, style)] if text else []

    def append(self, text: str, style: str = "") -> "Lines":
        if text:
            self.parts.append((text, style))
        return self

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.parts)

    def rstrip(self) -> None:
        while self.parts:
            text, style = self.parts[-1]
            stripped = text.rstrip()
            if stripped:
                self.parts[-1] = (stripped, style)
                return
            self.parts.pop()

    def to_text(self) -> Any:
        from rich.text import Span, Text

        plain = self.plain
        spans = []
        offset = 0
        for text, style in self.parts:
            if style:
                spans.append(Span(offset, offset + len(text), style))
            offset += len(text)
        return Text(plain, spans=spans)

    def __rich__(self) -> Any:
        return self.to_text()

    def wrapped(self, width: int, *, hang: int | None = None) -> "Lines":
        """These lines word-wrapped to ``width`` cells, for a terminal (which would otherwise
        cut words at its edge). A wrapped row hangs under the start of its line's text: after
        a leading label such as ``You: `` (a bold piece ending in ``": "``) or under its
        leading spaces. Words longer than a row are folded; nothing else is ever split."""
        from rich.cells import cell_len

        out = Lines()
        logical: list[list[tuple[str, str]]] = [[]]
        for text, style in self.parts:
            for index, piece in enumerate(text.split("\n")):
                if index:
                    logical.append([])
                if piece:
                    logical[-1].append((piece, style))
        for number, parts in enumerate(logical):
            if number:
                out.append("\n")
            plain = "".join(text for text, _ in parts)
            if cell_len(plain) <= width:
                out.parts.extend(parts)
                continue
            indent = len(plain) - len(plain.lstrip(" ")) if hang is None else hang
            if hang is None and parts and parts[0][1].startswith("bold") and parts[0][0].endswith(": "):
                indent = len(parts[0][0])
            indent = min(indent, width // 3)
            used = 0
            for text, style in parts:
                for token in re.findall(r" +|[^ ]+", text):
                    size = cell_len(token)
                    if token[0] == " ":
                        if used + size < width:
                            out.append(token, style)
                            used += size
                        else:
                            used = width  # no room for the space: the next word starts a row
                        continue
                    if used + size > width and used > indent:
                        out.rstrip_spaces()
                        out.append("\n" + " " * indent)
                        used = indent
                    while used + cell_len(token) > width:  # a word longer than the row
                        room, cut = width - used, 0
                        while cut < len(token) and cell_len(token[: cut + 1]) <= room:
                            cut += 1
                        cut = max(cut, 1)
                        out.append(token[:cut], style)
                        out.append("\n" + " " * indent)
                        token, used = token[cut:], indent
                    out.append(token, style)
                    used += cell_len(token)
        return out

    def rstrip_spaces(self) -> None:
        """Drop the spaces at the end of the last line (not its newline)."""
        while self.parts:
            text, style = self.parts[-1]
            stripped = text.rstrip(" ")
            if stripped or text == "":
                self.parts[-1] = (stripped, style)
                return
            self.parts.pop()

    def ansi(self, color_system: str | None) -> str:
        """The text with SGR colour codes for ``color_system`` (``None``: plain), no wrapping.

        Used for terminals and pagers: the terminal wraps long lines itself, so Rich's
        layout pass (the slow part of printing thousands of lines) is skipped.
        """
        if not color_system:
            return self.plain
        return "".join(_style_of(style, color_system).render(text, color_system=_color_system(color_system))
                       if style else text for text, style in self.parts)


_STYLES: dict[tuple[str, str], Any] = {}


def _style_of(style: str, color_system: str) -> Any:
    key = (style, color_system)
    if key not in _STYLES:
        from rich.style import Style

        _STYLES[key] = Style.parse(style)
    return _STYLES[key]


_COLOR_SYSTEMS: dict[str, Any] = {}


def _color_system(name: str) -> Any:
    if name not in _COLOR_SYSTEMS:
        from rich.color import ColorSystem

        _COLOR_SYSTEMS[name] = {"standard": ColorSystem.STANDARD, "256": ColorSystem.EIGHT_BIT,
                                "truecolor": ColorSystem.TRUECOLOR,
                                "windows": ColorSystem.WINDOWS}.get(name, ColorSystem.STANDARD)
    return _COLOR_SYSTEMS[name]
