"""``config show``: the settings in effect and where each comes from; API keys are masked, and
the base URL is shown without its ``user:password@``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..config import LOCAL_MODEL, mask_secret, resolve_model
from ..core.dsn import url_without_userinfo
from ..core.errors import ConfigError
from ..render import dumps, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State

__all__ = ["show_config"]


def show_config(state: State, *, as_json: bool) -> None:
    """Print the settings in effect: ``key  value`` lines, or one JSON object.

    The model and endpoint shown are those requests actually use (a default filled in, or
    the local model); a configuration that cannot send anything says why (``problem``).

    Args:
        state: The run.
        as_json: One JSON object instead of aligned lines.

    Raises:
        ConfigError: The config file is malformed or invalid.
    """
    s = state.settings()
    # The model and endpoint requests actually use (a default filled in, or the local model),
    # not only what was configured; a configuration that cannot send anything says why.
    model, base_url, problem = s.model, s.base_url, None
    try:
        choice = resolve_model(s)
    except ConfigError as exc:
        problem = exc.message
    else:
        model = choice.model
        base_url = "(the local llama.cpp server chatflow starts)" if choice.local else (
            choice.base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1")
    # The model client's transport: $CHATFLOW_TRANSPORT when set, else per command.
    env_transport = os.environ.get("CHATFLOW_TRANSPORT") or None
    transport = env_transport or "http (chat, replay --rerun), openai (REPL)"
    model_source = s.sources.get("model") if s.model else ("default" if model != LOCAL_MODEL else "default (local)")
    data: dict[str, Any] = {
        "config_file": str(s.config_path),
        "config_loaded": s.config_loaded,
        "data_dir": str(s.data_dir),
        "db_path": s.db,
        "db_source": s.sources.get("db_path"),
        "model": model,
        "model_source": model_source,
        "base_url": url_without_userinfo(base_url) if base_url else base_url,
        "base_url_source": s.sources.get("base_url"),
        "api_key_env": s.api_key_env,
        "api_key": mask_secret(s.api_key),
        "default_agent": s.default_agent,
        "max_turns": s.max_turns,
        "local_keep_alive": s.local_keep_alive,
        "local_keep_alive_source": s.sources.get("local_keep_alive"),
        "message_id_scope": s.message_id_scope,
        "message_id_scope_source": s.sources.get("message_id_scope", "default"),
        "max_context_tokens": s.max_context_tokens,
        "max_context_tokens_source": s.sources.get("max_context_tokens", "default") if s.max_context_tokens
        else "default (the model's context size: the local model's, or a table of common models)",
        "compact_at": s.compact_at,
        "compact_at_source": s.sources.get("compact_at", "default"),
        "compact_prompt": s.compact_prompt,
        "compact_prompt_source": s.sources.get("compact_prompt", "default") if s.compact_prompt
        else "default (chatflow's built-in prompt)",
        "max_tool_rounds": s.max_tool_rounds,
        "max_tool_rounds_source": s.sources.get("max_tool_rounds", "default"),
        "transport": transport,
        "transport_source": "env $CHATFLOW_TRANSPORT" if env_transport else "default",
        "agents": [a.name for a in s.agents],
    }
    if problem:
        data["problem"] = problem
    if as_json:
        state.env.stdout.write(dumps(data, indent=2) + "\n")
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, list):
            value = ", ".join(value) or "-"
        elif value is None:
            value = "off" if key == "compact_at" else "-"
        state.env.stdout.write(f"{key:<{width}}  {safe_text(str(value))}\n")
