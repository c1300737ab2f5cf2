"""Property tests: random valid histories, random max_turns, after pruning and after rollback.

The validity checks are :func:`chatflow_cli.core.messages.history_problems` (first message
after the system ones is USER; every TOOL answers an open call of the nearest MODEL message;
every call answered once, right after it; tool-call ids unique), plus: every SYSTEM message
survives, in order. Checked on a bare SessionContext and, through the contract fixture,
on both stores (reloaded from storage).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.memory import BaseSessionStore, SessionContext
from chatflow_cli.core.messages import Message, Role, ToolCall, history_problems

AGENT = Agent(name="A", instructions="")


@dataclass
class Conversation:
    """A generated conversation: system messages (with where they were added) and turns."""

    preamble: bool
    systems: list[tuple[int, Message]]  # (index of the turn they arrive in, message)
    turns: list[list[Message]]

    def system_messages(self) -> list[Message]:
        return [m for _, m in self.systems]


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    ids = itertools.count(1)
    turns: list[list[Message]] = []
    for t in range(draw(st.integers(0, 7))):
        turn = [Message.user(f"user {t + 1}")]
        for step in draw(st.lists(st.sampled_from(["text", "calls"]), max_size=3)):
            if step == "text":
                turn.append(Message.model(f"text {t + 1}.{len(turn)}"))
                continue
            calls = [ToolCall(f"call_{next(ids)}", "tool", "{}") for _ in range(draw(st.integers(1, 3)))]
            turn.append(Message.model(None, calls))
            for call in draw(st.permutations(calls)):  # results may arrive in any order
                turn.append(Message.tool(call.id, f"result of {call.id}"))
        if draw(st.booleans()):
            turn.append(Message.model(f"answer {t + 1}"))
        turns.append(turn)
    arrivals = sorted(draw(st.lists(st.integers(0, len(turns)), max_size=3)))
    systems = [(at, Message.system(f"system {k}")) for k, at in enumerate(arrivals)]
    return Conversation(draw(st.booleans()), systems, turns)


def feed(ctx: SessionContext, conv: Conversation, *, complete: bool) -> None:
    """Add the conversation message by message; systems arrive at their turn, mid-turn."""
    if conv.preamble:
        ctx.add_message(Message.model("stray text before any user message"))
    for index in range(len(conv.turns) + 1):
        turn = conv.turns[index] if index < len(conv.turns) else []
        for pos, msg in enumerate(turn):
            ctx.add_message(msg)
            if pos == 0:
                for at, system in conv.systems:
                    if at == index:
                        ctx.add_message(system)
        if not turn:
            for at, system in conv.systems:
                if at == index:
                    ctx.add_message(system)
        if complete and turn:
            ctx.complete_turn(turn[-1].content)


def expected_window(conv: Conversation, max_turns: int, last_turn: int) -> list[Message]:
    kept = conv.turns[:last_turn][-max_turns:] if last_turn else []
    return conv.system_messages() + [m for turn in kept for m in turn]


def assert_valid(history: tuple[Message, ...], conv: Conversation) -> None:
    assert history_problems(history) == []
    assert [m for m in history if m.role is Role.SYSTEM] == conv.system_messages()


@settings(max_examples=300, deadline=None)
@given(conv=conversations(), max_turns=st.integers(1, 6), data=st.data())
def test_context_prune_and_rollback_keep_histories_valid(
    conv: Conversation, max_turns: int, data: st.DataObject
) -> None:
    ctx = SessionContext("p", AGENT, max_turns=max_turns)
    feed(ctx, conv, complete=False)
    ctx._prune_history()
    n_turns = len(conv.turns)
    assert_valid(ctx.history, conv)
    assert list(ctx.history) == expected_window(conv, max_turns, n_turns)
    assert [t.number for t in ctx.turns] == list(range(max(1, n_turns - max_turns + 1), n_turns + 1))
    assert ctx.turn_count == n_turns
    ctx._prune_history()  # idempotent
    assert list(ctx.history) == expected_window(conv, max_turns, n_turns)

    target = data.draw(st.integers(0, n_turns), label="rollback_to")
    ctx.rollback_to(target)
    assert_valid(ctx.history, conv)
    assert list(ctx.history) == expected_window(conv, max_turns, target)
    assert ctx.turn_count == target
    ctx.add_message(Message.user("after rollback"))
    assert ctx.turns[-1].number == target + 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=conversations(), max_turns=st.integers(1, 6), data=st.data())
def test_stores_keep_histories_valid(
    make_store: Callable[..., BaseSessionStore], conv: Conversation, max_turns: int, data: st.DataObject
) -> None:
    store = make_store()
    session_id = uuid.uuid4().hex
    ctx = store.get_or_create(session_id, AGENT, max_turns=max_turns)
    feed(ctx, conv, complete=True)
    store.save(ctx)
    ctx._prune_history()  # a history of stray text only never completed a turn
    n_turns = len(conv.turns)

    reopened = make_store()
    reopened.set_agent_resolver(lambda name: AGENT)
    loaded = reopened.get(session_id)
    assert loaded is not None
    assert_valid(loaded.history, conv)
    assert list(loaded.history) == expected_window(conv, max_turns, n_turns)
    assert loaded.history == ctx.history

    target = data.draw(st.integers(0, n_turns), label="rollback_to")
    if data.draw(st.booleans(), label="through the context"):
        loaded.rollback_to(target)
        store.save(loaded)
    else:
        store.rollback(session_id, target)
    after = reopened.get(session_id)
    assert after is not None
    assert_valid(after.history, conv)
    assert list(after.history) == expected_window(conv, max_turns, target)
    assert after.turn_count == target
    seqs = [e.seq for e in store.events(session_id)]
    assert seqs == list(range(1, len(seqs) + 1))
