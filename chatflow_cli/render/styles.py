"""Private copies of Rich's styles, one set per console.

Rich caches a shared ``Style``'s ANSI codes for the colour system of the first console that
prints it; :class:`OwnStyles` gives each rendering its own copies, so a 256-colour console
never leaks its codes into a 16-colour one (and the other way round). Imports Rich: only the
modules that render for a terminal import this one.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.segment import Segment
from rich.style import Style

__all__ = ["OwnStyles"]


def _fresh_style(style: Style) -> Style:
    """A new ``Style`` equal to ``style``, with no ANSI codes cached yet.

    Rich caches a style's ANSI codes on the ``Style`` object the first time it is
    rendered, for the colour system of *that* console, and shares ``Style`` objects
    process-wide (``Style.parse``, ``Style + Style`` and ``Style.normalize`` are
    cached by ``lru_cache``; a Syntax theme's token style plus its background is one such object).
    Rendered for a 256-colour console first, a shared style then prints 256-colour codes
    into a 16-colour one (and the other way round). Segments printed through a private
    copy never read, nor leave, codes cached for another console.
    """
    return Style(
        color=style.color,
        bgcolor=style.bgcolor,
        bold=style.bold,
        dim=style.dim,
        italic=style.italic,
        underline=style.underline,
        blink=style.blink,
        blink2=style.blink2,
        reverse=style.reverse,
        conceal=style.conceal,
        strike=style.strike,
        underline2=style.underline2,
        frame=style.frame,
        encircle=style.encircle,
        overline=style.overline,
        link=style.link,
        meta=style.meta or None,
    )


class OwnStyles:
    """Maps Rich's (process-wide, shared) styles to private copies for one console.

    ``own(segments)`` yields the segments with every style replaced by its copy (one copy
    per distinct style, kept in this object), see :func:`_fresh_style`. Use one instance
    per console: the copies cache that console's ANSI codes.
    """

    __slots__ = ("_styles",)

    def __init__(self) -> None:
        self._styles: dict[Style, Style] = {}

    def style(self, style: Style | None) -> Style | None:
        if style is None:
            return None
        own = self._styles.get(style)
        if own is None:
            own = self._styles[style] = _fresh_style(style)
        return own

    def own(self, segments: Iterable[Segment]) -> Iterable[Segment]:
        style_of = self.style
        for text, style, control in segments:
            yield Segment(text, style_of(style), control)
