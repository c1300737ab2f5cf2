"""How the Runner fails a turn: an echoed API key is in no part of the traceback, a failed turn
reverts a handoff made in it, and a rescheduled or interrupted turn can run again with the same
idempotency key."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import AuthenticationError, ChatflowError
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.model import ModelClient
from chatflow_cli.core.runner import Runner
from tests.helpers.fakeserver import FakeServer
from tests.helpers.stored import events_of

MODEL = "fake-model"


def test_a_key_echoed_by_the_server_is_in_no_part_of_a_runner_traceback(fake_server: FakeServer, sqlite_store: Any) -> None:
    secret = "sk-ECHOED-0123456789abcdef"
    client = ModelClient(fake_server.url, secret, max_retries=0, timeout=10)
    runner = Runner(Agent("A", "x", model=MODEL), sqlite_store, model_client=client)
    fake_server.add_error(400, message=f"invalid key {secret}", headers={"x-should-retry": "false"})
    with pytest.raises(ChatflowError) as info:
        runner.run("leak", "hi")
    assert secret not in "".join(traceback.format_exception(info.value))


def test_a_failed_turn_reverts_a_handoff_made_in_it(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any, db_path: Any
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
    session = sqlite_store.get("ho")
    assert session.active_agent.name == "Beta" and session.turn_count == 1
    assert [s.active_agent_name for s in sqlite_store.list_sessions() if s.session_id == "ho"] == ["Beta"]
    failed = events_of(sqlite_store, "ho", "turn.failed")[-1]
    assert failed.payload["active_agent"] == "Beta" and failed.payload["reverted_from_agent"] == "Alpha"
    from .conftest import open_sqlite_store

    assert open_sqlite_store(db_path).get("ho").active_agent.name == "Beta"  # from the log, after a restart
    fake_server.add_text("beta again")
    assert runner.run("ho", "retry").agent == "Beta"
    assert fake_server.requests[-1]["messages"][0] == {"role": "system", "content": "beta"}


def test_a_rescheduled_or_interrupted_turn_can_be_retried_with_the_same_idempotency_key(
    fake_server: FakeServer, sqlite_store: Any, make_runner: Callable[..., Runner]
) -> None:
    from chatflow_cli.core.errors import IdempotencyConflictError, RateLimitedError

    runner = make_runner(Agent("A", "x", model=MODEL))
    fake_server.add_error(429, headers={"Retry-After": "0", "x-should-retry": "false"})
    with pytest.raises(RateLimitedError):
        runner.run("hook", "order 42?", idempotency_key="wamid.9")
    assert sqlite_store.get("hook").status is SessionStatus.RESCHEDULED
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
