"""The token budget and compaction from the command line, as real processes against the
fake server: ``--max-context-tokens``, config keys, ``sessions show`` reporting the context
use, ``sessions compact``, and automatic compaction in a one-shot ``chat``."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from chatflow_cli.core.compaction import DEFAULT_PROMPT
from tests.conftest import COMMAND, REPO
from tests.helpers.wait import wait_until


def _long(i: int) -> str:
    return f"question {i} " + "word " * 60


def test_max_context_tokens_trims_the_request_and_show_reports_it(chatflow, provider, config_file) -> None:
    config_file("compact_at = 0\n")  # trimming alone, no summary
    for i in range(1, 6):
        provider.add_text(f"answer {i}")
        assert chatflow("chat", "-s", "w", "--max-context-tokens", "600", _long(i)).returncode == 0
    sent = provider.requests[-1]["messages"]
    users = [m["content"] for m in sent if m["role"] == "user"]
    assert users[-1] == _long(5) and _long(1) not in users  # older turns left the request, whole
    show = chatflow("sessions", "show", "w", "--json").json()
    context = show["session"]["context"]
    assert context["context"] is None and context["summary_through"] is None  # fake-model: size unknown
    assert context["turns"] == 5 and context["tokens"] > 0
    assert [t["number"] for t in show["turns"]] == [1, 2, 3, 4, 5]  # nothing deleted


def test_config_sizes_show_and_automatic_compaction_in_one_shot_chat(chatflow, provider, config_file) -> None:
    config_file('max_context_tokens = 2000\ncompact_at = 0.8\ncompact_prompt = "Summarise tersely."\n')
    for i in range(1, 4):  # about 250 tokens a turn: far from 80 % of the 1,500-token budget
        provider.add_text(f"answer {i} " + "detail " * 60)
        assert chatflow("chat", "-s", "auto", _long(i)).returncode == 0
    show = chatflow("sessions", "show", "auto", "--json").json()["session"]["context"]
    assert show["context"] == 2000 and show["budget"] == 1500 and show["summary_through"] is None
    assert show["turns"] == 3 and 300 < show["tokens"] < 1200  # replies count what the server reported
    provider.add_text("SUMMARY of the early questions")
    provider.add_text("fourth answer")
    r = chatflow("chat", "-s", "auto", "--output", "jsonl", "question 4 " + "word " * 2000)  # passes 80 %
    assert r.returncode == 0, r
    # the message alone is larger; the warning names what was sent, the summary included
    assert "turn 4: the context (system message, summary of turns 1..3 and turn 4) is about " in r.stderr
    assert "over the budget of 1500; it was sent whole" in r.stderr
    assert "chatflow: compacted turns 1..3: " in r.stderr  # the automatic compaction says so
    types = [json.loads(line)["type"] for line in r.stdout.splitlines()]
    assert types.index("context.compacted") < types.index("message.user")
    compaction, turn = provider.requests[-2], provider.requests[-1]
    assert compaction["messages"][0]["content"] == "Summarise tersely." and "tools" not in compaction
    assert turn["messages"][1] == {"role": "system", "content": "SUMMARY of the early questions"}  # after the instructions
    after = chatflow("sessions", "show", "auto", "--json").json()
    assert after["session"]["context"]["summary_through"] is not None
    assert [t["number"] for t in after["turns"]] == [1, 2, 3, 4]
    text = chatflow("sessions", "show", "auto").stdout
    assert "context " in text and "of 2.0k tokens" in text and "summarised" in text


def test_compaction_off_in_config(chatflow, provider, config_file) -> None:
    config_file("max_context_tokens = 1000\ncompact_at = 0\n")
    for i in range(1, 7):
        provider.add_text(f"answer {i} " + "detail " * 60)
        assert chatflow("chat", "-s", "off", _long(i)).returncode == 0
    assert len(provider.requests) == 6
    assert all(m["content"] != DEFAULT_PROMPT for r in provider.requests for m in r["messages"])


def test_sessions_compact(chatflow, provider) -> None:
    for i in range(1, 5):
        provider.add_text(f"answer {i}")
        assert chatflow("chat", "-s", "c", f"question {i}").returncode == 0
    provider.add_text("the summary of 1..3")
    r = chatflow("sessions", "compact", "c", "--through", "3", "--instructions", "keep numbers", "--json")
    assert r.returncode == 0, r
    done = r.json()
    assert done["through"] == 3 and done["instructions"] == "keep numbers" and not done["repeated"]
    body = provider.requests[-1]
    assert body["messages"][0]["content"] == DEFAULT_PROMPT and "Focus: keep numbers" in body["messages"][1]["content"]
    again = chatflow("sessions", "compact", "c", "--through", "3", "--instructions", "keep numbers")
    assert again.returncode == 0 and "nothing was sent" in again.stdout and len(provider.requests) == 5
    # rollback below K: the summary no longer applies; every turn is still listed
    assert chatflow("sessions", "rollback", "c", "--to", "2").returncode == 0
    shown = chatflow("sessions", "show", "c", "--json").json()
    assert shown["session"]["context"]["summary_through"] is None
    events = [json.loads(line) for line in chatflow("replay", "c", "--output", "jsonl").stdout.splitlines()]
    compacted = [e for e in events if e["type"] == "context.compacted"]
    assert len(compacted) == 1 and compacted[0]["data"]["through"] == 3
    bad = chatflow("sessions", "compact", "c", "--through", "9")
    assert bad.returncode == 2 and "turns are 1..2" in bad.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_sessions_compact_says_so_and_compacts_nothing(chatflow, provider, signum) -> None:
    """SIGTERM while the summary is being written: said as ``chat`` says it (``chatflow:
    terminated (SIGTERM): ...``), exit 143; Ctrl-C: exit 130; nothing compacted either way."""
    for i in range(1, 4):
        provider.add_text(f"answer {i}")
        assert chatflow("chat", "-s", "k", f"question {i}").returncode == 0
    provider.add_hang()  # the summary never comes
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([*COMMAND, "sessions", "compact", "k"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)
    try:
        wait_until(lambda: len(provider.requests) == 4, 60, "the compaction request", proc=proc)
        proc.send_signal(signum)
        out, err = (b.decode() for b in proc.communicate(timeout=60))
    finally:
        if proc.poll() is None:
            proc.kill()
    if signum == signal.SIGTERM:
        assert proc.returncode == 143, (out, err)
        assert "chatflow: terminated (SIGTERM): the compaction was interrupted; nothing was compacted" in err, err
    else:
        assert proc.returncode == 130, (out, err)
        assert "chatflow: the compaction was interrupted; nothing was compacted" in err, err
    assert "Traceback" not in err and "chatflow: error:" not in err and out == ""
    shown = chatflow("sessions", "show", "k", "--json").json()
    assert shown["session"]["context"]["summary_through"] is None and shown["session"]["status"] == "idle"


def _big(i: int) -> str:
    return f"question {i} " + "word " * 550  # about 890 estimated tokens: two do not fit 1,536


def _users(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


def test_automatic_compaction_covers_every_turn_that_leaves_the_window(chatflow, provider) -> None:
    """2,048 tokens (1,536 of budget) and turns of about 900: each new turn pushes the one
    before out of the request, so it is summarised first, even with only one earlier turn."""
    provider.add_text("answer 1")
    assert chatflow("chat", "-s", "k", "--max-context-tokens", "2048", _big(1)).returncode == 0
    provider.add_text("S1: the first question")
    provider.add_text("answer 2")
    r2 = chatflow("chat", "-s", "k", "--max-context-tokens", "2048", _big(2))
    assert r2.returncode == 0, r2
    assert "chatflow: compacted turn 1: " in r2.stderr and "left the context window" not in r2.stderr
    compaction1, turn2 = provider.requests[1], provider.requests[2]
    assert compaction1["messages"][0]["content"] == DEFAULT_PROMPT and "question 1" in _users(compaction1)[0]
    assert {"role": "system", "content": "S1: the first question"} in turn2["messages"]
    assert _users(turn2) == [_big(2)]
    provider.add_text("S2: both questions")
    provider.add_text("answer 3")
    r3 = chatflow("chat", "-s", "k", "--max-context-tokens", "2048", "--output", "json", _big(3))
    assert r3.returncode == 0, r3
    compaction2, turn3 = provider.requests[3], provider.requests[4]
    asked = _users(compaction2)[0]  # the earlier summary and turn 2: nothing is skipped
    assert "S1: the first question" in asked and "question 2" in asked and "question 1 " not in asked
    assert {"role": "system", "content": "S2: both questions"} in turn3["messages"]
    assert _users(turn3) == [_big(3)]
    done = r3.json()  # stdout stays one JSON object; the compaction is a field of it
    assert done["compaction"]["through"] == 2 and done["compaction"]["failed"] is False
    assert "chatflow: compacted turns 1..2: " in r3.stderr
    events = [json.loads(line) for line in chatflow("replay", "k", "--output", "jsonl").stdout.splitlines()]
    assert [e["data"]["through"] for e in events if e["type"] == "context.compacted"] == [1, 2]


def test_turns_dropped_without_a_summary_are_announced(chatflow, provider, config_file) -> None:
    config_file("compact_at = 0\n")  # compaction off: dropping is the only way to fit
    provider.add_text("answer 1")
    assert chatflow("chat", "-s", "d", "--max-context-tokens", "2048", _big(1)).returncode == 0
    provider.add_text("answer 2")
    r = chatflow("chat", "-s", "d", "--max-context-tokens", "2048", "--output", "jsonl", _big(2))
    assert r.returncode == 0, r
    assert "chatflow: turn 1 left the context window (not summarised)" in r.stderr
    dropped = [json.loads(line) for line in r.stdout.splitlines() if '"context.dropped"' in line]
    assert [d["data"] for d in dropped] == [{"first": 1, "last": 1, "summarised": False}]
    assert _users(provider.requests[-1]) == [_big(2)]


def test_a_failed_automatic_compaction_says_so_and_the_drop_is_announced(chatflow, provider) -> None:
    provider.add_text("answer 1")
    assert chatflow("chat", "-s", "e", "--max-context-tokens", "2048", _big(1)).returncode == 0
    provider.add_error(400, {"error": {"message": "no summaries today", "type": "invalid_request_error"}})
    provider.add_text("answer 2")
    r = chatflow("chat", "-s", "e", "--max-context-tokens", "2048", "--output", "json", _big(2))
    assert r.returncode == 0, r
    assert "chatflow: automatic compaction through turn 1 failed: " in r.stderr
    assert "chatflow: turn 1 left the context window (not summarised)" in r.stderr
    assert r.json()["compaction"]["failed"] is True
    assert chatflow("sessions", "show", "e", "--json").json()["session"]["context"]["summary_through"] is None


def test_a_compacted_session_survives_export_and_import(chatflow, provider, tmp_path) -> None:
    for i in range(1, 4):
        provider.add_text(f"answer {i}")
        assert chatflow("chat", "-s", "x", f"question {i}").returncode == 0
    provider.add_text("S2: questions one and two")
    assert chatflow("sessions", "compact", "x", "--through", "2").returncode == 0
    provider.add_text("answer 4")
    assert chatflow("chat", "-s", "x", "question 4").returncode == 0
    exported = chatflow("sessions", "export", "x")
    assert exported.returncode == 0 and '"context.compacted"' in exported.stdout
    path = tmp_path / "x.jsonl"
    path.write_text(exported.stdout, encoding="utf-8")
    other = tmp_path / "other.db"
    imported = chatflow("--db", str(other), "sessions", "import", str(path))
    assert imported.returncode == 0, imported
    again = chatflow("--db", str(other), "sessions", "export", "x").jsonl()
    original = exported.jsonl()
    assert [(e["seq"], e["type"], e["data"]) for e in again[1:-1]] == [
        (e["seq"], e["type"], e["data"]) for e in original[1:]]  # apart from times and session.imported
    shown = chatflow("--db", str(other), "sessions", "show", "x", "--json").json()
    assert shown["session"]["context"]["summary_through"] == 2
    provider.add_text("answer 5")
    assert chatflow("--db", str(other), "chat", "-s", "x", "question 5").returncode == 0
    sent = provider.requests[-1]["messages"]
    assert {"role": "system", "content": "S2: questions one and two"} in sent
    assert [m["content"] for m in sent if m["role"] == "user"] == ["question 3", "question 4", "question 5"]


def _three_turns(chatflow, provider, session: str) -> None:
    for i in range(1, 4):
        provider.add_text(f"answer {i}")
        assert chatflow("chat", "-s", session, f"question {i}").returncode == 0


def test_a_summary_cut_by_the_token_limit_is_refused(chatflow, provider) -> None:
    _three_turns(chatflow, provider, "cut")
    provider.add_text("S: the first question was about", finish_reason="length")
    r = chatflow("sessions", "compact", "cut")
    assert r.returncode == 5, r
    assert "the summary was cut by the token limit" in r.stderr and "nothing was compacted" in r.stderr
    assert "--through" in r.stderr and r.stdout == ""
    assert chatflow("sessions", "show", "cut", "--json").json()["session"]["context"]["summary_through"] is None
    assert chatflow("sessions", "show", "cut", "--json").json()["session"]["status"] == "idle"


def test_compact_json_prints_its_error_as_json(chatflow, provider) -> None:
    _three_turns(chatflow, provider, "j")
    bad = chatflow("sessions", "compact", "j", "--through", "9", "--json")
    assert bad.returncode == 2
    error = bad.json()
    assert error["is_error"] is True and error["exit_code"] == 2 and "turns are 1..3" in error["error"]
    missing = chatflow("sessions", "compact", "nope", "--json")
    assert missing.returncode != 0 and missing.json()["is_error"] is True


def test_busy_during_a_compaction_says_a_compaction_is_running(chatflow, provider) -> None:
    import os
    import subprocess

    from tests.conftest import COMMAND, REPO
    from tests.helpers.stored import session_running
    from tests.helpers.wait import wait_until

    import threading

    _three_turns(chatflow, provider, "b")
    held = threading.Event()  # the summary's second chunk waits for it: the compaction runs until then
    summary = provider.add_text("the summary", chunks=["the", " summary"])
    summary.gate, summary.gate_at = held, 1
    env = dict(os.environ, PYTHONPATH=str(REPO))
    first = subprocess.Popen([*COMMAND, "sessions", "compact", "b"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, env=env)
    try:
        wait_until(lambda: session_running(chatflow, "b"), 60, "the compaction to hold the session")
        busy = chatflow("chat", "-s", "b", "question 4")
        assert busy.returncode == 4, busy
        assert f"is busy: a compaction is running in pid {first.pid}" in busy.stderr
    finally:
        held.set()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err


def test_sessions_show_always_prints_the_context_line(chatflow, provider, config_file) -> None:
    provider.add_text("answer 1")
    assert chatflow("chat", "-s", "v", "question 1").returncode == 0
    lines = chatflow("sessions", "show", "v").stdout.splitlines()
    tokens = chatflow("sessions", "show", "v", "--json").json()["session"]["context"]["tokens"]
    assert lines[:3] == [lines[0], "question 1", f"  context {tokens} tokens (budget unknown) · 1 turn sent"]
    config_file("max_context_tokens = 4000\n")
    lines = chatflow("sessions", "show", "v").stdout.splitlines()
    assert lines[2] == f"  context {tokens} of 4.0k tokens · 1 turn sent"


def test_usage_a_server_does_not_report_is_null_not_zero(chatflow, provider) -> None:
    """llama-cpp-python's server (the embedded model's) streams no usage: json says null."""
    provider.add_text("no counts here").report_usage = False
    r = chatflow("chat", "-s", "u", "--output", "json", "hello")
    assert r.returncode == 0, r
    assert r.json()["usage"] is None
    provider.add_text("counted")
    counted = chatflow("chat", "-s", "u", "--output", "json", "again").json()["usage"]
    assert counted is not None and counted["completion_tokens"] > 0


def test_a_summary_whose_stream_ended_without_a_finish_reason_is_refused(chatflow, provider) -> None:
    _three_turns(chatflow, provider, "nofinish")
    provider.add_text("S: the first question was about", finish_reason=None)
    r = chatflow("sessions", "compact", "nofinish")
    assert r.returncode == 5, r
    assert "the summary did not finish (the stream ended without a finish reason)" in r.stderr
    assert "nothing was compacted" in r.stderr and r.stdout == ""
    shown = chatflow("sessions", "show", "nofinish", "--json").json()["session"]
    assert shown["context"]["summary_through"] is None and shown["status"] == "idle"


def test_automatic_compaction_that_cannot_make_room_says_so_once_and_stops(chatflow, provider) -> None:
    provider.add_text("answer 1")
    assert chatflow("chat", "-s", "nr", "--max-context-tokens", "2048", _big(1)).returncode == 0
    pieces = [f"fact{i} " for i in range(1500)]  # one completion token a chunk: longer than turn 1
    provider.add_text("".join(pieces), chunks=pieces)
    provider.add_text("answer 2")
    r2 = chatflow("chat", "-s", "nr", "--max-context-tokens", "2048", "--output", "json", _big(2))
    assert r2.returncode == 0, r2
    notes = [line for line in r2.stderr_lines if "cannot make room" in line]
    assert len(notes) == 1 and notes[0].startswith("chatflow: automatic compaction through turn 1 cannot make room: "
                                                   "the summary (about "), r2.stderr
    assert "it is off for this session until you compact" in notes[0]
    assert "chatflow: turn 1 left the context window (not summarised)" in r2.stderr
    assert r2.json()["compaction"]["stopped"] is True
    asked = len(provider.requests)
    provider.add_text("answer 3")
    r3 = chatflow("chat", "-s", "nr", "--max-context-tokens", "2048", _big(3))
    assert r3.returncode == 0, r3
    assert "cannot make room" not in r3.stderr and "compacted" not in r3.stderr
    assert len(provider.requests) == asked + 1  # no compaction request: only the turn's
    events = [json.loads(line) for line in chatflow("replay", "nr", "--output", "jsonl").stdout.splitlines()]
    assert [e["type"] for e in events].count("context.compaction_stopped") == 1


def test_a_compaction_refused_as_over_the_context_says_what_can_help(chatflow, provider) -> None:
    """Any provider's ``context_length_exceeded`` for the summary request: compacting again
    cannot help, so neither the manual compaction's line nor the automatic one's says to;
    automatic compaction then stops for the session (said once)."""
    provider.add_text("answer 1")
    assert chatflow("chat", "-s", "f", "--max-context-tokens", "2048", _big(1)).returncode == 0
    over = {"error": {"message": "This model's maximum context length is 1024 tokens.",
                      "type": "invalid_request_error", "code": "context_length_exceeded"}}
    provider.add_error(400, over)
    r = chatflow("sessions", "compact", "f", "--through", "1")
    assert r.returncode == 5, r
    assert "the turns to summarise do not fit the model's context either; nothing was compacted" in r.stderr, r
    assert "start a new session" in r.stderr and "larger context" in r.stderr, r
    provider.add_error(400, over)
    provider.add_text("answer 2")
    r2 = chatflow("chat", "-s", "f", "--max-context-tokens", "2048", _big(2))
    assert r2.returncode == 0, r2
    assert "chatflow: automatic compaction through turn 1 cannot make room: the turns to summarise do not fit" \
        in r2.stderr, r2
    provider.add_text("answer 3")
    r3 = chatflow("chat", "-s", "f", "--max-context-tokens", "2048", _big(3))
    assert r3.returncode == 0 and "automatic compaction" not in r3.stderr, r3  # not tried again
