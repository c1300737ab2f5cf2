"""Attachments in a store: their bytes once by content hash, and which sessions use them.

A message's JSON holds only each attachment's metadata (``Message.attachments``); the bytes
live in a table of their own, keyed by SHA-256, written once however many messages, forks or
imports carry the same file, and a second table says which sessions reference which hash.
A backend writes both from ``insert_message`` (:meth:`_AttachmentTx.attachments_add`) and
forgets a deleted session's references from ``delete_row``
(:meth:`_AttachmentTx.attachments_drop_session`), removing the bytes no session references
any more. Rollback and failed turns keep their messages in the log, so their attachments
stay until the session is deleted. Loading a window never reads the bytes: the Runner asks
:meth:`_Attachments.attachment_data` for them when it builds a request; nor does it parse the
metadata, until a message's attachments are read (:func:`~chatflow_cli.core.messages.stored_message`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..attachments import Attachment
from ._core import _StoreCore

__all__ = ["_AttachmentTx", "_Attachments"]


class _AttachmentTx:
    """The attachment primitives of a backend's transaction (rows only; no rule)."""

    def attachments_add(self, session_id: str, attachments: Sequence[Attachment]) -> None:
        """Store the bytes of each attachment that has them (once per hash) and record that
        ``session_id`` references each."""
        raise NotImplementedError

    def attachments_drop_session(self, session_id: str) -> None:
        """Forget the references of ``session_id``; delete the bytes nothing references now."""
        raise NotImplementedError

    def attachment_blobs(self, hashes: Sequence[str]) -> dict[str, bytes]:
        """The stored bytes of those of ``hashes`` the store has."""
        raise NotImplementedError

    def attachment_hashes(self, session_id: str | None) -> list[str]:
        """The hashes ``session_id`` references (None: every hash stored), sorted."""
        raise NotImplementedError


class _Attachments(_StoreCore):
    """Reading attachments' bytes and references (one short read transaction a call)."""

    def attachment_data(self, hashes: Iterable[str]) -> dict[str, bytes]:
        """The bytes of the attachments ``hashes`` names (sha256 -> bytes), byte for byte as
        they were given; a hash the store does not hold is absent from the result."""
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        with self._read() as tx:
            return dict(tx.attachment_blobs(wanted))  # type: ignore[attr-defined]

    def attachment_hashes(self, session_id: str | None = None) -> list[str]:
        """The hashes of the attachments ``session_id``'s messages use (None: of every
        attachment the store holds), sorted."""
        with self._read() as tx:
            return list(tx.attachment_hashes(session_id))  # type: ignore[attr-defined]
