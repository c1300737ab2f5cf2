"""The manual as tests read it: README.md and the pages of docs/ (its subfolders too), and
the fenced code blocks of a page as CommonMark finds them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
#: folders under docs/ that hold generated output, not pages
GENERATED = {"build", "site"}


def doc_pages() -> list[Path]:
    """Every Markdown page under docs/, subfolders included, in path order."""
    return sorted(p for p in DOCS.rglob("*.md") if not GENERATED & set(p.relative_to(DOCS).parts[:-1]))


def pages() -> list[Path]:
    """README.md, then every Markdown page of the manual in path order."""
    return [README, *doc_pages()]


def name(path: Path) -> str:
    """A page's name: ``README.md``, or its path under docs/ (``library.md``, ``ops/fleet.md``)."""
    return path.name if path == README else path.relative_to(DOCS).as_posix()


def text() -> str:
    """README.md and every page of the manual, one after another."""
    return "\n\n".join(page.read_text(encoding="utf-8") for page in pages())


def page(name: str) -> str:
    """One page of docs/ (``"library.md"``)."""
    return (DOCS / name).read_text(encoding="utf-8")


OPENING = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}(?=[^`\n]*$)|~{3,})[ \t]*(?P<info>.*?)[ \t]*$")
MARKER = re.compile(r"^[ \t]*<!-- example: .*-->[ \t]*$")


@dataclass
class Fence:
    """A fenced code block: the line of its opening fence (1-based), the fence's indent, the
    info string's first word (its language, ``""`` when none), its body as written, and the
    ``<!-- example: ... -->`` lines right before it."""

    line: int
    indent: str
    lang: str
    body: str
    marks: list[str]


def fences(text: str) -> list[Fence]:
    """The fenced code blocks of a Markdown text, as CommonMark reads them: an opening fence of
    three or more backticks or tildes (indented or not; a backtick fence's info string holds
    no backtick), closed by a line of the same character at least as long (and nothing else),
    or by the end of the text."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = OPENING.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening.group("fence")
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), len(lines))
        marks, k = [], i
        while k > 0 and MARKER.match(lines[k - 1]):
            k -= 1
            marks.insert(0, lines[k].strip())
        info = opening.group("info").split()
        found.append(Fence(i + 1, opening.group("indent"), info[0] if info else "",
                           "".join(ln + "\n" for ln in lines[i + 1:end]), marks))
        i = end + 1
    return found
