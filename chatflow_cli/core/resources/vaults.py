"""Vaults: named sets of secrets that tools use and the model never sees.

A vault has entries (``github_token``); each entry's value lives in one of three places,
its *location*:

``keyring``
    the operating system's keyring through the ``keyring`` package (``pip install
    'chatflow-cli[vault]'``), service ``chatflow-vault:<vault>``, user name ``<entry>``.
    Used for a new value when ``keyring`` imports and its backend is usable: neither
    ``keyring.backends.fail.Keyring`` nor ``keyring.backends.null.Keyring``, nor a chain
    with no backend (``PYTHON_KEYRING_BACKEND`` chooses one, as ``keyring`` documents).
``file``
    otherwise: ``vault-secrets.json`` in the data directory, a JSON object
    ``{vault: {entry: value}}``, created with mode 0600 and replaced atomically (a
    temporary file, then ``os.replace``) under a lock file, so a crash or two writers never
    leave half a file. A file that group or other users can read or write, or that another
    user owns, is refused (:class:`~chatflow_cli.core.errors.VaultFileError`, exit 9).
``env:VAR``
    a reference to the environment variable ``VAR`` (as ``api_key_env`` is for the API
    key): nothing is stored, the variable is read each time a tool needs the value.

The session database holds only the catalogue (:class:`VaultCatalog`): vault names, entry
names and each entry's location, never a value. Every value read or written is remembered
by :mod:`chatflow_cli.core.resources.secrets` so that it is scrubbed from tool results,
events, error lines and logs.

Names (:func:`check_name`): a vault's name follows the one rule of memory stores and vaults,
:func:`~chatflow_cli.core.resources.mounts.check_resource_name` (1-64 characters of ``a-z
0-9 _ . -``, starting with a letter or a digit); an entry's name may hold uppercase letters
too (it is what a tool's ``Secret("...")`` asks for). A new name must not look like a
credential. A vault made before the rule was one (``Work2``) can still be listed and removed
(:func:`check_stored_name`), not filled or mounted. Error messages never echo a name that
breaks the rule (it may be a value typed in the wrong place). Values: at least
:data:`~chatflow_cli.core.resources.secrets.MIN_VALUE_LEN` characters, no NUL.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import ChatflowError, UsageError, VaultFileError, VaultNotFoundError, VaultStorageError
from .mounts import check_resource_name, name_problem
from .secrets import MIN_VALUE_LEN, NOT_SHOWN, may_show, quoted_name, remember_value

__all__ = [
    "FILE_NAME",
    "KEYRING_SERVICE_PREFIX",
    "MissingSecret",
    "SessionSecrets",
    "VaultCatalog",
    "VaultEntry",
    "VaultInfo",
    "Vaults",
    "check_env_name",
    "check_name",
    "check_stored_name",
    "check_value",
    "keyring_backend",
    "no_vault_error",
    "refuse_legacy",
]

#: The file holding vault values when no keyring is usable (in the data directory).
FILE_NAME = "vault-secrets.json"
#: Keyring service names are this prefix and the vault's name.
KEYRING_SERVICE_PREFIX = "chatflow-vault:"

_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def check_name(name: str, what: str = "vault", *, new: bool = False) -> str:
    """``name`` when it is a valid vault name (``what="vault"``:
    :func:`~chatflow_cli.core.resources.mounts.check_resource_name`) or entry name
    (``what="entry"``: the same rule, uppercase letters allowed); with ``new``, it must also
    not look like a credential.

    Raises:
        UsageError: it is not (exit 2); the message says what is wrong and quotes the name
            only when it has a name's shape and does not look like a credential.
    """
    if what == "vault":
        return check_resource_name(name, "vault", new=new)
    problem = name_problem(name, lowercase=False, new=new, values=True, entry=True)
    if problem is not None:
        shown = quoted_name(name, entry=True)
        raise UsageError(f"{what} name{'' if shown == NOT_SHOWN else ' ' + shown} is not valid: {problem}; use "
                         "1-64 letters, digits, '_', '.' or '-', starting with a letter or a digit, the letters "
                         "all lowercase or all uppercase")
    return name


def check_stored_name(name: str) -> str:
    """``name`` when it may name a stored vault: the rule of :func:`check_name`, or the looser
    one vaults were created with before (uppercase letters allowed), so such a vault can still
    be listed and removed.

    Raises:
        UsageError: (exit 2) as :func:`check_name` (the name is not echoed).
    """
    return check_name(name, "vault") if name_problem(name, lowercase=False) is not None else name


def _legacy(name: str) -> bool:
    """True for a stored vault whose name breaks today's rule (made before it: ``Work2``)."""
    return name_problem(name) is not None


