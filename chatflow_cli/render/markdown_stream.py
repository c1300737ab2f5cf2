"""Stream Markdown into a terminal as it arrives: finished blocks once, only the tail live.

A model's answer arrives as small text deltas. :class:`MarkdownStream` renders it with
Rich so that a long answer stays fast and readable:

* The text is split into Markdown *blocks* (paragraphs, list items, headings, block
  quotes, tables, fenced and indented code) by a small line-based scanner. A block is
  *complete* when a later block has started (a blank line followed by a non-continuation
  line, a heading, a fence, a sibling list item...); a fenced code block when its closing
  fence arrives. A complete block is rendered once with :class:`rich.markdown.Markdown`
  exactly as ``sessions show`` renders it (:func:`chatflow_cli.render.markdown_renderable`:
  single line breaks kept; code blocks with :class:`rich.syntax.Syntax`, highlighted) and
  printed into the scrollback. It is never redrawn.
* Only the unfinished *tail* (the open block plus the partial last line, and a spinner
  line while waiting) is drawn live, below the scrollback, and redrawn at most
  ``refresh_per_second`` times a second. A refresh costs time proportional to the tail,
  not to the answer, so the answer does not slow down as it grows.
* The tail is never taller than half the screen: when the open block grows past that
  (a long code block, a huge paragraph), its completed lines are printed into the
  scrollback and only the rest stays live. A paragraph's final rows (its complete lines,
  or the rows of a long line before a space where no inline markup is open) leave the
  live text as well, so a refresh costs the same for a paragraph of any length. A table
  is the exception: a later row can widen every column, so it is redrawn whole while it
  fits in the live region and, taller, held behind a row count until it is complete. Nothing is cropped or hidden behind an
  ellipsis, and because the live region always fits on the screen, moving the cursor
  back over it never reaches into the scrollback: no line is ever printed twice, also
  when the terminal is smaller than the answer.
* Resizes (seen at the next refresh; no SIGWINCH handler is needed): the part of the
  tail that is final already (complete code lines, a paragraph's rows but the last when
  its inline markup is settled) stays on screen as printed output, and only the rest —
  the line being written and the spinner, a few rows — is erased, its rows recomputed at
  the new width (terminals that reflow, which all but xterm do, wrap each old line into
  ``ceil(len/width)`` rows; inside tmux or screen, which report a new size late, and in
  xterm, which does not rewrap, each old line counts as one row and the live tail is at
  most 4 rows). While the size keeps changing nothing is drawn; the stream resumes once
  it has been stable for ``settle`` seconds (0.3). Nothing beyond that small live part is
  ever erased, so no line is lost; a line may show twice when the terminal had a size
  the stream could not know.
* Lines carry no trailing padding (Rich pads to the width): nothing extra lands in the
  scrollback or in copied text, and a reflow to a narrower width adds no blank rows.
* On a console that is not a terminal nothing is drawn live: complete blocks are
  printed as they complete, and the rest by :meth:`MarkdownStream.finish`.

Safety: model text is untrusted. Every delta goes through chatflow's one terminal
sanitizer, :func:`chatflow_cli.render.safe_text` (here also named
:func:`sanitize_terminal_text`), before anything is parsed: ESC (so CSI, OSC — including
OSC 52 clipboard writes and OSC 8 hyperlinks — and every other escape sequence), BEL, the
other C0 controls except ``\\n`` and ``\\t``, DEL, the C1 controls and the bidirectional
controls become visible, inert stand-ins; ``\\r\\n``, U+2028 and U+2029 become ``\\n``.
Markdown links are shown as ``text (url)`` rather than as OSC 8
hyperlinks, so a link's target is always visible.

Cosmetic limits, chosen on purpose: list items are printed one by one, so an ordered list
passing from 9 to 10 items shifts its text by one column; when a paragraph taller than the
live region has its top lines printed early, an emphasis (``**...**``) opened in the
printed part and closed later keeps its literal asterisks in the printed lines; a code
block printed in chunks is highlighted chunk by chunk (and the line being written of a
live code block on its own); a terminal shrunk to fewer rows than the line being written
takes at the new width has pushed that line's top rows into its scrollback before they
can be erased, so that one line may show twice.

Usage::

    stream = MarkdownStream(console)
    stream.set_status("thinking")        # spinner until the first token
    for delta in deltas:
        stream.feed(delta)
    stream.finish()

:class:`MarkdownStream` is not thread-safe: call it from one thread (the REPL calls
:meth:`MarkdownStream.refresh` on a timer from the same thread to animate the spinner and
show text that arrived just before a pause).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Self

from rich.console import Console, ConsoleOptions, RenderableType
from rich.control import Control
from rich.segment import ControlType, Segment, Segments
from rich.spinner import Spinner
from rich.style import Style
from rich.syntax import Syntax
from rich.text import Text

from .markdown import markdown_class, markdown_lines, markdown_renderable, parse_markdown
from .markdown import strip_blank_edges as _strip_blank_edges
from .markdown_blocks import SETEXT, Block, BlockScanner, settled_markup, starts_a_block
from .styles import OwnStyles
from .text import TextSanitizer, safe_text
from .unpadded import Line, fill_segments

__all__ = ["MarkdownStream", "RefreshStat", "sanitize_terminal_text"]

DEFAULT_CODE_THEME = "monokai"

# --------------------------------------------------------------------------- sanitizing

#: The one terminal sanitizer of chatflow (see :func:`chatflow_cli.render.text.safe_text`).
sanitize_terminal_text = safe_text
_Sanitizer = TextSanitizer


# --------------------------------------------------------------------------- the renderer

@dataclass
class RefreshStat:
    """One live refresh: when (monotonic s), how long it took (s), answer size then (chars)."""

    at: float
    seconds: float
    answer_chars: int
    tail_rows: int


@dataclass
class _Drawn:
    """The live tail on screen, and what of it may stay as final output after a resize.

    ``keep`` leading lines are final-able: after a resize they are left in place (the
    terminal reflowed them like any scrollback line) and the stream's state is advanced
    with ``keep_rows`` (Markdown rows of the open block, rendered at ``keep_width``) or
    ``keep_code`` (complete code lines of the open fence). The other lines are erased.
    """

    widths: list[int] = field(default_factory=list)  # cell width of each drawn tail line
    width: int = 0  # terminal size when drawn
    height: int = 0
    kind: str = ""  # "md", "fence" or "" (nothing final-able)
    keep: int = 0
    keep_rows: int = 0
    keep_code: int = 0
    keep_width: int = 0


@dataclass
class _Keep:
    kind: str = ""
    keep: int = 0
    rows: int = 0
    code: int = 0
    width: int = 0


def _terminal_reflows() -> bool:
    """Whether the terminal rewraps lines on a resize in step with the size we read.

    VTE, kitty, iTerm2, Windows Terminal, WezTerm, foot, Alacritty... do. xterm
    (``$XTERM_VERSION``) does not rewrap; tmux (``$TMUX``) and screen (``$STY``) rewrap at
    once but tell the program the new size later (tmux holds it back while resizes keep
    coming), so rows computed from the size we read may be too many: there, an old line
    is counted as one row (too few rows erased leave a line twice; too many would erase
    printed lines).
    """
    import os

    return not (os.environ.get("XTERM_VERSION") or os.environ.get("TMUX") or os.environ.get("STY"))


class MarkdownStream:
    """Render streamed Markdown into ``console``: complete blocks once, the tail live.

    Args:
        console: where to render. Live drawing happens only when ``console.is_terminal``
            (and not a dumb terminal) unless ``live`` says otherwise.
        code_theme: Pygments theme of code blocks (Rich's Markdown default).
        refresh_per_second: the most live redraws a second (default 20).
        live: force live drawing on (True) or off (False); None decides from the console.
        clock: monotonic clock in seconds, injectable for tests.
        settle: seconds the terminal size must stay the same after a resize before the
            live tail is drawn again (default 0.3).
        reflow: whether the terminal rewraps lines on a resize in step with the size read
            (None: all but xterm, and not inside tmux or screen): after a resize, the rows of
            the erased part are then computed for the new width, else one per line.

    Methods: :meth:`feed` (a text delta), :meth:`set_status` (a spinner line in the tail),
    :meth:`print` (a renderable into the scrollback, ending the current text),
    :meth:`refresh`, :meth:`finish`. ``text`` is everything fed (sanitized);
    ``stats`` the :class:`RefreshStat` of every live redraw.

    Resizes (SIGWINCH needs no handler: the size is read at every refresh):

    * The tail on screen was drawn for the old size. Its lines that are final already —
      the complete code lines of an open fence, the rows but the last of a paragraph whose
      inline markup is settled — stay where they are as printed output (the terminal has
      reflowed them like the rest of the scrollback); only the rest (the line being
      written, the spinner: a few rows) is erased, its row count computed for the new
      width. A paragraph whose top stayed continues at the width it started with, so its
      rows never shift.
    * Debounce: while the size keeps changing (until it has been stable for ``settle``
      seconds) nothing is drawn; complete text waits and is printed once, at the settled
      width. :meth:`finish` prints everything whatever the state.

    Lines are printed without trailing padding; a code block's background reaches the
    right edge with an erase-to-end-of-line in its colour, not with spaces.
    """

    def __init__(
        self,
        console: Console,
        *,
        code_theme: str = DEFAULT_CODE_THEME,
        refresh_per_second: float = 20.0,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        settle: float = 0.3,
        reflow: bool | None = None,
    ) -> None:
        self.console = console
        self.code_theme = code_theme
        self.interval = 1.0 / refresh_per_second if refresh_per_second > 0 else 0.0
        if live is None:
            live = console.is_terminal and not console.is_dumb_terminal
        self.live = live
        self.clock = clock
        self.settle = settle
        self.reflow = _terminal_reflows() if reflow is None else reflow
        self.stats: list[RefreshStat] = []
        self._sanitizer = _Sanitizer()
        self._styles = OwnStyles()  # private copies of Rich's shared styles, for this console
        self._parsed_styles: dict[str, Style] = {}
        self._scanner = BlockScanner()
        self._chunks: list[str] = []
        self._chars = 0
        self._partial = ""  # the incomplete last line
        self._ready: list[Block] = []  # complete blocks not yet printed
        self._out: list[Line] = []  # lines to print into the scrollback at the next refresh
        self._blocks_printed = 0  # blocks printed in this text segment
        self._rows_committed = 0  # rendered rows of the open block already printed
        self._pin: int | None = None  # width the open block's printed rows were rendered at
        self._code_committed = 0  # code lines of the open fence already printed
        self._continued = False  # the open block continues a paragraph whose top rows are printed
        self._status: str | None = None
        self._spinner: Spinner | None = None  # kept across refreshes so its frame advances
        self._drawn = _Drawn()
        self._size = self._terminal_size()
        self._settle_until = -math.inf
        self._cursor_hidden = False
        self._last_refresh = -math.inf
        self._closed = False

    # ------------------------------------------------------------------ public
    @property
    def text(self) -> str:
        """All text fed so far, sanitized."""
        return "".join(self._chunks)

    @property
    def has_text(self) -> bool:
        return self._chars > 0

    def feed(self, delta: str) -> None:
        """Add a text delta; redraw if the last redraw is older than the refresh interval."""
        if not delta:
            return
        clean = self._sanitizer.feed(delta)
        if clean:
            self._chunks.append(clean)
            self._chars += len(clean)
            self._take(clean)
        if self.clock() - self._last_refresh >= self.interval:
            self.refresh()

    def set_status(self, status: str | None, *, refresh: bool = True) -> None:
        """Show ``status`` with a spinner as the last live line (None removes it).

        The status shows only while no text of the current segment is live; with
        ``refresh=False`` the change appears at the next refresh.
        """
        self._status = sanitize_terminal_text(status) if status else None
        if refresh:
            self.refresh()

    def print(self, *renderables: RenderableType) -> None:
        """End the current text (its tail becomes final) and print ``renderables`` below it."""
        self.end_text()
        options = self.console.options
        for renderable in renderables:
            self._out.extend(self.console.render_lines(renderable, options, pad=False))
        self.refresh()

    def end_text(self) -> None:
        """The text so far is complete: print its tail as final blocks. Later text starts afresh."""
        self._check_resize()
        rest = self._sanitizer.flush()
        if rest:
            self._chunks.append(rest)
            self._chars += len(rest)
            self._take(rest)
        if self._partial:
            self._ready.extend(self._scanner.push_line(self._partial))
            self._partial = ""
        self._ready.extend(self._scanner.close())
        self._commit_ready()
        self._blocks_printed = 0
        self._continued = False

    def refresh(self, *, force: bool = True) -> None:
        """Print completed blocks and redraw the tail now (``force=False``: only if due).

        Right after a resize (until the size has been stable for ``settle`` seconds) it
        draws nothing.
        """
        now = self.clock()
        if not force and now - self._last_refresh < self.interval:
            return
        self._last_refresh = now
        if self._check_resize() and not self._closed:
            return
        started = time.perf_counter()
        self._commit_ready()
        tail, keep = self._tail_lines() if self.live else ([], _Keep())
        if not self._out and not tail and not self._drawn.widths:
            return
        self._write(tail, keep)
        if self.live:
            self.stats.append(RefreshStat(now, time.perf_counter() - started, self._chars, len(tail)))

    def finish(self) -> str:
        """Print everything still pending, remove the live tail, show the cursor; return the text."""
        if self._closed:
            return self.text
        self._status = None
        self.end_text()
        self._closed = True
        self._write([], _Keep())
        if self._cursor_hidden:
            self.console.show_cursor(True)
            self._cursor_hidden = False
        return self.text

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    # ------------------------------------------------------------------ text in
    def _take(self, clean: str) -> None:
        if "\n" not in clean:
            self._partial += clean
            return
        pieces = clean.split("\n")
        pieces[0] = self._partial + pieces[0]
        self._partial = pieces.pop()
        push = self._scanner.push_line
        for line in pieces:
            self._ready.extend(push(line))

    # ------------------------------------------------------------------ rendering
    def _terminal_size(self) -> tuple[int, int]:
        size = self.console.size
        return size.width, size.height

    def _options(self, width: int | None = None) -> ConsoleOptions:
        if width is None:
            return self.console.options.update(height=None)
        return self.console.options.update(width=width, height=None)

    def _max_live_rows(self) -> int:
        """Half the screen; at most 4 rows where the size we read may be stale (tmux,
        screen, xterm): a tail drawn for a width the terminal no longer has is erased
        short, so the less of it is live, the less of it can be left twice."""
        rows = max(2, self.console.size.height // 2)
        return rows if self.reflow else min(rows, 4)

    def _render_markdown(self, text: str, width: int | None = None) -> list[Line]:
        """``text`` laid out as ``sessions show`` lays it out: paragraphs, lists and inline
        styles by :func:`chatflow_cli.render.markdown_lines` (Rich's layout, without Rich's
        layout engine: a long paragraph costs a fraction), anything else by Rich's Markdown."""
        laid_out = markdown_lines(text, width or self._options().max_width)
        if laid_out is not None:
            style_of = self._style_of
            return _strip_blank_edges([[Segment(part, style_of(style)) for part, style in line.parts] for line in laid_out])
        if self.code_theme == DEFAULT_CODE_THEME:
            markdown = markdown_renderable(text)  # exactly as ``sessions show`` renders it
        else:
            markdown = markdown_class()(text, code_theme=self.code_theme, hyperlinks=False)
            markdown.parsed = parse_markdown(text)
        return _strip_blank_edges(self.console.render_lines(markdown, self._options(width), pad=False))

    def _style_of(self, style: str) -> Style | None:
        if not style:
            return None
        found = self._parsed_styles.get(style)
        if found is None:
            found = self._parsed_styles[style] = Style.parse(style)
        return found

    def _render_code(self, code_lines: Iterable[str], info: str, *, top: bool, bottom: bool) -> list[Line]:
        code = "\n".join(code_lines)
        if bottom:
            code = code.rstrip()
        syntax = Syntax(
            code,
            info or "text",
            theme=self.code_theme,
            word_wrap=True,
            padding=(1 if top else 0, 1, 1 if bottom else 0, 1),
        )
        return self.console.render_lines(syntax, self._options(), pad=False)

    def _gap(self, block_joined: bool) -> list[Line]:
        return [] if self._blocks_printed == 0 or block_joined else [[]]

    def _commit_ready(self) -> None:
        """Render each complete block once and queue its lines for the scrollback."""
        for block in self._ready:
            if block.kind == "fence":
                code = block.text.split("\n")[1 : -1 if block.closed else None]
                first = self._code_committed == 0
                rendered = self._render_code(code[self._code_committed :], block.info, top=first, bottom=True)
                self._code_committed = 0
            else:
                first = self._rows_committed == 0
                # A block whose top rows are printed already keeps the width they had.
                rendered = self._render_markdown(block.text, None if first else self._pin)[self._rows_committed :]
                self._rows_committed = 0
                self._pin = None
            if first and not self._continued:
                self._out.extend(self._gap(block.joined))
            self._continued = False
            self._out.extend(rendered)
            self._blocks_printed += 1
        self._ready.clear()

    def _trim_paragraph(self, limit: int) -> None:
        """Keep the open paragraph's live text short, so a refresh costs the same however
        long the paragraph grows (one 190 KB paragraph renders as fast as it prints).

        Single line breaks are hard breaks, so the rows of a paragraph's complete lines but
        the last are final: they are printed and dropped from the open block. A line longer
        than the live region is cut at a space where no inline markup is open; the rows of
        the text before the cut but the last are printed (greedy word wrap never changes an
        earlier row), and the words of that last row, checked to render to the same row on
        their own, start the text that stays live. The rest of the paragraph then continues
        those rows (no blank line between them).
        """
        scanner = self._scanner
        budget = max(1, limit) * max(1, self._size[0])
        if scanner._blanks and scanner.kind in ("para", "quote") and len(self._partial) > budget:
            if self._partial[:1].strip():  # a new paragraph after a blank line: the open block is complete
                self._ready.extend(scanner._emit())
                self._commit_ready()
        if scanner.kind not in (None, "para") or scanner._blanks:
            return
        width = self._pin if self._rows_committed else self._size[0]
        if not width or width <= 0 or (self._rows_committed and width > self._size[0]):
            return
        budget = max(1, limit) * width
        if len(scanner.lines) > 1 and (len(scanner.lines) > limit or sum(map(len, scanner.lines)) > budget):
            head = "\n".join(scanner.lines[:-1])
            if settled_markup(head) and not any(SETEXT.match(line) for line in scanner.lines):
                rows = self._render_markdown(head, width)
                if len(rows) >= self._rows_committed:  # else rows of the last line are printed already
                    self._print_continued(rows[self._rows_committed :], width)
                    scanner.lines = scanner.lines[-1:]
        if len(self._partial) > budget:
            self._trim_long_line(width)

    def _print_continued(self, rows: list[Line], width: int) -> None:
        """Print ``rows``, the final top of the open paragraph; what stays live continues them."""
        if rows:
            if self._rows_committed == 0 and not self._continued:
                self._out.extend(self._gap(self._scanner._joined))
            self._out.extend(rows)
        self._rows_committed = 0
        self._pin = None
        self._continued = True

    def _trim_long_line(self, width: int) -> None:
        scanner = self._scanner
        partial = self._partial
        end = len(partial) - width
        for _ in range(4):
            cut = partial.rfind(" ", 0, end)
            if cut <= 0:
                return
            end = cut - width // 2
            head = partial[:cut]
            text = "\n".join([*scanner.lines, head])
            if not settled_markup(text):
                continue
            rows = self._render_markdown(text, width)
            if len(rows) - 1 <= self._rows_committed:
                return
            last = "".join(segment.text for segment in rows[-1]).split()
            words = head.split()
            if not last or len(last) > len(words):
                continue
            carried = " ".join(words[-len(last) :])
            if starts_a_block(carried) or not settled_markup(carried) or re.search(r"[\[\]<>&\\!]", carried):
                continue
            alone = self._render_markdown(carried, width)
            if len(alone) != 1 or "".join(s.text for s in alone[0]).split() != last:
                continue
            self._print_continued(rows[self._rows_committed : -1], width)
            scanner.lines, scanner.kind, scanner._joined = [], None, False
            self._partial = carried + partial[cut:]
            return

    def _tail_lines(self) -> tuple[list[Line], _Keep]:
        """The live tail and what of it is final-able; moves its overflow (beyond half the
        screen) into the scrollback."""
        scanner = self._scanner
        limit = self._max_live_rows()
        status = self._status if not (scanner.lines or self._partial) else None
        lines: list[Line] = []
        keep = _Keep()
        if scanner.kind == "fence" and scanner.fence is not None:
            lines, keep = self._fence_tail(limit)
        elif self._open_table():
            lines = self._table_tail(limit)
        elif scanner.lines or self._partial.strip():
            self._trim_paragraph(limit)
            text = "\n".join([*scanner.lines, self._partial]) if scanner.lines else self._partial
            width = self._pin if self._rows_committed else None
            term_width = self._size[0]
            if width and term_width > 0 and width > term_width:
                limit = max(1, limit // math.ceil(width / term_width))  # rows wrap in the terminal
            rendered = self._render_markdown(text, width)
            if width and width > term_width > 0:
                # The block keeps a width the terminal no longer has: its live rows would wrap
                # into a number of rows that cannot be known for sure, so none is drawn; its
                # complete rows are printed as they become final, the rest when it completes.
                stable = self._render_markdown("\n".join(scanner.lines), width) if scanner.lines else []
                upto = max(self._rows_committed, len(stable) - 1)
                self._out.extend(stable[self._rows_committed : upto])
                self._rows_committed = upto
                rendered = []
            elif len(rendered) - self._rows_committed > limit and scanner.lines:
                # Print the stable top of an over-tall block; keep its last rows live.
                stable = self._render_markdown("\n".join(scanner.lines), width)
                upto = max(self._rows_committed, min(len(stable) - 1, len(rendered) - limit // 2))
                if upto > self._rows_committed:
                    if self._rows_committed == 0 and not self._continued:
                        self._out.extend(self._gap(scanner._joined))
                        self._pin = width or self._size[0]
                    self._out.extend(stable[self._rows_committed : upto])
                    self._rows_committed = upto
            lines = rendered[self._rows_committed :]
            gap = 0
            if self._rows_committed == 0 and not self._continued and self._gap(bool(scanner.lines) and scanner._joined):
                lines, gap = [[], *lines], 1
            if len(lines) > 1 and len(lines) <= limit and not scanner._blanks and settled_markup(text):
                keep = _Keep("md", len(lines) - 1, len(lines) - 1 - gap, width=width or self._size[0])
        if status:
            lines = [*lines, *self.console.render_lines(self._spinner_frame(status), self._options(), pad=False)]
        if len(lines) > limit:
            return lines[-limit:], _Keep()
        return lines, keep

    def _open_table(self) -> bool:
        """Whether the open block holds a table (a line starting with ``|``)."""
        scanner = self._scanner
        if scanner.kind not in (None, "para"):
            return False
        if self._partial.lstrip().startswith("|"):
            return True
        return any(line.lstrip().startswith("|") for line in scanner.lines)

    def _table_tail(self, limit: int) -> list[Line]:
        """A table is laid out from all its rows (a later row can widen every column), so it
        is never printed a row at a time: until its header and delimiter rows are in, a
        status line stands for it (no raw ``| Na`` flashes); while it fits in the live region
        it is redrawn whole at each refresh; taller, a status line counts its rows until it
        is complete and printed once, exactly as ``sessions show`` prints it."""
        scanner = self._scanner
        rows = len(scanner.lines) + (1 if self._partial.strip() else 0)
        gap = 1 if self._rows_committed == 0 and self._gap(scanner._joined) else 0
        if len(scanner.lines) < 2:  # no header and delimiter row yet: not a table, nothing raw to flash
            return self.console.render_lines(self._spinner_frame("receiving a table…"), self._options(), pad=False)
        if rows + 2 + gap <= limit:  # the rule and a row of spacing Rich may add
            text = "\n".join([*scanner.lines, self._partial])
            width = self._pin if self._rows_committed else None
            rendered = self._render_markdown(text, width)[self._rows_committed :]
            if len(rendered) + gap <= limit:
                return [*([[]] * gap), *rendered]
        status = f"receiving a table ({rows} rows)…"
        return self.console.render_lines(self._spinner_frame(status), self._options(), pad=False)

    def _spinner_frame(self, status: str) -> RenderableType:
        """The spinner line for ``status`` at the clock's time: the frame advances between refreshes.

        One :class:`rich.spinner.Spinner` lives as long as the stream (its text is updated), so its
        start time is the first frame's and each refresh shows the frame for the time elapsed
        since (``dots``: one frame per 80 ms).
        """
        if self._spinner is None:
            self._spinner = Spinner("dots", Text(status, style="dim"))
        else:
            self._spinner.update(text=Text(status, style="dim"))
        return self._spinner.render(self.clock())

    def _fence_tail(self, limit: int) -> tuple[list[Line], _Keep]:
        scanner = self._scanner
        assert scanner.fence is not None
        code = scanner.lines[1:]
        info = scanner.fence.info
        first = self._code_committed == 0
        complete = len(code) - self._code_committed
        rendered = self._render_code([*code[self._code_committed :], self._partial], info, top=first, bottom=False)
        if len(rendered) > limit and complete > 1:
            # Print all complete code lines but the last; the rest stays live.
            upto = len(code) - 1
            if first:
                self._out.extend(self._gap(scanner._joined))
            self._out.extend(self._render_code(code[self._code_committed : upto], info, top=first, bottom=False))
            self._code_committed = upto
            first, complete = False, 1
        gap: list[Line] = [[]] if first and self._blocks_printed and not scanner._joined else []
        # The complete lines and the line being written, rendered apart: the complete ones
        # are final and may stay on screen across a resize.
        done = self._render_code(code[self._code_committed :], info, top=first, bottom=False) if complete else []
        live = self._render_code([self._partial], info, top=first and not complete, bottom=False)
        keep = _Keep("fence", len(gap) + len(done), code=len(code)) if complete else _Keep()
        return [*gap, *done, *live], keep

    # ------------------------------------------------------------------ terminal out
    def _rows_of(self, widths: Iterable[int], width: int, *, reflowed: bool) -> int:
        """Rows that lines of ``widths`` cells take at terminal ``width``: a line wider than
        the terminal wraps into several when written, or when a reflowing terminal rewraps
        it; a non-reflowing terminal keeps an old line on one (cut) row."""
        if width <= 0 or not reflowed:
            return sum(1 for _ in widths)
        return sum(max(1, math.ceil(w / width)) for w in widths)

    def _check_resize(self) -> bool:
        """Notice a resize: keep the final-able part of the tail, erase the rest. True while settling."""
        if not self.live:
            return False
        size = self._terminal_size()
        now = self.clock()
        if size != self._size:
            self._size = size
            self._settle_until = now + self.settle
            self._release_tail(size)
            return True
        return now < self._settle_until

    def _release_tail(self, size: tuple[int, int]) -> None:
        drawn = self._drawn
        if not drawn.widths:
            return
        keep = drawn.keep
        if drawn.kind == "md":
            self._rows_committed += drawn.keep_rows
            self._pin = drawn.keep_width
        elif drawn.kind == "fence":
            self._code_committed = drawn.keep_code
        # The rest was drawn at the old width; a reflowing terminal has rewrapped it.
        width, height = size
        # Never more than those rows: erasing too many would remove printed lines.
        rows = self._rows_of(drawn.widths[keep:], width, reflowed=self.reflow)
        rows = min(rows, max(1, height))
        segments: list[Segment] = []
        if rows:
            codes: list[ControlType | tuple[ControlType, int]] = [ControlType.CARRIAGE_RETURN, (ControlType.ERASE_IN_LINE, 2)]
            codes += [(ControlType.CURSOR_UP, 1), (ControlType.ERASE_IN_LINE, 2)] * (rows - 1)
            segments.append(Control(*codes).segment)  # the cursor is where the erased rows began
        elif keep:
            segments.append(Segment.line())  # everything stays: the next output starts below it
        self._drawn = _Drawn()
        if segments:
            self.console.print(Segments(segments), end="", crop=False, soft_wrap=True, highlight=False)

    def _write(self, tail: list[Line], keep: _Keep) -> None:
        console = self.console
        width, height = self._size if self.live else self._terminal_size()
        fill_ok = console.is_terminal and console.color_system is not None
        segments: list[Segment] = []
        rows = self._rows_of(self._drawn.widths, width, reflowed=True)
        if rows:
            codes: list[ControlType | tuple[ControlType, int]] = [ControlType.CARRIAGE_RETURN, (ControlType.ERASE_IN_LINE, 2)]
            codes += [(ControlType.CURSOR_UP, 1), (ControlType.ERASE_IN_LINE, 2)] * (rows - 1)
            segments.append(Control(*codes).segment)
        newline = Segment.line()
        for line in self._out:
            segments.extend(fill_segments(line, width, fill_ok, self._styles))
            segments.append(newline)
        self._out = []
        widths = []
        for index, line in enumerate(tail):
            if index:
                segments.append(newline)
            drawn = fill_segments(line, width, fill_ok, self._styles)
            widths.append(Segment.get_line_length(drawn))
            segments.extend(drawn)
        self._drawn = _Drawn(widths, width, height, keep.kind, keep.keep, keep.rows, keep.code, keep.width)
        if tail and not self._cursor_hidden:
            console.show_cursor(False)
            self._cursor_hidden = True
        if segments:
            console.print(Segments(segments), end="", crop=False, soft_wrap=True, highlight=False)
