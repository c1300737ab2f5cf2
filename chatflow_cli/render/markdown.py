"""The Markdown layout: a model's reply as ``rich.markdown`` or as chatflow's own fast lines.

:func:`markdown_renderable` is ``rich.markdown.Markdown`` with one shared parser (and links
shown as ``text (url)``); :func:`markdown_lines` lays out the Markdown models write most
(paragraphs, emphasis, inline code, lists) itself, far faster, and returns ``None`` for
anything else. ``rich.markdown`` is imported only when Markdown is actually rendered (on a
terminal), so ``sessions show`` into a pipe stays fast.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from .lines import Lines

__all__ = ["Trimmed", "has_markdown", "is_blank_line", "markdown_lines", "markdown_renderable", "parse_markdown",
           "strip_blank_edges"]


#: emphasis, code, headings, quotes, links, images, tables, strikethrough, HTML and
#: entities, escapes, list items, indented code, setext underlines and rules.
_MARKDOWN_SYNTAX_RE = re.compile(
    r"[*_`#>\[\]|~<&\\]"
    r"|^[ \t]*(?:[-+][ \t]|\d{1,9}[.)](?:[ \t]|$))"
    r"|^(?: {4}|\t)"
    r"|^[ \t]*(?:=+|-{2,})[ \t]*$",
    re.MULTILINE,
)


def has_markdown(text: str | None) -> bool:
    """Whether rendering ``text`` as Markdown could look different from the text itself.

    Conservative: any character or line shape with a Markdown meaning counts, so a false
    ``True`` only costs time; ``False`` means CommonMark would show the same words (it
    would join a paragraph's lines; chatflow keeps them, see :func:`parse_markdown`).
    """
    if not text:
        return False
    return _MARKDOWN_SYNTAX_RE.search(text) is not None


def is_blank_line(line: Sequence[Any]) -> bool:
    """Whether a rendered line (a list of ``rich.segment.Segment``) shows nothing: only
    spaces, and no background colour (a blank row of a code block is not blank)."""
    return all(not seg.text.strip() and (seg.style is None or seg.style.bgcolor is None) for seg in line)


def strip_blank_edges(lines: list[Any]) -> list[Any]:
    """``lines`` (rendered lines) without the blank ones (:func:`is_blank_line`) at either end."""
    start, end = 0, len(lines)
    while start < end and is_blank_line(lines[start]):
        start += 1
    while end > start and is_blank_line(lines[end - 1]):
        end -= 1
    return lines[start:end]


class Trimmed:
    """A renderable drawn without blank rows at its edges and with each run of blank rows
    between blocks cut to one.

    Rich's Markdown puts a blank row between blocks and a table draws blank top and bottom
    edges, so a reply that starts or ends with a table (or has one between paragraphs)
    would get two blank rows where the REPL's live view, which lays out one block at a
    time, shows one: ``sessions show`` and ``/show`` draw replies through this to look the
    same as they did live.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        previous_blank = False
        for line in strip_blank_edges(console.render_lines(self.inner, options, pad=False)):
            blank = is_blank_line(line)
            if blank and previous_blank:
                continue
            previous_blank = blank
            yield from line
            yield Segment.line()


_MARKDOWN_TEMPLATE: Any = None
_MARKDOWN_PARSER: Any = None


def markdown_renderable(text: str) -> Any:
    """``rich.markdown.Markdown`` of ``text`` (already made safe), parsed by one shared parser.

    ``Markdown()`` builds a new ``markdown_it.MarkdownIt`` for every instance, which is
    about half the cost of a short answer; ``sessions show`` renders hundreds, so one
    parser configured as Rich's (CommonMark + strikethrough + tables) is reused and each
    instance copies a template's settings. Links are shown as ``text (url)``, not as
    OSC 8 hyperlinks, as in the REPL; single line breaks are kept (:func:`parse_markdown`).
    The REPL's live view renders through this too, so a reply looks the same live and in
    ``sessions show``.

    It renders through private copies of Rich's styles (see
    :class:`chatflow_cli.render.styles.OwnStyles`): Rich caches a shared ``Style``'s
    ANSI codes for the colour system of the first console that prints it, so printing
    Markdown on, say, a 256-colour console would otherwise make later 16-colour output
    (the REPL's code blocks) come out in 256-colour codes, and the other way round.
    """
    global _MARKDOWN_TEMPLATE
    import copy

    if _MARKDOWN_TEMPLATE is None:
        _MARKDOWN_TEMPLATE = markdown_class()("", hyperlinks=False)
    item = copy.copy(_MARKDOWN_TEMPLATE)
    item.markup = text
    item.parsed = parse_markdown(text)
    return item


_MARKDOWN_CLASS: Any = None


def markdown_class() -> Any:
    """``rich.markdown.Markdown`` as chatflow renders it: segments carry styles private to
    each rendering, and tables keep every character (:func:`_fitting_table_class`)."""
    global _MARKDOWN_CLASS
    if _MARKDOWN_CLASS is None:
        _MARKDOWN_CLASS = _isolated_markdown_class()
    return _MARKDOWN_CLASS


def _isolated_markdown_class() -> Any:
    """``rich.markdown.Markdown`` whose segments carry styles private to each rendering."""
    from rich.markdown import Markdown
    from rich.segment import Segment

    from .styles import OwnStyles

    class IsolatedMarkdown(Markdown):
        elements = {**Markdown.elements, "table_open": _fitting_table_class()}

        def __rich_console__(self, console: Any, options: Any) -> Any:
            styles = OwnStyles()
            for item in super().__rich_console__(console, options):
                if isinstance(item, Segment):
                    yield Segment(item.text, styles.style(item.style), item.control)
                else:
                    yield from styles.own(console.render(item, options))

    IsolatedMarkdown.__name__ = IsolatedMarkdown.__qualname__ = "Markdown"
    return IsolatedMarkdown


def _fitting_table_class() -> Any:
    """Rich's Markdown table that never drops a character.

    Rich lays a table out at the width it is given and cuts a word wider than its column
    with an ellipsis: four UUIDs in 80 columns become four identical stubs. Here a table is
    drawn as a table only when every column can be as wide as its widest word (so no word
    is cut), and its cells fold rather than cut should a word still not fit. Otherwise each
    row is drawn as lines of ``header: value`` (a blank line between rows), a value wider
    than the screen folded onto the next lines: every character stays on screen.
    """
    from rich import box
    from rich.markdown import TableElement
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    class FittingTable(TableElement):
        def __rich_console__(self, console: Any, options: Any) -> Any:
            headers: list[Any] = []
            if self.header is not None and self.header.row is not None:
                headers = [cell.content for cell in self.header.row.cells]
            rows = [[cell.content for cell in row.cells] for row in self.body.rows] if self.body is not None else []
            table = Table(box=box.SIMPLE, pad_edge=False, style="markdown.table.border", show_edge=True,
                          collapse_padding=True)
            for heading in headers:
                heading = heading.copy()
                heading.stylize("markdown.table.header")
                table.add_column(heading, overflow="fold")
            for row in rows:
                table.add_row(*row)
            # Rich measures a table within the width it is given: its true need is its
            # frame (measured empty) plus each column's widest word
            frame = Table(box=box.SIMPLE, pad_edge=False, show_edge=True, collapse_padding=True)
            for _ in range(len(table.columns)):
                frame.add_column("")
            frame.add_row(*[""] * len(table.columns))
            wide = options.update_width(1_000_000)
            need = Measurement.get(console, wide, frame).minimum + sum(
                max(Measurement.get(console, wide, cell).minimum for cell in (column.header, *column.cells))
                for column in table.columns
            )
            if need <= options.max_width:
                yield table
                return
            for n, row in enumerate(rows):
                if n:
                    yield Text("")
                for i, value in enumerate(row):
                    name = headers[i].plain.strip() if i < len(headers) else ""
                    line = Text.assemble((f"{name or f'column {i + 1}'}:", "markdown.table.header"), " ", value,
                                         overflow="fold")
                    yield line

    return FittingTable


# -- a fast path for the Markdown models write most ---------------------------------------
#: Block tokens :func:`markdown_lines` lays out itself; anything else (headings, code,
#: quotes, tables, rules, HTML) is left to ``rich.markdown``.
_SIMPLE_BLOCKS = frozenset({
    "paragraph_open", "paragraph_close", "inline", "bullet_list_open", "bullet_list_close",
    "ordered_list_open", "ordered_list_close", "list_item_open", "list_item_close",
})
#: Inline styles, as Rich's default Markdown theme has them.
_INLINE_STYLES = {"strong": "bold", "em": "italic", "s": "strike"}
_CODE_STYLE = "bold cyan on black"
_BULLET_STYLE = "bold"
_NUMBER_STYLE = "cyan"


def _markdown_parser() -> Any:
    global _MARKDOWN_PARSER
    if _MARKDOWN_PARSER is None:
        from markdown_it import MarkdownIt

        _MARKDOWN_PARSER = MarkdownIt().enable("strikethrough").enable("table")
    return _MARKDOWN_PARSER


def parse_markdown(text: str) -> list[Any]:
    """``text`` parsed as chatflow shows Markdown: CommonMark with tables and strikethrough,
    and every single line break kept (a soft break becomes a hard one), as chat interfaces
    show replies: CSV rows, addresses and poems keep their lines. A blank line still
    separates paragraphs."""
    tokens: list[Any] = _markdown_parser().parse(text)
    for token in tokens:
        if token.type == "inline" and token.children:
            for child in token.children:
                if child.type == "softbreak":
                    child.type, child.tag, child.markup = "hardbreak", "br", ""
    return tokens


def _inline_pieces(children: Sequence[Any]) -> list[tuple[str, str]] | None:
    """Inline tokens -> ``(text, style)`` pieces; ``"\n"`` alone is a hard line break.
    ``None`` when a token is not one :func:`markdown_lines` handles (links, images, HTML)."""
    pieces: list[tuple[str, str]] = []
    active: list[str] = []
    for tok in children:
        kind = tok.type
        if kind == "text":
            if tok.content:
                pieces.append((tok.content, " ".join(active)))
        elif kind == "softbreak":
            pieces.append((" ", " ".join(active)))
        elif kind == "hardbreak":
            pieces.append(("\n", ""))
        elif kind == "code_inline":
            pieces.append((tok.content, " ".join([*active, _CODE_STYLE])))
        elif kind.endswith("_open") and kind[:-5] in _INLINE_STYLES:
            active.append(_INLINE_STYLES[kind[:-5]])
        elif kind.endswith("_close") and kind[:-6] in _INLINE_STYLES:
            if active:
                active.pop()
        else:
            return None
    return pieces


def _wrap(pieces: list[tuple[str, str]], width: int) -> list[list[tuple[str, str]]]:
    """Greedy word wrap of styled pieces to ``width`` cells, as Rich wraps a paragraph:
    words (runs without spaces, possibly spanning styles) never split unless longer than
    the line, spaces at a break dropped, ``"\n"`` pieces force a break."""
    from rich.cells import cell_len

    width = max(1, width)
    # words: each a list of (text, style) fragments; separators remember their style
    lines: list[list[tuple[str, str]]] = []
    line: list[tuple[str, str]] = []
    used = 0
    word: list[tuple[str, str]] = []
    word_len = 0
    gap: tuple[str, str] | None = None  # the space before the word being built

    def place() -> None:
        nonlocal line, used, word, word_len, gap
        if not word:
            return
        if line and used + 1 + word_len > width:
            lines.append(line)
            line, used, gap = [], 0, None
        if line and gap is not None:
            line.append(gap)
            used += 1
        if word_len > width - used:  # longer than a whole line: fold it by characters
            for text, style in word:
                for ch in text:
                    w = cell_len(ch)
                    if used + w > width and line:
                        lines.append(line)
                        line, used = [], 0
                    line.append((ch, style))
                    used += w
        else:
            line.extend(word)
            used += word_len
        word, word_len, gap = [], 0, None

    for text, style in pieces:
        if text == "\n":
            place()
            lines.append(line)
            line, used, gap = [], 0, None
            continue
        for index, chunk in enumerate(text.split(" ")):
            if index > 0:  # a space came before this chunk
                place()
                if line or lines:
                    gap = (" ", style)
            if chunk:
                word.append((chunk, style))
                word_len += cell_len(chunk)
    place()
    if line or not lines:
        lines.append(line)
    return lines


def markdown_lines(text: str, width: int) -> list[Lines] | None:
    """``text`` (already made safe) laid out as Rich's Markdown would, or ``None``.

    Covers what models write most -- paragraphs, bullet and numbered lists (nested,
    tight), bold, italic, strikethrough and inline code -- with Rich's default styles,
    wrapping and list markers, without Rich's layout engine, which costs several times
    more per answer (``sessions show`` of 500 turns within 1 s). Anything else
    (headings, code blocks, quotes, tables, rules, links, images, HTML, loose lists)
    returns ``None``: the caller renders it with :func:`markdown_renderable`. Lines carry
    no trailing padding.
    """
    tokens = parse_markdown(text)
    out: list[Lines] = []
    # open list levels: [is_ordered, next_number, marker_width, marker_pending]
    levels: list[list[Any]] = []
    for index, tok in enumerate(tokens):
        kind = tok.type
        if kind not in _SIMPLE_BLOCKS:
            return None
        if kind == "paragraph_open":
            if levels and not tok.hidden:
                return None  # a loose list: Rich spaces it differently
            if not levels and out:
                out.append(Lines())
        elif kind in ("bullet_list_open", "ordered_list_open"):
            if not levels and out:
                out.append(Lines())
            ordered = kind == "ordered_list_open"
            start = int(tok.attrs.get("start", 1)) if ordered else 1
            count = 0
            for later in tokens[index + 1:]:
                if later.level == tok.level and later.type == kind.replace("_open", "_close"):
                    break
                if later.type == "list_item_open" and later.level == tok.level + 1:
                    count += 1
            marker_width = len(str(start + count)) + 2 if ordered else 3
            levels.append([ordered, start, marker_width, False])
        elif kind in ("bullet_list_close", "ordered_list_close"):
            levels.pop()
        elif kind == "list_item_open":
            levels[-1][3] = True
        elif kind == "inline":
            pieces = _inline_pieces(tok.children or [])
            if pieces is None:
                return None
            indent = sum(level[2] for level in levels)
            for row in _wrap(pieces, width - indent):
                line = Lines()
                for level in levels:
                    ordered, number, marker_width, pending = level
                    if pending:
                        if ordered:
                            line.append(f"{number}".rjust(marker_width - 1) + " ", _NUMBER_STYLE)
                            level[1] = number + 1
                        else:
                            line.append(" • ", _BULLET_STYLE)
                        level[3] = False
                    else:
                        line.append(" " * marker_width)
                for piece_text, style in row:
                    line.append(piece_text, style)
                out.append(line)
    return out
