"""The token budget and compaction from the command line, as real processes against the
fake server: ``--max-context-tokens``, config keys, ``sessions show`` reporting the context
use, ``sessions compact``, and automatic compaction in a one-shot ``chat``."""

from __future__ import annotations

import json

from chatflow_cli.core.compaction import DEFAULT_PROMPT


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
    assert "over the context budget of 1500; it was sent whole" in r.stderr  # the message alone is larger
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
