"""The PostgreSQL store's attachments: their migration and their transaction primitives.

The same two tables as SQLite's (migration 10 here): ``chatflow_attachments`` (the bytes,
once per SHA-256) and ``chatflow_attachment_refs`` (which session references which hash).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...attachments import Attachment
from .._attachments import _AttachmentTx

__all__ = ["MIGRATION", "PgAttachmentTx"]

#: ``(name, statements)`` of the migration that adds the tables (its number: ``schema``).
MIGRATION: tuple[str, list[str]] = (
    "attachments: their bytes once by content hash, and the sessions that reference them",
    [
        """CREATE TABLE IF NOT EXISTS chatflow_attachments (
    sha256     text PRIMARY KEY,            -- hex SHA-256 of data
    media_type text NOT NULL,
    size       bigint NOT NULL,
    data       bytea NOT NULL
)""",
        """CREATE TABLE IF NOT EXISTS chatflow_attachment_refs (
    session_id text NOT NULL REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    sha256     text NOT NULL,
    PRIMARY KEY (session_id, sha256)
)""",
        "CREATE INDEX IF NOT EXISTS chatflow_attachment_refs_by_hash ON chatflow_attachment_refs (sha256)",
    ],
)


class PgAttachmentTx(_AttachmentTx):
    """The attachment primitives over the transaction's connection (``self._x``)."""

    def _x(self, sql: str, params: Any = None) -> Any:
        raise NotImplementedError

    def attachments_add(self, session_id: str, attachments: Sequence[Attachment]) -> None:
        for a in attachments:
            if a.data is not None:
                self._x("INSERT INTO chatflow_attachments (sha256, media_type, size, data) VALUES (%s, %s, %s, %s) "
                        "ON CONFLICT (sha256) DO NOTHING", (a.sha256, a.media_type, a.size, a.data))
            self._x("INSERT INTO chatflow_attachment_refs (session_id, sha256) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                    (session_id, a.sha256))

    def attachments_drop_session(self, session_id: str) -> None:
        # the CTE's DELETE is not seen by the outer statement's snapshot: other sessions' refs only
        self._x(
            "WITH gone AS (DELETE FROM chatflow_attachment_refs WHERE session_id = %s RETURNING sha256) "
            "DELETE FROM chatflow_attachments AS a WHERE a.sha256 IN (SELECT sha256 FROM gone) AND NOT EXISTS "
            "(SELECT 1 FROM chatflow_attachment_refs AS r WHERE r.sha256 = a.sha256 AND r.session_id <> %s)",
            (session_id, session_id))

    def attachment_blobs(self, hashes: Sequence[str]) -> dict[str, bytes]:
        rows = self._x("SELECT sha256, data FROM chatflow_attachments WHERE sha256 = ANY(%s)", (list(hashes),))
        return {digest: bytes(data) for digest, data in rows.fetchall()}

    def attachment_hashes(self, session_id: str | None) -> list[str]:
        if session_id is None:
            rows = self._x("SELECT sha256 FROM chatflow_attachments ORDER BY sha256 COLLATE \"C\"")
        else:
            rows = self._x("SELECT sha256 FROM chatflow_attachment_refs WHERE session_id = %s "
                           "ORDER BY sha256 COLLATE \"C\"", (session_id,))
        return [h for (h,) in rows.fetchall()]