def no_vault_error(name: str, known: str) -> UsageError | VaultNotFoundError:
    """The error for no vault ``name`` (``known``: the vaults there are, in words). A name that
    breaks the name rule is not a vault's name: the error says so (exit 2) without quoting it,
    or suggesting anything made from it; otherwise no such vault (exit 3)."""
    problem = name_problem(name)
    if problem is not None:
        return UsageError(f"the vault name given is not a valid name ({problem}), so no vault has it (vaults: "
                          f"{known})")
    hint = f"; create one with: chatflow vault create {name}" if may_show(name) else ""
    return VaultNotFoundError(f"no vault {quoted_name(name)} (vaults: {known}{hint})")


# --------------------------------------------------------------------------------------
# the catalogue (what the session database holds)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class VaultEntry:
    """One entry of a vault: its ``name``, where its value lives (``location``: ``keyring``,
    ``file`` or ``env:VAR``) and when it was last set (``updated_at``, UTC epoch seconds)."""

    name: str
    location: str
    updated_at: float


@dataclass(frozen=True, slots=True)
class VaultInfo:
    """A vault: its ``name``, ``created_at`` (UTC epoch seconds) and ``entries`` by name order."""

    name: str
    created_at: float
    entries: tuple[VaultEntry, ...] = ()

    def entry(self, name: str) -> VaultEntry | None:
        """The entry called ``name``, or None."""
        return next((e for e in self.entries if e.name == name), None)


@runtime_checkable
class VaultCatalog(Protocol):
    """What a session store keeps of vaults: names and locations, never values.

    Every store (in memory, SQLite, PostgreSQL) implements it; each call is one short
    transaction.
    """

    def create_vault(self, name: str) -> VaultInfo:
        """Create an empty vault. Raises UsageError when it exists."""
        ...

    def get_vault(self, name: str) -> VaultInfo | None:
        """The vault and its entries, or None."""
        ...

    def list_vaults(self) -> list[VaultInfo]:
        """Every vault with its entries, by name."""
        ...

    def set_vault_entry(self, vault: str, entry: str, location: str) -> VaultEntry:
        """Add or replace an entry. Raises VaultNotFoundError when the vault does not exist."""
        ...

    def delete_vault_entry(self, vault: str, entry: str) -> bool:
        """Remove an entry; False when there was none."""
        ...

    def delete_vault(self, name: str) -> bool:
        """Remove a vault and its entries; False when there was none."""
        ...


# --------------------------------------------------------------------------------------
# where values live
# --------------------------------------------------------------------------------------
def keyring_backend() -> Any | None:
    """The usable ``keyring`` backend, or None (not installed, or only the fail/null backend)."""
    try:
        import keyring
        import keyring.backends.fail
        import keyring.backends.null
    except Exception:  # noqa: BLE001 - not installed, or a broken install: no keyring
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:  # noqa: BLE001 - a backend named by PYTHON_KEYRING_BACKEND that fails to load
        return None
    if isinstance(backend, (keyring.backends.fail.Keyring, keyring.backends.null.Keyring)):
        return None
    if getattr(backend, "backends", None) == []:  # a chainer with nothing in it
        return None
    return backend


