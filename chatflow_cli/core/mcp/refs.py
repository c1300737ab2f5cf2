"""Secret references in a tool server's ``env`` and ``headers``, resolved when it starts.

* ``vault:VAULT/ENTRY`` or ``env:VAR`` as the whole value;
* ``${vault:VAULT/ENTRY}``, ``${env:VAR}``, ``${VAR}`` or ``${VAR:-default}`` inside a value
  (the form Claude Code expands in ``.mcp.json``).

``command``, ``args`` and ``url`` take the ``${...}`` forms only (:func:`expand`): an
argument may well be the text ``env:X``.

Every value read is remembered for scrubbing (:mod:`chatflow_cli.core.resources.secrets`);
an error names the reference, never a value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import ChatflowError
from ..resources.secrets import remember_value
from .errors import MCPServerError

__all__ = ["expand", "resolve", "resolve_all"]

_REF_RE = re.compile(r"\$\{(?:vault:(?P<vault>[^}/]+)/(?P<entry>[^}]+)|env:(?P<env>[A-Za-z_]\w*)|"
                     r"(?P<var>[A-Za-z_]\w*)(?::-(?P<default>[^}]*))?)\}")


def _vault_value(vaults: Any, vault: str, entry: str, where: str) -> str:
    reader = vaults() if callable(vaults) else vaults
    if reader is None:
        raise MCPServerError(f"{where}: vault:{vault}/{entry} cannot be read here (no vaults given)")
    try:
        value = reader.read(vault, entry)
    except ChatflowError as exc:
        raise MCPServerError(f"{where}: vault:{vault}/{entry}: {exc.message}") from None
    if value is None:
        raise MCPServerError(f"{where}: vault {vault!r} has no entry {entry!r} (add it with: chatflow vault set "
                             f"{vault} {entry})")
    return str(value)


def _env_value(name: str, where: str, default: str | None = None) -> str:
    import os

    value = os.environ.get(name)
    if value is None:
        if default is not None:
            return default
        raise MCPServerError(f"{where}: the environment variable {name} is not set")
    remember_value(value)
    return value


def resolve(value: str, vaults: Any, where: str) -> str:
    """``value`` with its secret references replaced by what they name (module docstring).

    Raises:
        MCPServerError: a reference names a variable that is not set, a vault or an entry that
            does not exist, or a vault that cannot be read (never showing a value).
    """
    if value.startswith("vault:") and "/" in value and "${" not in value:
        vault, _, entry = value[6:].partition("/")
        return _vault_value(vaults, vault, entry, where)
    if value.startswith("env:") and re.match(r"^env:[A-Za-z_]\w*$", value):
        return _env_value(value[4:], where)
    return expand(value, vaults, where)


def expand(value: str, vaults: Any, where: str) -> str:
    """``value`` with its ``${...}`` references replaced (:func:`resolve` without the
    whole-value forms). Raises MCPServerError as :func:`resolve`."""

    def one(match: re.Match[str]) -> str:
        if match["vault"]:
            return _vault_value(vaults, match["vault"], match["entry"], where)
        return _env_value(match["env"] or match["var"], where, match["default"])

    return _REF_RE.sub(one, value) if "${" in value else value


def resolve_all(values: Mapping[str, str], vaults: Any, where: str) -> dict[str, str]:
    """Every value of ``values`` resolved (:func:`resolve`); ``where`` names them in errors."""
    return {key: resolve(str(value), vaults, f"{where} {key}") for key, value in values.items()}
