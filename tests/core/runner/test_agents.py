"""Agents, handoff tools and the set of agents a Runner knows (issue 4)."""

from __future__ import annotations

import pytest

from chatflow_cli.core.agents import Agent, AgentDefinitionError, HandoffTool, reachable_agents, snake_case
from chatflow_cli.core.tools import Tool, tool


@pytest.mark.parametrize(
    ("name", "snake"),
    [
        ("Billing", "billing"),
        ("BillingSpecialist", "billing_specialist"),
        ("OrderTrackingAgent", "order_tracking_agent"),
        ("Order Tracking", "order_tracking"),
        ("HTTPAgent", "http_agent"),
        ("support-tier-2", "support_tier_2"),
        ("  ", "agent"),
    ],
)
def test_snake_case(name: str, snake: str) -> None:
    assert snake_case(name) == snake


def test_an_agent_has_its_name_instructions_and_model_and_no_tools_or_handoffs_by_default() -> None:
    agent = Agent(name="Assistant", instructions="Helpful bot", model="gpt-4o")
    assert (agent.name, agent.instructions, agent.model, agent.tools, agent.handoffs) == (
        "Assistant", "Helpful bot", "gpt-4o", (), ())
    assert agent.wire_tools() is None
    with pytest.raises(AgentDefinitionError):
        Agent(name="")


def test_plain_functions_become_tools_and_handoffs_are_offered() -> None:
    def lookup(order_id: str) -> str:
        """Find an order."""
        return order_id

    billing = Agent(name="BillingSpecialist", instructions="Handles invoices.\nMore detail.")
    support = Agent(name="Support", instructions="Support", tools=[lookup], handoffs=[billing])
    tools = support.all_tools()
    assert list(tools) == ["lookup", "transfer_to_billing_specialist"]
    assert isinstance(tools["lookup"], Tool)
    handoff = tools["transfer_to_billing_specialist"]
    assert isinstance(handoff, HandoffTool) and handoff.target is billing and not handoff.is_custom
    assert "BillingSpecialist" in handoff.description and "Handles invoices." in handoff.description
    wire = support.wire_tools()
    assert wire is not None
    assert [t["function"]["name"] for t in wire] == ["lookup", "transfer_to_billing_specialist"]
    assert wire[1]["function"]["parameters"]["properties"] == {}


def test_tool_name_collisions_are_refused() -> None:
    @tool(name="transfer_to_billing")
    def clash() -> str:
        return ""

    agent = Agent(name="A", tools=[clash], handoffs=[Agent(name="Billing")])
    with pytest.raises(AgentDefinitionError, match="transfer_to_billing"):
        agent.all_tools()


def test_reachable_agents_follow_handoffs_with_cycles() -> None:
    billing = Agent(name="Billing", instructions="Billing specialist", model="gpt-4o")
    refunds = Agent(name="Refunds")
    support = Agent(name="Support", instructions="Support", handoffs=[billing], model="gpt-4o")
    billing.handoffs = [support, refunds]  # a cycle, set after construction
    assert billing.handoffs == (support, refunds)
    found = reachable_agents(support)
    assert found == {"Support": support, "Billing": billing, "Refunds": refunds}
    assert set(reachable_agents(refunds)) == {"Refunds"}


def test_duplicate_names_within_a_runner_are_an_error() -> None:
    first = Agent(name="Twin")
    second = Agent(name="Twin")
    root = Agent(name="Root", handoffs=[first, second])
    with pytest.raises(AgentDefinitionError, match="'Twin'"):
        reachable_agents(root)


def test_tool_cache_follows_reassignment() -> None:
    agent = Agent(name="A")
    assert agent.all_tools() == {}
    agent.tools = [Tool.custom("get_time")]
    assert list(agent.all_tools()) == ["get_time"]
