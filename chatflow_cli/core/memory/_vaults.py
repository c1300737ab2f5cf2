"""The vault catalogue of a store: vault names and entry names with where each value lives.

Values are never stored here (see :mod:`chatflow_cli.core.resources.vaults`). A backend
implements the five primitives of :class:`_VaultTx` on its transaction; the rules (names
checked, an unknown vault refused, one short transaction a call) are :class:`_Vaults`, which
:class:`~chatflow_cli.core.memory.base.BaseSessionStore` composes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UsageError, VaultNotFoundError
from ..resources.secrets import quoted_name
from ._core import _StoreCore

if TYPE_CHECKING:  # pragma: no cover
    from ..resources.vaults import VaultEntry, VaultInfo

# resources.vaults is imported by the methods that use it: a store whose vaults are never
# touched does not pay for it

__all__ = ["_VaultTx", "_Vaults", "check_location"]


def check_location(location: str) -> str:
    """``location`` when it is ``keyring``, ``file`` or ``env:VAR``. Raises UsageError."""
    if location in ("keyring", "file") or (location.startswith("env:") and len(location) > 4):
        return location
    raise UsageError("a vault entry lives in keyring, file or env:VAR, not elsewhere")


class _VaultTx:
    """The vault primitives of a backend's transaction (rows only; no rule)."""

    def vault_list(self, name: str | None) -> list[VaultInfo]:
        """Every vault (``name`` None) or the one called ``name``, with entries, by name."""
        raise NotImplementedError

    def vault_insert(self, name: str, at: float) -> bool:
        """Insert an empty vault; False when one of that name exists."""
        raise NotImplementedError

    def vault_put_entry(self, vault: str, entry: str, location: str, at: float) -> None:
        """Insert or replace an entry of an existing vault."""
        raise NotImplementedError

    def vault_delete_entry(self, vault: str, entry: str) -> bool:
        raise NotImplementedError

    def vault_delete(self, name: str) -> bool:
        """Delete a vault and its entries."""
        raise NotImplementedError


class _Vaults(_StoreCore):
    """The vault catalogue (:class:`~chatflow_cli.core.resources.vaults.VaultCatalog`)."""

    def create_vault(self, name: str) -> VaultInfo:
        """Create the empty vault ``name`` (one write transaction).

        Raises:
            UsageError: the name is not valid (or looks like a credential), or the vault exists.
        """
        from ..resources.vaults import VaultInfo, check_name

        check_name(name, new=True)
        at = self.clock()
        with self._write() as tx:
            if not tx.vault_insert(name, at):  # type: ignore[attr-defined]
                raise UsageError(f"vault {name!r} exists already (chatflow vault ls {name} shows its entries)")
        return VaultInfo(name, at)

    def get_vault(self, name: str) -> VaultInfo | None:
        """The vault ``name`` with its entries, or None."""
        with self._read() as tx:
            found: list[VaultInfo] = tx.vault_list(name)  # type: ignore[attr-defined]
        return found[0] if found else None

    def list_vaults(self) -> list[VaultInfo]:
        """Every vault with its entries, by name."""
        with self._read() as tx:
            return list(tx.vault_list(None))  # type: ignore[attr-defined]

    def set_vault_entry(self, vault: str, entry: str, location: str) -> VaultEntry:
        """Add or replace ``entry`` of ``vault``, whose value lives at ``location``.

        Raises:
            UsageError: a bad name (an entry's looking like a credential too) or location.
            VaultNotFoundError: no such vault.
        """
        from ..resources.vaults import VaultEntry, check_name, check_stored_name

        check_stored_name(vault)
        check_name(entry, "entry", new=True)
        check_location(location)
        at = self.clock()
        with self._write() as tx:
            if not tx.vault_list(vault):  # type: ignore[attr-defined]
                raise VaultNotFoundError(f"no vault {quoted_name(vault)}")
            tx.vault_put_entry(vault, entry, location, at)  # type: ignore[attr-defined]
        return VaultEntry(entry, location, at)

    def delete_vault_entry(self, vault: str, entry: str) -> bool:
        """Remove ``entry`` of ``vault``; False when there was none."""
        with self._write() as tx:
            return bool(tx.vault_delete_entry(vault, entry))  # type: ignore[attr-defined]

    def delete_vault(self, name: str) -> bool:
        """Remove the vault ``name`` and its entries; False when there was none."""
        with self._write() as tx:
            return bool(tx.vault_delete(name))  # type: ignore[attr-defined]
