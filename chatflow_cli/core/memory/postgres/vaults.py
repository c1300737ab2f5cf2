"""The PostgreSQL store's vault catalogue: its migration and its transaction primitives.

The same two tables as SQLite's (migration 9 here): ``chatflow_vaults`` and
``chatflow_vault_entries``; no column holds a value.
"""

from __future__ import annotations

from typing import Any

from ...resources.vaults import VaultEntry, VaultInfo
from .._vaults import _VaultTx

__all__ = ["MIGRATION", "PgVaultTx"]

#: ``(name, statements)`` of the migration that adds the catalogue (its number: ``schema``).
MIGRATION: tuple[str, list[str]] = (
    "vaults: their names and their entries' names and locations (never a value)",
    [
        """CREATE TABLE IF NOT EXISTS chatflow_vaults (
    name           text PRIMARY KEY,
    created_at_utc double precision NOT NULL
)""",
        """CREATE TABLE IF NOT EXISTS chatflow_vault_entries (
    vault          text NOT NULL REFERENCES chatflow_vaults (name) ON DELETE CASCADE,
    entry          text NOT NULL,
    -- keyring, file or env:VAR: where the value lives; never the value
    location       text NOT NULL CHECK (location IN ('keyring', 'file') OR location LIKE 'env:_%'),
    updated_at_utc double precision NOT NULL,
    PRIMARY KEY (vault, entry)
)""",
    ],
)


class PgVaultTx(_VaultTx):
    """The vault primitives over the transaction's connection (``self._x``). The connection is
    in pipeline mode, where a row count is not known until a result is read: every write that
    answers a question says so with ``RETURNING``."""

    def _x(self, sql: str, params: Any = None) -> Any:
        raise NotImplementedError

    def vault_list(self, name: str | None) -> list[VaultInfo]:
        where, args = ("WHERE v.name = %s", (name,)) if name is not None else ("", ())
        rows = self._x(
            "SELECT v.name, v.created_at_utc, e.entry, e.location, e.updated_at_utc FROM chatflow_vaults AS v "
            f"LEFT JOIN chatflow_vault_entries AS e ON e.vault = v.name {where} ORDER BY v.name COLLATE \"C\", "
            "e.entry COLLATE \"C\"", args).fetchall()
        out: list[VaultInfo] = []
        for vault, created, entry, location, updated in rows:
            if not out or out[-1].name != vault:
                out.append(VaultInfo(vault, created))
            if entry is not None:
                last = out[-1]
                out[-1] = VaultInfo(last.name, last.created_at, (*last.entries, VaultEntry(entry, location, updated)))
        return out

    def vault_insert(self, name: str, at: float) -> bool:
        return self._x("INSERT INTO chatflow_vaults (name, created_at_utc) VALUES (%s, %s) ON CONFLICT DO NOTHING "
                       "RETURNING name", (name, at)).fetchone() is not None

    def vault_put_entry(self, vault: str, entry: str, location: str, at: float) -> None:
        self._x(
            "INSERT INTO chatflow_vault_entries (vault, entry, location, updated_at_utc) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (vault, entry) DO UPDATE SET location = excluded.location, "
            "updated_at_utc = excluded.updated_at_utc", (vault, entry, location, at))

    def vault_delete_entry(self, vault: str, entry: str) -> bool:
        return self._x("DELETE FROM chatflow_vault_entries WHERE vault = %s AND entry = %s RETURNING entry",
                       (vault, entry)).fetchone() is not None

    def vault_delete(self, name: str) -> bool:
        self._x("DELETE FROM chatflow_vault_entries WHERE vault = %s", (name,))
        return self._x("DELETE FROM chatflow_vaults WHERE name = %s RETURNING name", (name,)).fetchone() is not None
