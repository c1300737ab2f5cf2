"""Resuming a session in the REPL resolves its model once; the flags' and config's model, what
``/new`` goes back to, is resolved only when ``/new`` needs it."""

from __future__ import annotations

from typing import Any

import pytest

from chatflow_cli.core.agents import Agent


def test_resuming_resolves_the_model_once_and_new_resolves_the_defaults_when_needed(
        repl_driver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import chatflow_cli.config as config

    d = repl_driver
    store = d.store()
    store.save(store.get_or_create("kept", Agent("Assistant", "")))
    store.set_session_endpoint("kept", "stored-model", d.server.url)
    store.close()
    real = config.resolve_model
    resolved: list[str | None] = []

    def counting(settings: Any, **kwargs: Any) -> Any:
        resolved.append(settings.model)
        return real(settings, **kwargs)

    monkeypatch.setattr(config, "resolve_model", counting)

    def script(d: Any) -> None:
        d.wait_prompt()
        assert resolved == ["stored-model"]  # the session's own model, once
        d.type("/new\r")
        d.wait_text("model: fake-model (a new session)")
        d.type("/exit\r")

    d.run(script, session_id="kept")
    assert resolved == ["stored-model", "fake-model"]
