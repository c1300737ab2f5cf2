"""The SQLite store's attachments: their migration and their transaction primitives.

Two tables (migration 11): ``chatflow_attachments`` (the bytes, once per SHA-256) and
``chatflow_attachment_refs`` (which session references which hash). A message's JSON holds
only the metadata (:class:`~chatflow_cli.core.attachments.Attachment`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ...attachments import Attachment
from .._attachments import _AttachmentTx

__all__ = ["MIGRATION", "SQLiteAttachmentTx"]

#: ``(name, statements)`` of the migration that adds the tables (its number: ``schema``).
MIGRATION: tuple[str, list[str]] = (
    "attachments: their bytes once by content hash, and the sessions that reference them",
    [
        """CREATE TABLE IF NOT EXISTS chatflow_attachments (
    sha256     TEXT PRIMARY KEY,            -- hex SHA-256 of data
    media_type TEXT NOT NULL,
    size       INTEGER NOT NULL,
    data       BLOB NOT NULL
)""",
        """CREATE TABLE IF NOT EXISTS chatflow_attachment_refs (
    session_id TEXT NOT NULL REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    sha256     TEXT NOT NULL,
    PRIMARY KEY (session_id, sha256)
) WITHOUT ROWID""",
        "CREATE INDEX IF NOT EXISTS chatflow_attachment_refs_by_hash ON chatflow_attachment_refs (sha256)",
    ],
)


class SQLiteAttachmentTx(_AttachmentTx):
    """The attachment primitives over the transaction's connection (``self.c``)."""

    @property
    def c(self) -> sqlite3.Connection:
        raise NotImplementedError

    def attachments_add(self, session_id: str, attachments: Sequence[Attachment]) -> None:
        c = self.c
        c.executemany("INSERT OR IGNORE INTO chatflow_attachments (sha256, media_type, size, data) VALUES (?, ?, ?, ?)",
                      [(a.sha256, a.media_type, a.size, a.data) for a in attachments if a.data is not None])
        c.executemany("INSERT OR IGNORE INTO chatflow_attachment_refs (session_id, sha256) VALUES (?, ?)",
                      [(session_id, a.sha256) for a in attachments])

    def attachments_drop_session(self, session_id: str) -> None:
        c = self.c
        hashes = [h for (h,) in c.execute("SELECT sha256 FROM chatflow_attachment_refs WHERE session_id = ?",
                                          (session_id,))]
        if not hashes:
            return
        c.execute("DELETE FROM chatflow_attachment_refs WHERE session_id = ?", (session_id,))
        c.executemany("DELETE FROM chatflow_attachments WHERE sha256 = ? AND NOT EXISTS "
                      "(SELECT 1 FROM chatflow_attachment_refs AS r WHERE r.sha256 = chatflow_attachments.sha256)",
                      [(h,) for h in hashes])

    def attachment_blobs(self, hashes: Sequence[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for digest in hashes:
            row = self.c.execute("SELECT data FROM chatflow_attachments WHERE sha256 = ?", (digest,)).fetchone()
            if row is not None:
                out[digest] = bytes(row[0])
        return out

    def attachment_hashes(self, session_id: str | None) -> list[str]:
        if session_id is None:
            rows = self.c.execute("SELECT sha256 FROM chatflow_attachments ORDER BY sha256")
        else:
            rows = self.c.execute("SELECT sha256 FROM chatflow_attachment_refs WHERE session_id = ? ORDER BY sha256",
                                  (session_id,))
        return [h for (h,) in rows]
