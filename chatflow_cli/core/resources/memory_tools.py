"""The tools an agent gets while memory stores are mounted on its session.

=====================  =================================================================  ============
tool                   what it does                                                       mounts
=====================  =================================================================  ============
``memory_view``        a document with numbered lines (or lines ``view_range``), or the   any
                       documents of a folder (``""``: the whole store) with their sizes
``memory_search``      the documents matching a query (the session search's language)     any
``memory_create``      a new document (refused when the path is taken: edit it instead)   read-write
``memory_str_replace`` replace a passage that is in the document exactly once             read-write
``memory_insert``      insert text after a line (0: at the top)                           read-write
``memory_delete``      delete a document, or every document under a folder                read-write
``memory_rename``      move a document to a path that is free                             read-write
=====================  =================================================================  ============

Each tool takes a ``store`` argument naming a mounted store; its schema lists the stores the
tool may use (for the write tools only the read-write mounts), and it is optional when
there is one. A read-only mount gets no write tool at all, so a write call a model forges is
an unknown tool (a tool error the model reads, never a write); a write tool called with a
store mounted read-only is refused the same way. Every failure (a path outside the store, a
passage no longer there, a document too large) is an error the model reads and the turn
goes on. Writes are recorded with the session, turn and agent (:class:`~.documents.Author`).

The tools are ``sequential`` (:class:`~chatflow_cli.core.tools.Tool`): the memory calls of one
model reply run one after another in the order the model gave them, so a create, an edit of
it and a view in one reply see each other and their versions follow the calls' order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import DocumentNotFoundError, UsageError
from .mounts import Mount

if TYPE_CHECKING:  # pragma: no cover
    from ..tools import Tool
    from .documents import Author, Document, DocumentInfo, DocumentVersion, MemoryHit

__all__ = ["MEMORY_TOOL_NAMES", "MEMORY_WRITE_TOOL_NAMES", "MemoryStoreAccess", "memory_tools"]

#: Every memory tool's name, in the order they are offered.
MEMORY_TOOL_NAMES = ("memory_view", "memory_search", "memory_create", "memory_str_replace", "memory_insert",
                     "memory_delete", "memory_rename")
#: The tools only a read-write mount gets.
MEMORY_WRITE_TOOL_NAMES = frozenset(MEMORY_TOOL_NAMES[2:])


class MemoryStoreAccess(Protocol):
    """What the memory tools need of a session store (every chatflow store has it)."""

    def read_document(self, store: str, path: str) -> Document: ...
    def list_documents(self, store: str, folder: str = "") -> list[DocumentInfo]: ...
    def search_memory(self, query: str, *, stores: list[str] | None = None, limit: int = 20) -> list[MemoryHit]: ...
    def create_document(self, store: str, path: str, text: str, *, author: Author | None = None) -> DocumentVersion: ...
    def replace_in_document(self, store: str, path: str, old: str, new: str, *,
                            author: Author | None = None) -> DocumentVersion: ...
    def insert_in_document(self, store: str, path: str, line: int, text: str, *,
                           author: Author | None = None) -> DocumentVersion: ...
    def delete_document(self, store: str, path: str, *, recursive: bool = False,
                        author: Author | None = None) -> list[DocumentVersion]: ...
    def rename_document(self, store: str, path: str, new_path: str, *,
                        author: Author | None = None) -> DocumentVersion: ...


def _view_range(view_range: list[int] | None, path: str, lines: int) -> tuple[int, int | None]:
    """``(first, last)`` of a ``view_range`` (None: the whole document); a range outside the
    document's ``lines`` is a UsageError naming the count, as an insert outside it is."""
    if view_range is None:
        return 1, None
    if len(view_range) != 2 or any(isinstance(n, bool) or not isinstance(n, int) for n in view_range):
        raise UsageError("view_range is [first line, last line] (-1: to the end)")
    first, last = view_range
    end = lines if last == -1 else last
    if not 1 <= first <= lines or not first <= end <= lines:
        raise UsageError(f"view_range {list(view_range)!r} is outside {path!r}, which has {lines} "
                         f"line{'' if lines == 1 else 's'}: give [first, last] with 1 <= first <= last <= {lines}, "
                         "or last -1 for the end")
    return first, last


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"


