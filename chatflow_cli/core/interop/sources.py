"""Read a file to import in any supported format, detecting the format when none is given."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO

from ..errors import ImportFormatError, UsageError
from .chatflow_format import read_chatflow
from .claude_code import looks_like_claude_code, read_claude_code
from .llm_logs import is_sqlite_file, read_llm_logs
from .markdown import read_markdown
from .openai_chat import read_openai
from .records import IMPORT_FORMATS, ImportedSession

__all__ = ["detect_format", "read_source"]


def detect_format(text: str) -> str | None:
    """The format of a text file to import, from its first non-empty line; None when unclear.

    ``---`` starts a Markdown transcript (front matter); a JSON object with ``"format":
    "chatflow"`` is chatflow's export; one with a ``messages`` list is the ``openai`` form;
    one with Claude Code's fields (``parentUuid``, ``sessionId``, a ``summary`` line) is a
    Claude Code session.
    """
    for line in text.split("\n"):
        if not line.strip():
            continue
        if line.strip() == "---":
            return "md"
        try:
            first = json.loads(line)
        except json.JSONDecodeError:
            return None
        if not isinstance(first, dict):
            return None
        if first.get("format") == "chatflow":
            return "chatflow"
        if isinstance(first.get("messages"), list):
            return "openai"
        if looks_like_claude_code(first):
            return "claude-code"
        return None
    return None


def _is_json_export(text: str) -> bool:
    """Whether ``text`` is what ``sessions export --format json`` (``sessions show --json``)
    writes: ``{"session": {...}, "turns": [...]}``, or an array of them."""
    head = text.lstrip()[:1]
    if head not in ("{", "["):
        return False
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return False
    items = data if isinstance(data, list) else [data]
    return bool(items) and all(isinstance(d, dict) and isinstance(d.get("session"), dict)
                               and isinstance(d.get("turns"), list) and "format" not in d for d in items)


def _read_text(path: str, stdin: IO[bytes] | None) -> str:
    try:
        if path == "-":
            data = (stdin or sys.stdin.buffer).read()
        else:
            data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"cannot import {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"cannot import {path}: it is a directory") from None
    except OSError as exc:
        raise UsageError(f"cannot import {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ImportFormatError(f"{path}: line {line}: not UTF-8 text", source=path, location=f"line {line}") from None


def read_source(path: str, fmt: str | None = None, *, stdin: IO[bytes] | None = None) -> tuple[str, list[ImportedSession]]:
    """``(format, sessions)`` read from ``path`` (``-``: stdin) in format ``fmt`` or the detected one.

    Raises:
        UsageError: an unknown format, a missing or unreadable file, an empty one, an
            ``llm`` import from stdin (a database is read in place), a ``json`` export (the
            shape ``sessions show --json`` prints, for reading: it does not import back), or
            a format that cannot be detected.
        ImportFormatError: the file is not what its format says (naming the line or row).
    """
    if fmt is not None and fmt not in IMPORT_FORMATS:
        raise UsageError(f"unknown import format {fmt!r}: one of {', '.join(IMPORT_FORMATS)}")
    if fmt == "llm" or (fmt is None and path != "-" and is_sqlite_file(path)):
        if path == "-":
            raise UsageError("an llm logs.db is read in place: give its path, not -")
        if not Path(path).exists():
            raise UsageError(f"cannot import {path}: no such file")
        return "llm", read_llm_logs(path)
    text = _read_text(path, stdin)
    if not text.strip():
        raise UsageError(f"{path} is empty: nothing to import")
    if fmt is None:
        fmt = detect_format(text)
        if fmt is None and _is_json_export(text):
            raise UsageError(f"{path} is a json export (sessions show --json): it does not import back; "
                             "export with --format chatflow (or md, openai)")
        if fmt is None:
            raise UsageError(f"cannot tell the format of {path}: give --from ({', '.join(IMPORT_FORMATS)})")
    lines = text.split("\n")  # not splitlines(): U+2028 and friends may stand inside JSON strings
    if fmt == "chatflow":
        return fmt, read_chatflow(lines, source=path)
    if fmt == "md":
        return fmt, read_markdown(text, source=path)
    if fmt == "openai":
        return fmt, read_openai(lines, source=path)
    return fmt, read_claude_code(lines, source=path)
