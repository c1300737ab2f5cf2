"""Memory documents: the path rule, the size limit, the records a memory store returns, and
the edits the memory tools make.

A memory store holds documents: a path (``customers/acme.md``) and its text. Paths are
relative and confined to the store (:func:`check_path`): segments of any characters but
``/``, ``\\``, control, invisible and space-like characters (spaces other than U+0020, and
U+0020 at a segment's start or end), none empty, ``.`` or ``..``, no
leading ``/``, at most :data:`MAX_PATH_CHARS` characters, normalized to Unicode NFC. A
folder is a path prefix: ``customers`` holds ``customers/acme.md``; folders are not stored,
they exist while a document is under them. A path is a document or a folder, never both:
the store refuses a write that would put a document at a folder's path or under a
document's path (:func:`parent_folders`).

A document's text is at most :data:`MAX_DOCUMENT_BYTES` bytes of UTF-8 and holds no NUL
(PostgreSQL text cannot); the stores return it byte for byte.

Every write gives the store's next ``seq`` (1, 2, 3... per store, gap-free, allocated in the
write's transaction, as the event log's ``seq``) and is kept as a :class:`DocumentVersion`:
what the document held after the write, who wrote it (:class:`Author`) and when. A
document's ``version`` is the ``seq`` of its last write.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import DocumentTooLargeError, MemoryConflictError, UsageError

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_PATH_CHARS",
    "Author",
    "Document",
    "DocumentInfo",
    "DocumentVersion",
    "MemoryHit",
    "MemoryStoreInfo",
    "VersionOp",
    "check_folder",
    "check_path",
    "check_text",
    "insert_lines",
    "numbered",
    "parent_folders",
    "replace_passage",
]

#: Largest document text, in bytes of UTF-8 (about 25,000 words): a memory is read into the
#: model's context whole, so a larger one would crowd out the conversation.
MAX_DOCUMENT_BYTES = 100_000
#: Longest document path, in characters.
MAX_PATH_CHARS = 512

#: What a write did: ``create`` (a new document), ``write`` (its whole text replaced),
#: ``str_replace``, ``insert``, ``delete``, ``rename`` (``previous_path`` names the old path),
#: ``revert`` (``reverts`` names the write undone), ``import``.
VersionOp = Literal["create", "write", "str_replace", "insert", "delete", "rename", "revert", "import"]


def _shown(path: object) -> str:
    text = repr(path)
    return text if len(text) <= 80 else text[:77] + "..."


#: Unicode categories a path may not hold: controls (Cc), format characters such as the
#: bidi overrides U+202E and zero-width joiners (Cf), surrogates (Cs), private use (Co),
#: unassigned code points (Cn), and line and paragraph separators (Zl, Zp). Any of them
#: makes a path that looks like another, or that no one can type.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})

#: Characters of other categories that show nothing, or nothing but a blank: Unicode's
#: default-ignorable code points (the combining grapheme joiner U+034F, the Hangul fillers
#: U+115F, U+1160, U+3164, U+FFA0, the Khmer inherent vowels, the Mongolian variation
#: selectors and vowel separator, the variation selectors U+FE00-U+FE0F and
#: U+E0100-U+E01EF, the musical formatting characters, the tag characters), and the
#: Braille blank U+2800. Spaces other than U+0020 (category Zs) are refused too.
_INVISIBLE_RANGES = (
    (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2800, 0x2800),
    (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def _invisible(code: int) -> bool:
    return any(low <= code <= high for low, high in _INVISIBLE_RANGES)


#: Slashes that have no compatibility form of their own but look like ``/``.
_SLASH_LOOKALIKES = frozenset("\u2044\u2215\u2571\u29f8\u1735")


def _looks_like_separator(ch: str) -> bool:
    """A character other than ``/``, ``.`` and ``\\`` that reads as one of them: its
    compatibility form holds one (fullwidth ``／`` and ``．``, the one-dot leader ``․``, the
    ellipsis) or it is a slash look-alike (the division and fraction slashes)."""
    if ch in "/.\\" or ord(ch) < 0x80:
        return False
    return ch in _SLASH_LOOKALIKES or any(c in "/.\\" for c in unicodedata.normalize("NFKC", ch))


def _code_point(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}{' ' + name if name else ''}"


def _refused_char(path: str) -> str | None:
    for ch in path:
        if ch == "\\":
            return "a backslash"
        category = unicodedata.category(ch)
        if category in _REFUSED_CATEGORIES:
            kind = "a control character" if category == "Cc" else (
                "an invisible format character" if category == "Cf" else "a character not allowed in a path")
            return f"{kind} ({_code_point(ch)})"
        if category == "Zs" and ch != " ":
            return f"a space other than U+0020 ({_code_point(ch)}), which looks like another or like none"
        if _invisible(ord(ch)):
            return f"an invisible character ({_code_point(ch)})"
        if _looks_like_separator(ch):
            return f"a look-alike of a slash or a dot ({_code_point(ch)}), which makes a path look like another"
    for segment in path.split("/"):
        if segment != segment.strip(" "):
            return "a name that begins or ends with a space (U+0020 SPACE), which no one sees"
        if segment and unicodedata.category(segment[0]).startswith("M"):
            return f"a name that begins with a combining mark ({_code_point(segment[0])}), which joins what is before it"
    return None


def check_path(path: object) -> str:
    """Return ``path``, NFC-normalized, when it names a document inside a store; a leading
    ``./`` is not accepted.

    Every path that enters a store goes through here (the memory tools, ``chatflow memory``,
    an import, the library), so ``café`` typed with a composed ``é`` or with ``e`` and a
    combining accent is one document; callers use the path this returns.

    Raises:
        UsageError: (exit 2) not a str, empty, absolute, with a ``..``, ``.`` or empty
            segment, a backslash, a control, format (U+202E and the rest of category Cf),
            surrogate, private-use, unassigned or line/paragraph-separator character, a
            space other than U+0020 (category Zs), another invisible character (a Hangul
            filler, U+034F, a variation selector, the Braille blank U+2800...), a segment
            beginning or ending with a space or beginning with a combining mark, a
            look-alike of ``/`` or ``.`` (fullwidth forms, the division slash, the one-dot
            leader), or over :data:`MAX_PATH_CHARS` characters.
    """
    if not isinstance(path, str) or not path:
        raise UsageError(f"memory path {_shown(path)} is empty: give a path such as customers/acme.md")
    bad = _refused_char(path)
    if bad is not None:
        raise UsageError(f"memory path {_shown(path)} holds {bad}: paths are visible, printable text")
    path = unicodedata.normalize("NFC", path)
    if len(path) > MAX_PATH_CHARS:
        raise UsageError(f"memory path {_shown(path)} is longer than {MAX_PATH_CHARS} characters")
    if path.startswith("/"):
        raise UsageError(f"memory path {_shown(path)} is absolute: paths are relative to the store (customers/acme.md)")
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise UsageError(
                f"memory path {_shown(path)} is outside the store or not canonical: no '..', '.' or empty segment")
    return path


def parent_folders(path: str) -> list[str]:
    """The folders ``path`` is under, outermost first: ``a/b/c.md`` -> ``["a", "a/b"]``."""
    parts = path.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts))]


def check_folder(folder: object) -> str:
    """A folder to list: ``""`` (or ``"/"``, ``"."``) is the whole store; otherwise a
    :func:`check_path` path, a trailing ``/`` allowed. Returns the folder without its
    trailing ``/`` (``""`` for the whole store). Raises :class:`UsageError` as :func:`check_path`."""
    if folder is None or folder in ("", "/", "."):
        return ""
    if isinstance(folder, str) and folder.endswith("/") and not folder.endswith("//"):
        folder = folder[:-1]
    return check_path(folder)


def check_text(text: object, path: str = "") -> str:
    """Return ``text`` when a document may hold it.

    Raises:
        UsageError: (exit 2) not a str, a NUL, or a lone surrogate (not UTF-8).
        DocumentTooLargeError: (exit 2) over :data:`MAX_DOCUMENT_BYTES` bytes of UTF-8.
    """
    if not isinstance(text, str):
        raise UsageError(f"a memory document's text must be a str, got {type(text).__name__}")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise UsageError(f"memory document {path!r}: the text is not valid Unicode (a lone surrogate)") from None
    if size > MAX_DOCUMENT_BYTES:
        raise DocumentTooLargeError(
            f"memory document {path!r} would be {size:,} bytes, over the limit of {MAX_DOCUMENT_BYTES:,}: "
            "split it into several documents",
            size=size, limit=MAX_DOCUMENT_BYTES)
    if "\x00" in text:
        raise UsageError(f"memory document {path!r}: the text holds a NUL character")
    return text


@dataclass(frozen=True, slots=True)
class Author:
    """Who made a write: the ``session_id``, its ``turn`` and the ``agent`` that ran it (all
    None for a person's write through ``chatflow memory`` or the library outside a turn)."""

    session_id: str | None = None
    turn: int | None = None
    agent: str | None = None

    def describe(self) -> str:
        """``session s1 turn 3 (Orders)``, or ``outside a session``."""
        if self.session_id is None:
            return "outside a session"
        out = f"session {self.session_id}"
        if self.turn is not None:
            out += f" turn {self.turn}"
        return out + (f" ({self.agent})" if self.agent else "")


@dataclass(frozen=True, slots=True)
class MemoryStoreInfo:
    """A memory store: its ``name``, ``description``, ``created_at`` (UTC epoch seconds),
    ``last_seq`` (the seq of its last write, 0 before any), ``documents`` (how many it holds
    now) and ``size_bytes`` (their text, UTF-8)."""

    name: str
    description: str = ""
    created_at: float = 0.0
    last_seq: int = 0
    documents: int = 0
    size_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "created_at": self.created_at,
                "last_seq": self.last_seq, "documents": self.documents, "size_bytes": self.size_bytes}


