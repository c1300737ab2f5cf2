"""Honest records: each turn records the model and endpoint that answered it, an unreported
usage is unknown (null) and never a false 0, and reasoning tokens are not counted as
context. The real ``chatflow`` process against the fake server over HTTP."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any



def _completed(chatflow: Any, session_id: str) -> list[dict[str, Any]]:
    events = chatflow("replay", session_id, "--output", "json").json()
    return [e for e in events if e["type"] == "turn.completed"]


def _payload(event: dict[str, Any]) -> dict[str, Any]:
    return event.get("payload", event.get("data", {}))


def test_each_turn_records_the_model_and_endpoint_that_answered_it(chatflow, provider, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-records-secret-1234")
    assert chatflow("chat", "-s", "sw", "-m", "model-a", "one").returncode == 0
    r = chatflow("chat", "-s", "sw", "-m", "model-b", "two")
    assert r.returncode == 0, r
    assert [q["model"] for q in provider.requests] == ["model-a", "model-b"]
    done = [_payload(e) for e in _completed(chatflow, "sw")]
    assert [(d["model"], d["base_url"]) for d in done] == [("model-a", provider.url), ("model-b", provider.url)]

    shown = chatflow("sessions", "show", "sw", "--json").json()
    assert [(t["model"], t["base_url"]) for t in shown["turns"]] == [("model-a", provider.url),
                                                                     ("model-b", provider.url)]
    text = chatflow("sessions", "show", "sw").stdout
    assert "Turn 1 · model-a" in text and "Turn 2 · model-b" in text
    replay = chatflow("replay", "sw").stdout
    assert f"turn 1 by Assistant (model-a at {provider.url})" in replay
    assert f"turn 2 by Assistant (model-b at {provider.url})" in replay

    md = chatflow("sessions", "export", "sw", "--format", "md").stdout
    first, second = md.split("## Turn 2")
    assert "`model-a`" in first.split("## Turn 1")[1] and "model-b" not in first.split("## Turn 1")[1]
    assert "`model-b`" in second and "model-a" not in second

    # both formats import back with each turn's own model and endpoint
    for fmt in ("chatflow", "md"):
        path = tmp_path / f"sw.{fmt}"
        assert chatflow("sessions", "export", "sw", "--format", fmt, "-o", str(path)).returncode == 0
        assert "sk-records-secret" not in path.read_text()
        r = chatflow("sessions", "import", str(path), "--into", f"sw-{fmt}")
        assert r.returncode == 0, r
        shown = chatflow("sessions", "show", f"sw-{fmt}", "--json").json()
        assert [(t["model"], t["base_url"]) for t in shown["turns"]] == [("model-a", provider.url),
                                                                         ("model-b", provider.url)], fmt
        again = chatflow("sessions", "export", f"sw-{fmt}", "--format", "md").stdout
        assert again.split("## Turn 2")[1].count("`model-b`") == 1 and "model-a" not in again.split("## Turn 2")[1]
    db = Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db"
    assert b"sk-records-secret" not in db.read_bytes()


def test_a_base_url_with_a_password_is_recorded_on_the_turn_without_it(chatflow, provider):
    url = provider.url.replace("http://", "http://user:pa55word@")
    r = chatflow("chat", "-s", "pw", "--base-url", url, "hi")
    assert r.returncode == 0, r
    [done] = _completed(chatflow, "pw")
    assert _payload(done)["base_url"] == provider.url


def test_a_server_that_reports_no_usage_leaves_it_unknown_not_zero(chatflow, provider):
    provider.add_text("no counts here").report_usage = False
    r = chatflow("chat", "-s", "nu", "--output", "json", "--idempotency-key", "k1", "hello")
    assert r.returncode == 0, r
    assert r.json()["usage"] is None
    [done] = _completed(chatflow, "nu")
    assert _payload(done)["usage"] is None
    md = chatflow("sessions", "export", "nu", "--format", "md").stdout
    assert "tokens in" not in md
    again = chatflow("chat", "-s", "nu", "--output", "json", "--idempotency-key", "k1", "hello")
    assert again.returncode == 0 and again.json()["replayed"] is True
    assert again.json()["usage"] is None  # the first result, usage unknown as it was
    # a turn whose second request reported none: unknown too, not the first request's part
    provider.add_tool_calls([("c1", "missing_tool", "{}")])
    provider.add_text("after the tool").report_usage = False
    r = chatflow("chat", "-s", "nu", "--output", "json", "again")
    assert r.returncode == 0, r
    assert r.json()["usage"] is None
    assert _payload(_completed(chatflow, "nu")[-1])["usage"] is None


def test_reported_usage_is_stored_in_one_shape(chatflow, provider):
    provider.add_text("counted", usage={"prompt_tokens": 21, "completion_tokens": 4, "total_tokens": 25})
    assert chatflow("chat", "-s", "us", "hello").returncode == 0
    [done] = _completed(chatflow, "us")
    assert _payload(done)["usage"] == {"prompt_tokens": 21, "completion_tokens": 4, "total_tokens": 25}
    md = chatflow("sessions", "export", "us", "--format", "md").stdout
    assert "21 tokens in, 4 out" in md


def test_old_usage_shapes_in_an_imported_log_still_render(chatflow, tmp_path):
    """A log written before: chatflow's own false ``{0, 0, 0}`` reads as unknown; an
    imported turn's ``input_tokens``/``output_tokens`` read as prompt and completion."""
    lines = [
        {"format": "chatflow", "version": 1, "session": {
            "session_id": "old", "title": None, "agent": "Assistant", "status": "idle", "metadata": {},
            "settings": {"max_turns": 20, "model": "m", "base_url": None},
            "created_at": "2026-01-01T00:00:00.000Z", "updated_at": "2026-01-01T00:00:00.000Z",
            "turns": 2, "events": 7}},
        {"seq": 1, "type": "session.created", "created_at": "2026-01-01T00:00:00.000Z",
         "data": {"agent": "Assistant", "max_turns": 20, "metadata": {}}},
    ]
    seq = 1
    for turn, usage in ((1, {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
                        (2, {"input_tokens": 12, "output_tokens": 3})):
        for kind, message in (("message.user", {"role": "user", "content": f"q{turn}"}),
                              ("message.model", {"role": "model", "content": f"a{turn}", "agent": "Assistant"})):
            seq += 1
            lines.append({"seq": seq, "type": kind, "created_at": "2026-01-01T00:00:00.000Z",
                          "data": {"turn": turn, "message": message}})
        seq += 1
        lines.append({"seq": seq, "type": "turn.completed", "created_at": "2026-01-01T00:00:00.000Z",
                      "data": {"turn": turn, "agent": "Assistant", "content": f"a{turn}", "usage": usage}})
    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    r = chatflow("sessions", "import", str(path))
    assert r.returncode == 0, r
    md = chatflow("sessions", "export", "old", "--format", "md").stdout
    turn1, turn2 = md.split("## Turn 2")
    assert "tokens in" not in turn1
    assert "12 tokens in, 3 out" in turn2
    # the log keeps what it was given, byte for byte
    assert [_payload(e)["usage"] for e in _completed(chatflow, "old")] == [lines[4]["data"]["usage"],
                                                                            lines[7]["data"]["usage"]]


def test_reasoning_tokens_are_not_counted_as_context(chatflow, provider):
    """A 10-character answer that cost 3,000 reasoning tokens stays in the next request's
    window (only what is sent back counts)."""
    provider.add_text("ten chars!", usage={"prompt_tokens": 30, "completion_tokens": 3004, "total_tokens": 3034,
                                           "completion_tokens_details": {"reasoning_tokens": 3000}})
    # reasoning text but no reasoning count: the reply is estimated, not taken as 3,000 tokens
    provider.add_reasoning(["thinking " * 50], text="short too",
                           usage={"prompt_tokens": 40, "completion_tokens": 3003, "total_tokens": 3043})
    provider.add_text("third")
    for message in ("first", "second", "third"):
        r = chatflow("chat", "-s", "rt", "--max-context-tokens", "2000", message)
        assert r.returncode == 0, r
        assert "dropped" not in r.stderr and "left out" not in r.stderr
    sent = json.dumps(provider.requests[-1]["messages"])
    assert "ten chars!" in sent and "short too" in sent
    [usage] = [_payload(e)["usage"] for e in _completed(chatflow, "rt")][:1]
    assert usage["reasoning_tokens"] == 3000 and usage["completion_tokens"] == 3004
