"""Library-first rollback and the summary read, run against both stores.

``store.rollback(session_id, to_turn=N)`` (or positional ``N``) keeps turns 1..N;
``store.rollback(session_id, last=K)`` removes the newest K turns as stored when its write
transaction runs. ``store.session_summary(session_id)`` reads one session's summary with
no agent resolver and no window.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import SessionBusyError, SessionNotFoundError, SessionTerminatedError
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.memory import (
    BaseSessionStore,
    Owner,
    SessionContext,
    SessionStoreProtocol,
    rollback_target,
)
from chatflow_cli.core.messages import Message


def _turns(store: BaseSessionStore, agent: Agent, count: int, session_id: str = "s") -> SessionContext:
    ctx = store.get_or_create(session_id, agent)
    for n in range(1, count + 1):
        ctx.add_message(Message.user(f"u{n}"))
        ctx.add_message(Message.model(f"m{n}"))
        ctx.complete_turn(f"m{n}")
    store.save(ctx)
    return ctx


def _live(store: BaseSessionStore, session_id: str = "s") -> list[str | None]:
    """The user messages of the live turns, oldest first."""
    return [r.messages[0].content for r in store.load_turns(session_id)]


# -- the three call forms ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "kept", "removed"),
    [
        (lambda any_store: any_store.rollback("s", 2), ["u1", "u2"], [3, 4]),
        (lambda any_store: any_store.rollback("s", to_turn=2), ["u1", "u2"], [3, 4]),
        (lambda any_store: any_store.rollback("s", last=2), ["u1", "u2"], [3, 4]),
        (lambda any_store: any_store.rollback("s", last=1), ["u1", "u2", "u3"], [4]),
        (lambda any_store: any_store.rollback("s", last=4), [], [1, 2, 3, 4]),
        (lambda any_store: any_store.rollback("s", to_turn=0), [], [1, 2, 3, 4]),
        (lambda any_store: asyncio.run(any_store.arollback("s", last=3)), ["u1"], [2, 3, 4]),
        (lambda any_store: asyncio.run(any_store.arollback("s", 3)), ["u1", "u2", "u3"], [4]),
    ],
    ids=["positional", "to_turn", "last=2", "last=1", "last=all", "to_turn=0", "async last", "async positional"],
)
def test_rollback_forms_keep_the_same_turns(any_store, agent, call, kept, removed) -> None:
    _turns(any_store, agent, 4)
    events = call(any_store)
    expected = {"to_turn": 4 - len(removed), "removed_turns": removed, "active_agent": "Assistant"}
    assert [(e.type, e.payload) for e in events] == [("rollback", expected)]
    assert _live(any_store) == kept
    assert any_store.session_summary("s").turn_count == len(kept)
    ctx = any_store.get("s")
    assert ctx is not None
    ctx.add_message(Message.user("next"))  # the next new turn follows the kept ones
    any_store.save(ctx)
    assert ctx.turn_count == len(kept) + 1


def test_last_counts_the_turns_stored_when_the_rollback_runs(any_store, agent) -> None:
    """A turn added after the caller read the count is the one ``last=1`` removes."""
    _turns(any_store, agent, 3)
    seen = any_store.session_summary("s").turn_count
    other = any_store.get("s")
    assert other is not None
    other.add_message(Message.user("u4"))
    other.add_message(Message.model("m4"))
    other.complete_turn("m4")
    any_store.save(other)
    events = any_store.rollback("s", last=1)
    assert seen == 3
    assert events[0].payload == {"to_turn": 3, "removed_turns": [4], "active_agent": "Assistant"}
    assert _live(any_store) == ["u1", "u2", "u3"]


# -- errors: nothing is written -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({}, TypeError, "exactly one of to_turn"),
        ({"to_turn": 1, "last": 1}, TypeError, "exactly one of to_turn"),
        ({"last": 0}, ValueError, "at least 1, got 0"),
        ({"last": -1}, ValueError, "at least 1, got -1"),
        ({"last": 3}, ValueError, "session 's' has only 2 turns; cannot remove the last 3"),
        ({"to_turn": 3}, ValueError, "turn 3 is beyond the last turn of session 's' (2)"),
        ({"to_turn": -1}, ValueError, "turn -1 is not a turn number"),
        ({"last": True}, TypeError, "last must be an int, got bool"),
        ({"to_turn": "1"}, TypeError, "to_turn must be an int, got str"),
        ({"last": 1.0}, TypeError, "last must be an int, got float"),
    ],
)
def test_bad_rollback_arguments_change_nothing(any_store, agent, kwargs, error, words) -> None:
    _turns(any_store, agent, 2)
    before = any_store.events("s")
    with pytest.raises(error) as caught:
        any_store.rollback("s", **kwargs)
    assert words in str(caught.value)
    assert any_store.events("s") == before
    assert _live(any_store) == ["u1", "u2"]


def test_rollback_of_an_absent_session_is_not_found_in_either_form(any_store) -> None:
    with pytest.raises(SessionNotFoundError):
        any_store.rollback("absent", last=1)
    with pytest.raises(SessionNotFoundError):
        any_store.rollback("absent", 0)


def test_rollback_refuses_a_session_a_live_owner_runs(any_store, agent) -> None:
    _turns(any_store, agent, 2)
    any_store.begin_turn("s", default_agent=agent, user_message=Message.user("u3"), owner=Owner.current())
    before = any_store.events("s")
    with pytest.raises(SessionBusyError, match="is busy"):
        any_store.rollback("s", last=1)
    assert any_store.events("s") == before


def test_rollback_refuses_a_terminated_session(any_store, agent) -> None:
    ctx = _turns(any_store, agent, 2)
    any_store.release(ctx, SessionStatus.TERMINATED, "closed")
    with pytest.raises(SessionTerminatedError):
        any_store.rollback("s", last=1)
    assert _live(any_store) == ["u1", "u2"]


# -- the rule itself ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "kwargs", "target"),
    [(5, {"to_turn": 5}, 5), (5, {"to_turn": 0}, 0), (5, {"last": 1}, 4), (5, {"last": 5}, 0), (1, {"last": 1}, 0),
     (0, {"to_turn": 0}, 0)],
)
def test_rollback_target(count, kwargs, target) -> None:
    assert rollback_target(count, **kwargs) == target


def test_rollback_target_names_the_session_when_given() -> None:
    with pytest.raises(ValueError, match=r"^the session has only 1 turn; cannot remove the last 2$"):
        rollback_target(1, last=2)
    with pytest.raises(ValueError, match=r"^session 'x' has only 0 turns; cannot remove the last 1$"):
        rollback_target(0, last=1, session_id="x")


# -- the summary read ------------------------------------------------------------------------------


def test_session_summary_is_the_list_row_and_needs_no_resolver(any_store, agent) -> None:
    calls: list[str] = []
    _turns(any_store, agent, 2)
    any_store.set_agent_resolver(lambda name: calls.append(name))
    summary = any_store.session_summary("s")
    assert summary == any_store.list_sessions()[0]
    shown = (summary.session_id, summary.active_agent_name, summary.turn_count, summary.preview)
    assert shown == ("s", "Assistant", 2, "u1")
    assert summary.status is SessionStatus.IDLE and summary.max_turns == any_store.default_max_turns
    assert asyncio.run(any_store.asession_summary("s")) == summary
    assert calls == []  # the agent resolver was not asked


def test_session_summary_of_an_absent_session_is_not_found(any_store) -> None:
    with pytest.raises(SessionNotFoundError):
        any_store.session_summary("absent")


def test_session_summary_shows_the_effective_status(any_store, agent) -> None:
    """Running while a live owner runs the turn; idle once that owner is dead, with nothing written."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        owner = Owner.of_process(child.pid)
        any_store.begin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=owner)
        assert any_store.session_summary("s").status is SessionStatus.RUNNING
    finally:
        child.kill()
        child.wait()
    seq = any_store.last_seq("s")
    assert any_store.session_summary("s").status is SessionStatus.IDLE
    assert any_store.last_seq("s") == seq


