"""Agent versions through the Runner: each reply records the version of the agent that gave
it, and an agent that changed between turns is reported once, before its reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent, agent_version
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.tools import Tool, tool
from tests.helpers.fakeserver import FakeServer

MODEL = "gpt-4o-mini"


def _types(runner: Runner, session_id: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in runner.run_streamed(session_id, text) if e.type != "text.delta"]


def test_a_changed_agent_is_reported_once_before_its_reply(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    support = Agent("Support", "Help with orders", model=MODEL)
    v1 = support.version
    runner = make_runner(support)
    for n in (1, 2):
        fake_server.add_text(f"answer {n}")
        assert "agent.changed" not in [t for t, _ in _types(runner, "s", f"q{n}")]
    # the definition changes between two runs (a new Runner, as after editing config.toml)
    changed = Agent("Support", "Help with orders and refunds", model=MODEL)
    runner = make_runner(changed)
    fake_server.add_text("answer 3")
    events = _types(runner, "s", "q3")
    kinds = [t for t, _ in events]
    assert kinds.count("agent.changed") == 1
    assert kinds.index("message.user") < kinds.index("agent.changed") < kinds.index("message.model")
    data = dict(events)["agent.changed"]
    assert data == {"turn": 3, "agent": "Support", "version": changed.version, "previous_version": v1,
                    "since_turn": 2}
    fake_server.add_text("answer 4")
    assert "agent.changed" not in [t for t, _ in _types(runner, "s", "q4")]
    replies = [m for r in sqlite_store.load_turns("s") for m in r.messages if m.role.value == "model"]
    assert [m.agent_version for m in replies] == [v1, v1, changed.version, changed.version]
    done = [e.payload for e in sqlite_store.events("s") if e.type == "turn.completed"]
    assert [p["agent_version"] for p in done] == [v1, v1, changed.version, changed.version]


def test_a_handoff_target_that_changed_is_reported_when_it_starts(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    def agents(billing_text: str) -> Agent:
        billing = Agent("Billing", billing_text, model=MODEL)
        support = Agent("Support", "Orders", model=MODEL, handoffs=[billing])
        billing.handoffs = [support]
        return support

    runner = make_runner(agents("Bills"))
    fake_server.add_tool_calls([("call_1", "transfer_to_billing", "{}")])
    fake_server.add_text("billing here")
    assert "agent.changed" not in [t for t, _ in _types(runner, "s", "refund")]
    # Billing changes; the session's active agent is Billing: reported at the turn's start
    start = agents("Bills and refunds")
    runner = make_runner(start)
    billing = start.handoffs[0]
    fake_server.add_tool_calls([("call_2", "transfer_to_support", "{}")])
    fake_server.add_text("support again")
    events = _types(runner, "s", "back to orders")
    changes = [d for t, d in events if t == "agent.changed"]
    assert [(c["agent"], c["since_turn"], c["version"]) for c in changes] == [("Billing", 1, billing.version)]
    handoff = next(d for t, d in events if t == "handoff")
    assert handoff["to_agent_version"] == start.version


def test_a_stand_in_for_an_unknown_agent_reports_nothing(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    old = Agent("Retired", "gone", model=MODEL)
    fake_server.add_text("hi")
    make_runner(old).run("s", "hello")
    # the session's agent is no longer known: the Runner's starting agent is another one
    runner = make_runner(Agent("Assistant", "new", model=MODEL), default_model=MODEL)
    fake_server.add_text("still here")
    kinds = [t for t, _ in _types(runner, "s", "again")]
    assert "agent.changed" not in kinds
    assert sqlite_store.session_summary("s").agent_versions == {"Retired": {"version": old.version, "turn": 1}}


# ---------------------------------------------------------------------------------------
# what a version covers
# ---------------------------------------------------------------------------------------
@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return order_id


def _base(**changes: Any) -> Agent:
    fields: dict[str, Any] = {"name": "Support", "instructions": "Orders", "model": MODEL, "tools": [lookup]}
    fields.update(changes)
    return Agent(**fields)


@pytest.mark.parametrize("changes", [
    {"instructions": "Orders and refunds"},
    {"model": "gpt-4o"},
    {"model": None},
    {"tools": []},
    {"tools": [Tool.custom("lookup", "Look an order up.", {"type": "object", "properties": {"id": {"type": "integer"}}})]},
    {"handoffs": [Agent("Billing")]},
], ids=["instructions", "model", "default-model", "no-tools", "tool-schema", "handoff"])
def test_each_part_of_the_definition_makes_a_new_version(changes: dict[str, Any]) -> None:
    assert _base(**changes).version != _base().version


@pytest.mark.parametrize("changes", [
    {"tool_choice": "required"},
    {"max_context_tokens": 4096},
], ids=["tool-choice", "context-size"])
def test_what_is_not_part_of_the_definition(changes: dict[str, Any]) -> None:
    assert _base(**changes).version == _base().version


def test_a_version_is_a_stable_short_hash_and_handoffs_count_by_name() -> None:
    agent = _base()
    assert agent.version == agent_version(agent) == _base().version
    assert len(agent.version) == 12 and int(agent.version, 16) >= 0
    billing = Agent("Billing", "Bills")
    support = _base(handoffs=[billing])
    before = support.version
    billing.instructions = "Bills and refunds"  # the target's own version changes, not Support's
    assert support.version == before
    support.instructions = "changed"  # read again after a change (not a stale cache)
    assert support.version != before