@dataclass(frozen=True, slots=True)
class DocumentInfo:
    """A document of a listing: ``path``, ``size_bytes`` (UTF-8), ``version`` (the seq of its
    last write) and ``updated_at`` (UTC epoch seconds)."""

    path: str
    size_bytes: int
    version: int
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size_bytes": self.size_bytes, "version": self.version,
                "updated_at": self.updated_at}


@dataclass(frozen=True, slots=True)
class Document:
    """A document as stored now: ``store``, ``path``, ``text``, ``version`` (the seq of its
    last write), ``updated_at`` (UTC epoch seconds)."""

    store: str
    path: str
    text: str
    version: int
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "path": self.path, "text": self.text, "version": self.version,
                "updated_at": self.updated_at}


@dataclass(frozen=True, slots=True)
class DocumentVersion:
    """One write of a memory store, in its history.

    ``seq``: the store's write number (gap-free). ``path``: the document written; ``text``:
    what it held after the write (None: deleted). ``op``: :data:`VersionOp`.
    ``previous_path``: a rename's old path. ``reverts``: the seq a revert undid.
    ``author``: who wrote it. ``created_at``: UTC epoch seconds.
    """

    store: str
    seq: int
    path: str
    op: VersionOp
    text: str | None
    author: Author = field(default_factory=Author)
    created_at: float = 0.0
    previous_path: str | None = None
    reverts: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "seq": self.seq, "path": self.path, "op": self.op, "text": self.text,
                "session_id": self.author.session_id, "turn": self.author.turn, "agent": self.author.agent,
                "created_at": self.created_at, "previous_path": self.previous_path, "reverts": self.reverts}


