"""Memory stores of the SQLite store: three tables and a full-text index, added by one
migration (:data:`MIGRATION`), and the primitives over them (:class:`SQLiteMemoryStoreTx`).

A document's words (its path and text, as :func:`~.search.words_of` gives them, the same
words the session search indexes) are indexed in the write that stores it: memory writes
are few and small, and a search must see the write that came just before it.
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING

from .._memstore_port import _MemoryStoreTx, doc_snippet

if TYPE_CHECKING:  # pragma: no cover
    from ...resources.documents import Document, DocumentInfo, DocumentVersion, MemoryHit, MemoryStoreInfo
    from ..search import Query

# The documents' value types and the search's words are imported where a memory store is
# used: a session's store that never touches one does not pay for them.

__all__ = ["MIGRATION", "SQLiteMemoryStoreTx"]

#: The migration that adds memory stores (its number is given where it is listed).
MIGRATION: tuple[str, list[str]] = (
    "memory stores: documents, their versioned writes, a full-text index of their words",
    [
        """CREATE TABLE IF NOT EXISTS chatflow_memory_stores (
    name           TEXT PRIMARY KEY,         -- a-z 0-9 _ . - (resources.mounts.check_resource_name)
    description    TEXT NOT NULL DEFAULT '',
    created_at_utc REAL NOT NULL,
    last_seq       INTEGER NOT NULL DEFAULT 0  -- the seq of the store's last write: the next is + 1
)""",
        """CREATE TABLE IF NOT EXISTS chatflow_memory_documents (
    doc_id         INTEGER PRIMARY KEY,      -- the rowid of the document's words in chatflow_memory_fts
    store          TEXT NOT NULL REFERENCES chatflow_memory_stores (name) ON DELETE CASCADE,
    path           TEXT NOT NULL,
    text           TEXT NOT NULL,
    size_bytes     INTEGER NOT NULL,         -- of the text in UTF-8
    version        INTEGER NOT NULL,         -- the seq of its last write
    updated_at_utc REAL NOT NULL,
    UNIQUE (store, path)
)""",
        """CREATE TABLE IF NOT EXISTS chatflow_memory_versions (
    store          TEXT NOT NULL REFERENCES chatflow_memory_stores (name) ON DELETE CASCADE,
    seq            INTEGER NOT NULL,         -- 1, 2, 3... per store, no gap
    path           TEXT NOT NULL,
    op             TEXT NOT NULL,            -- create, write, str_replace, insert, delete, rename, revert, import
    text           TEXT,                     -- the document after the write; NULL: deleted
    previous_path  TEXT,                     -- a rename's old path (gone after the write)
    reverts        INTEGER,                  -- the seq a revert undid
    session_id     TEXT,                     -- who wrote it: NULL outside a session
    turn           INTEGER,
    agent          TEXT,
    created_at_utc REAL NOT NULL,
    PRIMARY KEY (store, seq)
)""",
        """CREATE INDEX IF NOT EXISTS chatflow_memory_versions_by_path
    ON chatflow_memory_versions (store, path, seq)""",
        """CREATE INDEX IF NOT EXISTS chatflow_memory_versions_by_previous_path
    ON chatflow_memory_versions (store, previous_path, seq) WHERE previous_path IS NOT NULL""",
        """CREATE VIRTUAL TABLE IF NOT EXISTS chatflow_memory_fts USING fts5(
    words, tokenize = "ascii tokenchars '_'"
)""",
    ],
)

_VERSION_COLUMNS = ("store, seq, path, op, text, previous_path, reverts, session_id, turn, agent, created_at_utc")


def _version(r: tuple[object, ...]) -> DocumentVersion:
    from ...resources.documents import Author, DocumentVersion

    store, seq, path, op, text, previous, reverts, session_id, turn, agent, created = r
    return DocumentVersion(str(store), int(seq), str(path), op, text,  # type: ignore[arg-type,call-overload]
                           Author(session_id, turn, agent), float(created), previous, reverts)  # type: ignore[arg-type]


def _words(path: str, text: str) -> str:
    from ..search import words_of

    return " ".join(words_of(path + "\n" + text))


class SQLiteMemoryStoreTx(_MemoryStoreTx):
    """Needs ``self.c``: the transaction's connection."""

    @property
    def c(self) -> sqlite3.Connection:
        raise NotImplementedError

    def ms_get(self, name: str, *, for_update: bool = False) -> MemoryStoreInfo | None:
        # for_update: a write transaction (BEGIN IMMEDIATE) holds the database's write lock already
        r = self.c.execute("SELECT name, description, created_at_utc, last_seq FROM chatflow_memory_stores "
                           "WHERE name = ?", (name,)).fetchone()
        from ...resources.documents import MemoryStoreInfo

        return None if r is None else MemoryStoreInfo(r[0], r[1], r[2], r[3])

    def ms_insert(self, name: str, description: str, now: float) -> None:
        self.c.execute("INSERT INTO chatflow_memory_stores (name, description, created_at_utc) VALUES (?, ?, ?)",
                       (name, description, now))

    def ms_set_seq(self, name: str, seq: int) -> None:
        self.c.execute("UPDATE chatflow_memory_stores SET last_seq = ? WHERE name = ?", (seq, name))

    def ms_list(self) -> list[MemoryStoreInfo]:
        rows = self.c.execute(
            "SELECT s.name, s.description, s.created_at_utc, s.last_seq, COUNT(d.doc_id), "
            "COALESCE(SUM(d.size_bytes), 0) FROM chatflow_memory_stores AS s "
            "LEFT JOIN chatflow_memory_documents AS d ON d.store = s.name GROUP BY s.name ORDER BY s.name").fetchall()
        from ...resources.documents import MemoryStoreInfo

        return [MemoryStoreInfo(*r) for r in rows]

    def ms_delete(self, name: str) -> bool:
        c = self.c
        c.execute("DELETE FROM chatflow_memory_fts WHERE rowid IN "
                  "(SELECT doc_id FROM chatflow_memory_documents WHERE store = ?)", (name,))
        c.execute("DELETE FROM chatflow_memory_documents WHERE store = ?", (name,))
        c.execute("DELETE FROM chatflow_memory_versions WHERE store = ?", (name,))
        return c.execute("DELETE FROM chatflow_memory_stores WHERE name = ?", (name,)).rowcount > 0

    def doc_get(self, store: str, path: str) -> Document | None:
        r = self.c.execute("SELECT text, version, updated_at_utc FROM chatflow_memory_documents "
                           "WHERE store = ? AND path = ?", (store, path)).fetchone()
        from ...resources.documents import Document

        return None if r is None else Document(store, path, r[0], r[1], r[2])

    def doc_put(self, store: str, path: str, text: str, version: int, now: float) -> None:
        c = self.c
        doc_id = c.execute(
            "INSERT INTO chatflow_memory_documents (store, path, text, size_bytes, version, updated_at_utc) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (store, path) DO UPDATE SET text = excluded.text, "
            "size_bytes = excluded.size_bytes, version = excluded.version, updated_at_utc = excluded.updated_at_utc "
            "RETURNING doc_id", (store, path, text, len(text.encode("utf-8")), version, now)).fetchone()[0]
        c.execute("DELETE FROM chatflow_memory_fts WHERE rowid = ?", (doc_id,))
        c.execute("INSERT INTO chatflow_memory_fts (rowid, words) VALUES (?, ?)", (doc_id, _words(path, text)))

    def doc_delete(self, store: str, path: str) -> None:
        c = self.c
        c.execute("DELETE FROM chatflow_memory_fts WHERE rowid IN "
                  "(SELECT doc_id FROM chatflow_memory_documents WHERE store = ? AND path = ?)", (store, path))
        c.execute("DELETE FROM chatflow_memory_documents WHERE store = ? AND path = ?", (store, path))

    def _under(self, store: str, folder: str, columns: str) -> list[tuple[object, ...]]:
        if not folder:
            return self.c.execute(f"SELECT {columns} FROM chatflow_memory_documents WHERE store = ? ORDER BY path",
                                  (store,)).fetchall()
        # paths under folder/: substr compares characters exactly (no LIKE wildcards, no collation)
        prefix = folder + "/"
        return self.c.execute(
            f"SELECT {columns} FROM chatflow_memory_documents WHERE store = ? AND substr(path, 1, ?) = ? "
            "ORDER BY path", (store, len(prefix), prefix)).fetchall()

    def doc_first_under(self, store: str, folder: str) -> str | None:
        # the (store, path) index: paths from folder/ to folder0 (the next character after '/')
        r = self.c.execute("SELECT path FROM chatflow_memory_documents WHERE store = ? AND path >= ? AND path < ? "
                           "LIMIT 1", (store, folder + "/", folder + "0")).fetchone()
        return None if r is None else str(r[0])

    def doc_list(self, store: str, folder: str) -> list[DocumentInfo]:
        from ...resources.documents import DocumentInfo

        return [DocumentInfo(*r) for r in self._under(store, folder, "path, size_bytes, version, updated_at_utc")]  # type: ignore[arg-type]

    def doc_texts(self, store: str, folder: str) -> list[Document]:
        from ...resources.documents import Document

        return [Document(store, *r) for r in self._under(store, folder, "path, text, version, updated_at_utc")]  # type: ignore[arg-type]

    def version_add(self, version: DocumentVersion) -> None:
        a = version.author
        self.c.execute(
            f"INSERT INTO chatflow_memory_versions ({_VERSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (version.store, version.seq, version.path, version.op, version.text, version.previous_path,
             version.reverts, a.session_id, a.turn, a.agent, version.created_at))

    def versions(self, store: str, path: str | None, after_seq: int, limit: int | None) -> list[DocumentVersion]:
        sql = f"SELECT {_VERSION_COLUMNS} FROM chatflow_memory_versions WHERE store = ? AND seq > ?"
        args: list[object] = [store, after_seq]
        if path is not None:
            sql += " AND (path = ? OR previous_path = ?)"
            args += [path, path]
        sql += " ORDER BY seq LIMIT ?"
        args.append(-1 if limit is None else limit)
        return [_version(r) for r in self.c.execute(sql, args).fetchall()]

    def version_get(self, store: str, seq: int) -> DocumentVersion | None:
        r = self.c.execute(f"SELECT {_VERSION_COLUMNS} FROM chatflow_memory_versions WHERE store = ? AND seq = ?",
                           (store, seq)).fetchone()
        return None if r is None else _version(r)

    def last_version_touching(self, store: str, path: str, before_seq: int | None) -> DocumentVersion | None:
        below = (1 << 62) if before_seq is None else before_seq
        r = self.c.execute(
            f"SELECT {_VERSION_COLUMNS} FROM chatflow_memory_versions WHERE store = ? AND seq < ? AND "
            "(path = ? OR previous_path = ?) ORDER BY seq DESC LIMIT 1", (store, below, path, path)).fetchone()
        return None if r is None else _version(r)

    def doc_search(self, query: Query, stores: list[str] | None, limit: int) -> list[MemoryHit]:
        # The index ranks first and the page is cut there (bm25 of every match, then LIMIT):
        # only the page's documents are read. Limited to some stores, the documents are joined first,
        # unless the stores named are every store there is (a session mounting each one).
        from ...resources.documents import MemoryHit
        from ..search import to_fts5

        if stores is not None and self.c.execute(
                "SELECT NOT EXISTS (SELECT 1 FROM chatflow_memory_stores WHERE name NOT IN "
                "(SELECT value FROM json_each(?)))", (json.dumps(stores),)).fetchone()[0]:
            stores = None
        if stores is None:
            sql = ("SELECT d.store, d.path, d.text, d.version, d.updated_at_utc, f.rank FROM "
                   "(SELECT rowid, rank FROM chatflow_memory_fts WHERE chatflow_memory_fts MATCH ? "
                   "ORDER BY rank LIMIT ?) AS f JOIN chatflow_memory_documents AS d ON d.doc_id = f.rowid "
                   "ORDER BY f.rank")
            args: list[object] = [to_fts5(query), limit]
        else:
            sql = ("SELECT d.store, d.path, d.text, d.version, d.updated_at_utc, f.rank FROM chatflow_memory_fts AS f "
                   "JOIN chatflow_memory_documents AS d ON d.doc_id = f.rowid WHERE chatflow_memory_fts MATCH ? "
                   "AND d.store IN (SELECT value FROM json_each(?)) ORDER BY f.rank LIMIT ?")
            args = [to_fts5(query), json.dumps(stores), limit]
        return [MemoryHit(store, path, doc_snippet(query, path, text), float(rank), version, updated)
                for store, path, text, version, updated, rank in self.c.execute(sql, args).fetchall()]
