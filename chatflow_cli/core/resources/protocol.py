"""What a caller needs of a store to work with memory stores (every chatflow store has it:
the methods of :class:`~chatflow_cli.core.memory._memstores._MemoryStores`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .documents import Author, Document, DocumentInfo, DocumentVersion, MemoryHit, MemoryStoreInfo, VersionOp
from .memory_tools import MemoryStoreAccess

__all__ = ["MemoryStoresProtocol"]


class MemoryStoresProtocol(MemoryStoreAccess, Protocol):
    """The memory-store methods of a session store (sync; each has an ``a``-prefixed async twin)."""

    def create_memory_store(self, name: str, *, description: str = "",
                            exist_ok: bool = False) -> MemoryStoreInfo: ...
    def memory_stores(self) -> list[MemoryStoreInfo]: ...
    def memory_store(self, name: str) -> MemoryStoreInfo: ...
    def delete_memory_store(self, name: str) -> bool: ...
    def read_documents(self, store: str, folder: str = "") -> list[Document]: ...
    def memory_history(self, store: str, path: str | None = None, *, after_seq: int = 0,
                       limit: int | None = None) -> list[DocumentVersion]: ...
    def write_document(self, store: str, path: str, text: str, *, expected_version: int | None = None,
                       author: Author | None = None) -> DocumentVersion: ...
    def write_documents(self, store: str, documents: Mapping[str, str], *, op: VersionOp = "import",
                        author: Author | None = None) -> list[DocumentVersion]: ...
    def revert_memory(self, store: str, seq: int, *, force: bool = False,
                      author: Author | None = None) -> DocumentVersion: ...
