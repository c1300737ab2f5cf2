"""The SQLite store's vault catalogue: its migration and its transaction primitives.

Two tables (migration 10): ``chatflow_vaults`` (a vault's name) and ``chatflow_vault_entries``
(an entry's name and where its value lives). No column holds a value.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from .._vaults import _VaultTx

if TYPE_CHECKING:  # pragma: no cover
    from ...resources.vaults import VaultInfo

__all__ = ["MIGRATION", "SQLiteVaultTx"]

#: ``(name, statements)`` of the migration that adds the catalogue (its number: ``schema``).
MIGRATION: tuple[str, list[str]] = (
    "vaults: their names and their entries' names and locations (never a value)",
    [
        """CREATE TABLE IF NOT EXISTS chatflow_vaults (
    name           TEXT PRIMARY KEY,     -- letters, digits, '_', '-', '.' (checked by the store)
    created_at_utc REAL NOT NULL         -- epoch seconds
)""",
        """CREATE TABLE IF NOT EXISTS chatflow_vault_entries (
    vault          TEXT NOT NULL REFERENCES chatflow_vaults (name) ON DELETE CASCADE,
    entry          TEXT NOT NULL,
    -- where the value lives: the OS keyring, the owner-only file in the data directory, or
    -- env:VAR (a variable read when a tool needs it); the value itself is never stored here
    location       TEXT NOT NULL CHECK (location IN ('keyring', 'file') OR location LIKE 'env:_%'),
    updated_at_utc REAL NOT NULL,        -- epoch seconds
    PRIMARY KEY (vault, entry)
)""",
    ],
)


class SQLiteVaultTx(_VaultTx):
    """The vault primitives over the transaction's connection (``self.c``)."""

    @property
    def c(self) -> sqlite3.Connection:
        raise NotImplementedError

    def vault_list(self, name: str | None) -> list[VaultInfo]:
        from ...resources.vaults import VaultEntry, VaultInfo

        where, args = ("WHERE v.name = ?", (name,)) if name is not None else ("", ())
        rows = self.c.execute(
            "SELECT v.name, v.created_at_utc, e.entry, e.location, e.updated_at_utc FROM chatflow_vaults AS v "
            f"LEFT JOIN chatflow_vault_entries AS e ON e.vault = v.name {where} ORDER BY v.name, e.entry",
            args).fetchall()
        out: list[VaultInfo] = []
        for vault, created, entry, location, updated in rows:
            if not out or out[-1].name != vault:
                out.append(VaultInfo(vault, created))
            if entry is not None:
                last = out[-1]
                out[-1] = VaultInfo(last.name, last.created_at, (*last.entries, VaultEntry(entry, location, updated)))
        return out

    def vault_insert(self, name: str, at: float) -> bool:
        cursor = self.c.execute("INSERT OR IGNORE INTO chatflow_vaults (name, created_at_utc) VALUES (?, ?)",
                                (name, at))
        return cursor.rowcount == 1

    def vault_put_entry(self, vault: str, entry: str, location: str, at: float) -> None:
        self.c.execute(
            "INSERT INTO chatflow_vault_entries (vault, entry, location, updated_at_utc) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (vault, entry) DO UPDATE SET location = excluded.location, "
            "updated_at_utc = excluded.updated_at_utc", (vault, entry, location, at))

    def vault_delete_entry(self, vault: str, entry: str) -> bool:
        cursor = self.c.execute("DELETE FROM chatflow_vault_entries WHERE vault = ? AND entry = ?", (vault, entry))
        return cursor.rowcount > 0

    def vault_delete(self, name: str) -> bool:
        self.c.execute("DELETE FROM chatflow_vault_entries WHERE vault = ?", (name,))
        return self.c.execute("DELETE FROM chatflow_vaults WHERE name = ?", (name,)).rowcount > 0
