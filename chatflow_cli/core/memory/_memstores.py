"""Memory stores on the session store: named collections of documents that any number of
sessions mount and that outlive them (:class:`_MemoryStores`, a mixin of
:class:`~chatflow_cli.core.memory.base.BaseSessionStore`).

The rules, written once over :class:`~._memstore_port._MemoryStoreTx`:

* Every write takes the store's next ``seq`` inside its write transaction, with the store's
  row locked (``ms_get(..., for_update=True)``), so writes of one store are numbered 1, 2,
  3... without a gap, in the order they committed, in any number of processes.
* A write that depends on what the document holds checks it in that same transaction: a
  passage replaced must be there exactly once, a create finds no document, an
  ``expected_version`` is the document's version. Otherwise it raises
  :class:`~chatflow_cli.core.errors.MemoryConflictError` and writes nothing. Two sessions
  editing one document therefore never lose a write silently: the second edit of a passage
  the first one changed fails and says so.
* Nothing is ever overwritten in the history: a revert is a new write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import DocumentNotFoundError, MemoryConflictError, MemoryStoreNotFoundError, UsageError
from ..resources.memory_tools import MemoryStoreAccess
from ..resources.mounts import Mount, check_resource_name
from ..resources.secrets import NOT_SHOWN, quoted_name
from ._core import _StoreCore, stored_mounts
from ._twins import async_twin

if TYPE_CHECKING:  # pragma: no cover
    from ..resources.documents import (Author, Document, DocumentInfo, DocumentVersion, MemoryHit, MemoryStoreInfo,
                                       VersionOp)

# resources.documents (and the query parser) are imported by the methods that use them: a
# store whose memory stores are never touched does not pay for them

__all__ = ["MemoryStore", "_MemoryStores"]


def _author(author: Author | None) -> Author:
    """Who made a write: ``author``, else nobody (outside a session)."""
    from ..resources.documents import Author

    return author or Author()


def _tx(tx: Any) -> Any:
    """The transaction as memory-store primitives (every backend's transaction mixes them in)."""
    return tx


def _not_found(name: str) -> MemoryStoreNotFoundError:
    """The error for a store that does not exist; a name that breaks the name rule or looks
    like a credential is not quoted (a value typed where a name goes is never printed)."""
    shown = quoted_name(name)
    if shown == NOT_SHOWN:
        return MemoryStoreNotFoundError(
            f"no memory store {NOT_SHOWN} (chatflow memory ls lists them)", name=name)
    return MemoryStoreNotFoundError(
        f"memory store {shown} does not exist (chatflow memory ls lists them; chatflow memory create {name} "
        "makes it)", name=name)


def _refuse_clash(tx: Any, store: str, path: str) -> None:
    """A new document at ``path`` must not make a path both a document and a folder: no
    document may be at a folder above it, none under it. Called with the store's row locked
    (every write of the store waits for it), so two writers cannot make such a pair between
    them. A pair stored before this rule stays: its documents are read, edited, renamed
    and deleted as any other; only a new one is refused."""
    from ..resources.documents import parent_folders

    for folder in parent_folders(path):
        if tx.doc_get(store, folder) is not None:
            raise MemoryConflictError(
                f"memory path {path!r} would be under the document {folder!r}: a path is a document or a folder, "
                f"not both (rename or delete {folder!r} first, or choose another path): nothing was written")
    inside = tx.doc_first_under(store, path)
    if inside is not None:
        raise MemoryConflictError(
            f"memory path {path!r} is a folder (it holds {inside!r}): a path is a document or a folder, not both "
            "(choose another path, such as one inside the folder): nothing was written")


def _limit(limit: int | None, default: int | None) -> int | None:
    if limit is None:
        return default
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UsageError(f"limit must be a positive int, got {limit!r}")
    return limit


@runtime_checkable
class MemoryStore(MemoryStoreAccess, Protocol):
    """What callers need of a store to work with memory stores (``chatflow memory``,
    ``/memory``, the front-ends' mount checks): the stores, their documents and history, and
    a session's mounts; the memory tools need only :class:`MemoryStoreAccess`."""

    def create_memory_store(self, name: str, *, description: str = "",
                            exist_ok: bool = False) -> MemoryStoreInfo:
        """Create the memory store ``name``; its :class:`MemoryStoreInfo`."""
        ...

    def memory_stores(self) -> list[MemoryStoreInfo]:
        """Every memory store, by name."""
        ...

    def memory_store(self, name: str) -> MemoryStoreInfo:
        """The memory store ``name`` (MemoryStoreNotFoundError when there is none)."""
        ...

    def delete_memory_store(self, name: str) -> bool:
        """Delete the memory store ``name``; False when there was none."""
        ...

    def session_resources(self, session_id: str) -> list[Mount]:
        """The resources mounted on the stored session ``session_id``."""
        ...

    def read_documents(self, store: str, folder: str = "") -> list[Document]:
        """The documents under ``folder`` of ``store``, with their text."""
        ...

    def memory_history(self, store: str, path: str | None = None, *, after_seq: int = 0,
                       limit: int | None = None) -> list[DocumentVersion]:
        """The versions written to ``store`` (or one path of it), oldest first."""
        ...

    def write_document(self, store: str, path: str, text: str, *, expected_version: int | None = None,
                       author: Author | None = None) -> DocumentVersion:
        """Write the whole text of the document at ``path``."""
        ...

    def write_documents(self, store: str, documents: Mapping[str, str], *, op: VersionOp = "import",
                        author: Author | None = None, create: bool = False,
                        description: str = "") -> list[DocumentVersion]:
        """Write many documents in one transaction (all or none; ``create``: the store too)."""
        ...

    def revert_memory(self, store: str, seq: int, *, force: bool = False,
                      author: Author | None = None) -> DocumentVersion:
        """Undo the write ``seq`` of ``store`` with a new write."""
        ...

    def revert_writes(self, store: str, seqs: Sequence[int], *, force: bool = False,
                      author: Author | None = None) -> list[DocumentVersion]:
        """Undo several writes of ``store`` in one transaction."""
        ...


class _MemoryStores(_StoreCore):
    """Create, read, write, search and revert memory stores and their documents.

    Names follow :func:`~chatflow_cli.core.resources.mounts.check_resource_name`, paths
    :func:`~chatflow_cli.core.resources.documents.check_path`, texts
    :func:`~chatflow_cli.core.resources.documents.check_text`. Every write returns its
    :class:`~chatflow_cli.core.resources.documents.DocumentVersion`; ``author`` says who
    made it (default: outside a session).
    """

    # -- stores ------------------------------------------------------------------------
    def create_memory_store(self, name: str, *, description: str = "", exist_ok: bool = False) -> MemoryStoreInfo:
        """Create the memory store ``name`` and return it.

        Raises:
            UsageError: a bad name or description, or the store exists (unless ``exist_ok``).
        """
        check_resource_name(name, new=True)
        if not isinstance(description, str) or len(description) > 1000:
            raise UsageError("a memory store's description is a str of at most 1000 characters")
        with self._write() as raw:
            tx = _tx(raw)
            found = tx.ms_get(name)
            if found is not None:
                if exist_ok:
                    return found  # type: ignore[no-any-return]
                raise UsageError(f"memory store {name!r} exists already")
            tx.ms_insert(name, description, self.clock())
            return tx.ms_get(name)  # type: ignore[no-any-return]

    def memory_stores(self) -> list[MemoryStoreInfo]:
        """Every memory store, by name, with how many documents it holds and their size."""
        with self._read() as raw:
            return _tx(raw).ms_list()  # type: ignore[no-any-return]

    def memory_store(self, name: str) -> MemoryStoreInfo:
        """The memory store ``name``. Raises :class:`MemoryStoreNotFoundError` (exit 3)."""
        check_resource_name(name)
        for info in self.memory_stores():
            if info.name == name:
                return info
        raise _not_found(name)

    def delete_memory_store(self, name: str) -> bool:
        """Delete the memory store ``name`` with its documents and history; False if there was
        none. Sessions that mount it keep the mount (their memory tools then say it is gone)
        until the command line resumes one: it unmounts the store, with a reason, and says so."""
        check_resource_name(name)
        with self._write() as raw:
            return _tx(raw).ms_delete(name)  # type: ignore[no-any-return]

    # -- mounts ------------------------------------------------------------------------
    def session_resources(self, session_id: str) -> list[Mount]:
        """The resources mounted on the stored session ``session_id`` (the fold of its
        ``resource.mounted`` / ``resource.unmounted`` events; ``[]`` for no such session),
        read without loading its context window. A running turn's vault mounts:
        ``[m for m in store.session_resources(sid) if m.kind == "vault"]``."""
        with self._read() as tx:
            if tx.get_row(session_id) is None:
                return []
            return stored_mounts(tx, session_id)

    # -- reading -----------------------------------------------------------------------
    def read_document(self, store: str, path: str) -> Document:
        """The document at ``path`` of ``store``.

        Raises:
            MemoryStoreNotFoundError, DocumentNotFoundError: (exit 3).
            UsageError: a bad name or path.
        """
        from ..resources.documents import check_path

        check_resource_name(store)
        path = check_path(path)
        with self._read() as raw:
            tx = _tx(raw)
            doc = tx.doc_get(store, path)
            if doc is None:
                if tx.ms_get(store) is None:
                    raise _not_found(store)
                raise DocumentNotFoundError(f"memory store {store!r} has no document {path!r}", store=store, path=path)
            return doc  # type: ignore[no-any-return]

    def list_documents(self, store: str, folder: str = "") -> list[DocumentInfo]:
        """The documents of ``store`` under ``folder`` (``""``: all), by path.
        Raises :class:`MemoryStoreNotFoundError`, or :class:`UsageError` for a bad folder."""
        from ..resources.documents import check_folder

        check_resource_name(store)
        folder = check_folder(folder)
        with self._read() as raw:
            tx = _tx(raw)
            if tx.ms_get(store) is None:
                raise _not_found(store)
            return tx.doc_list(store, folder)  # type: ignore[no-any-return]

    def read_documents(self, store: str, folder: str = "") -> list[Document]:
        """:meth:`list_documents` with their texts, read in one transaction (an export)."""
        from ..resources.documents import check_folder

        check_resource_name(store)
        folder = check_folder(folder)
        with self._read() as raw:
            tx = _tx(raw)
            if tx.ms_get(store) is None:
                raise _not_found(store)
            return tx.doc_texts(store, folder)  # type: ignore[no-any-return]

    def memory_history(self, store: str, path: str | None = None, *, after_seq: int = 0,
                       limit: int | None = None) -> list[DocumentVersion]:
        """The writes of ``store`` after ``after_seq``, oldest first (of ``path`` only when
        given: its writes, renames to and from it). Raises :class:`MemoryStoreNotFoundError`."""
        from ..resources.documents import check_path

        check_resource_name(store)
        if path is not None:
            path = check_path(path)
        with self._read() as raw:
            tx = _tx(raw)
            if tx.ms_get(store) is None:
                raise _not_found(store)
            return tx.versions(store, path, int(after_seq), _limit(limit, None))  # type: ignore[no-any-return]

    def search_memory(self, query: str, *, stores: list[str] | None = None, limit: int = 20) -> list[MemoryHit]:
        """Documents matching ``query`` (the session search's query language, see
        :mod:`~chatflow_cli.core.memory.search`; paths are searched with the text), best
        first, in ``stores`` (every store when None).

        Raises:
            UsageError: a query that cannot be parsed, a bad store name or limit.
            MemoryStoreNotFoundError: a store of ``stores`` does not exist.
        """
        from .search import parse_query

        parsed = parse_query(query)
        wanted = None if stores is None else list(dict.fromkeys(check_resource_name(s) for s in stores))  # once each
        with self._read() as raw:
            tx = _tx(raw)
            for name in wanted or []:
                if tx.ms_get(name) is None:
                    raise _not_found(name)
            return tx.doc_search(parsed, wanted, _limit(limit, 20))  # type: ignore[no-any-return]

    # -- writing -----------------------------------------------------------------------
    def _record(self, tx: Any, store: str, path: str, op: VersionOp, text: str | None, author: Author,
                *, previous_path: str | None = None, reverts: int | None = None) -> DocumentVersion:
        """The write itself: the next seq, the document, the history; the row is locked."""
        from ..resources.documents import DocumentVersion

        row = tx.ms_get(store, for_update=True)
        seq = row.last_seq + 1
        now = self.clock()
        if previous_path is not None:
            tx.doc_delete(store, previous_path)
        if text is None:
            tx.doc_delete(store, path)
        else:
            if tx.doc_get(store, path) is None:
                _refuse_clash(tx, store, path)
            tx.doc_put(store, path, text, seq, now)
        version = DocumentVersion(store, seq, path, op, text, author, now, previous_path, reverts)
        tx.version_add(version)
        tx.ms_set_seq(store, seq)
        return version

    def _current(self, tx: Any, store: str, path: str) -> Document | None:
        if tx.ms_get(store, for_update=True) is None:
            raise _not_found(store)
        return tx.doc_get(store, path)  # type: ignore[no-any-return]

    @staticmethod
    def _missing(store: str, path: str) -> DocumentNotFoundError:
        return DocumentNotFoundError(f"memory store {store!r} has no document {path!r}", store=store, path=path)

    def write_document(self, store: str, path: str, text: str, *, expected_version: int | None = None,
                       author: Author | None = None) -> DocumentVersion:
        """Write the whole text of ``path`` (created if absent).

        ``expected_version``: None writes whatever the document holds (the old text stays in
        the history); 0 writes only when there is no document; N only when the document's
        version is N.

        Raises:
            MemoryStoreNotFoundError: (exit 3).
            MemoryConflictError: the document is not at ``expected_version``.
            UsageError, DocumentTooLargeError: a bad name, path or text.
        """
        from ..resources.documents import check_path, check_text

        check_resource_name(store)
        path = check_path(path)
        check_text(text, path)
        with self._write() as tx:
            doc = self._current(tx, store, path)
            have = 0 if doc is None else doc.version
            if expected_version is not None and expected_version != have:
                what = "does not exist" if doc is None else f"is at version {have}"
                wanted = "no document" if expected_version == 0 else f"version {expected_version}"
                raise MemoryConflictError(f"memory document {path!r} {what}, not {wanted}: nothing was written",
                                          current_version=doc.version if doc else None)
            return self._record(tx, store, path, "create" if doc is None else "write", text, _author(author))

    def create_document(self, store: str, path: str, text: str, *, author: Author | None = None) -> DocumentVersion:
        """Create ``path``; :class:`MemoryConflictError` when it exists (see :meth:`write_document`)."""
        try:
            return self.write_document(store, path, text, expected_version=0, author=author)
        except MemoryConflictError as exc:
            if exc.current_version is None:  # not there, but the path is a folder or under a document
                raise
            raise MemoryConflictError(
                f"memory document {path!r} exists already (version {exc.current_version}): edit it, or delete it first",
                current_version=exc.current_version) from None

    def replace_in_document(self, store: str, path: str, old: str, new: str, *,
                            author: Author | None = None) -> DocumentVersion:
        """Replace the one occurrence of the passage ``old`` in ``path`` by ``new``.

        Raises:
            MemoryConflictError: ``old`` is not in the document now (another write changed
                it) or is there more than once; nothing was written.
            MemoryStoreNotFoundError, DocumentNotFoundError: (exit 3).
            DocumentTooLargeError: the result would be over the limit.
        """
        from ..resources.documents import check_path, check_text, replace_passage

        check_resource_name(store)
        path = check_path(path)
        if not isinstance(old, str) or not isinstance(new, str):
            raise UsageError("the passage and its replacement are str")
        with self._write() as tx:
            doc = self._current(tx, store, path)
            if doc is None:
                raise self._missing(store, path)
            text = check_text(replace_passage(doc.text, old, new, path=path, version=doc.version), path)
            return self._record(tx, store, path, "str_replace", text, _author(author))

    def insert_in_document(self, store: str, path: str, line: int, text: str, *,
                           author: Author | None = None) -> DocumentVersion:
        """Insert ``text`` after line ``line`` of ``path`` (0: at the top).

        Raises:
            UsageError: ``line`` outside the document. Else as :meth:`replace_in_document`.
        """
        from ..resources.documents import check_path, check_text, insert_lines

        check_resource_name(store)
        path = check_path(path)
        if not isinstance(text, str):
            raise UsageError("the text to insert is a str")
        with self._write() as tx:
            doc = self._current(tx, store, path)
            if doc is None:
                raise self._missing(store, path)
            new = check_text(insert_lines(doc.text, line, text, path=path), path)
            return self._record(tx, store, path, "insert", new, _author(author))

    def delete_document(self, store: str, path: str, *, recursive: bool = False,
                        author: Author | None = None) -> list[DocumentVersion]:
        """Delete the document ``path`` or, with ``recursive``, every document under the
        folder ``path`` (one write each, in one transaction). Returns the writes.

        Raises:
            DocumentNotFoundError: nothing there to delete. MemoryStoreNotFoundError: (exit 3).
        """
        from ..resources.documents import check_path

        check_resource_name(store)
        path = check_path(path)
        with self._write() as raw:
            doc = self._current(raw, store, path)
            if doc is not None:
                return [self._record(raw, store, path, "delete", None, _author(author))]
            under = _tx(raw).doc_list(store, path) if recursive else []
            if not under:
                raise self._missing(store, path)
            return [self._record(raw, store, d.path, "delete", None, _author(author)) for d in under]

    def rename_document(self, store: str, path: str, new_path: str, *,
                        author: Author | None = None) -> DocumentVersion:
        """Move the document ``path`` to ``new_path``.

        Raises:
            MemoryConflictError: a document is at ``new_path`` already.
            DocumentNotFoundError, MemoryStoreNotFoundError: (exit 3).
        """
        from ..resources.documents import check_path

        check_resource_name(store)
        path = check_path(path)
        new_path = check_path(new_path)
        with self._write() as tx:
            doc = self._current(tx, store, path)
            if doc is None:
                raise self._missing(store, path)
            taken = _tx(tx).doc_get(store, new_path)
            if taken is not None:
                raise MemoryConflictError(f"memory document {new_path!r} exists already: nothing was renamed",
                                          current_version=taken.version)
            return self._record(tx, store, new_path, "rename", doc.text, _author(author), previous_path=path)

    def write_documents(self, store: str, documents: Mapping[str, str], *, op: VersionOp = "import",
                        author: Author | None = None, create: bool = False,
                        description: str = "") -> list[DocumentVersion]:
        """Write many documents in one transaction (an import): all of them or, when one is
        refused, none (and with ``create``, no new store either). A document whose text is
        unchanged is skipped. Returns the writes made.

        Every path and text is checked before the store is touched; two paths that are one
        after NFC normalization are refused. ``create``: make the store (with ``description``)
        in the same transaction when it does not exist.

        Raises:
            UsageError: a bad name, path or text, or a path given twice.
            MemoryConflictError: a path would be both a document and a folder.
            MemoryStoreNotFoundError: (exit 3) no store ``store`` and not ``create``.
        """
        from ..resources.documents import check_path, check_text

        check_resource_name(store)
        if create and (not isinstance(description, str) or len(description) > 1000):
            raise UsageError("a memory store's description is a str of at most 1000 characters")
        items: dict[str, str] = {}
        for given, text in documents.items():
            path = check_path(given)
            if path in items:
                raise UsageError(f"memory path {path!r} is given twice (the same path after Unicode NFC "
                                 "normalization): nothing was written")
            items[path] = check_text(text, path)
        out = []
        who = _author(author)
        with self._write() as raw:
            if create and _tx(raw).ms_get(store) is None:
                _tx(raw).ms_insert(store, description, self.clock())
            for path, text in items.items():
                doc = self._current(raw, store, path)
                if doc is None or doc.text != text:
                    out.append(self._record(raw, store, path, op, text, who))
        return out

    def revert_memory(self, store: str, seq: int, *, force: bool = False,
                      author: Author | None = None) -> DocumentVersion:
        """Undo the write ``seq`` of ``store`` with a new write: the document (both paths of
        a rename) goes back to what it held before ``seq``. The history keeps both.

        Raises:
            MemoryConflictError: a later write touched the document (unless ``force``: then
                those later writes are undone too, and stay in the history; a document a
                later rename moved is followed and moved back in the same write).
            UsageError: no write ``seq`` in the store. MemoryStoreNotFoundError: (exit 3).
        """
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise UsageError(f"a write number is an int, got {seq!r}")
        return self.revert_writes(store, [seq], force=force, author=author)[0]

    def revert_writes(self, store: str, seqs: Sequence[int], *, force: bool = False,
                      author: Author | None = None) -> list[DocumentVersion]:
        """Undo several writes of ``store`` in one transaction (all of them or none), newest
        first, each as :meth:`revert_memory` does: a folder deleted by ``chatflow memory rm``
        (one write a document, numbered one after another) comes back with the range of its
        writes. A later write that is itself one of ``seqs`` is no conflict. Returns the new
        writes, in the order they were made.

        Raises:
            UsageError: no ``seqs``, or one that is not a write of the store.
            MemoryConflictError, MemoryStoreNotFoundError: as :meth:`revert_memory`.
        """
        check_resource_name(store)
        wanted = [] if isinstance(seqs, (str, bytes)) else list(seqs)
        if not wanted or any(isinstance(s, bool) or not isinstance(s, int) for s in wanted):
            raise UsageError(f"the writes to undo are write numbers (ints), got {seqs!r}")
        wanted = sorted(set(wanted), reverse=True)
        who = _author(author)
        with self._write() as raw:
            tx = _tx(raw)
            if tx.ms_get(store, for_update=True) is None:
                raise _not_found(store)
            allowed = set(wanted)
            out: list[DocumentVersion] = []
            for seq in wanted:
                version = self._revert_one(tx, store, seq, force, allowed, who)
                allowed.add(version.seq)
                out.append(version)
            return out

    def _revert_one(self, tx: Any, store: str, seq: int, force: bool, allowed: set[int],
                    who: Author) -> DocumentVersion:
        undone: DocumentVersion | None = tx.version_get(store, seq)
        if undone is None:
            last = tx.ms_get(store).last_seq
            raise UsageError(f"memory store {store!r} has no write {seq} " + (
                f"(its writes are 1 to {last}; chatflow memory history {store})" if last else "(it has no writes yet)"))
        paths = [undone.path] + ([undone.previous_path] if undone.previous_path else [])
        for path in paths:
            later = [v for v in tx.versions(store, path, seq, None) if v.seq not in allowed]
            if later and not force:
                latest = later[-1]
                raise MemoryConflictError(
                    f"memory document {path!r} was written again after write {seq} (by write {latest.seq}, "
                    f"{latest.author.describe()}): revert that first, or force", current_version=latest.seq)
        # where the document is now: a later rename (forced past) moved it on from undone.path
        here = _moved_to(tx, store, undone.path, seq) if force else undone.path
        if undone.previous_path is not None:  # a rename: back to the old path
            old = tx.last_version_touching(store, undone.previous_path, seq)
            text = old.text if old is not None and old.path == undone.previous_path else undone.text
            if text is None:
                text = ""
            return self._record(tx, store, undone.previous_path, "revert", text, who,
                                previous_path=None if here == undone.previous_path else here, reverts=seq)
        before = tx.last_version_touching(store, undone.path, seq)
        text = before.text if before is not None and before.path == undone.path else None
        if here != undone.path and tx.doc_get(store, here) is not None:  # moved since: back, in one write
            if text is None:  # write seq made it: it goes, from where it is now
                return self._record(tx, store, here, "revert", None, who, reverts=seq)
            return self._record(tx, store, undone.path, "revert", text, who, previous_path=here, reverts=seq)
        if text is None and tx.doc_get(store, undone.path) is None:
            raise UsageError(f"write {seq} of memory store {store!r} left nothing to undo")
        return self._record(tx, store, undone.path, "revert", text, who, reverts=seq)

    # -- async twins -------------------------------------------------------------------
    asession_resources = async_twin(session_resources)
    acreate_memory_store = async_twin(create_memory_store, writes=True)
    amemory_stores = async_twin(memory_stores)
    amemory_store = async_twin(memory_store)
    adelete_memory_store = async_twin(delete_memory_store, writes=True)
    aread_document = async_twin(read_document)
    alist_documents = async_twin(list_documents)
    aread_documents = async_twin(read_documents)
    amemory_history = async_twin(memory_history)
    asearch_memory = async_twin(search_memory)
    awrite_document = async_twin(write_document, writes=True)
    acreate_document = async_twin(create_document, writes=True)
    areplace_in_document = async_twin(replace_in_document, writes=True)
    ainsert_in_document = async_twin(insert_in_document, writes=True)
    adelete_document = async_twin(delete_document, writes=True)
    arename_document = async_twin(rename_document, writes=True)
    awrite_documents = async_twin(write_documents, writes=True)
    arevert_memory = async_twin(revert_memory, writes=True)
    arevert_writes = async_twin(revert_writes, writes=True)


def _moved_to(tx: Any, store: str, path: str, seq: int) -> str:
    """Where the document that was at ``path`` after write ``seq`` is now: ``path`` followed
    through every later write that moved it (a rename, or the revert of one)."""
    after = seq
    for _ in range(10_000):  # each step moves past a later write: this bound is never reached
        move = next((v for v in tx.versions(store, path, after, None) if v.previous_path == path
                     and v.path != path), None)
        if move is None:
            break
        path, after = move.path, move.seq
    return path
