"""Resources mounted on a session: memory stores (documents that outlive a session) and
vaults (secrets a tool uses and the model never sees).

A session is created with the resources mounted on it (:class:`~.mounts.Mount`); mounting
and unmounting are events of its log (``resource.mounted``, ``resource.unmounted``), so a
resumed, forked or imported session keeps them and ``replay`` shows which resources each
turn ran with. :mod:`.mounts` holds the mount model and the naming rule both kinds share;
:mod:`.documents` the rules of memory documents (paths, sizes, edits, versions); :mod:`.memory_tools`
the tools an agent gets while a memory store is mounted; :mod:`.vaults` where vault values
live (the OS keyring, an owner-only file, an environment variable), the
:class:`~.vaults.Vaults` that reads and writes them and the :class:`~.vaults.SessionSecrets` a
turn's tool calls are filled from; :mod:`.secrets` the vault values read by this process, and
scrubbing them from text. ``keyring`` is imported only when a vault value is read or written.
The names below are resolved on first use: importing :mod:`.secrets` (every command's log
handlers do) does not import :mod:`.mounts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .mounts import (
        MOUNT_KINDS,
        MOUNT_MODES,
        Mount,
        MountKind,
        MountMode,
        check_resource_name,
        fold_mounts,
        parse_mount,
        unique_mounts,
    )

__all__ = [
    "MOUNT_KINDS",
    "MOUNT_MODES",
    "Mount",
    "MountKind",
    "MountMode",
    "check_resource_name",
    "fold_mounts",
    "parse_mount",
    "unique_mounts",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import mounts

    value = getattr(mounts, name)
    globals()[name] = value
    return value