def _backend_name(backend: Any) -> str:
    return f"{type(backend).__module__}.{type(backend).__qualname__}"


class _Keyring:
    """Values in the OS keyring (see the module docstring)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.name = _backend_name(backend)

    def _fail(self, doing: str, vault: str, entry: str, exc: Exception) -> VaultStorageError:
        return VaultStorageError(f"the keyring ({self.name}) failed {doing} {vault}/{entry}: {type(exc).__name__}")

    def get(self, vault: str, entry: str) -> str | None:
        try:
            value = self.backend.get_password(KEYRING_SERVICE_PREFIX + vault, entry)
        except Exception as exc:  # noqa: BLE001 - a locked or broken keyring
            raise self._fail("to read", vault, entry, exc) from None
        return value if isinstance(value, str) else None

    def set(self, vault: str, entry: str, value: str) -> None:
        try:
            self.backend.set_password(KEYRING_SERVICE_PREFIX + vault, entry, value)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("to store", vault, entry, exc) from None

    def delete(self, vault: str, entry: str) -> None:
        try:
            self.backend.delete_password(KEYRING_SERVICE_PREFIX + vault, entry)
        except Exception:  # noqa: BLE001 - nothing there (PasswordDeleteError) is fine
            pass


class _File:
    """Values in an owner-only JSON file (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME

    def _read(self) -> dict[str, dict[str, str]]:
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise VaultStorageError(f"cannot read the vault file {self.path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if info.st_mode & 0o077 or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
                whose = "" if not hasattr(os, "getuid") or info.st_uid == os.getuid() else \
                    f", owned by uid {info.st_uid}"
                raise VaultFileError(
                    f"the vault file {self.path} is open to other users (mode {stat.S_IMODE(info.st_mode):04o}"
                    f"{whose}): chatflow reads no secret others could have read or changed; check it, then "
                    f"chmod 600 {self.path}")
            raw = handle.read()
        try:
            data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
        except (UnicodeDecodeError, ValueError):
            raise VaultStorageError(f"the vault file {self.path} is not valid JSON") from None
        if not isinstance(data, dict) or not all(
                isinstance(v, dict) and all(isinstance(x, str) for x in v.values()) for v in data.values()):
            raise VaultStorageError(f"the vault file {self.path} is not an object of vaults of text values")
        return data

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            if not self.directory.is_dir():
                os.makedirs(self.directory, 0o700, exist_ok=True)
            fd = os.open(self.directory / (FILE_NAME + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise VaultStorageError(f"cannot write the vault file in {self.directory}: {exc.strerror or exc}") from None
        try:
            try:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX)
            except ImportError:  # pragma: no cover - not POSIX
                pass
            yield
        finally:
            os.close(fd)

    def _write(self, data: dict[str, dict[str, str]]) -> None:
        body = json.dumps(data, ensure_ascii=False, indent=1, sort_keys=True).encode("utf-8")
        try:
            # mkstemp creates the file 0600 whatever the umask; it is complete before it replaces the old one
            fd, temp = tempfile.mkstemp(prefix=FILE_NAME + ".", suffix=".tmp", dir=self.directory)
        except OSError as exc:
            raise VaultStorageError(f"cannot write the vault file in {self.directory}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise VaultStorageError(f"cannot write the vault file {self.path}: {exc.strerror or exc}") from None

    def get(self, vault: str, entry: str) -> str | None:
        return self._read().get(vault, {}).get(entry)

    def set(self, vault: str, entry: str, value: str) -> None:
        with self._locked():
            data = self._read()
            data.setdefault(vault, {})[entry] = value
            self._write(data)

    def delete(self, vault: str, entry: str | None = None) -> None:
        if not self.path.exists():
            return
        with self._locked():
            data = self._read()
            if vault not in data or (entry is not None and entry not in data[vault]):
                return
            if entry is None:
                del data[vault]
            else:
                del data[vault][entry]
                if not data[vault]:
                    del data[vault]
            self._write(data)


# --------------------------------------------------------------------------------------
# vaults
# --------------------------------------------------------------------------------------
class Vaults:
    """Vaults on a catalogue (a session store) with their values where each lives.

    Args:
        catalog: The store keeping vault and entry names (every chatflow store is one).
        data_dir: The data directory, where the vault file is kept when no keyring is usable.
        use_keyring: False: never the keyring (new values go to the file).
    """

    def __init__(self, catalog: VaultCatalog, data_dir: str | os.PathLike[str], *, use_keyring: bool = True) -> None:
        self.catalog = catalog
        self.file = _File(Path(data_dir).expanduser())
        self._use_keyring = use_keyring
        self._keyring: _Keyring | None = None
        self._looked = not use_keyring  # keyring looked up already (or not to be used)

    def _the_keyring(self) -> _Keyring | None:
        if not self._looked:
            backend = keyring_backend()
            self._keyring = _Keyring(backend) if backend is not None else None
            self._looked = True
        return self._keyring

    def default_location(self) -> str:
        """Where a value set now would live: ``keyring`` or ``file``."""
        return "keyring" if self._the_keyring() is not None else "file"

    def describe(self, location: str) -> str:
        """``location`` in words: the keyring backend, the file's path, or the variable."""
        if location == "keyring":
            ring = self._the_keyring()
            return f"keyring ({ring.name})" if ring is not None else "keyring (none usable now)"
        if location == "file":
            return f"file {self.file.path}"
        return location

    # -- the catalogue ------------------------------------------------------------------
    def create(self, name: str) -> VaultInfo:
        """Create the vault ``name``. Raises UsageError (a bad name, or it exists)."""
        return self.catalog.create_vault(check_name(name, new=True))

    def get_vault(self, name: str) -> VaultInfo:
        """The vault ``name`` (a name made before today's rule too: :func:`check_stored_name`).

        Raises:
            UsageError: not a vault name.
            VaultNotFoundError: no such vault.
        """
        info = self.catalog.get_vault(check_stored_name(name))
        if info is None:
            raise no_vault_error(name, ", ".join(v.name for v in self.catalog.list_vaults()) or "none")
        return info

    def list(self) -> list[VaultInfo]:
        """Every vault with its entries (names and locations, never values)."""
        return self.catalog.list_vaults()

    # -- values -------------------------------------------------------------------------
    def set(self, vault: str, entry: str, value: str | None = None, *, env: str | None = None,
            location: str | None = None) -> VaultEntry:
        """Set ``entry`` of ``vault``: ``value`` stored in the keyring or the file, or ``env``
        (a variable's name) recorded as a reference. ``location`` (``keyring``/``file``)
        forces where a value goes. A value the entry had elsewhere is removed from there.

        Raises:
            UsageError: a bad name, both or neither of ``value`` and ``env``, a value shorter
                than :data:`~chatflow_cli.core.resources.secrets.MIN_VALUE_LEN` or holding NUL.
            VaultNotFoundError: no such vault.
            VaultStorageError: the keyring or the file failed.
        """
        check_name(entry, "entry", new=True)
        info = self.get_vault(vault)
        refuse_legacy(vault)
        if (value is None) == (env is None):
            raise UsageError("give a vault value or an environment variable name, not both")
        if env is not None:
            check_env_name(env)
            where = f"env:{env}"
        else:
            assert value is not None
            check_value(value)
            remember_value(value)
            where = location or self.default_location()
            if where == "keyring":
                ring = self._the_keyring()
                if ring is None:
                    raise VaultStorageError("no usable keyring: install keyring (pip install 'chatflow-cli[vault]') "
                                            "or set PYTHON_KEYRING_BACKEND, or store the value in the file")
                ring.set(vault, entry, value)
            elif where == "file":
                self.file.set(vault, entry, value)
            else:
                raise UsageError(f"a value is stored in the keyring or the file, not {where!r}")
        old = info.entry(entry)
        if old is not None and old.location != where:
            self._forget(vault, old)
        return self.catalog.set_vault_entry(vault, entry, where)

    def _forget(self, vault: str, entry: VaultEntry) -> None:
        if entry.location == "keyring":
            ring = self._the_keyring()
            if ring is not None:
                ring.delete(vault, entry.name)
        elif entry.location == "file":
            self.file.delete(vault, entry.name)

    def remove(self, vault: str, entry: str | None = None) -> VaultInfo:
        """Remove an entry (its value too, from the keyring or the file), or with ``entry``
        None the whole vault. Returns the vault as it was.

        Raises:
            VaultNotFoundError: no such vault or entry.
        """
        info = self.get_vault(vault)
        if entry is not None:
            found = info.entry(check_name(entry, "entry"))
            if found is None:
                raise VaultNotFoundError(f"vault {quoted_name(vault)} has no entry {quoted_name(entry, entry=True)}")
            self._forget(vault, found)
            self.catalog.delete_vault_entry(vault, entry)
            return info
        for each in info.entries:
            self._forget(vault, each)
        self.file.delete(vault)
        self.catalog.delete_vault(vault)
        return info

    def remember_all(self, vault: str) -> None:
        """Read every entry of ``vault`` once, so each value is a secret of this process
        (:func:`~chatflow_cli.core.resources.secrets.remember_value`) before any tool runs. A
        vault that does not exist, an entry whose value is gone or cannot be read, are skipped:
        the tool that needs one says what is wrong."""
        try:
            info = self.catalog.get_vault(vault)
        except ChatflowError:
            return
        for entry in info.entries if info is not None else ():
            try:
                self.read(vault, entry.name, info=info)
            except ChatflowError:
                continue

    def read(self, vault: str, entry: str, *, info: VaultInfo | None = None) -> str | None:
        """The value of ``entry`` in ``vault``, or None when the vault has no such entry, its
        variable is unset, or its stored value is gone (removed from the keyring by hand).

        Raises:
            VaultNotFoundError: no such vault.
            VaultFileError: the vault file is open to other users.
            VaultStorageError: the keyring or the file failed; an env value that is too short.
        """
        info = info or self.get_vault(vault)
        found = info.entry(entry)
        if found is None:
            return None
        if found.location == "keyring":
            ring = self._the_keyring()
            if ring is None:
                raise VaultStorageError(f"{vault}/{entry} is kept in the keyring, and no keyring is usable now")
            value = ring.get(vault, entry)
        elif found.location == "file":
            value = self.file.get(vault, entry)
        elif found.location.startswith("env:"):
            value = os.environ.get(found.location[4:]) or None
            if value is not None and len(value) < MIN_VALUE_LEN:
                raise VaultStorageError(f"{vault}/{entry}: ${found.location[4:]} is shorter than {MIN_VALUE_LEN} "
                                        "characters, too short to be kept out of transcripts")
        else:
            raise VaultStorageError(f"{vault}/{entry}: unknown location {found.location!r}")
        if value is not None:
            remember_value(value)
        return value


def refuse_legacy(vault: str) -> None:
    """Raise UsageError (exit 2) when ``vault`` is a stored vault whose name breaks today's
    rule (made before it, ``Work2``): it cannot be mounted, so nothing more is put in it."""
    if not _legacy(vault):
        return
    # the name breaks the rule, so it is not quoted, nor is a lowercased one suggested
    raise UsageError("this vault was made before vault names were lowercase only: it cannot be mounted, so no "
                     "entry is set in it; create a vault with a valid name, set its entries there, then remove "
                     "this one (chatflow vault ls lists them)")


def check_env_name(env: str) -> str:
    """``env`` when it is an environment variable's name. Raises UsageError (exit 2) saying
    what is wrong without echoing it (``--env GH_TOKEN=ghp_...`` holds a value)."""
    if isinstance(env, str) and _ENV_RE.match(env):
        return env
    why = ("it holds '=': give the variable's name only (its value is read when a tool needs it)"
           if isinstance(env, str) and "=" in env else
           "use letters, digits and '_', not starting with a digit, at most 128 characters")
    raise UsageError(f"--env takes an environment variable's name, and this is not one: {why}")


def check_value(value: str) -> str:
    """``value`` when it can be a vault value. Raises UsageError (too short, NUL, not text)."""
    if not isinstance(value, str) or "\x00" in value:
        raise UsageError("a vault value is text without NUL characters")
    if len(value) < MIN_VALUE_LEN:
        raise UsageError(f"a vault value has at least {MIN_VALUE_LEN} characters (a shorter one could not be "
                         "told apart from ordinary text, so it could not be kept out of transcripts)")
    return value


class MissingSecret(LookupError):
    """A tool needs a secret that no mounted vault holds; ``str()`` names the vaults and the
    entry (never a value), for the tool's error result."""

    def __init__(self, message: str, *, entry: str, vaults: tuple[str, ...]) -> None:
        super().__init__(message)
        self.entry = entry
        self.vaults = vaults


class SessionSecrets:
    """The secrets one turn's tool calls are filled from: the vaults mounted on the session,
    in mount order (the first vault holding an entry wins).

    Args:
        vaults: The vault reader, or None (no vault can be read: a secret is missing).
        names: The mounted vaults' names, in mount order (repeats are ignored).
    """

    def __init__(self, vaults: Vaults | None, names: Sequence[str]) -> None:
        self.vaults = vaults
        self.names = tuple(dict.fromkeys(names))

    def get(self, entry: str, *, tool: str = "the tool") -> str:
        """The value of ``entry`` from the first mounted vault holding it.

        Raises:
            MissingSecret: no mounted vault holds it (or none is mounted); the message is
                written for the model and the user.
            ChatflowError: a vault could not be read (its message never holds a value).
        """
        if not self.names:
            raise MissingSecret(f"{tool} needs the secret {entry!r} from a vault, and no vault is mounted on this "
                                "session; nothing ran", entry=entry, vaults=())
        unknown: list[str] = []
        unset: list[tuple[str, str]] = []  # (vault, location) of an entry listed but with no value now
        if self.vaults is not None:
            for name in self.names:
                info = self.vaults.catalog.get_vault(name)
                if info is None:
                    unknown.append(name)
                    continue
                value = self.vaults.read(name, entry, info=info)
                if value is not None:
                    return value
                found = info.entry(entry)
                if found is not None:
                    unset.append((name, found.location))
        searched = ", ".join(repr(n) for n in self.names)
        gone = f" (no vault {', '.join(repr(n) for n in unknown)} exists)" if unknown else ""
        if unset:
            vault, location = unset[0]
            if location.startswith("env:"):
                var = location[4:]
                raise MissingSecret(
                    f"{tool} needs the secret {entry!r}: vault {vault!r} takes it from the environment variable "
                    f"{var}, which is not set (searched: {searched}){gone}; nothing ran. Set {var} in the environment "
                    "chatflow runs in", entry=entry, vaults=self.names)
            raise MissingSecret(
                f"{tool} needs the secret {entry!r}: vault {vault!r} lists it in the {location}, but the value is no "
                f"longer there (searched: {searched}){gone}; nothing ran. Set it again with: chatflow vault set "
                f"{vault} {entry}", entry=entry, vaults=self.names)
        raise MissingSecret(f"{tool} needs the secret {entry!r}, which no mounted vault holds (searched: "
                            f"{searched}){gone}; nothing ran. Add it with: chatflow vault set {self.names[0]} {entry}",
                            entry=entry, vaults=self.names)

    def for_tool(self, tool: str, entries: Sequence[str]) -> dict[str, str]:
        """``{entry: value}`` of every entry in ``entries``; raises as :meth:`get`."""
        return {entry: self.get(entry, tool=tool) for entry in dict.fromkeys(entries)}
