"""The mount model: which resources a session runs with, and in which mode.

A :class:`Mount` names one resource (a memory store or a vault) and the mode it is mounted
in. Mounting and unmounting are events of the session's log:

======================  ==================================================================
``resource.mounted``    ``{"kind": "memory_store"|"vault", "name": str, "mode": "read-only"|"read-write"}``
``resource.unmounted``  ``{"kind": ..., "name": str, "mode": ...}`` (the mode it had; + ``"reason"``
                        when chatflow unmounted it itself: the resource was deleted)
======================  ==================================================================

A session's current mounts are the fold of those events in ``seq`` order
(:func:`fold_mounts`): a mount of a ``(kind, name)`` already mounted replaces its mode, an
unmount removes it. The resources a turn ran with are the fold up to the event that ended
it (:func:`mounts_at`): the mounts made as it began are in it, those made after it are not. The command line writes a mount as ``NAME`` (read-write for a memory
store), ``NAME:ro`` / ``NAME:read-only`` or ``NAME:rw`` / ``NAME:read-write``
(:func:`parse_mount`). A vault is always mounted read-only: a tool reads its entries, the
model never writes them.

Names of memory stores and vaults follow one rule (:func:`check_resource_name`): 1 to 64
characters, lowercase ASCII letters, digits, ``_``, ``.`` and ``-``, starting with a letter
or a digit (``notes``, ``team.crm``, ``acme-2024``). A new name must also not look like a
credential (``new=True``). A name that breaks the rule is never echoed in the error: it may
be a value typed in the wrong place (``gh_token=ghp_...``); the message says what is wrong
(:func:`name_problem`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import UsageError
from .secrets import NOT_SHOWN, looks_like_secret, may_show, quoted_name

__all__ = [
    "MOUNT_KINDS",
    "MOUNT_MODES",
    "RESOURCE_MOUNTED",
    "RESOURCE_UNMOUNTED",
    "Mount",
    "MountKind",
    "MountMode",
    "check_resource_name",
    "fold_mounts",
    "mounts_at",
    "name_problem",
    "parse_mount",
    "unique_mounts",
]

MountKind = Literal["memory_store", "vault"]
MountMode = Literal["read-only", "read-write"]

#: The kinds of resource a session mounts.
MOUNT_KINDS: tuple[MountKind, ...] = ("memory_store", "vault")
#: The modes of a mount.
MOUNT_MODES: tuple[MountMode, ...] = ("read-only", "read-write")

#: The event types of the log (also in :class:`~chatflow_cli.core.events.EventType`).
RESOURCE_MOUNTED = "resource.mounted"
RESOURCE_UNMOUNTED = "resource.unmounted"

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_ANY_CASE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_MODE_ALIASES: dict[str, MountMode] = {
    "ro": "read-only", "read-only": "read-only", "rw": "read-write", "read-write": "read-write",
}
_KIND_WORDS = {"memory_store": "memory store", "vault": "vault"}


_NAME_CHARS = "a-z, 0-9, '_', '.', '-'"
# punctuation a message may name: one character of it is never a secret
_NAMED_PUNCTUATION = set("/\\:;,@!?*#%&+~'\"()[]{}<>|$^`")


def name_problem(name: object, *, lowercase: bool = True, new: bool = False, values: bool = False,
                 entry: bool = False) -> str | None:
    """What is wrong with ``name`` as a name, in words that never repeat it; None when nothing.

    The rule: 1-64 characters of ``a-z 0-9 _ . -`` (``A-Z`` too unless ``lowercase``),
    starting with a letter or a digit; with ``new``, not looking like a credential
    (:func:`~chatflow_cli.core.resources.secrets.looks_like_secret`). ``values``: the name
    is one a vault value goes with, and a ``=`` gets a hint that a value is never given there.
    ``entry`` (with ``lowercase`` False): a new vault entry's name, whose letters are all of one
    case (a name mixing them is never shown, so it is not made).
    """
    if not isinstance(name, str):
        return f"it is not text ({type(name).__name__})"
    if not name:
        return "it is empty"
    if "=" in name:
        hint = ": a vault value is never given on the command line (chatflow vault set reads it at a prompt " \
               "or from stdin)" if values else ""
        return f"it holds '='{hint}"
    if len(name) > 64:
        return f"it has {len(name)} characters, over 64"
    if any(c.isspace() for c in name):
        return "it holds a space or another blank"
    if not (name[0].isascii() and name[0].isalnum()):
        return "it does not start with a letter or a digit"
    allowed = _NAME_RE if lowercase else _ANY_CASE_RE
    if not allowed.fullmatch(name):
        if lowercase and _ANY_CASE_RE.fullmatch(name):  # no lowercased suggestion: it would show the name
            return "it holds an uppercase letter: names are lowercase"
        odd = next((c for c in name if not _ANY_CASE_RE.fullmatch("a" + c)), "")
        which = f"'{odd}'" if odd in _NAMED_PUNCTUATION else "a character"
        return f"it holds {which} other than {_NAME_CHARS}" + ("" if lowercase else " and A-Z")
    if new and entry and not may_show(name, entry=True) and not looks_like_secret(name):
        return ("it mixes uppercase and lowercase letters, as a value does: an entry's name is lowercase "
                "(github_token) or uppercase (GITHUB_TOKEN)")
    if new and looks_like_secret(name):
        return ("it looks like a credential (a long run of letters and digits, or a token's prefix), not a name: "
                "choose a name such as github_token")
    return None


def check_resource_name(name: object, kind: MountKind = "memory_store", *, new: bool = False) -> str:
    """Return ``name`` when it is a valid memory store or vault name.

    Args:
        name: The name to check.
        kind: ``"memory_store"`` or ``"vault"``: the word the message uses.
        new: A name about to be created: it must also not look like a credential.

    Raises:
        UsageError: (exit 2) not 1-64 characters of ``a-z 0-9 _ . -`` starting with a letter
            or a digit (or, when ``new``, it looks like a credential). The message says what is
            wrong and quotes the name only when it has a name's shape and does not look like a
            credential.
    """
    problem = name_problem(name, new=new, values=kind == "vault")
    if problem is not None:
        word = _KIND_WORDS.get(kind, "resource")
        shown = quoted_name(name)
        raise UsageError(
            f"{word} name{'' if shown == NOT_SHOWN else ' ' + shown} is not valid: {problem}; use 1-64 characters "
            f"of {_NAME_CHARS}, starting with a letter or a digit")
    assert isinstance(name, str)
    return name


def _shown_mode(mode: object) -> str:
    """A mode quoted for a message when it is a short word (never what may be a value)."""
    return repr(mode) if isinstance(mode, str) and re.fullmatch(r"[A-Za-z:-]{0,12}", mode) else "(not shown)"


def _check_mode(mode: str) -> MountMode:
    if mode not in MOUNT_MODES:
        raise UsageError(f"mount mode {_shown_mode(mode)} does not exist: use read-only (ro) or read-write (rw)")
    return mode


@dataclass(frozen=True, slots=True)
class Mount:
    """One resource mounted on a session.

    Attributes:
        kind: ``"memory_store"`` or ``"vault"``.
        name: the resource's name (:func:`check_resource_name`).
        mode: ``"read-only"`` or ``"read-write"``; a vault is always ``"read-only"``.

    Raises:
        UsageError: (exit 2) an unknown kind or mode, a bad name, or a vault mounted read-write.
    """

    kind: MountKind
    name: str
    mode: MountMode = "read-write"

    def __post_init__(self) -> None:
        if self.kind not in MOUNT_KINDS:
            raise UsageError(f"resource kind {_shown_mode(self.kind)} does not exist: use memory_store or vault")
        check_resource_name(self.name, self.kind)
        _check_mode(self.mode)
        if self.kind == "vault" and self.mode != "read-only":
            raise UsageError(f"vault {quoted_name(self.name)} can only be mounted read-only")

    @property
    def writable(self) -> bool:
        """True for a read-write mount."""
        return self.mode == "read-write"

    @property
    def key(self) -> tuple[str, str]:
        """``(kind, name)``: a session mounts a resource once."""
        return (self.kind, self.name)

    def to_dict(self) -> dict[str, str]:
        """The event payload: ``{"kind", "name", "mode"}``."""
        return {"kind": self.kind, "name": self.name, "mode": self.mode}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Mount:
        """The mount of an event payload (:meth:`to_dict`). Raises :class:`UsageError` when it is not one."""
        try:
            return cls(kind=data["kind"], name=data["name"], mode=data.get("mode", "read-only"))
        except (KeyError, TypeError):
            raise UsageError(f"not a resource mount (kind, name and mode): keys {sorted(map(str, data))}") from None

    @classmethod
    def memory_store(cls, name: str, mode: MountMode = "read-write") -> Mount:
        """A memory store mount (read-write unless ``mode`` says otherwise)."""
        return cls("memory_store", name, mode)

    @classmethod
    def vault(cls, name: str) -> Mount:
        """A vault mount (always read-only)."""
        return cls("vault", name, "read-only")

    def __str__(self) -> str:
        short = "ro" if self.mode == "read-only" else "rw"
        return f"{self.name}:{short}"


def parse_mount(text: str, kind: MountKind = "memory_store") -> Mount:
    """The mount written ``NAME``, ``NAME:ro``, ``NAME:rw``, ``NAME:read-only`` or ``NAME:read-write``.

    ``NAME`` alone is read-write for a memory store and read-only for a vault (a vault is
    only ever read-only; ``NAME:rw`` is refused for one).

    Raises:
        UsageError: (exit 2) a bad name, an unknown mode, or a vault asked read-write.
    """
    if not isinstance(text, str):
        raise UsageError(f"a mount is NAME or NAME:ro / NAME:rw, got {type(text).__name__}")
    name, sep, mode_text = text.strip().partition(":")
    if not sep:
        mode: MountMode = "read-only" if kind == "vault" else "read-write"
    else:
        found = _MODE_ALIASES.get(mode_text.strip().lower())
        if found is None:
            check_resource_name(name.strip(), kind)  # a bad name is the first thing to say
            shown = name.strip() if quoted_name(name.strip()) != NOT_SHOWN else "NAME"
            raise UsageError(
                f"mount mode {_shown_mode(mode_text)} does not exist: write {shown}:ro (read-only) "
                f"or {shown}:rw (read-write)")
        mode = found
    return Mount(kind, name.strip(), mode)


def unique_mounts(mounts: Iterable[Mount], where: str = "") -> list[Mount]:
    """``mounts`` with repeats dropped, in order. A resource given twice in the same mode is
    one mount; given in two modes (``--memory notes --memory notes:ro``) it is refused: which
    one was meant cannot be guessed, and the last one silently winning surprises.

    Raises:
        UsageError: (exit 2) one resource in two modes (``where``, such as ``--memory``,
            says where they were given).
    """
    seen: dict[tuple[str, str], Mount] = {}
    for mount in mounts:
        first = seen.setdefault(mount.key, mount)
        if first.mode != mount.mode:
            word = _KIND_WORDS.get(mount.kind, "resource")
            raise UsageError(
                f"{word} {mount.name!r} is mounted twice{' in ' + where if where else ''}, as {first} and as "
                f"{mount}: give it once, with the mode you mean")
    return list(seen.values())


def fold_mounts(events: Iterable[Any]) -> list[Mount]:
    """The mounts in force after ``events`` (``Event`` values or ``(type, payload)`` pairs, in
    ``seq`` order), in the order they were first mounted. Other event types are skipped."""
    current: dict[tuple[str, str], Mount] = {}
    for event in events:
        kind, payload = (event if isinstance(event, tuple) else (event.type, event.payload))
        if kind == RESOURCE_MOUNTED:
            mount = Mount.from_dict(payload)
            current[mount.key] = mount
        elif kind == RESOURCE_UNMOUNTED:
            current.pop((payload.get("kind"), payload.get("name")), None)
    return list(current.values())


def mounts_at(events: Iterable[Any], seq: int | None) -> list[Mount]:
    """The mounts in force just after the event ``seq`` (None: after every event) among
    ``events`` (stored ``Event`` values of one session, in ``seq`` order)."""
    return fold_mounts(e for e in events if seq is None or e.seq <= seq)