def test_every_store_satisfies_the_protocol_and_each_role(any_store) -> None:
    from chatflow_cli.core.memory import protocol

    assert isinstance(any_store, SessionStoreProtocol)
    roles = [protocol.TurnStore, protocol.ListingStore, protocol.EditStore, protocol.ClaimStore,
             protocol.ContextStore, protocol.SessionLookup]
    assert all(isinstance(any_store, role) for role in roles)
    assert all(issubclass(SessionStoreProtocol, role) for role in roles)
    assert not isinstance(object(), protocol.TurnStore)


def test_a_rollback_to_turn_0_with_system_removes_the_system_messages(any_store: BaseSessionStore) -> None:
    """``rollback_to(0, system=True)`` (an Agents SDK session's clear) empties the window,
    SYSTEM messages too, in every store; a plain rollback to 0 keeps them; the log keeps all."""
    agent = Agent("A", "")
    ctx = any_store.get_or_create("sys", agent)
    ctx.add_message(Message.system("Be brief."))
    ctx.add_message(Message.system("Answer in French."))
    any_store.save(ctx)
    _turns(any_store, agent, 2, "sys")
    ctx = any_store.get("sys")
    assert ctx is not None
    ctx.rollback_to(0)
    any_store.save(ctx)
    again = any_store.get("sys")
    assert again is not None and [m.content for m in again.history] == ["Be brief.", "Answer in French."]
    with pytest.raises(ValueError):
        again.rollback_to(1, system=True)
    again.rollback_to(0, system=True)
    assert again.history == ()
    (event,) = any_store.save(again)
    assert event.type == "rollback" and event.payload == {"to_turn": 0, "removed_turns": [], "system": True,
                                                   "active_agent": "A"}
    cleared = any_store.get("sys")
    assert cleared is not None and cleared.history == () and cleared.turn_count == 0
    cleared.add_message(Message.system("New rules."))
    any_store.save(cleared)
    fresh = any_store.get("sys")
    assert fresh is not None and [m.content for m in fresh.history] == ["New rules."]
    assert sum(1 for e in any_store.events("sys") if e.type == "message.system") == 3


