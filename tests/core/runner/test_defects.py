"""Defects a fresh tester found in the Runner (each test failed before its fix)."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import AuthenticationError, ChatflowError, UsageError
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.messages import Role
from chatflow_cli.core.model import ModelClient
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.tools import tool
from tests.helpers.fakeserver import FakeServer

MODEL = "fake-model"


def events_of(store: Any, session_id: str, type_: str) -> list[Any]:
    return [e for e in store.events(session_id) if e.type == type_]


def test_a_key_echoed_by_the_server_is_in_no_part_of_a_runner_traceback(fake_server: FakeServer, store: Any) -> None:
    secret = "sk-ECHOED-0123456789abcdef"
    client = ModelClient(fake_server.url, secret, max_retries=0, timeout=10)
    runner = Runner(Agent("A", "x", model=MODEL), store, model_client=client)
    fake_server.add_error(400, message=f"invalid key {secret}", headers={"x-should-retry": "false"})
    with pytest.raises(ChatflowError) as info:
        runner.run("leak", "hi")
    assert secret not in "".join(traceback.format_exception(info.value))


def test_a_tool_result_with_a_lone_surrogate_is_stored_and_the_model_sees_it(
    fake_server: FakeServer, make_runner: Callable[..., Runner], store: Any
) -> None:
    name = os.fsdecode(b"file-\xff.txt")  # 'file-\udcff.txt': not encodable as UTF-8

    @tool
    def list_files() -> str:
        """List files."""
        return name

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[list_files]))
    fake_server.add_tool_calls([("call_f", "list_files", "{}")])
    fake_server.add_text("there is one file")
    result = runner.run("surr", "what files?")
    assert result.content == "there is one file"
    tool_msg = [m for m in store.get("surr").history if m.role is Role.TOOL][0]
    assert tool_msg.content == "file-\\udcff.txt" and not tool_msg.is_error
    sent = fake_server.requests[1]["messages"][-1]
    assert sent["role"] == "tool" and sent["content"] == "file-\\udcff.txt"


def test_model_text_with_a_lone_surrogate_escape_is_stored(
    fake_server: FakeServer, make_runner: Callable[..., Runner], store: Any
) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL, tools=[]))
    fake_server.add_chunks([{"choices": [{"index": 0, "delta": {"content": "bad \ud800 char"},
                                          "finish_reason": "stop"}]}])
    result = runner.run("surr2", "hi")
    assert result.content == "bad \\ud800 char"
    assert store.get("surr2").history[-1].content == "bad \\ud800 char"


def test_a_user_message_with_a_lone_surrogate_is_a_usage_error_and_writes_nothing(
    make_runner: Callable[..., Runner], store: Any, fake_server: FakeServer
) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL))
    runner.run("surr3", "hello")
    seq = store.last_seq("surr3")
    with pytest.raises(UsageError):
        runner.run("surr3", "bad \udcff")
    with pytest.raises(UsageError):
        runner.run("surr4", "bad \udcff")
    assert store.last_seq("surr3") == seq and store.get("surr4") is None
    assert store.get("surr3").status is SessionStatus.IDLE and len(fake_server.requests) == 1


def test_a_failed_turn_reverts_a_handoff_made_in_it(
    fake_server: FakeServer, make_runner: Callable[..., Runner], store: Any, db_path: Any
) -> None:
    alpha = Agent("Alpha", "alpha", model=MODEL)
    beta = Agent("Beta", "beta", model=MODEL, handoffs=[alpha])
    runner = make_runner(beta)
    fake_server.add_text("hi from beta")
    runner.run("ho", "hello")
    fake_server.add_tool_calls([("call_h", "transfer_to_alpha", "{}")])
    fake_server.add_error(401, message="bad key", headers={"x-should-retry": "false"})
    with pytest.raises(AuthenticationError):
        runner.run("ho", "over to alpha")
    session = store.get("ho")
    assert session.active_agent.name == "Beta" and session.turn_count == 1
    assert [s.active_agent_name for s in store.list_sessions() if s.session_id == "ho"] == ["Beta"]
    failed = events_of(store, "ho", "turn.failed")[-1]
    assert failed.payload["active_agent"] == "Beta" and failed.payload["reverted_from_agent"] == "Alpha"
    from .conftest import sqlite_store

    assert sqlite_store(db_path).get("ho").active_agent.name == "Beta"  # from the log, after a restart
    fake_server.add_text("beta again")
    assert runner.run("ho", "retry").agent == "Beta"
    assert fake_server.requests[-1]["messages"][0] == {"role": "system", "content": "beta"}


def test_a_rescheduled_or_interrupted_turn_can_be_retried_with_the_same_idempotency_key(
    fake_server: FakeServer, store: Any, make_runner: Callable[..., Runner]
) -> None:
    from chatflow_cli.core.errors import IdempotencyConflictError, RateLimitedError

    runner = make_runner(Agent("A", "x", model=MODEL))
    fake_server.add_error(429, headers={"Retry-After": "0", "x-should-retry": "false"})
    with pytest.raises(RateLimitedError):
        runner.run("hook", "order 42?", idempotency_key="wamid.9")
    assert store.get("hook").status is SessionStatus.RESCHEDULED
    fake_server.add_text("shipped")
    first = runner.run("hook", "order 42?", idempotency_key="wamid.9")
    assert first.content == "shipped" and not first.replayed and first.turn == 1
    replay = runner.run("hook", "order 42?", idempotency_key="wamid.9")
    assert replay.replayed and replay.content == "shipped" and len(fake_server.requests) == 2
    with pytest.raises(IdempotencyConflictError):
        runner.run("hook", "other", idempotency_key="wamid.9")

    import threading

    cancel = threading.Event()
    fake_server.add_text("slow", delay=[0.0, 5.0], chunks=["s", "low"])
    it = runner.run_streamed("hook", "again?", idempotency_key="wamid.10", cancel=cancel)
    from chatflow_cli.core.errors import RunInterrupted

    with pytest.raises(RunInterrupted):
        for event in it:
            if event.type == "text.delta":
                cancel.set()
    fake_server.add_text("done")
    retried = runner.run("hook", "again?", idempotency_key="wamid.10")
    assert retried.content == "done" and not retried.replayed
    assert runner.run("hook", "again?", idempotency_key="wamid.10").replayed
