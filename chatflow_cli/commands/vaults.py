"""``chatflow vault ...``: create vaults, set, list and remove their entries.

A value is read from the terminal without echo, or from stdin when it is not a terminal; never
from the command line, where it would stay in the shell's history and the process list. A
value is one line: all of stdin with one trailing newline dropped, and a value with more lines
is refused (exit 2) unless ``--multiline`` keeps them; at a terminal, one line typed or pasted
(a paste of several lines is refused and discarded, never left for the shell), or with
``--multiline`` every line up to Ctrl-D. No message quotes a name that may hold a value. Where it lives is decided by
:class:`~chatflow_cli.core.resources.vaults.Vaults` (the keyring when one is usable, else the
owner-only file in the data directory), or ``--env VAR`` records a reference to a variable.
Listings show names and locations, never values.
"""

from __future__ import annotations

import os
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


def _one_newline_dropped(text: str) -> str:
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def _read_terminal(state: State, prompt: str, *, multiline: bool) -> tuple[str, bool]:
    """What is typed at the terminal (stdin), not shown: one line, or with ``multiline`` every
    line up to Ctrl-D. Returns ``(text, more)``: ``more`` is True when more was pasted after
    the first line (it is discarded with the terminal's pending input, never left for the
    shell). Ctrl-C raises KeyboardInterrupt; the terminal is restored in every case."""
    try:
        import select
        import termios
    except ImportError:  # pragma: no cover - not POSIX: one line, as getpass reads it
        import getpass

        return getpass.getpass(prompt), False
    fd = state.env.stdin.fileno()
    old = termios.tcgetattr(fd)
    quiet = list(old)
    quiet[3] &= ~termios.ECHO
    err = state.env.stderr
    chunks: list[bytes] = []
    more = False
    termios.tcsetattr(fd, termios.TCSADRAIN, quiet)  # before the prompt: nothing typed after it is shown
    try:
        err.write(prompt)
        err.flush()
        while True:
            data = os.read(fd, 65536)
            if not data:  # Ctrl-D
                break
            chunks.append(data)
            if not multiline and b"\n" in data:
                more = data.index(b"\n") < len(data) - 1 or bool(select.select([fd], [], [], 0.2)[0])
                break
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, old)  # what else was pasted is dropped here
        err.write("\n")
        err.flush()
    raw = b"".join(chunks)
    try:
        return raw.decode("utf-8"), more
    except UnicodeDecodeError as exc:
        raise UsageError(f"the vault value typed is not valid UTF-8 (bad byte at offset {exc.start})") from None


def _read_value(state: State, vault: str, entry: str, *, multiline: bool) -> str:
    more = False
    if state.env.stdin_isatty:
        end = " (not shown; end with Ctrl-D on a line of its own)" if multiline else " (not shown)"
        text, more = _read_terminal(state, f"value of {vault}/{entry}{end}: ", multiline=multiline)
    else:
        text = read_stdin_text(state, what="vault value")
    value = _one_newline_dropped(text)
    if not value:
        raise UsageError(f"no value for {vault}/{entry}: type it at the prompt, or pipe it on stdin")
    if not multiline and (more or "\n" in value or "\r" in value):
        count = len(value.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
        lines = "more than one line was pasted" if more else f"the value has {count} lines"
        raise UsageError(
            f"{lines}, and a vault value is one line: nothing was stored. From a password manager, give its first "
            f"line (pass show NAME | head -n 1 | chatflow vault set {vault} {entry}); --multiline keeps every line "
            "(a PEM key)")
    return value


def set_entry(state: State, vault: str, entry: str, *, given: str | None, env: str | None,
              location: str | None, as_json: bool, multiline: bool = False) -> None:
    """``vault set NAME ENTRY``: the value from the terminal or stdin, or ``--env VAR``.

    Raises:
        UsageError: a value given as an argument, a bad name (never echoed), a value too short
            or of several lines (without ``multiline``), a vault made before today's name rule.
        VaultNotFoundError: no such vault.
        VaultStorageError: the keyring or the file failed.
    """
    if given is not None:
        raise UsageError("a vault value is never taken from the command line (it would stay in your shell history "
                         "and the process list): run chatflow vault set NAME ENTRY and type it, or pipe it on stdin")
    from ..core.resources.vaults import check_env_name, check_name, refuse_legacy

    check_name(entry, "entry", new=True)
    if env is not None:
        check_env_name(env)
        if multiline:
            raise UsageError("--env records a variable's name: it does not go with --multiline")
    vaults = open_vaults(state)
    vaults.get_vault(vault)  # before asking for the value: an unknown vault fails first
    refuse_legacy(vault)
    if env is not None:
        if location is not None:
            raise UsageError("--env records a variable's name: it goes with neither --keyring nor --file")
        stored = vaults.set(vault, entry, env=env)
    else:
        value = _read_value(state, vault, entry, multiline=multiline)
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
    if name is not None:
        from ..core.resources.vaults import check_stored_name

        check_stored_name(name)
    store = state.store(create=False)
    if store is None:
        if name is not None:
            from ..core.resources.vaults import no_vault_error

            raise no_vault_error(name, "none")
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
    from ..core.resources.secrets import may_show

    vaults = open_vaults(state)
    info = vaults.get_vault(name)
    # a vault made before the name rule (Work2) is removed without its name being shown
    shown = f"vault {name}" if may_show(name) else "the vault given"
    if entry is None and info.entries and not yes and state.env.stdin_isatty:
        what = ", ".join(e.name if may_show(e.name, entry=True) else "(not shown)" for e in info.entries)
        if not confirm(state, f"Remove {shown} and its entries ({what})? Their values are deleted.",
                       assume_yes=False):
            notice(state, "nothing removed")
            return
    vaults.remove(name, entry)
    if entry is None:
        notice(state, f"removed {shown}")
    else:
        notice(state, f"removed entry {entry if may_show(entry, entry=True) else '(not shown)'} of {shown}")
