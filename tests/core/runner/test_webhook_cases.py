"""A webhook message is never lost: the seed's handler under a burst, a retry after a worker
died mid-turn, a turn that never started gives its claim back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import SessionBusyError
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.memory import MessageState
from chatflow_cli.core.messages import Role, history_problems
from chatflow_cli.core.runner import Runner
from tests.helpers.fakeserver import FakeServer, Reply
from tests.helpers.wait import wait_until

from .conftest import open_sqlite_store

REPO = Path(__file__).resolve().parents[3]
MODEL = "fake-model"


def seed_handler(store: Any, runner: Runner) -> Callable[[str, str, str], Any]:
    """The seed's ``handle_inbound_webhook``, as written."""

    async def handle_inbound_webhook(user_phone: str, message_text: str, webhook_msg_id: str) -> Any:
        if store.is_message_processed(webhook_msg_id):
            print(f"Skipping duplicate webhook: {webhook_msg_id}")
            return None

        store.mark_message_processed(webhook_msg_id)

        response = await runner.run_async(
            session_id=user_phone,
            user_message=message_text,
            metadata={"channel": "whatsapp", "phone": user_phone},
        )
        return response.content

    return handle_inbound_webhook


def test_the_webhook_handler_answers_a_burst_and_skips_the_redelivery(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    """Two messages of one customer at once (asyncio.gather), then the second delivered again:
    two turns for two messages, and the redelivery is a duplicate (no model call). Which of
    two simultaneous calls reaches the store first is not defined; the order of turns that
    wait is tested in tests/webhook (arrival order)."""
    runner = make_runner(Agent("Orders", "Answer order questions.", model=MODEL))
    handle = seed_handler(sqlite_store, runner)
    fake_server.reply_delay = 0.3  # the first answer takes a while: the second arrives meanwhile

    async def burst() -> list[Any]:
        return await asyncio.gather(handle("+15550199", "Where is order 404?", "wamid.1"),
                                    handle("+15550199", "And order 405?", "wamid.2"))

    assert asyncio.run(burst()) == ["ok: Where is order 404?", "ok: And order 405?"]
    assert asyncio.run(handle("+15550199", "And order 405?", "wamid.2")) is None  # the redelivery
    assert len(fake_server.requests) == 2
    session = sqlite_store.get("+15550199")
    assert sorted(m.content for m in session.history if m.role is Role.USER) == [
        "And order 405?", "Where is order 404?"]
    assert session.turn_count == 2 and history_problems(session.history) == []
    assert sqlite_store.message_state("wamid.1") is sqlite_store.message_state("wamid.2") is MessageState.PROCESSED


def test_a_turn_that_never_started_gives_its_claim_back(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    """With wait=0 the second message is refused while the first runs: its claim is freed, so
    the platform's redelivery runs it."""
    runner = make_runner(Agent("Orders", "x", model=MODEL))
    fake_server.reply_delay = 0.5

    async def main() -> None:
        first = asyncio.create_task(runner.run_async("c1", "one", message_id="m1"))
        while sqlite_store.message_state("m1") is not MessageState.IN_PROGRESS or sqlite_store.get("c1") is None:
            await asyncio.sleep(0.01)
        assert sqlite_store.claim_message("m2")
        with pytest.raises(SessionBusyError):
            await runner.run_async("c1", "two", wait=0)
        assert sqlite_store.message_state("m2") is MessageState.NEW
        await first
        result = await runner.run_async("c1", "two", message_id="m2")  # the redelivery
        assert result.content == "ok: two" and not result.replayed

    asyncio.run(main())
    assert sqlite_store.message_state("m2") is MessageState.PROCESSED


def test_message_id_replays_a_processed_message(fake_server: FakeServer, make_runner: Callable[..., Runner],
                                                sqlite_store: Any) -> None:
    runner = make_runner(Agent("Orders", "x", model=MODEL))
    first = runner.run("c1", "hello", message_id="wamid.X")
    again = runner.run("c1", "hello", message_id="wamid.X")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.content == first.content == "ok: hello"
    assert len(fake_server.requests) == 1


CHILD = textwrap.dedent(
    """
    import sys
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.model import ModelClient
    from chatflow_cli.core.runner import Runner
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    db, url, how, key = sys.argv[1:5]
    store = SQLiteSessionStore(db)
    runner = Runner(Agent("Orders", "x", model="fake-model"), store, model_client=ModelClient(url, "k", max_retries=0))
    if how == "idempotency_key":
        runner.run("c1", "refund order 7", idempotency_key=key)
    elif how == "seed":
        import asyncio

        async def handle_inbound_webhook(user_phone, message_text, webhook_msg_id):
            if store.is_message_processed(webhook_msg_id):
                return None
            store.mark_message_processed(webhook_msg_id)
            response = await runner.run_async(session_id=user_phone, user_message=message_text)
            return response.content

        asyncio.run(handle_inbound_webhook("c1", "refund order 7", key))
    else:
        store.claim_message(key)
        runner.run("c1", "refund order 7")
    """
)


@pytest.mark.parametrize("how", ["idempotency_key", "claim_message"])
def test_a_retry_after_the_worker_was_killed_mid_turn_runs_again(
    tmp_path: Path, fake_server: FakeServer, db_path: Path, make_runner: Callable[..., Runner], how: str
) -> None:
    """SIGKILL the worker while the model answers; the redelivery (same key, or the same
    message id claimed again) recovers the dead turn first and runs the message again, and
    the context window holds the message once."""
    import threading

    gate = threading.Event()  # the model never answers the first attempt
    fake_server.add(Reply(events=FakeServer.make_text("never sent").events, gate=gate))
    script = tmp_path / "worker.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(script), str(db_path), fake_server.url, how, "wamid.7"], env=env)
    try:
        # the worker is waiting for the model's answer
        wait_until(lambda: fake_server.requests or proc.poll() is not None, 30, "the worker's request")
        assert proc.poll() is None, "the worker exited before it asked the model"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    gate.set()
    store = open_sqlite_store(db_path)
    try:
        runner = make_runner(Agent("Orders", "x", model=MODEL), session_store=store)
        if how == "idempotency_key":
            result = runner.run("c1", "refund order 7", idempotency_key="wamid.7")
        else:
            assert store.message_state("wamid.7") is MessageState.NEW  # the dead worker's claim is free
            assert store.claim_message("wamid.7")
            result = runner.run("c1", "refund order 7")
            assert store.message_state("wamid.7") is MessageState.PROCESSED
        assert not result.replayed and result.content == "ok: refund order 7"
        assert len(fake_server.requests) == 2  # the model was asked again
        session = store.get("c1")
        assert [m.content for m in session.history if m.role is Role.USER] == ["refund order 7"]
        assert history_problems(session.history) == []
        types = [e.type for e in store.events("c1")]
        assert types.count("message.user") == 2 and "session.recovered" in types  # the log keeps both
        [summary] = store.list_sessions()
        assert summary.status is SessionStatus.IDLE
    finally:
        store.close()


def test_the_webhook_handler_waits_for_a_duplicate_held_by_a_worker_that_is_then_killed(
    tmp_path: Path, fake_server: FakeServer, db_path: Path, make_runner: Callable[..., Runner]
) -> None:
    """A worker process runs the seed's handler for a message and waits for the model; a second
    delivery of that message goes through the seed's handler in this process meanwhile, and
    waits; the worker is SIGKILLed; the second delivery then runs the message itself: one
    answer, one user message in the window, the message processed."""
    import threading

    gate = threading.Event()  # the model never answers the worker
    fake_server.add(Reply(events=FakeServer.make_text("never sent").events, gate=gate))
    script = tmp_path / "worker.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(script), str(db_path), fake_server.url, "seed", "wamid.9"], env=env)
    store = open_sqlite_store(db_path)
    answers: list[Any] = []
    try:
        # the worker is waiting for the model's answer
        wait_until(lambda: fake_server.requests or proc.poll() is not None, 30, "the worker's request")
        assert proc.poll() is None, "the worker exited before it asked the model"
        seen = threading.Event()
        real_state = store.message_state

        def watched(message_id: str) -> MessageState:
            state = real_state(message_id)
            if state is MessageState.IN_PROGRESS:
                seen.set()
            return state

        store.message_state = watched  # type: ignore[method-assign]
        runner = make_runner(Agent("Orders", "x", model=MODEL), session_store=store)
        handle = seed_handler(store, runner)
        second = threading.Thread(target=lambda: answers.append(asyncio.run(handle("c1", "refund order 7", "wamid.9"))))
        second.start()
        assert seen.wait(30)  # the duplicate found the worker on it
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    gate.set()
    try:
        second.join(90)
        assert answers == ["ok: refund order 7"]
        assert len(fake_server.requests) == 2
        store.message_state = real_state  # type: ignore[method-assign]
        assert store.message_state("wamid.9") is MessageState.PROCESSED
        session = store.get("c1")
        assert [m.content for m in session.history if m.role is Role.USER] == ["refund order 7"]
        assert history_problems(session.history) == []
        [summary] = store.list_sessions()
        assert summary.status is SessionStatus.IDLE
    finally:
        store.close()
