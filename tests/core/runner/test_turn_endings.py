"""A turn has one ending, its lease ends with it, and a claim is never left behind.

Every store kind, the real Runner against the fake model server over HTTP, with failures
injected at the steps between claim, begin, model call, commit and reply (a store subclass
whose ``save`` or ``active_agent_name`` raises where the test says, as a database that goes
away would). Checked: no session left ``running`` by a turn that ended, no claim leaked by a
run that failed before its turn started, no turn with two endings, no late write of a turn
another process recovered.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import SessionBusyError, StoreError, UsageError
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.memory import BaseSessionStore, Owner, SessionStore
from chatflow_cli.core.messages import Message, ToolCall
from chatflow_cli.core.model import ModelClient
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from tests.helpers.fakeserver import FakeServer

AGENT = Agent(name="Assistant", instructions="Be brief.", model="fake-model")
ENDINGS = ("turn.completed", "turn.failed", "turn.interrupted")


class _Faults:
    """What the store's next calls do wrong (each counter: that many calls fail)."""

    def __init__(self) -> None:
        self.down = False  # every save raises before anything is written (the database is away)
        self.fail_after_commit_of: str | None = None  # save raises once after committing this event
        self.fail_inside_commit_of: str | None = None  # save of this event raises inside its transaction
        self.first_reads_fail = 0  # active_agent_name (the Runner's first read) raises


def _faulty(base: type[BaseSessionStore]) -> type[BaseSessionStore]:
    class Faulty(base):  # type: ignore[valid-type,misc]
        faults = _Faults()

        def save(self, session: Any) -> Any:
            f = self.faults
            if f.down:
                raise StoreError("injected: the database is away; nothing of it was written")
            kinds = {e.type for e in session._journal}
            if f.fail_inside_commit_of in kinds:
                f.fail_inside_commit_of = None
                raise StoreError("injected: failed before the commit; nothing of it was written")
            self._armed = f.fail_after_commit_of in kinds
            try:
                return super().save(session)
            finally:
                self._armed = False

        def _notify_turn_ended(self) -> None:
            # a save's first step after its commit (the context has not learned of it yet)
            if getattr(self, "_armed", False):
                self._armed = False
                self.faults.fail_after_commit_of = None
                raise StoreError("injected: failed after the commit")
            super()._notify_turn_ended()

        def active_agent_name(self, session_id: str) -> Any:
            if self.faults.first_reads_fail:
                self.faults.first_reads_fail -= 1
                raise StoreError("injected: the database is away")
            return super().active_agent_name(session_id)

    Faulty.faults = _Faults()
    return Faulty


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made: Any
    if request.param == "memory":
        made = _faulty(SessionStore)()
    elif request.param == "sqlite":
        made = _faulty(SQLiteSessionStore)(tmp_path / "s.db")
    else:
        from chatflow_cli.core.memory.postgres import PostgresSessionStore

        made = _faulty(PostgresSessionStore)(request.getfixturevalue("pg_dsn"))
    yield made
    made.close()


def _runner(store: Any, fake_server: FakeServer) -> Runner:
    return Runner(AGENT, store, model_client=ModelClient(base_url=fake_server.url, api_key="k"))


