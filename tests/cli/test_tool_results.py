"""``--tool-result``: results for custom tools, plain text or JSON, each call answered once."""

from __future__ import annotations

from tests.helpers.config import CUSTOM_TOOLS


def test_tool_result_given_twice_records_both_and_continues(chatflow, provider, config_file):
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_C", "approve_refund", '{"order_id": "1"}'), ("call_D", "notify", "{}")])
    r = chatflow("chat", "-s", "two", "refund 1")
    assert r.returncode == 0, r
    provider.add_text("Both answered.")
    r = chatflow("chat", "-s", "two", "--tool-result", "call_C", '"y"', "--tool-result", "call_D", '"n"')
    assert r.returncode == 0, r
    assert r.stdout == "Both answered.\n"
    assert "still waiting" not in r.stderr
    sent = [m for m in provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert sent == [{"role": "tool", "tool_call_id": "call_C", "content": '"y"'},
                    {"role": "tool", "tool_call_id": "call_D", "content": '"n"'}]


def test_tool_result_for_the_same_call_twice_is_refused(chatflow, provider, config_file):
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_C", "approve_refund", "{}")])
    assert chatflow("chat", "-s", "dup", "refund").returncode == 0
    r = chatflow("chat", "-s", "dup", "--tool-result", "call_C", "a", "--tool-result", "call_C", "b")
    assert r.returncode == 2 and "call_C is given twice" in r.stderr, r
    assert len(provider.requests) == 1
    shown = chatflow("sessions", "show", "dup", "--json").json()
    assert shown["session"]["status"] == "idle"


def test_tool_result_plain_text_is_sent_as_given(chatflow, provider, config_file):
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_A", "approve_refund", "{}")])
    assert chatflow("chat", "-s", "plain", "refund").returncode == 0
    provider.add_text("Done.")
    r = chatflow("chat", "-s", "plain", "--tool-result", "call_A", "yes")
    assert r.returncode == 0, r
    assert provider.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_A", "content": "yes"}


def test_tool_result_unknown_id_names_what_waits(chatflow, provider, config_file):
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_A", "approve_refund", "{}"), ("call_B", "notify", "{}")])
    assert chatflow("chat", "-s", "wait", "refund").returncode == 0
    r = chatflow("chat", "-s", "wait", "--tool-result", "call_A", "ok", "--tool-result", "call_X", "ok")
    assert r.returncode == 2, r
    assert "no pending tool call call_X" in r.stderr and "waiting for: call_A, call_B" in r.stderr
    assert "['" not in r.stderr
    # nothing was recorded: call_A can still be answered
    r = chatflow("chat", "-s", "wait", "--tool-result", "call_A", "ok")
    assert r.returncode == 0 and "still waiting for: call_B" in r.stderr, r


def test_pending_tool_hint_says_plain_text_or_json_and_both_work(chatflow, provider, config_file):
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_A", "approve_refund", "{}"), ("call_B", "notify", "{}")])
    r = chatflow("chat", "-s", "hint", "refund")
    assert r.returncode == 0, r
    hint = "chatflow chat -s hint --tool-result call_A OUTPUT (plain text or JSON, sent as given)"
    assert hint in " ".join(r.stderr.split()), r.stderr
    assert "call_A JSON" not in r.stderr
    provider.add_text("Done.")
    r = chatflow("chat", "-s", "hint", "--tool-result", "call_A", "yes, approved",
                 "--tool-result", "call_B", '{"sent": true}')
    assert r.returncode == 0, r
    sent = [m for m in provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert sent == [{"role": "tool", "tool_call_id": "call_A", "content": "yes, approved"},
                    {"role": "tool", "tool_call_id": "call_B", "content": '{"sent": true}'}]


def test_a_submitted_result_is_not_shown_as_waiting_while_other_calls_wait(chatflow, provider, config_file):
    """call_B answered, call_E not: the unknown-id error, ``sessions show`` and the REPL treat
    call_B as answered (it was refused as 'already has a result' while shown as waiting)."""
    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_B", "approve_refund", '{"order_id": "1"}'), ("call_E", "notify", "{}")])
    assert chatflow("chat", "-s", "p19", "refund").returncode == 0
    r = chatflow("chat", "-s", "p19", "--tool-result", "call_B", "yes")
    assert r.returncode == 0 and "still waiting for: call_E" in r.stderr, r
    r = chatflow("chat", "-s", "p19", "--tool-result", "call_Z", "yes")
    assert r.returncode == 2 and "(waiting for: call_E)" in r.stderr, r
    shown = chatflow("sessions", "show", "p19").stdout.splitlines()
    at = next(i for i, line in enumerate(shown) if "called approve_refund" in line)
    assert shown[at + 1] == "  result: yes  (submitted; the turn goes on once every call has its result)"
    at = next(i for i, line in enumerate(shown) if "called notify" in line)
    assert shown[at + 1] == "  result: (waiting for --tool-result)"
    provider.add_text("Refunded and notified.")
    r = chatflow("chat", "-s", "p19", "--tool-result", "call_E", "sent")
    assert r.returncode == 0 and r.stdout == "Refunded and notified.\n", r
    sent = [m for m in provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in sent] == [("call_B", "yes"), ("call_E", "sent")]
