"""The storage primitives of memory stores (:class:`_MemoryStoreTx`), a part of every store's
transaction.

A backend's transaction class mixes this in beside its :class:`~._port._Tx`; the rules
(sequence numbers, conflicts, reverts) live once in :mod:`._memstores`. Every method runs
inside the transaction it belongs to; a write method is only called in a write transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..resources.documents import Document, DocumentInfo, DocumentVersion, MemoryHit, MemoryStoreInfo
    from .search import Query

__all__ = ["_MemoryStoreTx", "doc_snippet"]


def doc_snippet(query: Query, path: str, text: str) -> str:
    """A search hit's snippet: of the text where the query matches it, else of the path."""
    from .search import HIGHLIGHT_START, memory_snippet

    snippet = memory_snippet(query, text)
    return snippet if HIGHLIGHT_START in snippet else memory_snippet(query, path)


class _MemoryStoreTx:
    """Memory store primitives; every backend implements each method."""

    def ms_get(self, name: str, *, for_update: bool = False) -> MemoryStoreInfo | None:
        """The store's row (``documents`` and ``size_bytes`` may be 0: not counted here), or None.
        ``for_update``: lock the row until the transaction ends (its seq is about to grow)."""
        raise NotImplementedError

    def ms_insert(self, name: str, description: str, now: float) -> None:
        raise NotImplementedError

    def ms_set_seq(self, name: str, seq: int) -> None:
        """Record ``seq`` as the store's last write."""
        raise NotImplementedError

    def ms_list(self) -> list[MemoryStoreInfo]:
        """Every store, by name, with its document count and size."""
        raise NotImplementedError

    def ms_delete(self, name: str) -> bool:
        """Remove the store with its documents and history; True if it existed."""
        raise NotImplementedError

    def doc_get(self, store: str, path: str) -> Document | None:
        raise NotImplementedError

    def doc_put(self, store: str, path: str, text: str, version: int, now: float) -> None:
        """Insert or replace the document at ``path``."""
        raise NotImplementedError

    def doc_delete(self, store: str, path: str) -> None:
        raise NotImplementedError

    def doc_list(self, store: str, folder: str) -> list[DocumentInfo]:
        """The documents under ``folder`` (``""``: all), by path. A document whose path is
        ``folder`` itself is not listed."""
        raise NotImplementedError

    def doc_first_under(self, store: str, folder: str) -> str | None:
        """The path of one document under ``folder`` (``folder/...``), or None: is it a folder?"""
        raise NotImplementedError

    def doc_texts(self, store: str, folder: str) -> list[Document]:
        """:meth:`doc_list` with the texts."""
        raise NotImplementedError

    def version_add(self, version: DocumentVersion) -> None:
        raise NotImplementedError

    def versions(self, store: str, path: str | None, after_seq: int, limit: int | None) -> list[DocumentVersion]:
        """The store's writes after ``after_seq``, oldest first; with ``path``, those whose
        ``path`` or ``previous_path`` is ``path``."""
        raise NotImplementedError

    def version_get(self, store: str, seq: int) -> DocumentVersion | None:
        raise NotImplementedError

    def last_version_touching(self, store: str, path: str, before_seq: int | None) -> DocumentVersion | None:
        """The newest write (below ``before_seq`` when given) whose ``path`` or
        ``previous_path`` is ``path``."""
        raise NotImplementedError

    def doc_search(self, query: Query, stores: list[str] | None, limit: int) -> list[MemoryHit]:
        """Documents matching ``query`` (in ``stores``, or every store), best first."""
        raise NotImplementedError
