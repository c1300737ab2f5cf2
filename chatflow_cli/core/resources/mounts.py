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
or a digit (``notes``, ``team.crm``, ``acme-2024``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import UsageError

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
    "parse_mount",
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
_MODE_ALIASES: dict[str, MountMode] = {
    "ro": "read-only", "read-only": "read-only", "rw": "read-write", "read-write": "read-write",
}
_KIND_WORDS = {"memory_store": "memory store", "vault": "vault"}


def check_resource_name(name: object, kind: MountKind = "memory_store") -> str:
    """Return ``name`` when it is a valid memory store or vault name.

    Raises:
        UsageError: (exit 2) not 1-64 characters of ``a-z 0-9 _ . -`` starting with a letter or a digit.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        word = _KIND_WORDS.get(kind, "resource")
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise UsageError(
            f"{word} name {shown} is not valid: use 1-64 characters of a-z, 0-9, '_', '.', '-', "
            "starting with a letter or a digit")
    return name


def _check_mode(mode: str) -> MountMode:
    if mode not in MOUNT_MODES:
        raise UsageError(f"mount mode {mode!r} does not exist: use read-only (ro) or read-write (rw)")
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
            raise UsageError(f"resource kind {self.kind!r} does not exist: use memory_store or vault")
        check_resource_name(self.name, self.kind)
        _check_mode(self.mode)
        if self.kind == "vault" and self.mode != "read-only":
            raise UsageError(f"vault {self.name!r} can only be mounted read-only")

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
            raise UsageError(f"not a resource mount: {dict(data)!r}") from None

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
        raise UsageError(f"a mount is NAME or NAME:ro / NAME:rw, got {text!r}")
    name, sep, mode_text = text.strip().partition(":")
    if not sep:
        mode: MountMode = "read-only" if kind == "vault" else "read-write"
    else:
        found = _MODE_ALIASES.get(mode_text.strip().lower())
        if found is None:
            raise UsageError(
                f"mount mode {mode_text!r} (in {text!r}) does not exist: write {name}:ro (read-only) "
                f"or {name}:rw (read-write)")
        mode = found
    return Mount(kind, name.strip(), mode)


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
