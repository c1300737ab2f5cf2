"""Each server's tool list, kept between runs: a turn offers a server's tools without starting it.

A server is started to list its tools only when nothing is known of them; once it has listed
them, the list is kept in a file of a cache directory (the command line's: ``mcp-tools/`` in
chatflow's cache directory, docs/mcp.md), and later runs offer those tools to the model with
the server not started; it starts when the model calls one of them, and the list it gives then
replaces the file's.

The file is named by :func:`definition_key`, a hash of what defines the server: its
transport, command, arguments and directory, or its URL, and the *names* of its environment
variables and headers, never their values (a secret is often one). It holds only the tools
(name, description, input schema), with every secret value chatflow has read scrubbed out
(:func:`~chatflow_cli.core.resources.secrets.scrub_values`), written owner-only and whole
(a temporary file renamed over the old one). A file that cannot be read or parsed counts as
none; one that cannot be written is skipped (logged).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..resources.secrets import scrub_values

__all__ = ["FORMAT", "CachedTool", "definition_key", "encode", "load", "save"]

log = logging.getLogger("chatflow_cli.core.mcp")

#: The file format; a file of another format counts as none.
FORMAT = 1
_FOLDER = "mcp-tools"


@dataclass(frozen=True)
class CachedTool:
    """A tool as a server listed it (the fields chatflow offers to the model)."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] = field(default_factory=dict)


def definition_key(transport: str, params: Mapping[str, Any]) -> str:
    """The hash naming a server's file: transport, command, args, cwd, url, and the names
    (never the values) of its env and headers."""
    shape = {"format": FORMAT, "transport": transport, "command": params.get("command"),
             "args": [str(a) for a in params.get("args") or ()], "cwd": params.get("cwd"), "url": params.get("url"),
             "env": sorted(params.get("env") or {}), "headers": sorted(params.get("headers") or {})}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _path(directory: Path, key: str) -> Path:
    return directory / _FOLDER / f"{key}.json"


def load(directory: Path, key: str) -> list[CachedTool] | None:
    """The tools kept for ``key``; None when there is no usable file."""
    try:
        data = json.loads(_path(directory, key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("tools"), list):
        return None
    tools = []
    for item in data["tools"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        schema = item.get("input_schema")
        description = item.get("description")
        tools.append(CachedTool(item["name"], description if isinstance(description, str) else None,
                                schema if isinstance(schema, dict) else {}))
    return tools


def _scrubbed(value: Any) -> Any:
    if isinstance(value, str):
        return scrub_values(value)
    if isinstance(value, dict):
        return {str(k): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrubbed(v) for v in value]
    return value


def encode(listed: list[Any]) -> str:
    """The file's text for the tools ``listed`` (``mcp.types.Tool`` or :class:`CachedTool`)."""
    tools = [{"name": str(t.name), "description": getattr(t, "description", None),
              "input_schema": getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {}}
             for t in listed]
    return json.dumps({"format": FORMAT, "tools": _scrubbed(tools)}, ensure_ascii=False, sort_keys=True, indent=1)


def save(directory: Path, key: str, listed: list[Any]) -> None:
    """Keep the tools ``listed`` for ``key`` (nothing is written when the file says the same)."""
    path = _path(directory, key)
    text = encode(listed)
    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except (OSError, ValueError):
        pass
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tools-", suffix=".tmp")  # owner-only
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        log.info("MCP tools cache %s not written: %s", path, exc.strerror or exc)
