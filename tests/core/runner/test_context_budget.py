"""The Runner sends the token-budget window: against the fake server over HTTP."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.tokens import MESSAGE_OVERHEAD, estimate_tokens
from chatflow_cli.core.messages import Message


def _sent(fake_server: Any) -> list[dict[str, Any]]:
    return fake_server.requests[-1]["messages"]


def test_old_turns_leave_the_request_when_the_budget_is_full(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any
) -> None:
    runner = make_runner(Agent("A", instructions="Be brief."), default_model="m", max_context_tokens=600,
                         max_tokens=100, compact_at=None)  # trimming alone, no summary
    for i in range(6):
        fake_server.add_text(f"answer {i}")
        runner.run("s", f"question {i} " + "word " * 60)
    sent = _sent(fake_server)
    # 500 tokens of budget: the instructions, then the newest whole turns only
    assert sent[0] == {"role": "system", "content": "Be brief."}
    users = [m["content"] for m in sent if m["role"] == "user"]
    assert users[-1].startswith("question 5") and not any(u.startswith("question 0") for u in users)
    assert 1 < len(users) < 6
    fake_server.add_text("x")
    result = runner.run("s", "last")
    assert result.context is not None
    assert result.context["budget"] == 500 and result.context["context"] == 600
    assert result.context["tokens"] <= 500 and not result.context["over_budget"]
    # the stored session keeps every turn: the budget shapes the request only
    assert sqlite_store.get("s").turn_count == 7


def test_a_newest_turn_over_the_budget_is_sent_whole_with_a_warning(
    make_runner: Callable[..., Runner], fake_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    runner = make_runner(Agent("A"), default_model="m", max_context_tokens=200, max_tokens=50, compact_at=None)
    fake_server.add_text("short")
    runner.run("s", "earlier")
    fake_server.add_text("ok")
    big = "long " * 400
    with caplog.at_level(logging.WARNING):
        result = runner.run("s", big)
    assert [m["content"] for m in _sent(fake_server)] == [big]
    assert result.context is not None and result.context["over_budget"] and result.context["turns"] == 1
    assert "over the context budget of 150 tokens" in caplog.text


def test_a_tool_round_stays_whole_and_the_reply_takes_the_providers_count(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any
) -> None:
    from chatflow_cli.core.tools import tool

    @tool
    def lookup(order_id: str) -> str:
        """Look an order up."""
        return "shipped " * 50

    runner = make_runner(Agent("A", tools=[lookup]), default_model="m", max_context_tokens=400, max_tokens=50,
                         compact_at=None)
    fake_server.add_tool_calls([("call_1", "lookup", '{"order_id": "A-1"}')])
    fake_server.add_chunks([{"choices": [{"index": 0, "delta": {"content": "It shipped."}}]},
                            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}],
                           usage={"prompt_tokens": 90, "completion_tokens": 4, "total_tokens": 94})
    runner.run("s", "where is A-1?")
    fake_server.add_text("fine")
    runner.run("s", "thanks " * 40)
    sent = _sent(fake_server)
    roles = [m["role"] for m in sent]
    # either the whole first turn (call and result) or none of it
    assert roles in (["user"], ["user", "assistant", "tool", "assistant", "user"])
    stored = sqlite_store.load_turns("s")[0].messages
    assert stored[-1].content == "It shipped." and stored[-1].tokens == 4 + MESSAGE_OVERHEAD
    assert stored[0].tokens == estimate_tokens(Message.user("where is A-1?"))


def test_an_unknown_model_has_no_token_budget(make_runner: Callable[..., Runner], fake_server: Any) -> None:
    runner = make_runner(Agent("A"), default_model="my-finetune")
    fake_server.add_text("a")
    runner.run("s", "word " * 3000)
    fake_server.add_text("b")
    result = runner.run("s", "next")
    assert len(_sent(fake_server)) == 3
    assert result.context is not None and result.context["budget"] is None and not result.context["over_budget"]
