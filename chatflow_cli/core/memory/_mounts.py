"""A stored session's mounts: the fold of its ``resource.mounted`` / ``resource.unmounted``
events (two indexed reads of the event log, by type)."""

from __future__ import annotations

from typing import Any

from ..resources.mounts import RESOURCE_MOUNTED, RESOURCE_UNMOUNTED, Mount, fold_mounts

__all__ = ["stored_mounts"]


def stored_mounts(tx: Any, session_id: str) -> list[Mount]:
    """The mounts in force in the stored session ``session_id`` (in the transaction ``tx``)."""
    mounted = tx.events_of_type(session_id, RESOURCE_MOUNTED, 0)
    if not mounted:
        return []
    events = sorted(mounted + tx.events_of_type(session_id, RESOURCE_UNMOUNTED, 0), key=lambda e: e.seq)
    return fold_mounts(events)