def _endings(store: Any, session_id: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for event in store.events(session_id):
        if event.type in ENDINGS:
            out.setdefault(event.payload["turn"], []).append(event.type)
    return out


def _window_texts(store: Any, session_id: str) -> list[str]:
    return [m.content or "" for r in store.load_turns(session_id) if r.in_window for m in r.messages]


# ---------------------------------------------------------------------------------------
# one ending per turn
# ---------------------------------------------------------------------------------------


def test_an_error_after_the_completion_committed_writes_no_second_ending(store: Any, fake_server: FakeServer) -> None:
    """The save that completes the turn commits, then fails (a lost connection after the
    COMMIT, an error after it): the turn stays completed, in the window, its message
    processed -- no ``turn.failed`` for it -- and a redelivery gets the first answer."""
    runner = _runner(store, fake_server)
    store.faults.fail_after_commit_of = "turn.completed"
    with pytest.raises(StoreError, match="after the commit"):
        runner.run("s", "order 404?", message_id="m1")
    assert _endings(store, "s") == {1: ["turn.completed"]}
    assert _window_texts(store, "s") == ["order 404?", "ok: order 404?"]
    assert store.message_state("m1").value == "processed"
    assert store.get("s").status is SessionStatus.IDLE
    again = runner.run("s", "order 404?", message_id="m1", wait=2)
    assert again.replayed and again.content == "ok: order 404?"
    assert len(fake_server.requests) == 1


def test_a_completion_that_failed_inside_its_transaction_is_failed_once(store: Any, fake_server: FakeServer) -> None:
    """The completion's save fails before its commit: the turn failed, one ending, and the
    failure is not written together with the completion still in the turn's journal."""
    runner = _runner(store, fake_server)
    store.faults.fail_inside_commit_of = "turn.completed"
    with pytest.raises(StoreError, match="before the commit"):
        runner.run("s", "order 404?", message_id="m1")
    assert _endings(store, "s") == {1: ["turn.failed"]}
    assert store.message_state("m1").value == "new"  # the redelivery runs it
    assert runner.run("s", "order 404?", message_id="m1", wait=2).content == "ok: order 404?"
    assert _endings(store, "s") == {1: ["turn.failed", "turn.completed"]}
    assert _window_texts(store, "s") == ["order 404?", "ok: order 404?"]


# ---------------------------------------------------------------------------------------
# the lease ends with the turn
# ---------------------------------------------------------------------------------------


def test_a_turn_whose_ending_could_not_be_stored_does_not_hold_the_session(store: Any, fake_server: FakeServer) -> None:
    """The database goes away mid-turn: the reply's save, the failure's and the fresh copy's
    all fail, so the row still says ``running`` under this process. The turn is over, so the
    customer's next message (in the recommended ``message_id=`` form) starts at once -- the
    dead attempt recovered -- instead of waiting and failing busy; even while the caller
    keeps the error (and with it the turn's context) alive."""
    runner = _runner(store, fake_server)
    assert runner.run("s", "first").content == "ok: first"
    fake_server.add_text("lost in the outage", delay=0.3)
    store.faults.down = True
    with pytest.raises(StoreError, match="away") as info:
        runner.run("s", "during the outage", message_id="m1")
    store.faults.down = False
    kept = info.value  # a handler that logs the error keeps its traceback
    started = time.monotonic()
    result = runner.run("s", "after the outage", message_id="m2", wait=3)
    assert result.content == "ok: after the outage"
    assert time.monotonic() - started < 3
    types = [e.type for e in store.events("s")]
    assert "session.recovered" in types
    assert store.message_state("m1").value == "new"  # the failed delivery runs when redelivered
    assert runner.run("s", "during the outage", message_id="m1", wait=3).content == "ok: during the outage"
    assert all(len(v) == 1 or v[-1] == "turn.completed" for v in _endings(store, "s").values())
    del kept


# ---------------------------------------------------------------------------------------
# a claim is freed by every failure between claim and turn
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["store error", "invalid text"])
def test_a_run_failing_before_its_turn_starts_frees_the_claim(store: Any, fake_server: FakeServer,
                                                                 failure: str) -> None:
    """The seed's handler: ``mark_message_processed`` then ``run``; the run fails before
    ``begin_turn`` started a turn. The claim is free again, so the redelivery (the same
    handler) runs the message instead of skipping it as a duplicate."""
    runner = _runner(store, fake_server)
    runner.run("s", "hello")
    text = "order 404?"
    store.mark_message_processed("m1")
    if failure == "store error":
        store.faults.first_reads_fail = 1
        with pytest.raises(StoreError):
            runner.run("s", text)
    else:
        with pytest.raises(UsageError):
            runner.run("s", "bad \udc80 text")
    assert store.message_state("m1").value == "new"
    # the redelivery, through the same handler
    assert not store.is_message_processed("m1", wait=0)
    store.mark_message_processed("m1")
    assert runner.run("s", text).content == f"ok: {text}"
    assert store.message_state("m1").value == "processed"


def test_run_async_failing_before_its_turn_starts_frees_the_claim(store: Any, fake_server: FakeServer) -> None:
    runner = _runner(store, fake_server)

    async def handler() -> None:  # the seed's handler, its run failing before the turn
        await runner.run_async("s", "hello")
        store.mark_message_processed("m1")
        store.faults.first_reads_fail = 1
        with pytest.raises(StoreError):
            await runner.run_async("s", "order 404?")
        assert not await store.ais_message_processed("m1", wait=0)

    asyncio.run(handler())
    assert store.message_state("m1").value == "new"


# ---------------------------------------------------------------------------------------
# a turn recovered as dead takes no late write
# ---------------------------------------------------------------------------------------


def _dead_owner() -> Owner:
    """The owner record of a worker this process cannot see alive (its pid has exited)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    me = Owner.current()
    return Owner(proc.pid, 1, me.host, me.token)


def test_a_recovered_turn_takes_no_late_write_from_its_first_worker(store: Any) -> None:
    """Worker A starts the turn for message m1 and is cut off long enough to count as dead;
    the redelivery of m1 on worker B recovers A's turn (out of the window: the retry replaces
    it) and starts it again. A comes back and saves its tool round (no status change): the
    save is refused, nothing written, and the window holds the user message once."""
    late = store.begin_turn("s", default_agent=AGENT, user_message=Message.user("order 404?"), owner=_dead_owner(),
                            message_id="m1")
    retry = store.begin_turn("s", default_agent=AGENT, user_message=Message.user("order 404?"),
                             owner=Owner.current(), message_id="m1")
    assert retry.turn == late.turn == 1
    late.session.add_message(Message.model(None, [ToolCall("call_late", "lookup", "{}")], agent="Assistant"))
    before = store.last_seq("s")
    with pytest.raises(SessionBusyError, match="no longer holds the session"):
        store.save(late.session)
    assert store.last_seq("s") == before
    assert _window_texts(store, "s") == ["order 404?"]
    retry.session.add_message(Message.model("the answer", agent="Assistant"))
    retry.session.complete_turn("the answer", AGENT, {})
    retry.session.set_status(SessionStatus.IDLE, reason="turn completed")
    store.save(retry.session)
    assert _window_texts(store, "s") == ["order 404?", "the answer"]
    assert store.message_state("m1").value == "processed"


def test_a_redelivery_after_the_answer_was_lost_gets_it_only_from_the_message_id_form(
    store: Any, fake_server: FakeServer
) -> None:
    """A worker completes the turn and dies before answering the platform (README, webhook
    section): the seed's handler skips the redelivery (nothing to send), the ``message_id=``
    form returns the first answer again, without a model call."""
    runner = _runner(store, fake_server)
    assert runner.run("s", "order 404?", message_id="m1").content == "ok: order 404?"
    assert store.is_message_processed("m1", wait=0)  # the seed's handler: return None
    again = runner.run("s", "order 404?", message_id="m1", wait=0)
    assert again.replayed and again.content == "ok: order 404?"
    assert len(fake_server.requests) == 1
