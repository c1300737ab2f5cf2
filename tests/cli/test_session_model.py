"""The model and endpoint belong to the session: resuming it uses them; a session none of
whose turns worked keeps none."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers.fakeserver import FakeServer


def test_resume_uses_the_sessions_model_and_endpoint(chatflow, fake_server, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    r = chatflow("chat", "-s", "ep", "--base-url", fake_server.url, "-m", "fake-model", "first")
    assert r.returncode == 0, r
    r = chatflow("chat", "-s", "ep", "second")  # no flags, no environment: the session's own
    assert r.returncode == 0, r
    assert [q["model"] for q in fake_server.requests] == ["fake-model", "fake-model"]
    assert "switches" not in r.stderr
    r = chatflow("chat", "-s", "ep", "-m", "other-model", "third")
    assert r.returncode == 0, r
    assert "session ep used model fake-model; --model switches it to other-model" in r.stderr
    r = chatflow("chat", "-s", "ep", "fourth")
    assert fake_server.requests[-1]["model"] == "other-model"
    shown = chatflow("sessions", "show", "ep", "--json").json()["session"]
    assert shown["model"] == "other-model" and shown["base_url"] == fake_server.url
    db = Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db"
    assert b"sk-" not in db.read_bytes()


def test_a_session_whose_first_turn_failed_remembers_no_endpoint(chatflow, fake_server, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    fake_server.add_error(401)
    r = chatflow("chat", "-s", "f1", "--base-url", fake_server.url, "-m", "wrong-model", "first fails")
    assert r.returncode == 5, r
    shown = chatflow("sessions", "show", "f1", "--json").json()["session"]
    assert (shown["model"], shown["base_url"]) == (None, None)
    with FakeServer() as other:  # the endpoint this call is configured with
        monkeypatch.setenv("OPENAI_BASE_URL", other.url)
        monkeypatch.setenv("CHATFLOW_MODEL", "right-model")
        r = chatflow("chat", "-c", "resume")
        assert r.returncode == 0, r
        assert [q["model"] for q in other.requests] == ["right-model"]
        assert len(fake_server.requests) == 1  # the failed URL was not used again
        shown = chatflow("sessions", "show", "f1", "--json").json()["session"]
        assert (shown["model"], shown["base_url"]) == ("right-model", other.url)
        # a later failure on another endpoint leaves the last one that worked
        fake_server.add_error(401)
        r = chatflow("chat", "-s", "f1", "--base-url", fake_server.url, "again")
        assert r.returncode == 5, r
        shown = chatflow("sessions", "show", "f1", "--json").json()["session"]
        assert (shown["model"], shown["base_url"]) == ("right-model", other.url)