@dataclass(frozen=True, slots=True)
class MemoryHit:
    """A document that matched a memory search: ``store``, ``path``, ``snippet`` (the
    session search's marks around matched words), ``rank`` (lower is better), ``version``,
    ``updated_at``."""

    store: str
    path: str
    snippet: str
    rank: float
    version: int
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        snippet = self.snippet.replace("\x02", "[").replace("\x03", "]")  # the search's highlight marks
        return {"store": self.store, "path": self.path, "snippet": snippet, "rank": self.rank,
                "version": self.version, "updated_at": self.updated_at}


def replace_passage(text: str, old: str, new: str, *, path: str = "", version: int | None = None) -> str:
    """``text`` with the one occurrence of ``old`` replaced by ``new``.

    Raises:
        MemoryConflictError: ``old`` is empty, absent (another write changed it first) or
            there more than once (the edit must say which: give more of the passage).
    """
    if not old:
        raise MemoryConflictError("the passage to replace is empty", current_version=version)
    count = text.count(old)
    if count == 0:
        raise MemoryConflictError(
            f"the passage to replace is not in {path!r} (now at version {version}): it may have been changed "
            "by another write; view the document again", current_version=version)
    if count > 1:
        raise MemoryConflictError(
            f"the passage to replace is in {path!r} {count} times: give more of it so that it is there once",
            current_version=version)
    return text.replace(old, new, 1)


def insert_lines(text: str, line: int, insert: str, *, path: str = "") -> str:
    """``text`` with ``insert`` put after line ``line`` (0: before the first line).

    Raises:
        UsageError: ``line`` outside 0..the number of lines.
    """
    lines = text.splitlines(keepends=True)
    if isinstance(line, bool) or not isinstance(line, int) or not 0 <= line <= len(lines):
        raise UsageError(f"line {line!r} is outside {path!r}, which has {len(lines)} "
                         f"line{'' if len(lines) == 1 else 's'} (0 inserts at the top)")
    if line and not lines[line - 1].endswith(("\n", "\r")):
        lines[line - 1] += "\n"
    if not insert.endswith("\n") and line < len(lines):
        insert += "\n"
    return "".join(lines[:line]) + insert + "".join(lines[line:])


def numbered(text: str, first: int = 1, last: int | None = None) -> str:
    """Lines ``first``..``last`` of ``text`` (1-based, inclusive), each after its number and a tab."""
    lines = text.splitlines()
    last = len(lines) if last is None or last < 0 else min(last, len(lines))
    return "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(max(1, first), last + 1))