class _Tools:
    def __init__(self, store: MemoryStoreAccess, mounts: Sequence[Mount], author: Author) -> None:
        self.store = store
        self.author = author
        self.readable = [m.name for m in mounts if m.kind == "memory_store"]
        self.writable = [m.name for m in mounts if m.kind == "memory_store" and m.writable]

    def pick(self, store: str | None, write: bool) -> str:
        names = self.writable if write else self.readable
        if store is None or store == "":
            if len(names) == 1:
                return names[0]
            raise UsageError(f"say which memory store: one of {', '.join(names)}")
        if store in names:
            return store
        if write and store in self.readable:
            raise UsageError(f"memory store {store!r} is mounted read-only in this session: nothing was written")
        raise UsageError(f"memory store {store!r} is not mounted in this session (mounted: "
                         f"{', '.join(self.readable) or 'none'})")

    def view(self, path: str = "", store: str | None = None, view_range: list[int] | None = None) -> str:
        from .documents import check_folder, numbered

        name = self.pick(store, write=False)
        folder = check_folder(path)
        if folder:
            try:
                doc = self.store.read_document(name, folder)
            except DocumentNotFoundError:
                pass  # maybe a folder
            else:
                lines = len(doc.text.splitlines())
                first, last = _view_range(view_range, doc.path, lines)
                head = f"{name}/{doc.path} (version {doc.version}, {lines} lines, {_size(len(doc.text.encode()))}):"
                return head + "\n" + (numbered(doc.text, first, last) if doc.text else "(empty)")
        docs = self.store.list_documents(name, folder)
        if not docs:
            if folder:
                raise UsageError(f"memory store {name!r} has no document or folder {folder!r}")
            return f"memory store {name!r} is empty"
        where = f"{name}/{folder}/" if folder else f"{name}/"
        count = f"{len(docs)} document" + ("" if len(docs) == 1 else "s")
        return f"{where} ({count}):\n" + "\n".join(
            f"{_size(d.size_bytes):>10}  {d.path}" for d in docs)

    def search(self, query: str, store: str | None = None) -> str:
        stores = self.readable if store in (None, "") else [self.pick(store, write=False)]
        hits = self.store.search_memory(query, stores=stores, limit=10)
        if not hits:
            return f"no memory document matches {query!r}"
        return "\n".join(f"{h.store}/{h.path} (version {h.version}): " + self._snippet(h) for h in hits)

    def _snippet(self, hit: MemoryHit) -> str:
        """The hit's snippet, matches in ``[...]``. When a vault value of this process is in
        the document, the snippet is made again from the document with the value replaced
        first: the match marks, or the snippet's cut ends, could split a value that the
        scrubbing of the tool result would then no longer recognise."""
        from .secrets import scrub_values, values_read

        snippet = hit.snippet.replace("\x02", "[").replace("\x03", "]").replace("\n", " ")
        if not values_read():
            return snippet
        text = self.store.read_document(hit.store, hit.path).text
        scrubbed = scrub_values(text)
        if scrubbed is text:
            return snippet
        return _plain_snippet(scrubbed, hit.snippet)

    def create(self, path: str, file_text: str, store: str | None = None) -> str:
        name = self.pick(store, write=True)
        v = self.store.create_document(name, path, file_text, author=self.author)
        return f"created {name}/{v.path} (version {v.seq})"

    def str_replace(self, path: str, old_str: str, new_str: str, store: str | None = None) -> str:
        name = self.pick(store, write=True)
        v = self.store.replace_in_document(name, path, old_str, new_str, author=self.author)
        return f"replaced the passage in {name}/{v.path} (version {v.seq})"

    def insert(self, path: str, insert_line: int, insert_text: str, store: str | None = None) -> str:
        name = self.pick(store, write=True)
        v = self.store.insert_in_document(name, path, insert_line, insert_text, author=self.author)
        return f"inserted the text after line {insert_line} of {name}/{v.path} (version {v.seq})"

    def delete(self, path: str, store: str | None = None) -> str:
        name = self.pick(store, write=True)
        done = self.store.delete_document(name, path, recursive=True, author=self.author)
        return f"deleted {', '.join(f'{name}/{v.path}' for v in done)}"

    def rename(self, old_path: str, new_path: str, store: str | None = None) -> str:
        name = self.pick(store, write=True)
        v = self.store.rename_document(name, old_path, new_path, author=self.author)
        return f"renamed {name}/{v.previous_path} to {name}/{v.path} (version {v.seq})"