# -- the active agent comes back ----------------------------------------------------------------


def _turn(store: BaseSessionStore, n: int, handoff_to: str | None = None, session_id: str = "h") -> None:
    """Turn ``n`` of the session (made with Assistant), with a handoff inside it when asked."""
    ctx = store.get_or_create(session_id, Agent("Assistant", ""))
    ctx.add_message(Message.user(f"u{n}"))
    if handoff_to is not None:
        ctx.set_active_agent(Agent(handoff_to, ""), tool_call_id=f"h{n}")
    ctx.add_message(Message.model(f"m{n}"))
    ctx.complete_turn(f"m{n}")
    store.save(ctx)


def _agent(store: BaseSessionStore, session_id: str = "h") -> str | None:
    """The active agent as every reader sees it: the summary, a loaded context, the name read."""
    loaded = store.get(session_id)
    assert loaded is not None
    names = {store.session_summary(session_id).active_agent_name, loaded.active_agent.name,
             store.active_agent_name(session_id)}
    assert len(names) == 1, names
    return names.pop()


def _by_store(store: BaseSessionStore, turn: int) -> str | None:
    """``store.rollback``; the active agent after it."""
    store.rollback("h", turn)
    return _agent(store)


def _by_context(store: BaseSessionStore, turn: int) -> str | None:
    """``ctx.rollback_to`` then ``store.save``: the context holds the agent at once, as the store does after."""
    ctx = store.get("h")
    assert ctx is not None
    ctx.rollback_to(turn)
    held = ctx.active_agent.name
    store.save(ctx)
    assert ctx.active_agent.name == held == _agent(store)
    return held


def _by_edit(store: BaseSessionStore, turn: int) -> str | None:
    """``ctx.rollback_to`` inside ``store.edit``; the agent the context holds right after it."""
    done = store.edit("h", lambda ctx: (ctx.rollback_to(turn), ctx.active_agent.name)[1], last_turns=1)
    assert done.value == _agent(store)
    return str(done.value)


def test_the_rollback_event_records_the_agent_it_brings_back(any_store) -> None:
    _turn(any_store, 1)
    _turn(any_store, 2, handoff_to="Billing")
    (event,) = any_store.rollback("h", 1)
    assert event.payload == {"to_turn": 1, "removed_turns": [2], "active_agent": "Assistant"}
    assert any_store.events("h")[-1].payload == event.payload


@pytest.mark.parametrize("rollback", [_by_store, _by_context, _by_edit], ids=["store.rollback", "rollback_to", "edit"])
def test_a_rollback_across_a_handoff_brings_back_the_agent_of_that_turn(any_store, rollback) -> None:
    _turn(any_store, 1)
    _turn(any_store, 2, handoff_to="Billing")
    assert _agent(any_store) == "Billing"
    assert rollback(any_store, 1) == "Assistant"
    assert _agent(any_store) == "Assistant"


@pytest.mark.parametrize("rollback", [_by_store, _by_context, _by_edit], ids=["store.rollback", "rollback_to", "edit"])
def test_a_rollback_between_two_handoffs_brings_back_the_middle_agent(any_store, rollback) -> None:
    _turn(any_store, 1)
    _turn(any_store, 2, handoff_to="Billing")
    _turn(any_store, 3)
    _turn(any_store, 4, handoff_to="Refunds")
    assert rollback(any_store, 3) == "Billing"  # the handoff of turn 2 still stands at turn 3
    assert _agent(any_store) == "Billing"
    assert rollback(any_store, 2) == "Billing"
    assert rollback(any_store, 1) == "Assistant"
    assert _agent(any_store) == "Assistant"


