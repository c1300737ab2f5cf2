"""The composition root: settings in, agents, model client and Runner out.

Every front-end that runs turns (``chat``, ``replay --rerun``, the REPL) and ``agents ls``
builds what it needs here, so there is one place where

* the model is resolved from the settings, once (:func:`chatflow_cli.config.resolve_model`),
  and the embedded model's llama.cpp server is started or reused;
* the configured agents are built and their tool modules imported (:func:`build_agents`);
* the model client is made with its transport (:func:`transport_for`) and the
  :class:`~chatflow_cli.core.runner.Runner` is put on the store;
* a session's stored model and endpoint are read and kept (below).

The embedded local model (SmolLM2-135M) is sampled greedily (``temperature``
:data:`LOCAL_TEMPERATURE`): at the server's default, and even at 0.2, it wanders; remote
models keep their provider's default.

The session's model and endpoint (:func:`session_endpoint`, :func:`remember_endpoint`), which
the front-ends resolve before building and store after a turn: a session keeps the model and
base URL it talks to (``store.session_endpoint``); resuming it uses them unless
``--model``/``--base-url`` (or the REPL's ``/model``) switch it, which is announced. What a
session keeps is the endpoint of its last turn that worked: a run that fails leaves it where
it was, and a session none of whose turns worked keeps none (its first turn's endpoint is
stored while that turn runs, so a process waiting on it uses it too, and taken back when the
turn fails), so resuming it uses what this call is given or configured, never a URL the user
does not give this time. Each turn also records what answered it (``turn.completed``'s
``model`` and ``base_url``).

A URL's ``user:password@`` is never stored (the store leaves it out, see
:func:`~chatflow_cli.core.dsn.url_without_userinfo`; the user name goes too). Resuming a
session whose stored URL is the one given or configured now without its userinfo
(``--base-url``, else ``OPENAI_BASE_URL`` or ``base_url`` in config.toml) uses the one given,
credentials included; otherwise the stored URL is used as is (a server wanting the
credentials then answers 401, a clear error line).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from .config import (DEFAULT_AGENT_NAME, DEFAULT_INSTRUCTIONS, LOCAL_MODEL, AgentSpec, Settings, ToolSpec, cache_dir,
                     resolve_model)
from .context import notice
from .core.dsn import url_without_userinfo
from .core.errors import ChatflowError, ConfigError, NotFoundError

if TYPE_CHECKING:  # pragma: no cover
    from .config import ModelChoice
    from .context import State
    from .core.agents import Agent
    from .core.memory import BaseSessionStore
    from .core.memory.protocol import ContextStore, EditStore, SessionLookup, SessionSummary
    from .core.model import ModelClient
    from .core.resources.mounts import Mount
    from .core.resources.vaults import Vaults
    from .core.runner import Runner

__all__ = ["LOCAL_TEMPERATURE", "Assembly", "adopt_starting_agent", "assemble", "build_agents", "build_servers",
           "endpoint_of", "gone_notice", "keep_endpoint", "remember_endpoint", "session_endpoint", "session_mounts",
           "stored_endpoint", "transport_for", "unmount_gone", "vault_reader", "with_credentials"]

#: Sampling temperature for the embedded local model (see the module docstring).
LOCAL_TEMPERATURE = 0.0


def transport_for(default: str) -> str:
    """The model client's transport.

    Args:
        default: ``http`` for ``chatflow chat`` and ``replay --rerun`` (no openai import: a
            one-shot call starts about 0.5 s sooner), ``openai`` for the REPL.

    Returns:
        ``$CHATFLOW_TRANSPORT`` (``http`` or ``openai``) when set, else ``default``.

    Raises:
        ConfigError: ``$CHATFLOW_TRANSPORT`` names no transport.
    """
    from .core.model import TRANSPORTS

    chosen = os.environ.get("CHATFLOW_TRANSPORT") or default
    if chosen not in TRANSPORTS:
        from .render import safe_text

        raise ConfigError(f"CHATFLOW_TRANSPORT={safe_text(chosen)!r}: use {' or '.join(TRANSPORTS)}")
    return chosen


@dataclass
class Assembly:
    """What :func:`assemble` built for one run.

    Attributes:
        runner: The Runner on the store; every configured agent resolves in it.
        choice: The model choice the settings resolved to (resolved once).
        agents: The configured agents by name.
        client_for: Makes a model client for another base URL with the same API key,
            timeout and transport (the REPL's ``/switch`` to a session stored on another
            endpoint); ``None`` for the embedded local model, whose server has one URL.
    """

    runner: Runner
    choice: ModelChoice
    agents: dict[str, Agent]
    client_for: Callable[[str], ModelClient] | None = None


@contextlib.contextmanager
def assemble(
    settings: Settings,
    store: BaseSessionStore,
    *,
    choice: ModelChoice | None = None,
    model: str | None = None,
    agent: str | None = None,
    timeout: float = 60.0,
    transport: str = "openai",
    on_retry: Callable[[dict[str, Any]], None] | None = None,
    on_wait: Callable[[dict[str, Any]], None] | None = None,
    max_context_tokens: int | None = None,
) -> Iterator[Assembly]:
    """A Runner on ``store`` whose model client points at the configured endpoint.

    The local model's llama.cpp server, when it is the choice, is started or reused on
    entering (:class:`~chatflow_cli.core.local.LocalModel`): with ``local_keep_alive`` 0 it
    is private and stopped on every way out (no orphan process); otherwise it is the warm
    server of the data directory, left running for the next call until it idles out. The
    Runner is closed on the way out.

    Args:
        settings: The settings in effect (flags already applied).
        store: The session store the Runner writes to.
        choice: The model choice when the caller resolved it already (it is not resolved
            again); ``None`` resolves it from ``settings``.
        model: ``--model``: replaces every agent's model (``local``: the embedded model).
        agent: ``--agent``: the starting agent's name, else the configured start.
        timeout: Seconds to wait for the model server.
        transport: ``http`` or ``openai`` (see :func:`transport_for`).
        on_retry: Called before the client retries a request (rate limit, 5xx, no connection).
        on_wait: Called while the run waits for a busy session.
        max_context_tokens: ``--max-context-tokens``: the model's context size, for every agent.

    Raises:
        ConfigError: No model is configured, or a tool module cannot be imported.
        NotFoundError: ``agent`` is not a configured agent.
        ProviderError: The local model server failed to start.
    """
    if choice is None:
        choice = resolve_model(settings)
    with contextlib.ExitStack() as stack:
        base_url, api_key, default_model = choice.base_url, choice.api_key, choice.model
        local = None
        if choice.local:
            from .core.local import LocalModel

            local = stack.enter_context(LocalModel(keep_alive=settings.local_keep_alive, data_dir=settings.data_dir))
            base_url = local.base_url
            default_model = local.model or LOCAL_MODEL
        override = default_model if model == LOCAL_MODEL else model
        start, agents = build_agents(settings, model_override=override, vaults=_vaults_of(settings, store))
        if agent:
            if agent not in agents:
                from .render import safe_text

                # -a is --agent: a file given to it was meant to be attached (-f)
                hint = f"; {safe_text(agent)} is a file: to attach a file use -f PATH" if os.path.isfile(agent) else ""
                raise NotFoundError(f"unknown agent {safe_text(agent)!r} (configured: {', '.join(sorted(agents))})"
                                    + hint)
            start = agents[agent]
        from .core.model import ModelClient
        from .core.runner import Runner

        client = local.client(timeout=timeout, transport=transport) if local is not None else ModelClient(
            base_url, api_key, timeout=timeout, transport=transport)
        temperature = LOCAL_TEMPERATURE if choice.local else None
        # the context size: --max-context-tokens, config's, else per agent, the local n_ctx, the model table
        context = max_context_tokens or settings.max_context_tokens
        if context is None and local is not None:
            context = local.n_ctx  # what the running server reports, not the option it was started with
        runner = Runner(start, store, model_client=client, default_model=default_model, temperature=temperature,
                        max_context_tokens=context, compact_at=settings.compact_at,
                        compact_prompt=settings.compact_prompt, max_tool_rounds=settings.max_tool_rounds)
        # Every configured agent resolves, not only those reachable from the starting one:
        # a session whose active agent is another one keeps its instructions and tools.
        runner.agents.update(agents)
        runner.vaults = _vaults_of(settings, store)  # made when a tool first needs a secret
        if on_retry is not None and isinstance(client, ModelClient):  # the local client retries nothing
            client.on_retry = on_retry
        if on_wait is not None:
            runner.on_wait = on_wait
        stack.callback(runner.close)
        resolved = choice
        logging.getLogger("chatflow_cli.assembly").debug(
            "model client: %s transport, model %s%s, starting agent %s", transport, default_model,
            " (local)" if choice.local else "", start.name)

        def client_for(url: str) -> ModelClient:
            return ModelClient(url, resolved.api_key, timeout=timeout, transport=transport)

        yield Assembly(runner=runner, choice=choice, agents=agents, client_for=None if choice.local else client_for)


def _vaults_of(settings: Settings, store: BaseSessionStore) -> Callable[[], Vaults]:
    """A function making the vault reader of ``store`` and the data directory (its module is
    imported then, not by a chat that needs no secret)."""
    def make() -> Vaults:
        from .core.resources.vaults import Vaults

        return Vaults(store, settings.data_dir)

    return make


def vault_reader(settings: Settings, store: BaseSessionStore | None) -> Callable[[], Vaults] | None:
    """What reads the ``vault:`` references of MCP servers outside a turn (``mcp ls``,
    ``agents ls``): the vaults of ``store`` (None: no database yet, so no vault)."""
    return _vaults_of(settings, store) if store is not None else None


def session_mounts(settings: Settings, store: Any, session_id: str, runner: Runner, agent: str | None,
                   memory: Sequence[str] | None, vaults: Sequence[str] = ()) -> tuple[Mount, ...]:
    """The resources a turn mounts. Memory stores: ``memory = [...]`` of the agent that
    answers in config.toml (``agent``, else the session's active agent, else the starting
    agent), then ``--memory`` (a store in both gets ``--memory``'s mode). Vaults: ``--vault``,
    then the agent's ``vaults = [...]``, in that order (the first vault holding an entry
    fills a ``Secret`` parameter; vaults the session has already come before them all).
    Mounts already in force are not written again (the Runner skips them); a vault mount
    stays on the session (``resource.mounted``), so a resumed session keeps its secrets.

    Raises:
        UsageError: a bad name or mode (exit 2).
        MemoryStoreNotFoundError: a memory store that does not exist (exit 3).
        VaultNotFoundError: a vault that does not exist (exit 3).
    """
    from .core.resources.mounts import Mount, parse_mount, unique_mounts

    name = agent or store.active_agent_name(session_id) or runner.starting_agent.name
    spec = settings.agent(name)
    mounts = {m.name: m for m in (spec.memory if spec is not None else ())}
    given = unique_mounts([parse_mount(text) for text in memory], "--memory") if memory else []
    for mount in given:
        mounts[mount.name] = mount
    for mount in mounts.values():
        store.memory_store(mount.name)  # MemoryStoreNotFoundError (exit 3) before anything runs
    vault_names = dict.fromkeys([*vaults, *(spec.vaults if spec is not None else ())])
    vault_mounts = tuple(Mount.vault(v) for v in vault_names)
    if vault_mounts:
        vaults_of = runner.vaults if runner.vaults is not None else _vaults_of(settings, store)
        reader = vaults_of() if callable(vaults_of) else vaults_of
        for mount in vault_mounts:
            reader.get_vault(mount.name)  # VaultNotFoundError (exit 3) before anything is sent
    return (*mounts.values(), *vault_mounts)


def unmount_gone(store: Any, session_id: str) -> list[tuple[Mount, str]]:
    """The resources mounted on the stored session ``session_id`` that no longer exist (a
    memory store or vault deleted since it was mounted), each unmounted now with a
    ``resource.unmounted`` event whose ``reason`` says why, so the session goes on without
    them and is told once. Returns each with that reason (for the notice); ``[]`` after one
    read when nothing is mounted. When the unmount cannot be stored now (another process
    runs a turn on the session), the resources are still returned."""
    mounts = store.session_resources(session_id)
    if not mounts:
        return []
    gone: list[tuple[Mount, str]] = []
    stores: set[str] | None = None
    for mount in mounts:
        if mount.kind == "memory_store":
            if stores is None:
                stores = {info.name for info in store.memory_stores()}
            if mount.name not in stores:
                gone.append((mount, f"memory store {mount.name!r} no longer exists"))
        elif mount.kind == "vault" and store.get_vault(mount.name) is None:
            gone.append((mount, f"vault {mount.name!r} no longer exists"))
    if gone:
        try:
            session = store.get(session_id)
            if session is not None:
                for mount, reason in gone:
                    session.unmount(mount.name, mount.kind, reason=reason)
                store.save(session)
        except ChatflowError as exc:  # a busy session: its turn says so; the next run tries again
            logging.getLogger("chatflow_cli.assembly").debug("unmounting %s: %s", gone, exc)
    return gone


def gone_notice(session_id: str, reason: str) -> str:
    """The notice for a resource :func:`unmount_gone` took off ``session_id``."""
    return f"{reason} (it was mounted on session {session_id}): unmounted; the session goes on without it"


def adopt_starting_agent(store: ContextStore, session_id: str, runner: Runner) -> str | None:
    """A session whose active agent is no longer configured (removed from config.toml, or
    renamed) continues with the Runner's starting agent (``default_agent``): it is made the
    session's active agent (a stored ``handoff`` event), and the note to show is returned.
    None when the session does not exist, its agent is configured, or it waits for tool
    results (a turn is open: it is left as it is)."""
    try:
        session = store.get(session_id)
    except ChatflowError:
        return None
    if session is None or session.pending_tool_calls:
        return None
    name = getattr(session.active_agent, "name", None)
    if not isinstance(name, str) or name in runner.agents:
        return None
    start = runner.starting_agent
    from .render import safe_text

    try:
        session.set_active_agent(start)
        store.save(session)
    except ChatflowError:  # busy or changed meanwhile: the turn itself says so
        return None
    return (f"agent {safe_text(name)!r} of session {session_id} is no longer configured: continuing with agent "
            f"{safe_text(start.name)!r} (choose another with --agent NAME, or /agent NAME in the REPL)")


def build_servers(settings: Settings, vaults: Any = None) -> dict[str, Any]:
    """The declared MCP servers, by name (not started): one object each, shared by the
    agents that name it. ``vaults`` reads their ``vault:`` references when they start; the
    tools each lists are kept in the cache directory (:func:`~chatflow_cli.config.cache_dir`),
    so a later run offers them without starting it."""
    if not settings.mcp_servers:
        return {}
    tools_cache = cache_dir()
    return {spec.name: spec.build(vaults, tools_cache=tools_cache) for spec in settings.mcp_servers}


def build_agents(settings: Settings, *, model_override: str | None = None,
                 vaults: Any = None) -> tuple[Agent, dict[str, Agent]]:
    """Build the configured agents: ``(starting agent, {name: Agent})``.

    With no agents configured, one default agent (:data:`DEFAULT_AGENT_NAME`) answers, with
    every declared MCP server. ``model_override`` (``--model``) replaces every agent's model: flags come
    first. The starting agent is ``default_agent`` or the first one in the file.
    Each agent's ``version`` is that of its definition in the file (before
    ``model_override``), so ``agents ls`` and the turns a session ran agree on it.
    A configured agent gets the MCP servers its ``mcp_servers`` names (``vaults``: see
    :func:`build_servers`); they start when a turn first needs them.

    Tool references are imported here, and only here, from what the user wrote in the
    config file. A reference that cannot be imported, or names something that
    is not a tool or a function, raises :class:`ConfigError` naming the file and line.
    """
    from .core.agents import Agent
    from .core.tools import Tool

    servers = build_servers(settings, vaults)
    if not settings.agents:
        agent = Agent(DEFAULT_AGENT_NAME, DEFAULT_INSTRUCTIONS, mcp_servers=servers.values())
        _pin_version(agent, model_override)
        return agent, {agent.name: agent}
    agents: dict[str, Agent] = {}
    for spec in settings.agents:
        tools = _with_approval(settings, spec, [_load_tool(settings, spec, tool_spec, Tool) for tool_spec in spec.tools])
        chosen = [servers[name] if only is None else servers[name].only(*only) for name, only in spec.mcp_servers]
        agents[spec.name] = Agent(spec.name, spec.instructions, model=spec.model, tools=tools,
                                  max_context_tokens=spec.max_context_tokens, mcp_servers=chosen,
                                  tool_choice=spec.tool_choice)
    for spec in settings.agents:
        agents[spec.name].handoffs = tuple(agents[name] for name in spec.handoffs)
    for built in agents.values():
        _pin_version(built, model_override)
    start = settings.default_agent or settings.agents[0].name
    return agents[start], agents


def _with_approval(settings: Settings, spec: AgentSpec, tools: list[Any]) -> list[Any]:
    """The agent's tools, those its ``tool_approval`` names given that policy (a copy of the
    tool: another agent may use the same one without it). A name that is none of its Python
    tools is a ConfigError."""
    if not spec.tool_approval:
        return tools
    import copy

    by_name = {t.name: i for i, t in enumerate(tools) if not t.is_custom}
    for name, policy in spec.tool_approval:
        if name not in by_name:
            raise ConfigError(f"config file {settings.config_path}, agent {spec.name!r}: tool_approval names "
                              f"{name!r}, which is none of its Python tools ({', '.join(by_name) or 'none'}); MCP "
                              "tools take their policy from their server's approval and tool_approval")
        changed = copy.copy(tools[by_name[name]])
        changed.approval = policy
        tools[by_name[name]] = changed
    return tools


def _pin_version(agent: Agent, model_override: str | None) -> None:
    """Fix ``agent.version`` at its definition in the config file, then apply ``--model``:
    a model given for one run (or the model a session keeps) is not a new version of the
    agent; the model written in config.toml is part of it."""
    agent.version = agent.version
    if model_override:
        agent.model = model_override


def _load_tool(settings: Settings, spec: AgentSpec, tool_spec: ToolSpec, tool_cls: Any) -> Any:
    where = f"config file {settings.config_path}" + (f", agent {spec.name!r} (line {spec.line})" if spec.line else "")
    if tool_spec.ref is None:
        try:
            return tool_cls.custom(tool_spec.name or "", tool_spec.description, tool_spec.parameters or None)
        except Exception as exc:
            raise ConfigError(f"{where}: custom tool {tool_spec.name!r}: {exc}") from None
    module_name, _, attr = tool_spec.ref.partition(":")
    try:
        module = _import_tool_module(module_name, settings.config_path.parent)
    except Exception as exc:  # ImportError, or the module raised while importing
        raise ConfigError(
            f"{where}: cannot import tool module {module_name!r} ({type(exc).__name__}: {exc})"
        ) from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise ConfigError(f"{where}: module {module_name!r} has no {attr!r}")
    if isinstance(obj, tool_cls):
        return obj
    if callable(obj):
        from .core.tools import tool

        try:
            return tool(obj)
        except Exception as exc:
            raise ConfigError(f"{where}: {tool_spec.ref} cannot be a tool: {exc}") from None
    raise ConfigError(f"{where}: {tool_spec.ref} is not a @tool function")


def _import_tool_module(name: str, config_dir: Path) -> Any:
    """Import ``name`` looking its top-level package up in ``config_dir``, then the current
    directory, then ``sys.path`` (see the module docstring). Raises what importing raises."""
    import importlib
    import importlib.util
    import sys
    from importlib.machinery import PathFinder

    top = name.partition(".")[0]
    if top not in sys.modules:
        dirs: list[str] = []
        for directory in (config_dir, Path.cwd()):
            try:
                resolved = str(Path(directory).resolve())
            except OSError:
                continue
            if resolved not in dirs:
                dirs.append(resolved)
        found = PathFinder.find_spec(top, dirs)
        if found is not None and found.loader is not None:
            module = importlib.util.module_from_spec(found)
            sys.modules[top] = module
            try:
                found.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(top, None)
                raise
    return importlib.import_module(name)


# ---------------------------------------------------------------------------------------
# the session's stored model and endpoint
# ---------------------------------------------------------------------------------------
_OPENAI_URL = "https://api.openai.com/v1"


def session_endpoint(state: State, store: SessionLookup | None, existing: SessionSummary | None, model: str | None,
                     base_url: str | None) -> tuple[str | None, str | None]:
    """The model and base URL to use on ``existing`` (a session or ``None``): the flags when
    given, else those stored with the session (``store.session_endpoint``), else ``None``
    (the configured ones). A flag that changes a stored value is announced."""
    if existing is None or store is None:
        return model, base_url
    stored_model, stored_url = store.session_endpoint(existing.session_id)  # never holds a password
    shown_url = url_without_userinfo(base_url) if base_url else base_url
    for flag, what, given, stored in (("--model", "model", model, stored_model),
                                      ("--base-url", "endpoint", shown_url, stored_url)):
        if given and stored and given != stored:
            notice(state, f"session {existing.session_id} used {what} {stored}; {flag} switches it to {given}")
    if base_url and not model and stored_model == "local":
        stored_model = None  # the embedded model's name means nothing to another endpoint
    if not base_url and stored_url:
        stored_url = with_credentials(stored_url, state.settings().base_url)
    return model or stored_model, base_url or stored_url


def with_credentials(stored_url: str, *given: str | None) -> str:
    """The first of ``given`` (URLs given or configured now, ``None`` skipped) that is
    ``stored_url`` once its ``user:password@`` is left out -- the same endpoint, with the
    credentials the user gives this time -- else ``stored_url`` as is."""
    for url in given:
        if url and url_without_userinfo(url) == stored_url:
            return url
    return stored_url


def endpoint_of(choice: ModelChoice) -> tuple[str, str | None]:
    """The ``(model, base_url)`` a :class:`~chatflow_cli.config.ModelChoice` sends requests to,
    as stored with a session (the local model has no fixed URL: ``None``)."""
    if choice.local:
        return choice.model, None
    return choice.model, choice.base_url or os.environ.get("OPENAI_BASE_URL") or _OPENAI_URL


def stored_endpoint(store: SessionLookup, session_id: str) -> tuple[str | None, str | None] | None:
    """The session's stored ``(model, base_url)``; ``None`` when the session does not exist
    or the store cannot say (a failing store never hides the error being reported)."""
    try:
        return store.session_endpoint(session_id)
    except ChatflowError:
        return None


def remember_endpoint(store: EditStore, session_id: str, choice: ModelChoice, *, model: str | None = None,
                      base_url: str | None = None, worked: bool | None = True, begun: bool = False) -> None:
    """Store ``choice``'s model and endpoint (or ``model`` and ``base_url``, a switch made
    since) with the session, by the rule of :func:`keep_endpoint`."""
    wanted = endpoint_of(choice)
    if model:
        wanted = (model, wanted[1])
    if base_url:
        wanted = (wanted[0], base_url)
    keep_endpoint(store, session_id, wanted, worked=worked, begun=begun)


def keep_endpoint(store: EditStore, session_id: str, wanted: tuple[str | None, str | None], *,
                  worked: bool | None = True, begun: bool = False) -> None:
    """Keep the session's stored endpoint the one of its last turn that worked.

    ``begun``: a turn has begun; ``wanted`` is stored only when the session has none yet (a
    brand-new session's, so another process waiting on it uses it). ``worked``: the run
    worked, ``wanted`` is stored (a switch). ``worked=False``: the run failed; the stored
    endpoint stays, unless the session has no live turn (none of its turns worked), when it
    is taken back: resuming it then uses the endpoint that call is given or configured.
    ``worked=None``: no run now (leaving the REPL): as ``True`` when the session has a live
    turn, else as ``False``. A missing session or a store failure here never hides the run's
    own outcome."""
    if wanted[1] is not None:  # compared with what the store keeps: never a password
        wanted = (wanted[0], url_without_userinfo(wanted[1]))
    try:
        stored = store.session_endpoint(session_id)
        if begun:
            if stored == (None, None):
                store.set_session_endpoint(session_id, *wanted)
            return
        if worked is not True:
            live = store.session_summary(session_id).turn_count > 0
            if worked is None and live:
                worked = True
            elif not live:
                if stored != (None, None):
                    store.set_session_endpoint(session_id, None, None)
                return
        if worked and stored != wanted:
            store.set_session_endpoint(session_id, *wanted)
    except ChatflowError:  # SessionNotFoundError included
        pass
