"""A session that uses every kind of event, for export and import tests."""

from __future__ import annotations

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.memory import BaseSessionStore
from chatflow_cli.core.messages import Message, ToolCall

TRICKY = "ünïcødé ✓ line\u2028sep, a fence ```, a comment end --> and\n## Turn 9\n<!-- chatflow:turn {} -->"


def build_rich_session(store: BaseSessionStore, session_id: str = "rich") -> None:
    """System message, tool calls and results, a handoff, a rolled-back turn, a failed turn,
    an interrupted turn, a reply cut by the token limit, metadata changes and a custom event."""
    support, billing = Agent("Support", ""), Agent("Billing", "")
    s = store.get_or_create(session_id, support, max_turns=3, metadata={"channel": "cli"})
    s.add_message(Message.system("Be brief."))
    s.add_message(Message.user("Where is order 404?"))
    s.add_message(Message.model(None, [ToolCall("c1", "status", '{"order": 404}'),
                                       ToolCall("c2", "eta", '{"order": 404}')], agent="Support"))
    s.add_message(Message.tool("c1", '{"status": "IN_TRANSIT"}', name="status"))
    s.add_message(Message.tool("c2", "tomorrow", name="eta", is_error=True))
    s.add_message(Message.model("In transit, " + TRICKY, agent="Support", reasoning="think -->"))
    s.complete_turn("In transit", usage={"input_tokens": 12, "output_tokens": 5})
    store.save(s)
    s.add_message(Message.user("Refund it"))
    s.add_message(Message.model(None, [ToolCall("h1", "transfer_to_billing", "{}")], agent="Support"))
    s.add_message(Message.tool("h1", "Transferred", name="transfer_to_billing"))
    s.set_active_agent(billing, tool_call_id="h1")
    s.add_message(Message.model("Refunded.", agent="Billing"))
    s.complete_turn("Refunded.", usage={"input_tokens": 20, "output_tokens": 2})
    s.update_metadata({"tier": "gold"})
    store.save(s)
    s.add_message(Message.user("A turn that is rolled back"))
    s.add_message(Message.model("soon gone", agent="Billing"))
    s.complete_turn("soon gone")
    store.save(s)
    store.rollback(session_id, 2)
    s = store.get(session_id)
    assert s is not None
    s.add_message(Message.user("A turn that fails"))
    s.fail_turn(RuntimeError("provider said no"), agent=billing)
    store.save(s)
    s.add_message(Message.user("Tell me a long story"))
    s.add_message(Message.model("Once upon", agent="Billing", finish_reason="length"))
    s.complete_turn("Once upon", finish_reason="length")
    store.save(s)
    s.add_message(Message.user("Interrupted question"))
    s.interrupt_turn("interrupted", partial_text="Part", agent=billing)
    store.save(s)
    s.update_metadata({"channel": "web"})
    s.metadata.pop("tier")
    store.save(s)
    store.append_event(session_id, "note", {"text": TRICKY}, idempotency_key="note-1")
