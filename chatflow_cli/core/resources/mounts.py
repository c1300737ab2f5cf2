"""A resource mounted on a session (:class:`Mount`) and the ``NAME[:ro|:rw]`` form that names one.

(The vault branch's minimal copy of the interface agreed with the memory-store work: the
dataclass and the parser; the ``resource.mounted`` / ``resource.unmounted`` events and the
session's current mounts come with that work.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import UsageError

__all__ = ["Mount", "MountKind", "MountMode", "parse_mount"]

MountKind = Literal["memory_store", "vault"]
MountMode = Literal["read-only", "read-write"]


@dataclass(frozen=True)
class Mount:
    """One resource mounted on a session: its ``kind``, ``name`` and ``mode``."""

    kind: MountKind
    name: str
    mode: MountMode


def parse_mount(kind: MountKind, text: str, *, default: MountMode = "read-write") -> Mount:
    """``name``, ``name:ro`` or ``name:rw`` as a :class:`Mount` of ``kind``.

    Raises:
        UsageError: an empty name, or a mode other than ``ro``/``rw``.
    """
    name, sep, mode = text.rpartition(":")
    if not sep:
        name, mode = text, ""
    modes: dict[str, MountMode] = {"": default, "ro": "read-only", "rw": "read-write"}
    if mode not in modes:
        raise UsageError(f"mount {text!r}: the mode after ':' is ro or rw, not {mode!r}")
    if not name:
        raise UsageError(f"mount {text!r}: no name before the mode")
    return Mount(kind, name, modes[mode])
