"""The config file's shape: reading ``config.toml`` and checking every key it may hold.

:func:`read_toml` reads the file (UTF-8, TOML); :func:`validate_file` checks its keys and
values and returns them as plain values, the agents as :class:`AgentSpec` with their
:class:`ToolSpec` tools. Every problem is one :class:`~chatflow_cli.core.errors.ConfigError`
naming the file, the line and the problem. :mod:`chatflow_cli.config` merges these values
with the flags, the environment and the defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.errors import ChatflowError, ConfigError, UsageError
from .core.resources.mounts import Mount, check_resource_name, parse_mount, unique_mounts

__all__ = ["MESSAGE_ID_SCOPES", "AgentSpec", "ToolSpec", "read_toml", "validate_file"]

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOOL_REF_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
#: The largest ``max_tool_rounds`` config.toml takes (a model looping on tools costs a request a round).
MAX_TOOL_ROUNDS_LIMIT = 1000

_TOP_KEYS = {"model", "base_url", "api_key_env", "default_agent", "max_turns", "agents", "local_keep_alive",
             "message_id_scope", "db", "max_context_tokens", "compact_at", "compact_prompt", "max_tool_rounds",
             "mcp_servers", "mcp_config"}
#: ``--message-id`` scopes: ``global`` (one id space for every session: WhatsApp-style
#: provider message ids) or ``session`` (ids unique within one chat only: Telegram-style).
MESSAGE_ID_SCOPES = ("global", "session")
_AGENT_KEYS = {"name", "instructions", "model", "handoffs", "tools", "max_context_tokens", "memory", "vaults",
               "mcp_servers", "tool_approval", "tool_choice"}
_CUSTOM_TOOL_KEYS = {"name", "description", "parameters"}


@dataclass(frozen=True)
class ToolSpec:
    """A tool of a configured agent.

    Either ``ref`` (``"module:function"``, a ``@tool`` function imported when the agent is
    built) or a custom tool: ``name``, ``description`` and a JSON Schema ``parameters``,
    answered from outside with ``--tool-result``.
    """

    ref: str | None = None
    name: str | None = None
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.ref or f"{self.name} (custom)"


@dataclass(frozen=True)
class AgentSpec:
    """An agent as written in ``config.toml``; ``handoffs`` are agent names."""

    name: str
    instructions: str = ""
    model: str | None = None
    handoffs: tuple[str, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    line: int | None = None  # where its [[agents]] table starts, for error messages
    max_context_tokens: int | None = None  # its model's context size, when the model table is wrong
    #: memory stores a session this agent starts or continues in ``chat`` mounts ("notes", "notes:ro")
    memory: tuple[Mount, ...] = ()
    vaults: tuple[str, ...] = ()  # vaults its tools' secrets come from, after those mounted on the session
    #: MCP servers whose tools it is offered: ``(server name, only these tools or None)``
    mcp_servers: tuple[tuple[str, tuple[str, ...] | None], ...] = ()
    #: approval policies of its Python tools, by tool name (``always``, ``ask``, ``never``)
    tool_approval: tuple[tuple[str, str], ...] = ()
    #: the first request of each turn's ``tool_choice``: ``auto``, ``none``, ``required`` or a
    #: tool's name (that tool is called); None: the provider's default
    tool_choice: str | None = None


# ---------------------------------------------------------------------------------------
# config file parsing and validation
# ---------------------------------------------------------------------------------------
def _memory_mounts(text: str, agent: str, raw: Any, start: int) -> tuple[Mount, ...]:
    """An agent's ``memory = ["notes", "crm:ro"]``: memory store mounts (``NAME[:ro|:rw]``)."""
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise _Problem(f"agent {agent!r}: memory must be a list of memory store names (\"notes\" or \"notes:ro\")",
                       _key_line(text, "memory", start))
    try:
        return tuple(unique_mounts([parse_mount(item) for item in raw], "the agent's memory list"))
    except UsageError as exc:
        raise _Problem(f"agent {agent!r}: memory: {exc.message}", _key_line(text, "memory", start)) from None


_TOML_POS_RE = re.compile(r"^(?P<msg>.*?)\s*\(at line (?P<line>\d+), column (?P<col>\d+)\)\s*$")


