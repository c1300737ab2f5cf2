"""A small VT100 screen for tests: what a person would see on screen and in the scrollback.

It implements what Rich and prompt-toolkit emit: printable text (wide characters take two
cells), ``\\n`` (with the tty's implicit carriage return), ``\\r``, backspace, CSI cursor
moves (A B C D G H), erase in line/display (K, J), and ignores SGR, modes and OSC strings.
Like a real terminal, the cursor cannot move above the top row of the *screen*: what has
scrolled into the scrollback can no longer be erased. Lines that fill the last column wrap
lazily (pending wrap). :meth:`Terminal.resize` reflows soft-wrapped lines as VTE, kitty
and iTerm2 do.
"""

from __future__ import annotations

import re

from rich.cells import get_character_cell_size

_CSI = re.compile(r"\x1b\[([0-9;?<=>]*)([ -/]*)([@-~])")
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


class Terminal:
    def __init__(self, width: int = 80, height: int = 24) -> None:
        self.width = width
        self.height = height
        self.rows: list[list[str | None]] = [[None] * width]
        self.wrapped: list[bool] = [False]  # row continues on the next row (soft wrap)
        self.top = 0  # index of the screen's first row; rows above it are scrollback
        self.row = 0
        self.col = 0
        self._pending_wrap = False

    # -------------------------------------------------------------- output
    def feed(self, data: str) -> None:
        i, n = 0, len(data)
        while i < n:
            ch = data[i]
            if ch == "\x1b":
                m = _CSI.match(data, i)
                if m:
                    self._csi(m.group(1), m.group(3))
                    i = m.end()
                    continue
                m = _OSC.match(data, i)
                if m:
                    i = m.end()
                    continue
                i += 2  # ESC + one byte (charset selection and the like)
                continue
            if ch == "\n":
                self._linefeed()
                self.col = 0
            elif ch == "\r":
                self.col = 0
                self._pending_wrap = False
            elif ch == "\b":
                self.col = max(0, self.col - 1)
                self._pending_wrap = False
            elif ch == "\x07" or ord(ch) < 0x20:
                pass
            else:
                self._put(ch)
            i += 1

    def _ensure(self, row: int) -> None:
        while len(self.rows) <= row:
            self.rows.append([None] * self.width)
            self.wrapped.append(False)

    def _linefeed(self) -> None:
        self._pending_wrap = False
        if self.row == self.top + self.height - 1:
            self.top += 1
        self.row += 1
        self._ensure(self.row)

    def _put(self, ch: str) -> None:
        size = get_character_cell_size(ch)
        if size == 0:
            return
        if self._pending_wrap or self.col + size > self.width:
            self.wrapped[self.row] = True
            self._linefeed()
            self.col = 0
        self._ensure(self.row)
        line = self.rows[self.row]
        line[self.col] = ch
        if size == 2 and self.col + 1 < self.width:
            line[self.col + 1] = ""
        self.col += size
        if self.col >= self.width:
            self.col = self.width - 1
            self._pending_wrap = True

    def _csi(self, params: str, final: str) -> None:
        if params.startswith("?") or final == "m":
            return
        args = [int(p) if p else 0 for p in params.split(";")] if params else []
        first = args[0] if args else 0
        self._pending_wrap = False
        if final == "A":
            self.row = max(self.top, self.row - max(1, first))
        elif final == "B":
            self.row = min(self.top + self.height - 1, self.row + max(1, first))
            self._ensure(self.row)
        elif final == "C":
            self.col = min(self.width - 1, self.col + max(1, first))
        elif final == "D":
            self.col = max(0, self.col - max(1, first))
        elif final == "G":
            self.col = min(self.width - 1, max(1, first) - 1)
        elif final in "Hf":
            row = (args[0] if args else 1) or 1
            col = (args[1] if len(args) > 1 else 1) or 1
            self.row = self.top + min(self.height, row) - 1
            self.col = min(self.width, col) - 1
            self._ensure(self.row)
        elif final == "K":
            line = self.rows[self.row]
            if first == 0:
                span = range(self.col, self.width)
            elif first == 1:
                span = range(self.col + 1)
            else:
                span = range(self.width)
            for c in span:
                line[c] = None
            if first != 1:
                self.wrapped[self.row] = False
        elif final == "J":
            if first == 0:
                self._csi("0", "K")
                for r in range(self.row + 1, min(len(self.rows), self.top + self.height)):
                    self.rows[r] = [None] * self.width
                    self.wrapped[r] = False
            elif first == 2:
                for r in range(self.top, min(len(self.rows), self.top + self.height)):
                    self.rows[r] = [None] * self.width
                    self.wrapped[r] = False

    # -------------------------------------------------------------- resize
    def resize(self, width: int, height: int) -> None:
        """Reflow to ``width`` and keep the cursor's line on screen (as VTE does)."""
        logical: list[list[str | None]] = []
        cursor_line = cursor_offset = 0
        current: list[str | None] = []
        for index, row in enumerate(self.rows):
            if index == self.row:
                cursor_line, cursor_offset = len(logical), len(current) + self.col
            cells = row if self.wrapped[index] else _trim(row)
            current.extend(cells)
            if not self.wrapped[index]:
                logical.append(current)
                current = []
        if current:
            logical.append(current)
        self.width, self.height = width, height
        self.rows, self.wrapped = [], []
        for number, cells in enumerate(logical):
            pieces = [cells[i : i + width] for i in range(0, len(cells), width)] or [[]]
            if number == cursor_line:
                row_in = min(cursor_offset // width, len(pieces) - 1) if width else 0
                self.row = len(self.rows) + row_in
                self.col = min(cursor_offset - row_in * width, width - 1)
            for k, piece in enumerate(pieces):
                self.rows.append(list(piece) + [None] * (width - len(piece)))
                self.wrapped.append(k < len(pieces) - 1)
        self._ensure(self.row)
        self.top = max(0, self.row - height + 1)
        self._pending_wrap = False

    # -------------------------------------------------------------- reading
    def lines(self) -> list[str]:
        """Scrollback and screen, one string per row, trailing blanks removed."""
        out = ["".join(c if c is not None else " " for c in row).rstrip() for row in self.rows]
        while out and not out[-1]:
            out.pop()
        return out

    def logical_lines(self) -> list[str]:
        """Like :meth:`lines`, with soft-wrapped rows joined."""
        out: list[str] = []
        current = ""
        for row, wrapped in zip(self.rows, self.wrapped):
            text = "".join(c if c is not None else " " for c in row)
            if wrapped:
                current += text
            else:
                out.append((current + text).rstrip())
                current = ""
        if current:
            out.append(current.rstrip())
        while out and not out[-1]:
            out.pop()
        return out

    def screen(self) -> list[str]:
        return self.lines()[self.top : self.top + self.height]


def _trim(row: list[str | None]) -> list[str | None]:
    end = len(row)
    while end and row[end - 1] is None:
        end -= 1
    return row[:end]


def written_rows(term: Terminal) -> list[list[str | None]]:
    """Each row's cells up to the last one anything was written to (None: never written)."""
    rows = []
    for row in term.rows:
        end = len(row)
        while end and row[end - 1] is None:
            end -= 1
        rows.append(row[:end])
    return rows
