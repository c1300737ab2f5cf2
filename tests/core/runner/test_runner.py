"""The Runner against the fake server over real HTTP, on SQLite files (issue 4).

Cases 1, 2 and 4 of the issue are here with its exact values; case 3 (Ctrl-C in a real
process) is in test_runner_processes.py, case 5 (the real SmolLM2) in test_local_model.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import (
    AuthenticationError,
    BadRequestError,
    ConfigError,
    IdempotencyConflictError,
    InvalidToolCallError,
    MaxToolRoundsExceeded,
    PendingToolCallsError,
    ProviderResponseError,
    RateLimitedError,
    RunInterrupted,
    SessionNotFoundError,
    StreamBrokenError,
    ToolResultError,
)
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.messages import Message, Role, check_history
from chatflow_cli.core.memory import INTERRUPTED_TOOL_RESULT
from chatflow_cli.core.runner import Runner, StreamEvent
from chatflow_cli.core.tools import Tool, tool
from tests.helpers.fakeserver import FakeServer
from tests.helpers.stored import events_of
from tests.helpers.wait import wait_until

from .conftest import open_sqlite_store

MODEL = "fake-model"


def non_system(history: Any) -> list[Message]:
    return [m for m in history if m.role is not Role.SYSTEM]


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


# --------------------------------------------------------------------------------------
# issue 4, case 1: stream quirks
# --------------------------------------------------------------------------------------
def test_a_quirky_stream_is_stored_and_returned_as_hello_world(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any, db_path: Any
) -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
    fake_server.add_chunks([
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello"}}]},
        {"choices": []},
        {"choices": [{"index": 0, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": " world"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": usage},
    ])
    runner = make_runner(Agent("Assistant", "Helpful bot", model=MODEL))
    result = runner.run("case-1", "Say hello")

    assert result.content == "Hello world"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (11, 2, 13)
    assert result.turn == 1 and result.agent == "Assistant" and result.status is SessionStatus.IDLE
    stored = open_sqlite_store(db_path).get("case-1")  # read back through a fresh connection
    assert [(m.role, m.content) for m in stored.history] == [(Role.USER, "Say hello"), (Role.MODEL, "Hello world")]
    completed = events_of(sqlite_store, "case-1", "turn.completed")
    assert len(completed) == 1 and completed[0].payload["usage"] == usage
    assert events_of(sqlite_store, "case-1", "turn.failed") == []
    assert stored.status is SessionStatus.IDLE


# --------------------------------------------------------------------------------------
# issue 4, case 2: custom tools answered by id
# --------------------------------------------------------------------------------------
def test_custom_tool_results_are_paired_by_id_and_sent_in_call_order(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    weather = Tool.custom("get_weather", "Weather for a city.",
                          {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    clock = Tool.custom("get_time", "The time in a city.",
                        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    runner = make_runner(Agent("Assistant", "Use the tools.", model=MODEL, tools=[weather, clock]))
    fake_server.add_tool_calls([("call_W", "get_weather", '{"city": "Lisbon"}'),
                                ("call_T", "get_time", '{"city": "Lisbon"}')])
    fake_server.add_text("It is 14:00 and 21C in Lisbon.")

    first = runner.run("case-2", "Weather and time in Lisbon?")
    assert first.status is SessionStatus.IDLE and first.content is None
    assert [c.id for c in first.pending_tool_calls] == ["call_W", "call_T"]
    pending = events_of(sqlite_store, "case-2", "tool.pending")
    assert len(pending) == 1 and pending[0].payload["tool_use_ids"] == ["call_W", "call_T"]
    assert len(fake_server.requests) == 1
    with pytest.raises(PendingToolCallsError):  # no user message between a call and its result
        runner.run("case-2", "hurry up")

    assert runner.submit_tool_result("case-2", "call_T", "14:00") is None
    assert len(fake_server.requests) == 1, "no request before both results are in"
    seq = sqlite_store.last_seq("case-2")
    with pytest.raises(ToolResultError):
        runner.submit_tool_result("case-2", "call_X", "???")  # a third result, unknown id
    with pytest.raises(ToolResultError):
        runner.submit_tool_result("case-2", "call_T", "15:00")  # a second result for call_T
    assert sqlite_store.last_seq("case-2") == seq, "a rejected result writes nothing"
    assert len(fake_server.requests) == 1

    final = runner.submit_tool_result("case-2", "call_W", {"temp": "21C"})
    assert final is not None and final.content == "It is 14:00 and 21C in Lisbon."
    assert final.turn == 1 and final.status is SessionStatus.IDLE
    assert len(fake_server.requests) == 2
    sent = fake_server.requests[1]["messages"]
    assert roles(sent) == ["system", "user", "assistant", "tool", "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in sent[3:]] == [("call_W", '{"temp": "21C"}'),
                                                                    ("call_T", "14:00")]
    seq = sqlite_store.last_seq("case-2")
    with pytest.raises(ToolResultError):
        runner.submit_tool_result("case-2", "call_T", "16:00")
    assert sqlite_store.last_seq("case-2") == seq
    check_history(sqlite_store.get("case-2").history)


def test_regular_tools_called_with_custom_ones_wait_in_call_order(
    fake_server: FakeServer, make_runner: Callable[..., Runner]
) -> None:
    @tool
    def add(a: int, b: int) -> int:
        return a + b

    approve = Tool.custom("approve", "Ask a human.")
    runner = make_runner(Agent("A", "x", model=MODEL, tools=[add, approve]))
    fake_server.add_tool_calls([("call_1", "approve", "{}"), ("call_2", "add", '{"a": 2, "b": 3}')])
    fake_server.add_text("approved; sum 5")
    first = runner.run("mixed", "go")
    assert [c.id for c in first.pending_tool_calls] == ["call_1"]
    result = runner.submit_tool_result("mixed", "call_1", "yes")
    assert result is not None and result.content == "approved; sum 5"
    sent = fake_server.requests[1]["messages"]
    assert [(m.get("tool_call_id"), m["content"]) for m in sent if m["role"] == "tool"] == [
        ("call_1", "yes"), ("call_2", "5")]


def test_a_failing_regular_tool_beside_a_custom_one_stays_an_error_result(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any, db_path: Any
) -> None:
    """Seed 003: the regular results of a reply that also called custom tools wait with the
    custom ones; an error result of a regular tool (it raised, or is unknown) keeps
    ``is_error`` in the stored TOOL message, and a good one stays unflagged."""
    @tool
    def divide(a: int, b: int) -> float:
        return a / b

    approve = Tool.custom("approve", "Ask a human.")
    runner = make_runner(Agent("A", "x", model=MODEL, tools=[divide, approve]))
    fake_server.add_tool_calls([("call_1", "divide", '{"a": 1, "b": 0}'), ("call_2", "approve", "{}"),
                                ("call_3", "divide", '{"a": 6, "b": 3}'), ("call_4", "no_such_tool", "{}")])
    fake_server.add_text("1/0 failed; approved; 6/3 is 2")
    first = runner.run("mixed-error", "go")
    assert [c.id for c in first.pending_tool_calls] == ["call_2"]
    result = runner.submit_tool_result("mixed-error", "call_2", "yes")
    assert result is not None and result.content == "1/0 failed; approved; 6/3 is 2"

    other = open_sqlite_store(db_path)  # as another process reads it
    tools = {m.tool_call_id: m for m in other.get("mixed-error").history if m.role is Role.TOOL}
    other.close()
    assert list(tools) == ["call_1", "call_2", "call_3", "call_4"]  # call order
    assert [tools[i].is_error for i in tools] == [True, False, False, True]
    assert tools["call_1"].content == "Error: divide raised ZeroDivisionError: division by zero"
    assert tools["call_3"].content == "2.0" and tools["call_2"].content == "yes"
    stored = [e.payload["message"] for e in events_of(sqlite_store, "mixed-error", "tool.result")]
    assert [(m["tool_call_id"], m.get("is_error", False)) for m in stored] == [
        ("call_1", True), ("call_2", False), ("call_3", False), ("call_4", True)]
    check_history(sqlite_store.get("mixed-error").history)


# --------------------------------------------------------------------------------------
# issue 4, case 4: nothing persisted twice
# --------------------------------------------------------------------------------------
def test_two_turns_store_four_messages(
    fake_server: FakeServer, make_runner: Callable[..., Runner], db_path: Any
) -> None:
    runner = make_runner(Agent("Assistant", "Be brief.", model=MODEL))
    fake_server.add_text("Hello!")
    fake_server.add_text("Fine, thanks.")
    assert runner.run("case-4", "Hi").content == "Hello!"
    assert runner.run("case-4", "How are you?").content == "Fine, thanks."

    reopened = open_sqlite_store(db_path)
    history = reopened.get("case-4").history
    assert [(m.role, m.content) for m in non_system(history)] == [
        (Role.USER, "Hi"), (Role.MODEL, "Hello!"), (Role.USER, "How are you?"), (Role.MODEL, "Fine, thanks.")]
    message_events = [e for e in reopened.events("case-4") if e.type.startswith("message.")]
    assert len(message_events) == 4
    records = reopened.load_turns("case-4")
    assert sum(len(r.messages) for r in records) == 4
    second = fake_server.requests[1]["messages"]
    assert second == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "How are you?"},
    ]


def test_system_argument_and_metadata(fake_server: FakeServer, make_runner: Callable[..., Runner],
                                      sqlite_store: Any) -> None:
    runner = make_runner(Agent("Assistant", "Agent instructions.", model=MODEL))
    runner.run("sys", "hi", metadata={"channel": "whatsapp"}, system="Session rules.")
    runner.run("sys", "again", metadata={"channel": "whatsapp", "phone": "+1"})
    assert fake_server.requests[1]["messages"][:2] == [
        {"role": "system", "content": "Agent instructions."}, {"role": "system", "content": "Session rules."}]
    assert sqlite_store.get("sys").metadata == {"channel": "whatsapp", "phone": "+1"}


# --------------------------------------------------------------------------------------
# tools
# --------------------------------------------------------------------------------------
def test_tool_errors_become_error_results_and_the_run_goes_on(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    @tool
    def explode(reason: str) -> str:
        """Fails on purpose."""
        raise RuntimeError(f"boom: {reason}")

    @tool
    def echo(text: str) -> str:
        return text

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[explode, echo]))
    fake_server.add_tool_calls([
        ("call_1", "explode", '{"reason": "disk"}'),
        ("call_2", "no_such_tool", "{}"),
        ("call_3", "echo", '{"text": 5}'),
        ("call_4", "echo", '{"text": "fine"}'),
    ])
    fake_server.add_text("recovered")
    result = runner.run("errors", "go")
    assert result.content == "recovered"
    tools = [m for m in sqlite_store.get("errors").history if m.role is Role.TOOL]
    assert [m.tool_call_id for m in tools] == ["call_1", "call_2", "call_3", "call_4"]
    assert [m.is_error for m in tools] == [True, True, True, False]
    assert "RuntimeError: boom: disk" in tools[0].content
    assert "unknown tool 'no_such_tool'" in tools[1].content and "echo" in tools[1].content
    assert "invalid arguments for echo" in tools[2].content
    assert tools[3].content == "fine"
    sent = [m for m in fake_server.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in sent] == [t.content for t in tools]


def test_a_call_whose_arguments_are_not_a_json_object_fails_the_turn_and_runs_nothing(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    ran: list[str] = []

    @tool
    def echo(text: str) -> str:
        ran.append(text)
        return text

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[echo]))
    runner.run("cut", "hello")
    window = sqlite_store.get("cut").history
    fake_server.add_tool_calls([("call_ok", "echo", '{"text": "fine"}'), ("call_cut", "echo", '{"text": "unterm')],
                               finish_reason="length")
    with pytest.raises(InvalidToolCallError) as info:
        runner.run("cut", "go")
    assert info.value.exit_code == 5 and "call_cut" in info.value.message and "token limit" in info.value.message
    assert ran == [], "no call of a reply with cut arguments runs"
    session = sqlite_store.get("cut")
    assert session.history == window and session.status is SessionStatus.IDLE
    assert [e.type for e in sqlite_store.events("cut")][-2:] == ["turn.failed", "status"]
    runner.run("cut", "again")  # the fake refuses arguments that are not a JSON object: none were stored
    assert all("tool_calls" not in m for m in fake_server.requests[-1]["messages"])


def test_parallel_tool_calls_run_concurrently_and_results_keep_call_order(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    barrier = threading.Barrier(3, timeout=10)  # only passes when all three run at once

    @tool
    def slow(name: str, delay: float) -> str:
        barrier.wait()
        time.sleep(delay)
        return f"done {name}"

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[slow]))
    fake_server.add_tool_calls([("call_a", "slow", '{"name": "a", "delay": 0.2}'),
                                ("call_b", "slow", '{"name": "b", "delay": 0.0}'),
                                ("call_c", "slow", '{"name": "c", "delay": 0.1}')])
    fake_server.add_text("all done")
    finished: list[str] = []
    for event in runner.run_streamed("parallel", "go"):
        if event.type == "tool.call_finished":
            finished.append(event.data["id"])
    assert finished == ["call_a", "call_b", "call_c"]
    sent = [m for m in fake_server.requests[1]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in sent] == [
        ("call_a", "done a"), ("call_b", "done b"), ("call_c", "done c")]


def test_async_tools_run_on_the_callers_loop_in_run_async(
    fake_server: FakeServer, make_runner: Callable[..., Runner]
) -> None:
    loops: list[Any] = []

    @tool
    async def lookup(order_id: str) -> dict:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0.01)
        return {"order_id": order_id, "status": "IN_TRANSIT"}

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[lookup]))
    fake_server.add_tool_calls([("call_o", "lookup", '{"order_id": "404"}')])
    fake_server.add_text("In transit.")

    async def main() -> Any:
        result = await runner.run_async("async", "Where is 404?")
        return result, asyncio.get_running_loop()

    result, loop = asyncio.run(main())
    assert result.content == "In transit."
    assert loops == [loop]
    sent = fake_server.requests[1]["messages"][-1]
    assert json.loads(sent["content"]) == {"order_id": "404", "status": "IN_TRANSIT"}


def test_llama_cpp_style_tool_call_chunks_and_reused_call_ids(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    @tool
    def get_weather(city: str) -> str:
        return f"12C in {city}"

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[get_weather]))
    for city in ("CityA", "CityB"):
        # llama.cpp repeats id and name in every chunk, and numbers calls from call_0 each time
        fake_server.add_tool_calls([("call_0", "get_weather", json.dumps({"city": city}))], split=4,
                                   repeat_id_name=True)
        fake_server.add_text(f"12C in {city}.")
    assert runner.run("llama", "Weather in CityA?").content == "12C in CityA."
    assert runner.run("llama", "And CityB?").content == "12C in CityB."
    history = sqlite_store.get("llama").history
    check_history(history)
    calls = [c for m in history for c in m.tool_calls]
    assert [c.name for c in calls] == ["get_weather", "get_weather"]
    assert calls[0].id == "call_0" and calls[1].id != "call_0"
    assert [m.content for m in history if m.role is Role.TOOL] == ["12C in CityA", "12C in CityB"]


def test_max_tool_rounds_is_a_clear_error_and_the_session_stays_valid(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    @tool
    def again() -> str:
        return "call me again"

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[again]), max_tool_rounds=2)
    fake_server.add_text("first answer")
    runner.run("rounds", "hello")
    before = sqlite_store.get("rounds").history
    for k in range(3):
        fake_server.add_tool_calls([(f"call_{k}", "again", "{}")])
    with pytest.raises(MaxToolRoundsExceeded, match="max_tool_rounds=2"):
        runner.run("rounds", "loop forever")
    assert len(fake_server.requests) == 4
    session = sqlite_store.get("rounds")
    assert session.history == before and session.status is SessionStatus.IDLE
    assert len(events_of(sqlite_store, "rounds", "turn.failed")) == 1
    fake_server.add_text("back to normal")
    result = runner.run("rounds", "hello again")
    assert result.content == "back to normal" and result.turn == 2
    check_history(sqlite_store.get("rounds").history)


def test_tool_choice_forces_the_first_request_only(fake_server: FakeServer,
                                                   make_runner: Callable[..., Runner]) -> None:
    @tool
    def ping() -> str:
        return "pong"

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[ping], tool_choice="ping"))
    fake_server.add_tool_calls([("call_p", "ping", "{}")])
    fake_server.add_text("pong received")
    assert runner.run("choice", "ping it").content == "pong received"
    first, second = fake_server.requests
    assert first["tool_choice"] == {"type": "function", "function": {"name": "ping"}}
    assert "tool_choice" not in second


# --------------------------------------------------------------------------------------
# handoffs
# --------------------------------------------------------------------------------------
def test_handoff_switches_the_active_agent_once_and_the_target_answers(
    fake_server: FakeServer, make_runner: Callable[..., Runner], db_path: Any, sqlite_store: Any, client: Any
) -> None:
    @tool
    def refund(invoice: str) -> str:
        """Refund an invoice."""
        return f"refunded {invoice}"

    billing = Agent(name="BillingSpecialist", instructions="Billing specialist", model=MODEL, tools=[refund])
    support = Agent(name="Support", instructions="Support", handoffs=[billing], model=MODEL)
    runner = make_runner(support)
    fake_server.add_tool_calls([("call_h", "transfer_to_billing_specialist", "{}")])
    fake_server.add_text("Billing here: I can refund that.")
    result = runner.run("handoff", "I was charged twice")

    assert result.content == "Billing here: I can refund that." and result.agent == "BillingSpecialist"
    first, second = fake_server.requests
    assert first["messages"][0] == {"role": "system", "content": "Support"}
    assert [t["function"]["name"] for t in first["tools"]] == ["transfer_to_billing_specialist"]
    assert second["messages"][0] == {"role": "system", "content": "Billing specialist"}
    assert [t["function"]["name"] for t in second["tools"]] == ["refund"]
    assert second["messages"][-1]["role"] == "tool" and second["messages"][-1]["tool_call_id"] == "call_h"
    handoffs = events_of(sqlite_store, "handoff", "handoff")
    assert len(handoffs) == 1
    assert handoffs[0].payload == {"turn": 1, "from_agent": "Support", "to_agent": "BillingSpecialist",
                                   "tool_call_id": "call_h", "to_agent_version": billing.version}
    assert [s.active_agent_name for s in sqlite_store.list_sessions()] == ["BillingSpecialist"]

    # after a restart: the resolver maps the stored name back to the agent with its tools
    reopened = open_sqlite_store(db_path)
    runner2 = Runner(support, reopened, model_client=client)
    assert reopened.get("handoff").active_agent is billing
    fake_server.add_text("Still billing.")
    assert runner2.run("handoff", "thanks").agent == "BillingSpecialist"
    assert fake_server.requests[2]["messages"][0] == {"role": "system", "content": "Billing specialist"}
    assert len(events_of(reopened, "handoff", "handoff")) == 1


# --------------------------------------------------------------------------------------
# failures
# --------------------------------------------------------------------------------------
def test_a_failed_turn_leaves_the_window_as_before_and_keeps_the_user_message_in_the_log(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL))
    fake_server.add_text("one")
    runner.run("fail", "first")
    before = sqlite_store.get("fail").history
    fake_server.add_error(401, message="bad key")
    with pytest.raises(AuthenticationError) as info:
        runner.run("fail", "second")
    assert info.value.session_id == "fail"
    session = sqlite_store.get("fail")
    assert session.history == before and session.status is SessionStatus.IDLE and session.turn_count == 1
    users = [e.payload["message"]["content"] for e in events_of(sqlite_store, "fail", "message.user")]
    assert users == ["first", "second"]
    failed = events_of(sqlite_store, "fail", "turn.failed")
    assert len(failed) == 1 and failed[0].payload["turn"] == 2
    assert failed[0].payload["error_type"] == "AuthenticationError"

    fake_server.add_text("two")
    retry = runner.run("fail", "second")
    assert retry.turn == 2 and retry.content == "two"
    assert roles(fake_server.requests[-1]["messages"]) == ["system", "user", "assistant", "user"]


def test_failure_mid_tool_round_drops_the_whole_turn(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    @tool
    def t() -> str:
        return "x"

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[t]))
    fake_server.add_tool_calls([("call_1", "t", "{}")])
    fake_server.add_invalid_json()
    with pytest.raises(ProviderResponseError):
        runner.run("midway", "go")
    session = sqlite_store.get("midway")
    assert session.history == () and session.status is SessionStatus.IDLE and session.turn_count == 0
    fake_server.add_text("ok now")
    assert runner.run("midway", "go").turn == 1


def test_a_stream_broken_mid_tool_round_keeps_the_turn_as_interrupted(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    @tool
    def t() -> str:
        return "x"

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[t]))
    fake_server.add_tool_calls([("call_1", "t", "{}")])
    fake_server.add_close_midstream(after=["Hel"])
    with pytest.raises(StreamBrokenError) as info:
        runner.run("midway", "go")
    assert info.value.exit_code == 6 and "kept as interrupted turn 1" in info.value.message
    session = sqlite_store.get("midway")
    assert [(m.role, m.content, m.interrupted) for m in session.history] == [
        (Role.USER, "go", False), (Role.MODEL, None, False), (Role.TOOL, "x", False), (Role.MODEL, "Hel", True)]
    assert session.status is SessionStatus.IDLE and session.turn_count == 1
    fake_server.add_text("ok now")
    assert runner.run("midway", "go on").turn == 2


def test_rate_limited_turn_reschedules_the_session_with_a_retry_time(
    fake_server: FakeServer, sqlite_store: Any
) -> None:
    from chatflow_cli.core.model import ModelClient

    client = ModelClient(fake_server.url, "k", max_retries=1, timeout=10)
    runner = Runner(Agent("A", "x", model=MODEL), sqlite_store, model_client=client)
    fake_server.add_error(429, headers={"Retry-After": "0.2"})
    fake_server.add_text("after one retry")
    assert runner.run("rl", "hi").content == "after one retry"
    assert len(fake_server.requests) == 2

    fake_server.add_error(429, headers={"Retry-After": "0.1"})
    fake_server.add_error(503, headers={"Retry-After": "30"})
    before = time.time()
    with pytest.raises(RateLimitedError) as info:
        runner.run("rl", "again")
    assert info.value.retry_at is not None and before + 29 <= info.value.retry_at <= time.time() + 31
    session = sqlite_store.get("rl")
    assert session.status is SessionStatus.RESCHEDULED and session.turn_count == 1
    status = events_of(sqlite_store, "rl", "status")[-1].payload
    assert status["status"] == "rescheduled" and status["retry_at"] == info.value.retry_at
    assert [s.status for s in sqlite_store.list_sessions()] == [SessionStatus.RESCHEDULED]

    fake_server.add_text("back")
    result = runner.run("rl", "again")
    assert result.content == "back" and result.turn == 2 and sqlite_store.get("rl").status is SessionStatus.IDLE


# --------------------------------------------------------------------------------------
# interrupts
# --------------------------------------------------------------------------------------
def test_cancel_mid_stream_keeps_partial_text_flagged_interrupted(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL))
    fake_server.add_text("one two three four five", delay=0.3)
    cancel = threading.Event()
    seen: list[str] = []
    with pytest.raises(RunInterrupted):
        for event in runner.run_streamed("cut", "count", cancel=cancel):
            if event.type == "text.delta":
                seen.append(event.data["text"])
                if len(seen) == 2:
                    cancel.set()
    session = sqlite_store.get("cut")
    last = session.history[-1]
    assert last.role is Role.MODEL and last.interrupted and last.content == "".join(seen) == "one two"
    assert session.status is SessionStatus.IDLE
    assert len(events_of(sqlite_store, "cut", "turn.interrupted")) == 1
    fake_server.add_text("next")
    assert runner.run("cut", "go on").turn == 2
    check_history(sqlite_store.get("cut").history)


def test_closing_the_stream_early_interrupts_without_raising(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL))
    fake_server.add_text("alpha beta gamma", delay=0.2)
    stream = runner.run_streamed("closed", "hi")
    for event in stream:
        if event.type == "text.delta":
            break
    stream.close()  # type: ignore[attr-defined]
    session = sqlite_store.get("closed")
    assert session.status is SessionStatus.IDLE
    assert session.history[-1].interrupted and session.history[-1].content == "alpha"
    assert len(events_of(sqlite_store, "closed", "turn.interrupted")) == 1


def test_task_cancellation_while_a_tool_runs_stores_a_synthetic_result(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    started = threading.Event()

    @tool
    def slow_job() -> str:
        started.set()
        time.sleep(3)
        return "finished"

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[slow_job]))
    fake_server.add_tool_calls([("call_s", "slow_job", "{}")])

    async def main() -> None:
        task = asyncio.create_task(runner.run_async("acancel", "do it"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    t0 = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - t0 < 2.5, "cancellation does not wait for the tool"
    session = sqlite_store.get("acancel")
    assert session.status is SessionStatus.IDLE
    model, result = session.history[-2:]
    assert model.tool_calls[0].id == "call_s"
    assert result.tool_call_id == "call_s" and result.interrupted and result.is_error
    assert result.content == INTERRUPTED_TOOL_RESULT
    assert events_of(sqlite_store, "acancel", "turn.interrupted")[0].payload["tool_use_ids"] == ["call_s"]


# --------------------------------------------------------------------------------------
# streaming, idempotency, async
# --------------------------------------------------------------------------------------
def test_streamed_events_carry_their_log_seq(fake_server: FakeServer, make_runner: Callable[..., Runner],
                                             sqlite_store: Any) -> None:
    @tool
    def get_time() -> str:
        return "14:00"

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[get_time]))
    fake_server.add_tool_calls([("call_t", "get_time", "{}")])
    fake_server.add_text("It is 14:00.")
    events: list[StreamEvent] = list(runner.run_streamed("stream", "time?"))
    types = [e.type for e in events]
    assert types.index("tool.call_started") < types.index("tool.call_finished") < types.index("tool.result")
    assert types[-1] == "result" and events[-1].result is not None
    assert "".join(e.data["text"] for e in events if e.type == "text.delta") == "It is 14:00."
    persisted = [e for e in events if e.persisted]
    logged = sqlite_store.events("stream")
    assert [(e.seq, e.type) for e in persisted] == [(e.seq, e.type) for e in logged]
    assert [e.seq for e in persisted] == list(range(1, len(logged) + 1))
    statuses = [e.data["status"] for e in events if e.type == "status"]
    assert statuses == ["running", "idle"]
    assert events[-1].result.events == tuple(logged)
    json.dumps([e.to_dict() for e in events])


def test_idempotency_key_returns_the_first_result_without_calling_the_model(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL))
    fake_server.add_text("first answer")
    first = runner.run("idem", "hello", idempotency_key="wamid.1")
    seq = sqlite_store.last_seq("idem")
    again = runner.run("idem", "hello", idempotency_key="wamid.1")
    assert again.replayed and not first.replayed
    assert (again.content, again.turn, again.agent, again.usage) == (first.content, first.turn, first.agent,
                                                                     first.usage)
    assert len(fake_server.requests) == 1 and sqlite_store.last_seq("idem") == seq
    with pytest.raises(IdempotencyConflictError):
        runner.run("idem", "something else", idempotency_key="wamid.1")
    assert sqlite_store.last_seq("idem") == seq
    assert len(non_system(sqlite_store.get("idem").history)) == 2


def test_run_async_matches_run(fake_server: FakeServer, make_runner: Callable[..., Runner]) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL))

    async def main() -> list[Any]:
        return await asyncio.gather(runner.run_async("a1", "one"), runner.run_async("a2", "two"))

    results = asyncio.run(main())
    assert sorted(r.content for r in results) == ["ok: one", "ok: two"]
    assert {r.session_id for r in results} == {"a1", "a2"}


def test_a_second_run_in_the_same_process_is_refused_while_the_first_runs(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    from chatflow_cli.core.errors import SessionBusyError

    runner = make_runner(Agent("A", "x", model=MODEL))
    fake_server.add_text("slow reply here", delay=0.3)
    thread = threading.Thread(target=runner.run, args=("busy1", "first"))
    thread.start()
    wait_until(lambda: events_of_safe(sqlite_store, "busy1", "message.user"), what="the first turn to begin")
    seq = sqlite_store.last_seq("busy1")
    with pytest.raises(SessionBusyError, match=r"^session 'busy1' is busy: a turn is running in pid \d+ on "):
        runner.run("busy1", "second", wait=0)  # wait=0: refused at once (the default waits its turn)
    assert sqlite_store.last_seq("busy1") == seq
    result = runner.run("busy1", "second", wait=10)
    thread.join()
    assert result.turn == 2


def events_of_safe(store: Any, session_id: str, type_: str) -> list[Any]:
    try:
        return events_of(store, session_id, type_)
    except SessionNotFoundError:  # the session does not exist yet
        return []


def test_idempotency_key_of_a_failed_or_waiting_turn(fake_server: FakeServer, make_runner: Callable[..., Runner],
                                                     sqlite_store: Any) -> None:
    approve = Tool.custom("approve", "Ask a human.")
    runner = make_runner(Agent("A", "x", model=MODEL, tools=[approve]))
    fake_server.add_text("hello")
    runner.run("idem2", "hi")
    fake_server.add_error(400, message="bad request")
    with pytest.raises(BadRequestError):
        runner.run("idem2", "this fails", idempotency_key="k-fail")
    seq = sqlite_store.last_seq("idem2")
    with pytest.raises(IdempotencyConflictError):  # same key, another message: still refused
        runner.run("idem2", "other text", idempotency_key="k-fail")
    assert sqlite_store.last_seq("idem2") == seq and len(fake_server.requests) == 2
    # the failed attempt gave no result: a retry with the same key and message runs the turn
    fake_server.add_text("worked now")
    retried = runner.run("idem2", "this fails", idempotency_key="k-fail")
    assert not retried.replayed and retried.content == "worked now" and retried.turn == 2
    again = runner.run("idem2", "this fails", idempotency_key="k-fail")  # now the key maps to it
    assert again.replayed and again.content == "worked now" and len(fake_server.requests) == 3
    sqlite_store.rollback("idem2", 1)  # the retried turn leaves the window; the custom-tool turn is turn 2 again

    fake_server.add_tool_calls([("call_ap", "approve", "{}")])
    waiting = runner.run("idem2", "needs approval", idempotency_key="k-wait")
    again = runner.run("idem2", "needs approval", idempotency_key="k-wait")
    assert again.replayed and [c.id for c in again.pending_tool_calls] == ["call_ap"]
    assert again.turn == waiting.turn == 2 and len(fake_server.requests) == 4


def test_a_callers_cancel_event_stops_a_request_to_a_silent_server_at_once(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL))  # client read timeout: 20 s
    # the stream opens after 3 s, then stays silent for 3 s before each further chunk
    fake_server.add_text("late reply", chunks=["late", " reply"], delay=3.0)
    cancel = threading.Event()
    timer = threading.Timer(3.5, cancel.set)  # set from another thread, as the REPL does
    timer.start()
    started = time.monotonic()
    with pytest.raises(RunInterrupted):
        runner.run("silent", "anyone there?", cancel=cancel)
    assert time.monotonic() - started < 5.5, "the read was woken, not left to the next chunk"
    session = sqlite_store.get("silent")
    assert session.status is SessionStatus.IDLE
    assert [m.role for m in session.history] == [Role.USER]  # no partial text: nothing was said
    assert len(events_of(sqlite_store, "silent", "turn.interrupted")) == 1


def test_cancel_before_the_server_answers_is_an_interrupt_not_a_failure(
    fake_server: FakeServer, sqlite_store: Any
) -> None:
    from chatflow_cli.core.model import ModelClient

    runner = Runner(Agent("A", "x", model=MODEL), sqlite_store,
                    model_client=ModelClient(fake_server.url, "k", max_retries=0, timeout=2))
    fake_server.add_hang()
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with pytest.raises(RunInterrupted):
        runner.run("hung", "hello?", cancel=cancel)
    assert events_of(sqlite_store, "hung", "turn.failed") == []
    assert len(events_of(sqlite_store, "hung", "turn.interrupted")) == 1
    assert sqlite_store.get("hung").status is SessionStatus.IDLE


def test_a_cancel_event_set_while_the_server_hangs_interrupts_the_turn_at_once(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any, db_path: Any
) -> None:
    """The server took the request and never sends headers; the client would wait 20 s. A
    cancel event set 0.3 s in ends the run at once as an interrupt; the session is idle,
    valid, and answers the next message."""
    runner = make_runner(Agent("A", "x", model=MODEL))  # client read timeout: 20 s
    fake_server.add_hang()
    cancel = threading.Event()
    cancelled: dict[str, float] = {}

    def cancel_when_waiting() -> None:
        wait_until(lambda: fake_server.requests, what="the request to reach the server")
        time.sleep(0.3)  # the scenario: the client has been waiting a while, not just started
        cancelled["at"] = time.monotonic()
        cancel.set()

    threading.Thread(target=cancel_when_waiting, daemon=True).start()
    with pytest.raises(RunInterrupted):
        runner.run("hung-long", "hello?", cancel=cancel)
    ended = time.monotonic()
    assert ended - cancelled["at"] < 1.0, f"the run ended {ended - cancelled['at']:.1f} s after the cancel"
    assert events_of(sqlite_store, "hung-long", "turn.failed") == []
    interrupted = events_of(sqlite_store, "hung-long", "turn.interrupted")
    assert len(interrupted) == 1 and interrupted[0].payload["turn"] == 1
    other = open_sqlite_store(db_path)  # what another process sees
    session = other.get("hung-long")
    other.close()
    assert session.status is SessionStatus.IDLE
    assert [m.role for m in session.history] == [Role.USER]  # nothing was said: no partial message
    check_history(session.history)
    assert len(fake_server.requests) == 1

    fake_server.add_text("here now")
    again = runner.run("hung-long", "still there?")
    assert again.content == "here now" and again.turn == 2 and again.status is SessionStatus.IDLE
    assert roles(fake_server.requests[-1]["messages"])[-1] == "user"
    check_history(sqlite_store.get("hung-long").history)


@pytest.mark.parametrize("installed", [True, False])
def test_a_runner_with_no_endpoint_says_accurately_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, sqlite_store: Any, installed: bool
) -> None:
    from chatflow_cli.core import local_probe

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(local_probe, "local_available", lambda: installed)
    runner = Runner(Agent(name="Bot", instructions="Assistant", model="gpt-4o"), sqlite_store)
    with pytest.raises(ConfigError) as info:
        runner.run("s", "hi")
    text = str(info.value)
    assert "OPENAI_API_KEY" in text
    assert ("chatflow_cli.core.local.LocalServer" in text) is installed
    assert ("pip install 'chatflow-cli[local]'" in text) is not installed
    session = sqlite_store.get("s")
    # the session exists (created when the turn began) and the failed turn left nothing in it
    assert (session.status, session.turn_count, session.history) == (SessionStatus.IDLE, 0, ())