def test_turn_numbers_used_again_after_a_rollback_take_their_new_handoffs(any_store) -> None:
    _turn(any_store, 1)
    _turn(any_store, 2, handoff_to="Billing")
    assert _by_store(any_store, 1) == "Assistant"
    _turn(any_store, 2, handoff_to="Sales")  # turn 2 again, handing off elsewhere
    _turn(any_store, 3)
    assert _by_store(any_store, 2) == "Sales"  # not Billing: that turn 2 was rolled back
    assert _agent(any_store) == "Sales"
    assert _by_store(any_store, 1) == "Assistant"
    assert _agent(any_store) == "Assistant"


@pytest.mark.parametrize("system", [False, True], ids=["to 0", "to 0 with system"])
def test_a_rollback_to_turn_0_gives_the_agent_the_session_was_created_with(any_store, system) -> None:
    _turn(any_store, 1, handoff_to="Billing")
    _turn(any_store, 2, handoff_to="Refunds")
    ctx = any_store.get("h")
    assert ctx is not None
    ctx.rollback_to(0, system=system)
    assert ctx.active_agent.name == "Assistant"
    any_store.save(ctx)
    assert _agent(any_store) == "Assistant"


def test_a_failed_turn_after_a_handoff_then_a_rollback(any_store) -> None:
    """A handoff in a failed turn is undone and never comes back; one before it stays."""
    _turn(any_store, 1, handoff_to="Billing")
    ctx = any_store.get("h")
    assert ctx is not None
    billing = ctx.active_agent
    ctx.add_message(Message.user("u2"))
    ctx.set_active_agent(Agent("Refunds", ""))
    ctx.fail_turn(RuntimeError("provider said no"), agent=billing)
    any_store.save(ctx)
    assert _agent(any_store) == "Billing"
    _turn(any_store, 2)  # turn 2 again, no handoff
    _turn(any_store, 3)
    assert _by_store(any_store, 2) == "Billing"  # not Refunds: the handoff of the failed turn 2 is gone
    assert _agent(any_store) == "Billing"
    assert _by_store(any_store, 0) == "Assistant"


def test_a_handoff_right_after_a_rollback_in_one_edit_is_kept(any_store) -> None:
    """An import replays "rollback, then hand off to the agent of the rolled-back turn again"
    in one edit: the handoff is recorded and stands."""
    _turn(any_store, 1)
    _turn(any_store, 2, handoff_to="Billing")

    def change(ctx: SessionContext) -> None:
        ctx.rollback_to(1)
        ctx.add_message(Message.user("u2 again"))
        ctx.set_active_agent("Billing")

    done = any_store.edit("h", change)
    assert [e.type for e in done.events] == ["rollback", "message.user", "handoff"]
    assert done.events[2].payload["from_agent"] == "Assistant"
    assert _agent(any_store) == "Billing"


def _rollback_as_written_before(store: BaseSessionStore, to_turn: int, session_id: str = "h") -> None:
    """A rollback as chatflow stored it before rollbacks brought the agent back: no
    ``active_agent`` in its event, and the session's agent left as it was."""
    with store._write() as tx:
        row = tx.get_row(session_id)
        assert row is not None
        event = store._append(tx, session_id, "rollback",
                              {"to_turn": to_turn, "removed_turns": list(range(to_turn + 1, row.turn_count + 1))})
        tx.remove_turns(session_id, to_turn + 1, None, "rolled_back", event.seq)
        tx.remove_summaries(session_id, to_turn, event.seq)
        row.turn_count = to_turn
        tx.update_row(row)


def test_a_log_written_before_rollbacks_recorded_the_agent_replays_right(any_store) -> None:
    _turn(any_store, 1)
    _turn(any_store, 2, handoff_to="Billing")
    _rollback_as_written_before(any_store, 1)
    assert "active_agent" not in any_store.events("h")[-1].payload
    assert _agent(any_store) == "Billing"  # what the old rollback left
    _turn(any_store, 2)  # turn 2 again, no handoff
    _turn(any_store, 3)
    assert _by_store(any_store, 2) == "Assistant"  # the old rollback dropped the handoff of the first turn 2
    assert _agent(any_store) == "Assistant"


def test_a_context_made_by_hand_is_created_with_the_agent_it_started_with(any_store) -> None:
    """A handoff before the first save: the log says created with Assistant, then the
    handoff, so a rollback to 0 gives Assistant back."""
    ctx = SessionContext("hand", Agent("Assistant", ""))
    ctx.add_message(Message.user("u1"))
    ctx.set_active_agent(Agent("Billing", ""))
    ctx.complete_turn("")
    any_store.save(ctx)
    created = any_store.events("hand")[0]
    assert created.type == "session.created" and created.payload["agent"] == "Assistant"
    assert _agent(any_store, "hand") == "Billing"
    any_store.rollback("hand", 0)
    assert _agent(any_store, "hand") == "Assistant"
