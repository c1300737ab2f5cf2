"""A session's model and endpoint: which model a stored session talks to, and where.

A session keeps the model and base URL it talks to (``store.session_endpoint``); resuming it
uses them unless ``--model``/``--base-url`` (or the REPL's ``/model``) switch it, which is
announced. What a session keeps is the endpoint of its last turn that worked: a run that
fails leaves it where it was, and a session none of whose turns worked keeps none (its
first turn's endpoint is stored while that turn runs, so a process waiting on it uses it
too, and taken back when the turn fails), so resuming it uses what this call is given or
configured, never a URL the user does not give this time. Each turn also records what
answered it (``turn.completed``'s ``model`` and ``base_url``).

A URL's ``user:password@`` is never stored (the store leaves it out, see
:func:`~chatflow_cli.core.dsn.url_without_userinfo`; the user name goes too). Resuming a
session whose stored URL is the one given or configured now without its userinfo
(``--base-url``, else ``OPENAI_BASE_URL`` or ``base_url`` in config.toml) uses the one given,
credentials included; otherwise the stored URL is used as is (a server wanting the
credentials then answers 401, a clear error line).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .context import notice
from .core.dsn import url_without_userinfo
from .core.errors import ChatflowError

if TYPE_CHECKING:  # pragma: no cover
    from .config import ModelChoice
    from .context import State
    from .core.memory.protocol import EditStore, SessionLookup, SessionSummary

__all__ = ["endpoint_of", "keep_endpoint", "remember_endpoint", "session_endpoint", "stored_endpoint",
           "with_credentials"]

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