def read_toml(path: Path) -> tuple[str, dict[str, Any]]:
    """``(text, table)`` of the TOML file at ``path``.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 or is not TOML (with the line).
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror or exc}") from exc
    if not raw:
        return "", {}  # an empty file is an empty table: no parser needed
    import tomllib

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"config file {path}, line {line}: not valid UTF-8") from exc
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = _TOML_POS_RE.match(str(exc))
        if m:
            raise ConfigError(
                f"config file {path}, line {m['line']}: {m['msg']} (column {m['col']})"
            ) from exc
        raise ConfigError(f"config file {path}: {exc}") from exc


def _line_of(text: str, pattern: str, start: int = 1) -> int | None:
    """1-based number of the first line at or after ``start`` matching ``pattern``."""
    rx = re.compile(pattern)
    for number, line in enumerate(text.splitlines(), 1):
        if number >= start and rx.search(line):
            return number
    return None


def _key_line(text: str, key: str, start: int = 1) -> int | None:
    return _line_of(text, rf"^\s*(\"{re.escape(key)}\"|{re.escape(key)})\s*=", start) or _line_of(
        text, rf"\b{re.escape(key)}\b", start
    )


class _Problem(Exception):
    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def _mcp_servers(text: str, data: dict[str, Any], path: Path) -> tuple[Any, ...]:
    """The MCP servers declared: ``[mcp_servers.NAME]`` tables, then those of the JSON files
    ``mcp_config`` names (a path or a list; relative to the config file's folder); a name
    declared twice is an error. The module of their shape is imported only when some are."""
    tables = data.get("mcp_servers", {})
    files = data.get("mcp_config", [])
    if not tables and not files:
        return ()
    from .core.mcp.config import read_mcp_json, spec_from_table

    if not isinstance(tables, dict):
        raise _Problem("mcp_servers must be tables: [mcp_servers.NAME]", _key_line(text, "mcp_servers"))
    specs: dict[str, Any] = {}
    for name, table in tables.items():
        try:
            specs[name] = spec_from_table(name, table, source=str(path))
        except ValueError as exc:
            raise _Problem(str(exc), _line_of(text, rf"^\s*\[\s*mcp_servers\.\"?{re.escape(name)}\b")) from None
    if isinstance(files, str):
        files = [files]
    if not isinstance(files, list) or not all(isinstance(f, str) and f.strip() for f in files):
        raise _Problem("mcp_config must be the path of an mcpServers JSON file (or a list of them)",
                       _key_line(text, "mcp_config"))
    for name in files:
        found = Path(name).expanduser()
        if not found.is_absolute():
            found = path.parent / found
        try:
            listed = read_mcp_json(found)
        except ChatflowError as exc:
            raise _Problem(exc.message, _key_line(text, "mcp_config")) from None
        for spec in listed:
            if spec.name in specs:
                raise _Problem(f"MCP server {spec.name!r} is declared twice (in {specs[spec.name].source} and "
                               f"{spec.source})", _key_line(text, "mcp_config"))
            specs[spec.name] = spec
    return tuple(specs.values())


def _agent_servers(text: str, agent: str, raw: Any, start: int,
                   known: set[str]) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    """An agent's ``mcp_servers = ["time", { name = "git", tools = ["git_log"] }]``."""
    where = _key_line(text, "mcp_servers", start)
    if not isinstance(raw, list):
        raise _Problem(f"agent {agent!r}: mcp_servers must be a list of server names", where)
    chosen: dict[str, tuple[str, ...] | None] = {}
    for item in raw:
        tools: tuple[str, ...] | None = None
        if isinstance(item, dict):
            name, listed = item.get("name"), item.get("tools")
            if set(item) - {"name", "tools"} or not isinstance(listed, list) or not all(
                    isinstance(t, str) and t for t in listed):
                raise _Problem(f"agent {agent!r}: an mcp_servers entry is a name or {{ name = \"NAME\", tools = "
                               "[\"TOOL\", ...] }", where)
            tools = tuple(listed)
        else:
            name = item
        if not isinstance(name, str) or name not in known:
            raise _Problem(f"agent {agent!r}: mcp_servers: {name!r} is not a declared MCP server (declared: "
                           f"{', '.join(sorted(known)) or 'none'})", where)
        chosen[name] = tools
    return tuple(chosen.items())


def validate_file(path: Path, text: str, data: dict[str, Any]) -> dict[str, Any]:
    """The checked settings of ``data`` (the table read from ``path``, whose source is ``text``):
    the keys given, with ``agents`` a list of :class:`AgentSpec`.

    Raises:
        ConfigError: an unknown or forbidden key (an API key, a password in ``db``), a value
            of the wrong type or range, an unknown handoff target or default agent.
    """
    try:
        return _validate_inner(text, data, path)
    except _Problem as problem:
        where = f", line {problem.line}" if problem.line else ""
        raise ConfigError(f"config file {path}{where}: {problem.message}") from None


def _want_str(text: str, key: str, value: Any, start: int = 1) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Problem(f"{key} must be a non-empty string", _key_line(text, key, start))
    return value


def _validate_inner(text: str, data: dict[str, Any], path: Path = Path("config.toml")) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in data:
        if key in {"api_key", "openai_api_key", "key"}:
            raise _Problem(
                f"{key} is not allowed: API keys never live in files; set api_key_env to the NAME "
                "of the environment variable that holds the key",
                _key_line(text, key),
            )
        if key not in _TOP_KEYS:
            raise _Problem(
                f"unknown key {key!r} (known: {', '.join(sorted(_TOP_KEYS))})", _key_line(text, key)
            )
    for key in ("model", "base_url", "default_agent"):
        if key in data:
            out[key] = _want_str(text, key, data[key])
    if "api_key_env" in data:
        value = _want_str(text, "api_key_env", data["api_key_env"])
        if not _ENV_NAME_RE.match(value):
            raise _Problem(
                "api_key_env must be the NAME of an environment variable (like OPENAI_API_KEY), not a key",
                _key_line(text, "api_key_env"),
            )
        out["api_key_env"] = value
    if "db" in data:
        value = _want_str(text, "db", data["db"])
        from .core.dsn import dsn_password, is_postgres_url, url_problem

        problem = url_problem(value)
        if problem is not None:  # never the URL itself: it may hold a password
            raise _Problem(f"db: {problem}", _key_line(text, "db"))
        if is_postgres_url(value) and dsn_password(value):
            raise _Problem(
                "db must not hold a password: passwords never live in files; use PGPASSWORD or ~/.pgpass",
                _key_line(text, "db"),
            )
        out["db"] = value
    if "message_id_scope" in data:
        value = _want_str(text, "message_id_scope", data["message_id_scope"])
        if value not in MESSAGE_ID_SCOPES:
            raise _Problem("message_id_scope must be \"global\" or \"session\"", _key_line(text, "message_id_scope"))
        out["message_id_scope"] = value
    if "max_turns" in data:
        value = data["max_turns"]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _Problem("max_turns must be a positive integer", _key_line(text, "max_turns"))
        out["max_turns"] = value
    if "max_tool_rounds" in data:
        value = data["max_tool_rounds"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOOL_ROUNDS_LIMIT:
            raise _Problem(f"max_tool_rounds must be a whole number from 0 to {MAX_TOOL_ROUNDS_LIMIT} (replies with "
                           "tool calls allowed in one turn; default 10)", _key_line(text, "max_tool_rounds"))
        out["max_tool_rounds"] = value
    if "max_context_tokens" in data:
        out["max_context_tokens"] = _context_tokens(text, data["max_context_tokens"])
    if "compact_at" in data:
        value = data["compact_at"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise _Problem("compact_at must be a share of the context budget from 0 (off) to 1, like 0.8",
                           _key_line(text, "compact_at"))
        out["compact_at"] = float(value) or None
    if "compact_prompt" in data:
        value = _want_str(text, "compact_prompt", data["compact_prompt"])
        if not value.strip():
            raise _Problem("compact_prompt must not be empty", _key_line(text, "compact_prompt"))
        out["compact_prompt"] = value
    if "local_keep_alive" in data:
        from .core.local import parse_keep_alive

        try:
            out["local_keep_alive"] = parse_keep_alive(data["local_keep_alive"])
        except ChatflowError as exc:
            raise _Problem(f"local_keep_alive: {exc.message}", _key_line(text, "local_keep_alive")) from None
    servers = _mcp_servers(text, data, path)
    if servers:
        out["mcp_servers"] = servers
    agents_raw = data.get("agents", [])
    if isinstance(agents_raw, dict):  # [agents.Name] tables
        agents_raw = [{"name": name, **body} if isinstance(body, dict) else body for name, body in agents_raw.items()]
    if not isinstance(agents_raw, list):
        raise _Problem("agents must be an array of tables ([[agents]])", _key_line(text, "agents"))
    specs: list[AgentSpec] = []
    header_line = 0
    for index, raw in enumerate(agents_raw):
        header_line = (
            _line_of(text, r"^\s*\[\[\s*agents\s*\]\]", header_line + 1)
            or _line_of(text, r"^\s*\[\s*agents\.", header_line + 1)
            or header_line
        )
        start = header_line or 1
        if not isinstance(raw, dict):
            raise _Problem(f"agents[{index}] must be a table", start or None)
        for key in raw:
            if key not in _AGENT_KEYS:
                raise _Problem(
                    f"agents[{index}]: unknown key {key!r} (known: {', '.join(sorted(_AGENT_KEYS))})",
                    _key_line(text, key, start),
                )
        if "name" not in raw:
            raise _Problem(f"agents[{index}]: name is missing", start or None)
        name = _want_str(text, "name", raw["name"], start)
        if any(spec.name == name for spec in specs):
            raise _Problem(f"agent {name!r} is defined twice", _key_line(text, "name", start))
        instructions = raw.get("instructions", "")
        if not isinstance(instructions, str):
            raise _Problem(f"agent {name!r}: instructions must be a string", _key_line(text, "instructions", start))
        model = _want_str(text, "model", raw["model"], start) if "model" in raw else None
        handoffs = raw.get("handoffs", [])
        if not isinstance(handoffs, list) or not all(isinstance(h, str) and h for h in handoffs):
            raise _Problem(f"agent {name!r}: handoffs must be a list of agent names", _key_line(text, "handoffs", start))
        tools_raw = raw.get("tools", [])
        if not isinstance(tools_raw, list):
            raise _Problem(f"agent {name!r}: tools must be a list", _key_line(text, "tools", start))
        tools: list[ToolSpec] = []
        for tool in tools_raw:
            tools.append(_tool_spec(text, name, tool, start))
        memory = _memory_mounts(text, name, raw.get("memory", []), start)
        vaults = raw.get("vaults", [])
        if not isinstance(vaults, list):
            raise _Problem(f"agent {name!r}: vaults must be a list of vault names", _key_line(text, "vaults", start))
        for vault in vaults:
            try:
                check_resource_name(vault, "vault")
            except UsageError as exc:
                raise _Problem(f"agent {name!r}: vaults must be a list of vault names: {exc.message}",
                               _key_line(text, "vaults", start)) from None
        agent_servers = _agent_servers(text, name, raw.get("mcp_servers", []), start, {sv.name for sv in servers})
        approvals = raw.get("tool_approval", {})
        if not isinstance(approvals, dict) or not all(v in ("always", "ask", "never") for v in approvals.values()):
            raise _Problem(f"agent {name!r}: tool_approval must be a table of tool names and policies (always, ask "
                           "or never)", _key_line(text, "tool_approval", start))
        tool_choice = raw.get("tool_choice")
        if tool_choice is not None and (not isinstance(tool_choice, str)
                                        or not re.match(r"^[A-Za-z0-9_-]{1,64}$", tool_choice)):
            raise _Problem(f"agent {name!r}: tool_choice must be auto, none, required or the name of one of its "
                           "tools", _key_line(text, "tool_choice", start))
        specs.append(
            AgentSpec(
                name=name,
                instructions=instructions,
                model=model,
                handoffs=tuple(handoffs),
                tools=tuple(tools),
                line=header_line or None,
                max_context_tokens=_context_tokens(text, raw["max_context_tokens"], start)
                if "max_context_tokens" in raw else None,
                memory=memory,
                vaults=tuple(dict.fromkeys(vaults)),
                mcp_servers=agent_servers,
                tool_approval=tuple(approvals.items()),
                tool_choice=tool_choice,
            )
        )
    names = {spec.name for spec in specs}
    for spec in specs:
        for target in spec.handoffs:
            if target not in names:
                raise _Problem(
                    f"agent {spec.name!r} hands off to {target!r}, which is not a configured agent",
                    _line_of(text, rf"[\"']{re.escape(target)}[\"']", spec.line or 1),
                )
    if "default_agent" in out and out["default_agent"] not in names:
        raise _Problem(
            f"default_agent {out['default_agent']!r} is not a configured agent", _key_line(text, "default_agent")
        )
    out["agents"] = specs
    return out


def _context_tokens(text: str, value: Any, start: int = 1) -> int:
    """A ``max_context_tokens`` value: an integer >= 2 (tokens)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise _Problem("max_context_tokens must be a number of tokens (an integer, at least 2)",
                       _key_line(text, "max_context_tokens", start))
    return value


def _tool_spec(text: str, agent: str, tool: Any, start: int) -> ToolSpec:
    if isinstance(tool, str):
        if not _TOOL_REF_RE.match(tool):
            raise _Problem(
                f"agent {agent!r}: tool {tool!r} must be a 'module:function' reference",
                _line_of(text, re.escape(tool), start),
            )
        return ToolSpec(ref=tool)
    if isinstance(tool, dict):
        unknown = set(tool) - _CUSTOM_TOOL_KEYS
        if unknown:
            raise _Problem(
                f"agent {agent!r}: custom tool has unknown key(s) {sorted(unknown)} "
                f"(known: {', '.join(sorted(_CUSTOM_TOOL_KEYS))})",
                _key_line(text, sorted(unknown)[0], start),
            )
        name = tool.get("name")
        if not isinstance(name, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$", name):
            raise _Problem(
                f"agent {agent!r}: a custom tool needs a name of letters, digits, '_' or '-'",
                _key_line(text, "name", start),
            )
        description = tool.get("description", "")
        if not isinstance(description, str):
            raise _Problem(f"tool {name!r}: description must be a string", _key_line(text, "description", start))
        parameters = tool.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise _Problem(
                f"tool {name!r}: parameters must be a JSON Schema object (type = \"object\")",
                _key_line(text, "parameters", start),
            )
        return ToolSpec(name=name, description=description, parameters=dict(parameters))
    raise _Problem(
        f"agent {agent!r}: each tool is a 'module:function' string or a custom tool table",
        _key_line(text, "tools", start),
    )