_PATH = "a document's path inside the store, relative, such as customers/acme.md"
_DESCRIPTIONS: dict[str, tuple[str, dict[str, str]]] = {
    "memory_view": (
        "Read your long-term memory, kept between conversations: a document with numbered lines, or the "
        "documents of a folder. View the whole store (no path) at the start of a task to see what you know.",
        {"path": "a document or a folder; empty: the whole store",
         "view_range": "only these lines of a document: [first, last], last -1 for the end"}),
    "memory_search": ("Search your memory documents for words or a \"phrase\" (OR, NOT, prefix* work).",
                      {"query": "the words to find"}),
    "memory_create": ("Create a new memory document. Fails when one is at the path: edit it instead.",
                      {"path": _PATH, "file_text": "the document's whole text"}),
    "memory_str_replace": (
        "Replace a passage of a memory document. The passage must be in the document exactly once, as it is "
        "now: if another conversation changed it, view the document again and retry.",
        {"path": _PATH, "old_str": "the passage, exactly as in the document", "new_str": "what replaces it"}),
    "memory_insert": ("Insert text into a memory document after a line (0: at the top).",
                      {"path": _PATH, "insert_line": "the line to insert after (0: before the first)",
                       "insert_text": "the text to insert"}),
    "memory_delete": ("Delete a memory document, or every document in a folder.", {"path": _PATH}),
    "memory_rename": ("Move a memory document to a new path that is free.",
                      {"old_path": _PATH, "new_path": "its new path"}),
}


#: Each tool's parameters schema and signature, worked out once (a turn builds its tools
#: each round, so this is kept out of the turn's time).
_SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {}


def _make(name: str, function: Any, stores: list[str]) -> Tool:
    from ..tools import Tool  # here: core.tools imports asyncio, which a store's import never pays for

    description, params = _DESCRIPTIONS[name]
    if name not in _SCHEMAS:
        made = Tool.from_function(function, name=name, description=description)
        for param, text in params.items():
            made.parameters["properties"][param]["description"] = text
        _SCHEMAS[name] = (made.parameters, made._params)
    schema, signature = _SCHEMAS[name]
    parameters = {**schema, "properties": dict(schema["properties"]), "required": list(schema["required"])}
    parameters["properties"]["store"] = {
        "type": "string", "enum": list(stores),
        "description": "the memory store" + (" (optional: there is one)" if len(stores) == 1 else "")}
    if len(stores) > 1:
        parameters["required"].append("store")
    return Tool(name, description, parameters, function, sequential=True, _params=signature)


def memory_tools(store: MemoryStoreAccess, mounts: Sequence[Mount], author: Author | None = None) -> list[Tool]:
    """The memory tools for ``mounts`` (vault mounts are skipped), writing as ``author``.

    No memory store mounted: no tool. Only read-only mounts: ``memory_view`` and
    ``memory_search``. A read-write mount adds the five write tools, whose ``store``
    argument lists the read-write mounts only.
    """
    from .documents import Author

    tools = _Tools(store, mounts, author or Author())
    if not tools.readable:
        return []
    made = [_make("memory_view", tools.view, tools.readable), _make("memory_search", tools.search, tools.readable)]
    if tools.writable:
        for name, function in (("memory_create", tools.create), ("memory_str_replace", tools.str_replace),
                               ("memory_insert", tools.insert), ("memory_delete", tools.delete),
                               ("memory_rename", tools.rename)):
            made.append(_make(name, function, tools.writable))
    return made


def _plain_snippet(text: str, marked: str, width: int = 240) -> str:
    """About ``width`` characters of ``text`` (a document whose secrets are already
    replaced) around the first word the store's snippet ``marked`` (matches between
    ``\\x02`` and ``\\x03``) highlighted, or from the start; no match marks, ``…`` at a cut end."""
    start = marked.find("\x02")
    word = marked[start + 1:marked.find("\x03", start)] if start >= 0 else ""
    at = text.lower().find(word.lower()) if word else -1
    begin = max(0, at - width // 3) if at >= 0 else 0
    piece = text[begin:begin + width].replace("\n", " ")
    return ("…" if begin else "") + piece + ("…" if begin + width < len(text) else "")

