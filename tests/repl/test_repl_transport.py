"""The REPL sends through the ``openai`` client (start-up time does not matter there);
``CHATFLOW_TRANSPORT=http`` moves it to the http transport like one-shot ``chatflow chat``."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("setting", "agent"), [(None, "OpenAI/Python"), ("http", "chatflow/")])
def test_the_repl_transport(repl_driver, monkeypatch: pytest.MonkeyPatch, setting: str | None, agent: str) -> None:
    d = repl_driver
    if setting is None:
        monkeypatch.delenv("CHATFLOW_TRANSPORT", raising=False)
    else:
        monkeypatch.setenv("CHATFLOW_TRANSPORT", setting)
    d.server.add_text("hello from the model")

    def script(d) -> None:
        d.type("hello repl\r")
        d.wait_text("hello from the model")

    d.run(script, session_id="repl-transport")
    agents = [entry.headers.get("user-agent", "") for entry in d.server.log]
    assert len(agents) == 1 and agents[0].startswith(agent), agents
