"""Interrupting a running turn from another process or host (``store.request_interrupt``,
``chatflow sessions interrupt``): the turn stops at its next chunk or tool boundary, keeps
the partial reply, answers open tool calls with the synthetic result, the session is idle.
Every store kind, with the real Runner against the fake model server over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import RunInterrupted
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.memory import INTERRUPTED_TOOL_RESULT, BaseSessionStore, SessionStore
from chatflow_cli.core.model import ModelClient
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from chatflow_cli.core.tools import tool
from tests.helpers.fakeserver import FakeServer


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def any_kind_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BaseSessionStore]:
    store: BaseSessionStore
    if request.param == "memory":
        store = SessionStore()
    elif request.param == "sqlite":
        store = SQLiteSessionStore(tmp_path / "s.db")
    else:
        from chatflow_cli.core.memory.postgres import PostgresSessionStore

        store = PostgresSessionStore(request.getfixturevalue("pg_dsn"))
    yield store
    store.close()


def _wait_for(predicate: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {predicate}"
        time.sleep(0.01)
    return value


def _run_in_thread(runner: Runner, session_id: str, text: str,
                   first_text: threading.Event | None = None) -> tuple[threading.Thread, list[Any]]:
    """The turn on a thread (another worker); ``first_text`` is set when its first text arrives."""
    out: list[Any] = []

    def go() -> None:
        try:
            for event in runner.run_streamed(session_id, text):
                if event.type == "text.delta" and first_text is not None:
                    first_text.set()
                if event.result is not None:
                    out.append(event.result)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    return thread, out


def test_a_requested_interrupt_stops_the_reply_at_the_next_chunk_and_keeps_it(
    any_kind_store: BaseSessionStore, fake_server: FakeServer
) -> None:
    store = any_kind_store
    agent = Agent(name="Assistant", instructions="", model="fake-model")
    runner = Runner(agent, store, model_client=ModelClient(base_url=fake_server.url, api_key="k"))
    assert store.request_interrupt.__self__ is store
    runner.run("s", "first")
    assert store.request_interrupt("s") is None  # nothing runs: nothing written
    before = store.last_seq("s")
    chunks = ["Part one. ", "Part two. "] + [f"more {i}. " for i in range(40)]
    fake_server.add_text("".join(chunks), chunks=chunks, delay=[0, 0.3] + [0.3] * 40)
    first_text = threading.Event()
    thread, out = _run_in_thread(runner, "s", "tell me a long story", first_text)
    assert first_text.wait(30)
    asked = store.request_interrupt("s")
    assert asked == 2
    thread.join(timeout=60)
    assert not thread.is_alive()
    [outcome] = out
    assert isinstance(outcome, RunInterrupted), outcome
    assert "another process's request" in str(outcome)
    events = store.events("s", after_seq=before)
    types = [e.type for e in events]
    assert "turn.interrupt_requested" in types and "turn.interrupted" in types
    assert types.index("turn.interrupt_requested") < types.index("turn.interrupted")
    interrupted = next(e for e in events if e.type == "turn.interrupted")
    assert interrupted.payload["turn"] == 2 and interrupted.payload["reason"] == "interrupt requested"
    summary = next(s for s in store.list_sessions() if s.session_id == "s")
    assert summary.status is SessionStatus.IDLE
    [record] = [r for r in store.load_turns("s") if r.number == 2]
    reply = record.messages[-1]
    assert reply.interrupted and reply.content and reply.content.startswith("Part one.")
    assert reply.content != "".join(chunks)  # stopped before the end
    assert runner.run("s", "next").content == "ok: next"  # the session takes the next turn


def test_a_requested_interrupt_during_a_tool_answers_open_calls_with_the_synthetic_result(
    any_kind_store: BaseSessionStore, fake_server: FakeServer
) -> None:
    store = any_kind_store
    started = threading.Event()
    release = threading.Event()

    @tool
    def slow_lookup(order_id: str) -> str:
        """Look an order up (slowly)."""
        started.set()
        release.wait(30)
        return f"order {order_id}: shipped"

    agent = Agent(name="Assistant", instructions="", model="fake-model", tools=[slow_lookup])
    runner = Runner(agent, store, model_client=ModelClient(base_url=fake_server.url, api_key="k"))
    fake_server.add_tool_calls([("call_1", "slow_lookup", '{"order_id": "404"}')])
    thread, out = _run_in_thread(runner, "t", "where is 404?")
    assert started.wait(30)
    assert store.request_interrupt("t") == 1
    thread.join(timeout=60)
    release.set()
    [outcome] = out
    assert isinstance(outcome, RunInterrupted), outcome
    [record] = store.load_turns("t")
    tool_results = [m for m in record.messages if m.role.value == "tool"]
    assert [m.content for m in tool_results] == [INTERRUPTED_TOOL_RESULT]
    assert next(s for s in store.list_sessions() if s.session_id == "t").status is SessionStatus.IDLE
    assert len(fake_server.requests) == 1  # the model was not asked again after the tool


def test_an_interrupt_request_for_another_run_is_not_this_runs(any_kind_store: BaseSessionStore) -> None:
    """The request names the owner it was made for: a later turn of the session is not stopped."""
    from chatflow_cli.core.memory import Owner
    from chatflow_cli.core.messages import Message

    from chatflow_cli.core._run.lifecycle import lease_of as _lease_of

    store = any_kind_store
    agent = Agent(name="Assistant", instructions="")
    first = store.begin_turn("u", default_agent=agent, user_message=Message.user("q1"), owner=Owner.current())
    assert store.request_interrupt("u") == 1
    assert store.interrupt_requested("u", _lease_of(first.session))
    first.session.interrupt_turn(reason="interrupt requested")
    store.release(first.session)
    second = store.begin_turn("u", default_agent=agent, user_message=Message.user("q2"), owner=Owner.current())
    assert not store.interrupt_requested("u", _lease_of(second.session))
    assert not store.interrupt_requested("u", _lease_of(first.session))
