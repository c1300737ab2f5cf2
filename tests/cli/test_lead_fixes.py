"""Fresh-tester findings on `chat`: a failed webhook delivery runs again; --agent switches a session."""

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


def test_agent_flag_on_an_existing_session_switches_to_that_agent(chatflow, provider, config_file):
    config_file(
        """
[[agents]]
name = "Support"
instructions = "You answer customer questions."

[[agents]]
name = "Billing"
instructions = "You handle refunds."
"""
    )
    assert chatflow("chat", "-s", "agx", "one").returncode == 0
    switched = chatflow("chat", "-s", "agx", "-a", "Billing", "two")
    assert switched.returncode == 0, switched
    sent = provider.requests[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "You handle refunds."}
    listed = json.loads(chatflow("sessions", "ls", "--json").stdout)
    assert [s["agent"] for s in listed if s["session_id"] == "agx"] == ["Billing"]
    # the next turn, with no flag, stays with the agent the session now has
    assert chatflow("chat", "-s", "agx", "three").returncode == 0
    assert provider.requests[-1]["messages"][0] == {"role": "system", "content": "You handle refunds."}


def test_delete_with_an_unknown_id_deletes_nothing(chatflow, provider):
    assert chatflow("chat", "-s", "md1", "hello").returncode == 0
    result = chatflow("sessions", "delete", "md1", "nosuch")
    assert result.returncode == 3
    assert "nosuch" in result.stderr and result.stderr.count("\n") == 1
    listed = json.loads(chatflow("sessions", "ls", "--json").stdout)
    assert [s["session_id"] for s in listed] == ["md1"]
    assert chatflow("sessions", "delete", "md1").returncode == 0


def test_invalid_ids_are_usage_errors_on_every_command(chatflow, provider):
    assert chatflow("chat", "-s", "real", "hello").returncode == 0
    for args in (("sessions", "show", "../x"), ("replay", "a b"), ("sessions", "delete", "a'b"),
                 ("sessions", "rollback", "a b", "--to", "0", "--yes")):
        result = chatflow(*args)
        assert result.returncode == 2 and "invalid session id" in result.stderr, result
    assert chatflow("sessions", "show", "nosuch").returncode == 3  # valid id, no session
    for bad in ("-x", ".", ".."):
        result = chatflow("chat", "-s", bad, "hi")
        assert result.returncode == 2 and "invalid session id" in result.stderr, result
    assert [s["session_id"] for s in chatflow("sessions", "ls", "--json").json()] == ["real"]
