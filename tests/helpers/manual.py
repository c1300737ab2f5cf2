"""The manual as tests read it: README.md and the pages of docs/."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"


def pages() -> list[Path]:
    """README.md, then every Markdown page of the manual in name order."""
    return [README, *sorted(DOCS.glob("*.md"))]


def text() -> str:
    """README.md and every page of the manual, one after another."""
    return "\n\n".join(page.read_text(encoding="utf-8") for page in pages())


def page(name: str) -> str:
    """One page of docs/ (``"library.md"``)."""
    return (DOCS / name).read_text(encoding="utf-8")
