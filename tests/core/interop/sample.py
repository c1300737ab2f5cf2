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


def build_every_event_session(store: BaseSessionStore, session_id: str = "every") -> None:
    """A session whose log holds every event type the store writes (``EventType``) and a
    custom event: runs under an owner (``status``), an interrupt request, a run whose owner
    died (recovered), custom tools waiting and answered, agent versions and their change,
    a handoff, a rolled-back and a failed turn, a compaction, a title set and cleared and
    set again, archive and unarchive, an earlier import, and the session left archived; resources
    mounted and one unmounted."""
    from chatflow_cli.core.interop.importer import import_sessions
    from chatflow_cli.core.interop.records import ImportedSession, ImportedTurn
    from chatflow_cli.core.memory import Owner

    me = Owner.current()
    dead = Owner(me.pid, me.start_time + 1, me.host, "dead-run-token")  # same pid, another process: dead
    support, billing = Agent("Support", "", version="s1"), Agent("Billing", "", version="b1")
    s = store.get_or_create(session_id, support, max_turns=4, metadata={"channel": "cli"})
    s.add_message(Message.system("Be brief."))
    from chatflow_cli.core.resources import Mount

    s.mount(Mount.memory_store("notes"))  # resources mounted, one changed and one unmounted
    s.mount(Mount.memory_store("crm", "read-only"))
    s.mount(Mount.vault("keys"))
    s.unmount("crm")
    store.save(s)
    # turn 1: a run under an owner, tool call and result, versioned reply
    start = store.begin_turn(session_id, default_agent=support, user_message=Message.user("Order 404?"), owner=me)
    s = start.session
    s.add_message(Message.model(None, [ToolCall("c1", "status", '{"order": 404}')], agent="Support",
                                agent_version="s1"))
    s.add_message(Message.tool("c1", "IN_TRANSIT", name="status"))
    s.add_message(Message.model("In transit.", agent="Support", agent_version="s1"))
    s.complete_turn("In transit.", usage={"input_tokens": 9, "output_tokens": 3}, agent_version="s1")
    store.release(s)
    # turn 2: custom tools wait (tool.pending), a result is submitted, the turn continues
    start = store.begin_turn(session_id, default_agent=support, user_message=Message.user("Refund?"), owner=me)
    s = start.session
    s.add_message(Message.model(None, [ToolCall("p1", "approve", "{}")], agent="Support", agent_version="s1"))
    s.record_event("tool.pending", {"turn": start.turn, "tool_use_ids": ["p1"]})
    store.release(s)
    store.submit_tool_result(session_id, "p1", "approved")
    start = store.begin_turn(session_id, default_agent=support, user_message=None, owner=me)
    s = start.session
    # a new version of Support (agent.changed), then a handoff to Billing
    s.note_agent_version("Support", "s2")
    s.add_message(Message.model(None, [ToolCall("h1", "transfer_to_billing", "{}")], agent="Support",
                                agent_version="s2"))
    s.add_message(Message.tool("h1", "Transferred", name="transfer_to_billing"))
    s.set_active_agent(billing, tool_call_id="h1", agent_version="b1")
    s.add_message(Message.model("Refunded.", agent="Billing", agent_version="b1"))
    s.complete_turn("Refunded.", agent=billing)
    s.update_metadata({"tier": "gold"})
    store.release(s)
    # turn 3: an interrupt request from another process, then the run stops
    start = store.begin_turn(session_id, default_agent=billing, user_message=Message.user("A long story"), owner=me)
    assert store.request_interrupt(session_id) == start.turn
    s = start.session
    s.interrupt_turn("interrupted", partial_text="Once", agent=billing)
    store.release(s)
    # turn 4: its owner dies; the next turn recovers it
    store.begin_turn(session_id, default_agent=billing, user_message=Message.user("Lost run"), owner=dead)
    start = store.begin_turn(session_id, default_agent=billing, user_message=Message.user("Again"), owner=me)
    s = start.session
    s.add_message(Message.model("Here.", agent="Billing"))
    s.complete_turn("Here.")
    store.release(s)
    # a rolled-back turn and a failed turn
    s = store.get(session_id)
    assert s is not None
    s.add_message(Message.user("Rolled back soon"))
    s.add_message(Message.model("gone", agent="Billing"))
    s.complete_turn("gone")
    store.save(s)
    store.rollback(session_id, s.turn_count - 1)
    s = store.get(session_id)
    assert s is not None
    s.add_message(Message.user("This fails"))
    s.fail_turn(RuntimeError("provider said no"), agent=billing)
    store.save(s)
    # a compaction of turn 1
    ctx = store.begin_compaction(session_id, owner=me)
    store.finish_compaction(ctx, Message.summary("Order 404 is in transit.", 1),
                            {"through": 1, "model": "m", "tokens_before": 50, "instructions": None,
                             "summary": "Order 404 is in transit."})
    # an earlier import into it (session.imported)
    earlier = ImportedSession("openai", "openai:earlier", session_id, turns=[
        ImportedTurn("1", [Message.user("imported question"), Message.model("imported answer")])])
    import_sessions(store, [earlier], fmt="openai", source="earlier.jsonl", into=session_id)
    # title set, cleared, set again; archived, unarchived, archived again; a custom event
    store.set_title(session_id, "Order 404 ✓")
    store.set_title(session_id, None)
    store.set_title(session_id, "Order 404, refunded")
    store.append_event(session_id, "note", {"text": TRICKY}, idempotency_key="note-1")
    store.archive(session_id)
    store.unarchive(session_id)
    store.archive(session_id)
