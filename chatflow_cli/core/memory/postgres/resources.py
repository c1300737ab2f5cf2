"""Memory stores of the PostgreSQL store: three tables, a ``tsvector`` of each document's
words with a GIN index, added by one migration (:data:`MIGRATION`), and the primitives over
them (:class:`PgMemoryStoreTx`).

A write locks its store's row (``SELECT ... FOR UPDATE``) before it reads the document or
the store's ``last_seq``: writes of one store, from any number of workers, are serialised
there and numbered without a gap; the row lock is held only by the write's short
transaction. The vector holds the same folded words the session search indexes (the
document's path and text), so both searches find the same things.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...resources.documents import Author, Document, DocumentInfo, DocumentVersion, MemoryHit, MemoryStoreInfo
from .._memstore_port import _MemoryStoreTx, doc_snippet
from ..search import Query

if TYPE_CHECKING:
    import psycopg

__all__ = ["MIGRATION", "PgMemoryStoreTx"]

#: The migration that adds memory stores (its number is given where it is listed).
MIGRATION: tuple[str, list[str]] = (
    "memory stores: documents, their versioned writes, a tsvector of their words",
    [
        """CREATE TABLE IF NOT EXISTS chatflow_memory_stores (
    name           text PRIMARY KEY,          -- a-z 0-9 _ . - (resources.mounts.check_resource_name)
    description    text NOT NULL DEFAULT '',
    created_at_utc double precision NOT NULL,
    last_seq       bigint NOT NULL DEFAULT 0  -- the seq of the store's last write, advanced under the row lock
)""",
        """CREATE TABLE IF NOT EXISTS chatflow_memory_documents (
    store          text NOT NULL REFERENCES chatflow_memory_stores (name) ON DELETE CASCADE,
    path           text NOT NULL,
    text           text NOT NULL,
    size_bytes     integer NOT NULL,          -- of the text in UTF-8
    version        bigint NOT NULL,           -- the seq of its last write
    updated_at_utc double precision NOT NULL,
    search_vector  tsvector,                  -- the words of path and text (memory.search.words_of)
    PRIMARY KEY (store, path)
)""",
        """CREATE INDEX IF NOT EXISTS chatflow_memory_documents_search
    ON chatflow_memory_documents USING gin (search_vector)""",
        """CREATE TABLE IF NOT EXISTS chatflow_memory_versions (
    store          text NOT NULL REFERENCES chatflow_memory_stores (name) ON DELETE CASCADE,
    seq            bigint NOT NULL,           -- 1, 2, 3... per store, no gap
    path           text NOT NULL,
    op             text NOT NULL,             -- create, write, str_replace, insert, delete, rename, revert, import
    text           text,                      -- the document after the write; NULL: deleted
    previous_path  text,                      -- a rename's old path (gone after the write)
    reverts        bigint,                    -- the seq a revert undid
    session_id     text,                      -- who wrote it: NULL outside a session
    turn           integer,
    agent          text,
    created_at_utc double precision NOT NULL,
    PRIMARY KEY (store, seq)
)""",
        """CREATE INDEX IF NOT EXISTS chatflow_memory_versions_by_path
    ON chatflow_memory_versions (store, path, seq)""",
        """CREATE INDEX IF NOT EXISTS chatflow_memory_versions_by_previous_path
    ON chatflow_memory_versions (store, previous_path, seq) WHERE previous_path IS NOT NULL""",
    ],
)

_VERSION_COLUMNS = "store, seq, path, op, text, previous_path, reverts, session_id, turn, agent, created_at_utc"


def _version(r: Any) -> DocumentVersion:
    store, seq, path, op, text, previous, reverts, session_id, turn, agent, created = r
    return DocumentVersion(store, int(seq), path, op, text, Author(session_id, turn, agent), float(created),
                           previous, None if reverts is None else int(reverts))


class PgMemoryStoreTx(_MemoryStoreTx):
    """Needs ``self._x(sql, params)`` (a statement of the transaction), :meth:`_vector` and :meth:`_tsquery`."""

    def _x(self, sql: str, params: Any = None) -> psycopg.Cursor[Any]:
        raise NotImplementedError

    @staticmethod
    def _vector(path: str, text: str) -> str | None:
        """The ``tsvector`` literal of a document's path and text (the store's search code)."""
        raise NotImplementedError

    @staticmethod
    def _tsquery(query: Query) -> str:
        """The ``tsquery`` literal of ``query`` over those vectors (the store's search code)."""
        raise NotImplementedError

    def ms_get(self, name: str, *, for_update: bool = False) -> MemoryStoreInfo | None:
        r = self._x("SELECT name, description, created_at_utc, last_seq FROM chatflow_memory_stores WHERE name = %s"
                    + (" FOR UPDATE" if for_update else ""), (name,)).fetchone()
        return None if r is None else MemoryStoreInfo(r[0], r[1], float(r[2]), int(r[3]))

    def ms_insert(self, name: str, description: str, now: float) -> None:
        self._x("INSERT INTO chatflow_memory_stores (name, description, created_at_utc) VALUES (%s, %s, %s) "
                "ON CONFLICT (name) DO NOTHING", (name, description, now))

    def ms_set_seq(self, name: str, seq: int) -> None:
        self._x("UPDATE chatflow_memory_stores SET last_seq = %s WHERE name = %s", (seq, name))

    def ms_list(self) -> list[MemoryStoreInfo]:
        rows = self._x(
            "SELECT s.name, s.description, s.created_at_utc, s.last_seq, COUNT(d.path), "
            "COALESCE(SUM(d.size_bytes), 0) FROM chatflow_memory_stores AS s "
            "LEFT JOIN chatflow_memory_documents AS d ON d.store = s.name GROUP BY s.name ORDER BY s.name COLLATE \"C\""
        ).fetchall()
        return [MemoryStoreInfo(r[0], r[1], float(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in rows]

    def ms_delete(self, name: str) -> bool:
        self._x("DELETE FROM chatflow_memory_documents WHERE store = %s", (name,))
        self._x("DELETE FROM chatflow_memory_versions WHERE store = %s", (name,))
        # RETURNING, not rowcount: in pipeline mode a count is known only once results are read
        return bool(self._x("DELETE FROM chatflow_memory_stores WHERE name = %s RETURNING 1", (name,)).fetchall())

    def doc_get(self, store: str, path: str) -> Document | None:
        r = self._x("SELECT text, version, updated_at_utc FROM chatflow_memory_documents "
                    "WHERE store = %s AND path = %s", (store, path)).fetchone()
        return None if r is None else Document(store, path, r[0], int(r[1]), float(r[2]))

    def doc_put(self, store: str, path: str, text: str, version: int, now: float) -> None:
        self._x(
            "INSERT INTO chatflow_memory_documents (store, path, text, size_bytes, version, updated_at_utc, "
            "search_vector) VALUES (%s, %s, %s, %s, %s, %s, %s::tsvector) ON CONFLICT (store, path) DO UPDATE SET "
            "text = excluded.text, size_bytes = excluded.size_bytes, version = excluded.version, "
            "updated_at_utc = excluded.updated_at_utc, search_vector = excluded.search_vector",
            (store, path, text, len(text.encode("utf-8")), version, now, self._vector(path, text)))

    def doc_delete(self, store: str, path: str) -> None:
        self._x("DELETE FROM chatflow_memory_documents WHERE store = %s AND path = %s", (store, path))

    def _under(self, store: str, folder: str, columns: str) -> list[Any]:
        if not folder:
            return self._x(f"SELECT {columns} FROM chatflow_memory_documents WHERE store = %s "
                           "ORDER BY path COLLATE \"C\"", (store,)).fetchall()
        prefix = folder + "/"
        return self._x(f"SELECT {columns} FROM chatflow_memory_documents WHERE store = %s AND "
                       "left(path, %s) = %s ORDER BY path COLLATE \"C\"", (store, len(prefix), prefix)).fetchall()

    def doc_first_under(self, store: str, folder: str) -> str | None:
        prefix = folder + "/"
        r = self._x("SELECT path FROM chatflow_memory_documents WHERE store = %s AND left(path, %s) = %s LIMIT 1",
                    (store, len(prefix), prefix)).fetchone()
        return None if r is None else str(r[0])

    def doc_list(self, store: str, folder: str) -> list[DocumentInfo]:
        return [DocumentInfo(r[0], int(r[1]), int(r[2]), float(r[3]))
                for r in self._under(store, folder, "path, size_bytes, version, updated_at_utc")]

    def doc_texts(self, store: str, folder: str) -> list[Document]:
        return [Document(store, r[0], r[1], int(r[2]), float(r[3]))
                for r in self._under(store, folder, "path, text, version, updated_at_utc")]

    def version_add(self, version: DocumentVersion) -> None:
        a = version.author
        self._x(
            f"INSERT INTO chatflow_memory_versions ({_VERSION_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (version.store, version.seq, version.path, version.op, version.text, version.previous_path,
             version.reverts, a.session_id, a.turn, a.agent, version.created_at))

    def versions(self, store: str, path: str | None, after_seq: int, limit: int | None) -> list[DocumentVersion]:
        sql = f"SELECT {_VERSION_COLUMNS} FROM chatflow_memory_versions WHERE store = %s AND seq > %s"
        args: list[Any] = [store, after_seq]
        if path is not None:
            sql += " AND (path = %s OR previous_path = %s)"
            args += [path, path]
        sql += " ORDER BY seq LIMIT %s"
        args.append(limit)
        return [_version(r) for r in self._x(sql, args).fetchall()]

    def version_get(self, store: str, seq: int) -> DocumentVersion | None:
        r = self._x(f"SELECT {_VERSION_COLUMNS} FROM chatflow_memory_versions WHERE store = %s AND seq = %s",
                    (store, seq)).fetchone()
        return None if r is None else _version(r)

    def last_version_touching(self, store: str, path: str, before_seq: int | None) -> DocumentVersion | None:
        below = (1 << 62) if before_seq is None else before_seq
        r = self._x(
            f"SELECT {_VERSION_COLUMNS} FROM chatflow_memory_versions WHERE store = %s AND seq < %s AND "
            "(path = %s OR previous_path = %s) ORDER BY seq DESC LIMIT 1", (store, below, path, path)).fetchone()
        return None if r is None else _version(r)

    def doc_search(self, query: Query, stores: list[str] | None, limit: int) -> list[MemoryHit]:
        sql = ("SELECT d.store, d.path, d.text, d.version, d.updated_at_utc, ts_rank_cd(d.search_vector, q.q) AS r "
               "FROM (SELECT %s::tsquery AS q) AS q, chatflow_memory_documents AS d WHERE d.search_vector @@ q.q")
        args: list[Any] = [self._tsquery(query)]
        if stores is not None:
            sql += " AND d.store = ANY(%s)"
            args.append(list(stores))
        sql += " ORDER BY r DESC, d.store COLLATE \"C\", d.path COLLATE \"C\" LIMIT %s"
        args.append(limit)
        return [MemoryHit(store, path, doc_snippet(query, path, text), -float(rank), int(version),
                          float(updated))
                for store, path, text, version, updated, rank in self._x(sql, args).fetchall()]

