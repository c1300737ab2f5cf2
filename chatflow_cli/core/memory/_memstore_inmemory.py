"""Memory stores of the in-memory store: dicts under the store's lock, each change with an
undo step (as every write of :mod:`.inmemory`), so a failed transaction leaves nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..resources.documents import Document, DocumentInfo, DocumentVersion, MemoryHit, MemoryStoreInfo
from ._memstore_port import _MemoryStoreTx, doc_snippet
from .search import Query, words_of

__all__ = ["MemStores", "_InMemoryMemoryStoreTx"]


@dataclass(slots=True)
class _Store:
    info: MemoryStoreInfo
    documents: dict[str, Document] = field(default_factory=dict)
    history: list[DocumentVersion] = field(default_factory=list)


#: name -> store, as the in-memory session store holds them.
MemStores = dict[str, _Store]


def _under(path: str, folder: str) -> bool:
    return not folder or path.startswith(folder + "/")


class _InMemoryMemoryStoreTx(_MemoryStoreTx):
    """Needs ``self._memstores`` (the store's dict) and ``self.undo`` (the transaction's undo steps)."""

    _memstores: MemStores
    undo: list[Callable[[], object]]

    def ms_get(self, name: str, *, for_update: bool = False) -> MemoryStoreInfo | None:
        entry = self._memstores.get(name)
        return None if entry is None else entry.info

    def ms_insert(self, name: str, description: str, now: float) -> None:
        self._memstores[name] = _Store(MemoryStoreInfo(name, description, now))
        self.undo.append(lambda: self._memstores.pop(name, None))

    def ms_set_seq(self, name: str, seq: int) -> None:
        entry = self._memstores[name]
        old = entry.info
        entry.info = replace(old, last_seq=seq)
        self.undo.append(lambda: setattr(entry, "info", old))

    def ms_list(self) -> list[MemoryStoreInfo]:
        return [replace(s.info, documents=len(s.documents),
                        size_bytes=sum(len(d.text.encode("utf-8")) for d in s.documents.values()))
                for _, s in sorted(self._memstores.items())]

    def ms_delete(self, name: str) -> bool:
        entry = self._memstores.pop(name, None)
        if entry is None:
            return False
        self.undo.append(lambda: self._memstores.__setitem__(name, entry))
        return True

    def doc_get(self, store: str, path: str) -> Document | None:
        entry = self._memstores.get(store)
        return None if entry is None else entry.documents.get(path)

    def doc_put(self, store: str, path: str, text: str, version: int, now: float) -> None:
        docs = self._memstores[store].documents
        old = docs.get(path)
        docs[path] = Document(store, path, text, version, now)
        self.undo.append(lambda: docs.pop(path, None) if old is None else docs.__setitem__(path, old))

    def doc_delete(self, store: str, path: str) -> None:
        docs = self._memstores[store].documents
        old = docs.pop(path, None)
        if old is not None:
            self.undo.append(lambda: docs.__setitem__(path, old))

    def doc_texts(self, store: str, folder: str) -> list[Document]:
        docs = self._memstores[store].documents
        return [docs[p] for p in sorted(docs) if _under(p, folder)]

    def doc_first_under(self, store: str, folder: str) -> str | None:
        prefix = folder + "/"
        return next((p for p in self._memstores[store].documents if p.startswith(prefix)), None)

    def doc_list(self, store: str, folder: str) -> list[DocumentInfo]:
        return [DocumentInfo(d.path, len(d.text.encode("utf-8")), d.version, d.updated_at)
                for d in self.doc_texts(store, folder)]

    def version_add(self, version: DocumentVersion) -> None:
        history = self._memstores[version.store].history
        if history and history[-1].seq >= version.seq:
            raise AssertionError(f"memory store {version.store!r}: seq {version.seq} already used")
        history.append(version)
        self.undo.append(history.pop)

    def versions(self, store: str, path: str | None, after_seq: int, limit: int | None) -> list[DocumentVersion]:
        out = [v for v in self._memstores[store].history
               if v.seq > after_seq and (path is None or path in (v.path, v.previous_path))]
        return out if limit is None else out[:limit]

    def version_get(self, store: str, seq: int) -> DocumentVersion | None:
        history = self._memstores[store].history
        return history[seq - 1] if 0 < seq <= len(history) else None

    def last_version_touching(self, store: str, path: str, before_seq: int | None) -> DocumentVersion | None:
        for version in reversed(self._memstores[store].history):
            if (before_seq is None or version.seq < before_seq) and path in (version.path, version.previous_path):
                return version
        return None

    def doc_search(self, query: Query, stores: list[str] | None, limit: int) -> list[MemoryHit]:
        hits: list[tuple[int, str, str, Document]] = []
        for name in sorted(self._memstores) if stores is None else stores:
            for doc in self._memstores[name].documents.values():
                score = query.score(words_of(doc.path + "\n" + doc.text))
                if score:
                    hits.append((-score, name, doc.path, doc))
        hits.sort(key=lambda h: (h[0], h[1], h[2]))
        return [MemoryHit(d.store, d.path, doc_snippet(query, d.path, d.text), float(rank),
                          d.version, d.updated_at) for rank, _n, _p, d in hits[:limit]]
