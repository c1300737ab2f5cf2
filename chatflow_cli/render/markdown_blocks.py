"""Markdown split into blocks as it streams in, line by line: :class:`BlockScanner`.

A small line-based scanner, close enough to CommonMark for display, tells when a block
(paragraph, list item, heading, block quote, table, fenced or indented code) is complete:
when a later block has started, or a fenced code block's closing fence arrives.
:func:`settled_markup` and :func:`starts_a_block` say whether text already seen can still
change how it is laid out. :class:`~chatflow_cli.render.markdown_stream.MarkdownStream`
uses them to print complete blocks once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SETEXT", "Block", "BlockScanner", "settled_markup", "starts_a_block"]

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_ATX = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")
_HR = re.compile(r"^ {0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,})$")
SETEXT = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")
_LIST = re.compile(r"^(?P<indent> {0,3})(?P<marker>[-*+]|(?P<num>\d{1,9})[.)])(?P<space>[ \t]+|$)")
_QUOTE = re.compile(r"^ {0,3}>")


def _indent_of(line: str) -> int:
    width = 0
    for char in line:
        if char == " ":
            width += 1
        elif char == "\t":
            width += 4 - width % 4
        else:
            break
    return width


@dataclass
class Block:
    """A complete block: its Markdown ``text``, ``kind`` and whether it continues the previous one."""

    kind: str  # para, list, quote, icode, heading, hr, fence
    text: str
    joined: bool = False  # a sibling list item: no blank line before it
    info: str = ""  # fence info string (language)
    closed: bool = False  # a fence whose closing line is the block's last line


@dataclass
class _Fence:
    char: str
    length: int
    info: str


class BlockScanner:
    """Splits complete lines into Markdown blocks; close enough to CommonMark for display.

    :meth:`push_line` takes one complete line (no newline) and returns the blocks it
    completed. ``lines`` and ``kind`` describe the open block.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.kind: str | None = None
        self.fence: _Fence | None = None  # open top-level fence
        self._nested_fence: _Fence | None = None  # a fence inside a list item
        self._blanks = 0
        self._content_indent = 0  # list item content column
        self._marker_family = ""
        self._joined = False

    # -- helpers
    def _emit(self, *, closed: bool = False) -> list[Block]:
        if not self.lines:
            return []
        info = self.fence.info if self.fence else ""
        block = Block(self.kind or "para", "\n".join(self.lines), self._joined, info, closed)
        self.lines, self.kind, self.fence, self._nested_fence = [], None, None, None
        self._blanks, self._joined = 0, False
        return [block]

    @staticmethod
    def _opens_fence(line: str) -> _Fence | None:
        match = _FENCE.match(line)
        if match is None:
            return None
        fence = match.group("fence")
        info = match.group("info").strip()
        if fence[0] == "`" and "`" in info:
            return None
        return _Fence(fence[0], len(fence), info.split(" ")[0] if info else "")

    @staticmethod
    def _closes(fence: _Fence, line: str, *, nested: bool = False) -> bool:
        stripped = line.strip()
        return (
            len(stripped) >= fence.length
            and set(stripped) == {fence.char}
            and (nested or _indent_of(line) <= 3)  # a fence in a list item closes indented
        )

    def _start(self, line: str, *, joined: bool = False) -> list[Block]:
        """Open a block with ``line``; headings and rules complete at once."""
        indent = _indent_of(line)
        self._joined = joined
        fence = self._opens_fence(line) if indent <= 3 else None
        if fence is not None:
            self.kind, self.fence, self.lines = "fence", fence, [line]
            return []
        if _ATX.match(line):
            self.kind, self.lines = "heading", [line]
            return self._emit()
        if _HR.match(line):
            self.kind, self.lines = "hr", [line]
            return self._emit()
        item = _LIST.match(line)
        if item is not None:
            self.kind, self.lines = "list", [line]
            self._set_item(item)
            return []
        if _QUOTE.match(line):
            self.kind, self.lines = "quote", [line]
            return []
        self.kind, self.lines = ("icode" if indent >= 4 else "para"), [line]
        return []

    def _set_item(self, item: re.Match[str]) -> None:
        space = item.group("space")
        marker_end = len(item.group("indent")) + len(item.group("marker"))
        gap = len(space.expandtabs(4)) if space else 1
        self._content_indent = marker_end + (gap if 1 <= gap <= 4 else 1)
        marker = item.group("marker")
        self._marker_family = marker[-1] if item.group("num") else marker

    def _sibling_item(self, line: str) -> re.Match[str] | None:
        item = _LIST.match(line)
        if item is None or _indent_of(line) >= self._content_indent or _HR.match(line):
            return None
        return item

    # -- the scanner
    def push_line(self, line: str) -> list[Block]:
        if self.fence is not None:
            self.lines.append(line)
            return self._emit(closed=True) if len(self.lines) > 1 and self._closes(self.fence, line) else []
        if self._nested_fence is not None:
            self.lines.append(line)
            if self._closes(self._nested_fence, line, nested=True):
                self._nested_fence = None
            return []
        if not line.strip():
            if self.lines:
                self._blanks += 1
            return []
        if not self.lines:
            return self._start(line)
        indent = _indent_of(line)
        if self._blanks:
            blanks, self._blanks = self._blanks, 0
            continues = (self.kind == "list" and indent >= self._content_indent) or (
                self.kind == "icode" and indent >= 4
            )
            if continues:
                self.lines.extend([""] * blanks)
                self.lines.append(line)
                if self.kind == "list":
                    self._nested_fence = self._opens_fence(line)
                return []
            item = self._sibling_item(line) if self.kind == "list" else None
            same_list = item is not None and self._family(item) == self._marker_family
            return self._emit() + self._start(line, joined=same_list)
        # no blank line before this one
        kind = self.kind
        nested = kind == "list" and indent >= self._content_indent
        if nested:
            self.lines.append(line)
            self._nested_fence = self._opens_fence(line)
            return []
        if indent <= 3 and self._opens_fence(line) is not None:
            return self._emit() + self._start(line)
        if _ATX.match(line):
            return self._emit() + self._start(line)
        if kind == "para" and SETEXT.match(line):
            self.lines.append(line)
            self.kind = "heading"
            return self._emit()
        if _HR.match(line):
            return self._emit() + self._start(line)
        item = _LIST.match(line)
        if item is not None:
            if kind == "list":
                same = self._family(item) == self._marker_family
                return self._emit() + self._start(line, joined=same)
            if kind == "para" and item.group("num") not in (None, "1"):
                self.lines.append(line)  # "2." cannot interrupt a paragraph
                return []
            return self._emit() + self._start(line)
        if _QUOTE.match(line):
            if kind == "quote":
                self.lines.append(line)
                return []
            return self._emit() + self._start(line)
        if kind == "icode" and indent < 4:
            return self._emit() + self._start(line)
        self.lines.append(line)  # paragraph text, or a lazy continuation line
        return []

    @staticmethod
    def _family(item: re.Match[str]) -> str:
        marker = item.group("marker")
        return marker[-1] if item.group("num") else marker

    def close(self) -> list[Block]:
        """End of text: the open block is complete (an unclosed fence too)."""
        return self._emit()


_EMPHASIS = re.compile(r"(?<![\w*])\*(?!\*)|(?<!\*)\*(?![\w*])|(?<!\w)_(?!_)|(?<!_)_(?!\w)")


def settled_markup(text: str) -> bool:
    """True when no inline span (code, emphasis) is open in ``text`` and it is not a table:
    later text cannot then change how its earlier rows are laid out."""
    if text.count("`") % 2 or text.count("**") % 2 or text.count("__") % 2:
        return False
    if len(_EMPHASIS.findall(text.replace("**", "").replace("__", ""))) % 2:
        return False
    return not any(line.lstrip().startswith("|") for line in text.split("\n"))


def starts_a_block(line: str) -> bool:
    """Whether ``line`` would open a block other than a paragraph (a list item, heading,
    quote, rule, fence, table row, HTML) if it began a line."""
    return bool(
        _LIST.match(line) or _ATX.match(line) or _QUOTE.match(line) or _HR.match(line) or SETEXT.match(line)
        or _FENCE.match(line) or line.lstrip().startswith(("|", "<"))
    )
