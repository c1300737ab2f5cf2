"""Message ids (``--message-id``): one turn per id, a failed turn runs again on redelivery,
the scope global or per session."""

from __future__ import annotations

import json


def test_a_message_id_whose_turn_failed_runs_again_on_redelivery(chatflow, provider):
    provider.add_error(500, message="upstream down")
    provider.add_error(500, message="upstream down")
    provider.add_error(500, message="upstream down")
    failed = chatflow("chat", "-s", "wh", "--message-id", "wamid.RETRY", "order status?")
    assert failed.returncode != 0
    provider.add_text("In transit.")
    retried = chatflow("chat", "-s", "wh", "--message-id", "wamid.RETRY", "order status?")
    assert retried.returncode == 0, retried
    assert retried.stdout == "In transit.\n"
    again = chatflow("chat", "-s", "wh", "--message-id", "wamid.RETRY", "order status?")
    assert again.returncode == 0 and "already processed" in again.stderr
    shown = json.loads(chatflow("sessions", "show", "wh", "--json").stdout)
    assert [t["number"] for t in shown["turns"]] == [1]


def test_message_ids_scoped_per_session(chatflow, provider):
    a = chatflow("chat", "-s", "chat-100", "--message-id", "250", "--message-id-scope", "session", "hi")
    b = chatflow("chat", "-s", "chat-200", "--message-id", "250", "--message-id-scope", "session", "hi")
    assert a.returncode == 0 and b.returncode == 0, (a, b)
    assert len(provider.requests) == 2 and "already processed" not in b.stderr
    again = chatflow("chat", "-s", "chat-200", "--message-id", "250", "--message-id-scope", "session", "hi")
    assert again.returncode == 0 and "already processed" in again.stderr
    assert len(provider.requests) == 2


def test_message_ids_are_global_by_default(chatflow, provider):
    assert chatflow("chat", "-s", "wa-1", "--message-id", "wamid.1", "hi").returncode == 0
    r = chatflow("chat", "-s", "wa-2", "--message-id", "wamid.1", "hi")
    assert r.returncode == 0 and "already processed" in r.stderr
    assert len(provider.requests) == 1


def test_message_id_scope_from_config(chatflow, provider, config_file):
    config_file('message_id_scope = "session"\n')
    assert chatflow("chat", "-s", "t-1", "--message-id", "7", "hi").returncode == 0
    r = chatflow("chat", "-s", "t-2", "--message-id", "7", "hi")
    assert r.returncode == 0 and "already processed" not in r.stderr, r
    assert len(provider.requests) == 2
