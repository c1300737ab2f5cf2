"""``--output``/``--json`` on every command: listings, errors and events share one data shape."""

from __future__ import annotations

import json


def test_sessions_ls_and_show_take_output_formats(chatflow, provider):
    assert chatflow("chat", "-s", "o1", "one").returncode == 0
    assert chatflow("chat", "-s", "o1", "two").returncode == 0
    rows = chatflow("sessions", "ls", "-o", "jsonl").jsonl()
    assert [r["session_id"] for r in rows] == ["o1"] and rows == chatflow("sessions", "ls", "--json").json()
    assert chatflow("sessions", "ls", "--output", "json").json() == rows
    lines = chatflow("sessions", "show", "o1", "--output", "jsonl").jsonl()
    assert lines[0]["session"]["session_id"] == "o1"
    assert [ln["turn"]["number"] for ln in lines[1:]] == [1, 2]
    whole = chatflow("sessions", "show", "o1", "--output", "json").json()
    assert whole == chatflow("sessions", "show", "o1", "--json").json()
    assert whole["turns"] == [ln["turn"] for ln in lines[1:]]
    clash = chatflow("sessions", "ls", "--json", "--output", "jsonl")
    assert clash.returncode == 2 and "--json" in clash.stderr


def test_json_error_for_a_missing_session(chatflow, provider):
    r = chatflow("sessions", "show", "nonexist", "--json")
    assert r.returncode == 3, r
    assert r.json() == {"error": "no session 'nonexist' (list them with: chatflow sessions ls)",
                        "error_type": "SessionNotFoundError", "exit_code": 3, "session_id": "nonexist",
                        "is_error": True}
    assert "chatflow: error: no session 'nonexist'" in r.stderr
    r = chatflow("replay", "nonexist", "--json")
    assert r.returncode == 3
    [event] = r.jsonl()
    assert event["schema"] == 1 and event["type"] == "error" and event["data"]["exit_code"] == 3


def test_chat_jsonl_and_replay_share_one_event_shape(chatflow, provider):
    r = chatflow("chat", "-s", "ev", "--output", "jsonl", "hi")
    assert r.returncode == 0, r
    live = r.jsonl()
    replay = chatflow("replay", "ev", "--output", "jsonl").jsonl()
    assert chatflow("replay", "ev", "--json").jsonl() == replay
    assert chatflow("replay", "ev", "--output", "json").json() == replay
    keys = {"schema", "seq", "type", "session_id", "turn", "created_at", "data"}
    assert all(set(e) == keys for e in replay), replay[0]
    by_seq = {e["seq"]: e for e in replay}
    for e in live:
        assert e["schema"] == 1 and e["session_id"] == "ev" and "payload" not in e
        if "seq" in e:  # a stored event: the same type, turn and data as replay shows
            stored = by_seq[e["seq"]]
            assert (e["type"], e["turn"], e["data"]) == (stored["type"], stored["turn"], stored["data"])
    statuses = [e for e in replay if e["type"] == "status"]
    assert statuses and any("owner" in e["data"] for e in statuses)
    assert all('"token"' not in json.dumps(e["data"]) for e in live + replay)
    assert live[-1]["type"] == "result" and live[-1]["data"]["is_error"] is False


def test_chat_jsonl_error_result_keeps_is_error_in_data(chatflow, provider):
    provider.add_error(400, message="bad things")
    r = chatflow("chat", "-s", "err", "--output", "jsonl", "hi")
    assert r.returncode == 5, r
    final = r.jsonl()[-1]
    assert final["type"] == "result" and final["data"]["is_error"] is True and "is_error" not in final
    assert final["data"]["exit_code"] == 5


def test_chat_errors_before_the_run_end_a_json_output_as_errors_during_it_do(chatflow, provider, tmp_path):
    """A file that cannot be attached, an empty message, a bad session id: refused before the
    run, each still ends ``--output json`` with its error object and ``jsonl`` with one failed
    ``result`` event, once (a run's own failure is not printed twice)."""
    missing = str(tmp_path / "nonexist.png")
    cases = [(["-f", missing, "x"], "AttachmentError", 2), (["  "], None, 2), (["-s", "bad id!", "x"], None, 2)]
    for args, error_type, code in cases:
        r = chatflow("chat", "--output", "json", *args)
        assert r.returncode == code, r
        obj = r.json()
        assert obj["is_error"] is True and obj["exit_code"] == code and obj["error"] in r.stderr, (args, r)
        assert error_type in (None, obj["error_type"]), obj
        [event] = chatflow("chat", "--output", "jsonl", *args).jsonl()
        assert event["type"] == "result" and event["data"] == obj, (args, event)
    assert provider.requests == []
    provider.add_error(400, message="bad things")
    r = chatflow("chat", "-s", "once", "--output", "json", "hi")
    assert r.returncode == 5 and r.stdout.count("\n") == 1 and r.json()["error_type"] == "BadRequestError", r
