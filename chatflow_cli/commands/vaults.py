"""``chatflow vault ...``: create vaults, set, list and remove their entries.

A value is read from the terminal without echo (``getpass``), or from stdin when it is not a
terminal (one trailing newline dropped); never from the command line, where it would stay in
the shell's history and the process list. Where it lives is decided by
:class:`~chatflow_cli.core.resources.vaults.Vaults` (the keyring when one is usable, else the
owner-only file in the data directory), or ``--env VAR`` records a reference to a variable.
Listings show names and locations, never values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..context import confirm, notice, read_stdin_text
from ..core.errors import UsageError
from ..render import dumps, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State
    from ..core.resources.vaults import VaultInfo, Vaults

__all__ = ["create_vault", "list_vaults", "open_vaults", "remove_vault", "set_entry"]


def open_vaults(state: State) -> Vaults:
    """The vaults of the run's store, with the vault file in the run's data directory."""
    from ..core.resources.vaults import Vaults

    return Vaults(state.open_store(), state.settings().data_dir)


def create_vault(state: State, name: str) -> None:
    """``vault create NAME``. Raises UsageError (bad name, or the vault exists)."""
    vaults = open_vaults(state)
    vaults.create(name)
    notice(state, f"created vault {name}; add an entry with: chatflow vault set {name} ENTRY")


def _read_value(state: State, vault: str, entry: str) -> str:
    if state.env.stdin_isatty:
        import getpass

        try:
            value = getpass.getpass(f"value of {vault}/{entry} (not shown): ", stream=None)
        except EOFError:
            value = ""
    else:
        value = read_stdin_text(state, what="vault value")
        if value.endswith("\r\n"):
            value = value[:-2]
        elif value.endswith("\n"):
            value = value[:-1]
    if not value:
        raise UsageError(f"no value for {vault}/{entry}: type it at the prompt, or pipe it on stdin")
    return value


def set_entry(state: State, vault: str, entry: str, *, given: str | None, env: str | None,
              location: str | None, as_json: bool) -> None:
    """``vault set NAME ENTRY``: the value from the terminal or stdin, or ``--env VAR``.

    Raises:
        UsageError: a value given as an argument, a bad name, a value too short.
        VaultNotFoundError: no such vault.
        VaultStorageError: the keyring or the file failed.
    """
    if given is not None:
        raise UsageError("a vault value is never taken from the command line (it would stay in your shell history "
                         f"and the process list): run chatflow vault set {vault} {entry} and type it, or pipe it on "
                         "stdin")
    vaults = open_vaults(state)
    from ..core.resources.vaults import check_name

    check_name(entry, "entry")
    vaults.get_vault(vault)  # before asking for the value: an unknown vault fails first
    if env is not None:
        if location is not None:
            raise UsageError("--env records a variable's name: it goes with neither --keyring nor --file")
        stored = vaults.set(vault, entry, env=env)
    else:
        value = _read_value(state, vault, entry)
        if location == "file" or (location is None and vaults.default_location() == "file"):
            from ..config import ensure_private_dir

            ensure_private_dir(vaults.file.directory)
        stored = vaults.set(vault, entry, value, location=location)
    if as_json:
        state.env.stdout.write(dumps(_entry_row(vaults, stored.name, stored.location, stored.updated_at)) + "\n")
    notice(state, f"set {vault}/{entry} in {vaults.describe(stored.location)}")


def _entry_row(vaults: Vaults, name: str, location: str, updated_at: float) -> dict[str, Any]:
    return {"name": name, "location": location, "where": vaults.describe(location), "updated_at": updated_at}


def _vault_row(vaults: Vaults, info: VaultInfo) -> dict[str, Any]:
    return {"name": info.name, "created_at": info.created_at,
            "entries": [_entry_row(vaults, e.name, e.location, e.updated_at) for e in info.entries]}


def list_vaults(state: State, name: str | None, *, as_json: bool) -> None:
    """``vault ls [NAME]``: vaults and their entries' names and locations, never values.

    Raises:
        VaultNotFoundError: ``name`` names no vault.
    """
    store = state.store(create=False)
    if store is None:
        if name is not None:
            from ..core.errors import VaultNotFoundError

            raise VaultNotFoundError(f"no vault {name!r} (vaults: none; create one with: chatflow vault create "
                                     f"{name})")
        infos: list[VaultInfo] = []
        vaults = None
    else:
        from ..core.resources.vaults import Vaults

        vaults = Vaults(store, state.settings().data_dir)
        infos = [vaults.get_vault(name)] if name is not None else vaults.list()
    if as_json:
        rows = [_vault_row(vaults, i) for i in infos] if vaults is not None else []
        state.env.stdout.write(dumps(rows[0] if name is not None else rows, indent=2) + "\n")
        return
    if not infos:
        notice(state, "no vaults (create one with: chatflow vault create NAME)")
        return
    assert vaults is not None
    out = state.env.stdout
    for info in infos:
        out.write(f"{safe_text(info.name)}" + ("" if info.entries else "  (no entries)") + "\n")
        width = max((len(e.name) for e in info.entries), default=0)
        for each in info.entries:
            out.write(f"  {safe_text(each.name).ljust(width)}  {safe_text(vaults.describe(each.location))}\n")


def remove_vault(state: State, name: str, entry: str | None, *, yes: bool) -> None:
    """``vault rm NAME [ENTRY]``: remove an entry, or the vault with all its entries (on a
    terminal the user is asked first unless ``--yes``); values go from the keyring or file too.

    Raises:
        VaultNotFoundError: no such vault or entry.
    """
    vaults = open_vaults(state)
    info = vaults.get_vault(name)
    if entry is None and info.entries and not yes and state.env.stdin_isatty:
        what = ", ".join(e.name for e in info.entries)
        if not confirm(state, f"Remove vault {name} and its entries ({what})? Their values are deleted.",
                       assume_yes=False):
            notice(state, "nothing removed")
            return
    vaults.remove(name, entry)
    notice(state, f"removed {name}/{entry}" if entry is not None else f"removed vault {name}")
