"""SessionContext on its own: the issue's pruning cases 1-3, turn numbers, rollback, journal events."""

from __future__ import annotations

import pytest

from chatflow_cli.core.errors import InvalidHistoryError, PendingToolCallsError, UsageError
from chatflow_cli.core.memory import INTERRUPTED_TOOL_RESULT, SessionContext
from chatflow_cli.core.messages import Message, Role, ToolCall, history_problems


class _Agent:
    def __init__(self, name: str) -> None:
        self.name = name


def _weather_history() -> list[Message]:
    return [
        Message.system("Be brief."),
        Message.user("Weather in CityA?"),
        Message.model(None, [ToolCall("call_a", "get_weather", '{"city": "CityA"}')]),
        Message.tool("call_a", "12C"),
        Message.model("12C in CityA."),
        Message.user("And CityB?"),
        Message.model(None, [ToolCall("call_b", "get_weather", '{"city": "CityB"}')]),
        Message.tool("call_b", "20C"),
        Message.model("20C in CityB."),
    ]


def _context(messages: list[Message], max_turns: int) -> SessionContext:
    ctx = SessionContext("s", _Agent("A"), max_turns=max_turns)
    for msg in messages:
        ctx.add_message(msg)
    return ctx


def test_max_turns_1_keeps_system_and_whole_second_turn() -> None:
    history = _weather_history()
    ctx = _context(history, 1)
    ctx._prune_history()
    assert ctx.history == (history[0], *history[5:])
    assert len(ctx.history) == 5
    assert [t.number for t in ctx.turns] == [2]
    assert history_problems(ctx.history) == []


@pytest.mark.parametrize("max_turns", [2, 3])
def test_larger_windows_leave_history_unchanged(max_turns: int) -> None:
    history = _weather_history()
    ctx = _context(history, max_turns)
    ctx._prune_history()
    assert ctx.history == tuple(history)


def _parallel_history() -> list[Message]:
    return [
        Message.system("sys"),
        Message.user("hi"),
        Message.model("hello"),
        Message.user("Compare A and B"),
        Message.model(None, [ToolCall("call_p1", "price", '{"x": "A"}'), ToolCall("call_p2", "price", '{"x": "B"}')]),
        Message.tool("call_p1", "10"),
        Message.tool("call_p2", "12"),
    ]


def test_parallel_calls_are_kept_in_call_order() -> None:
    history = _parallel_history()
    ctx = _context(history, 1)
    ctx._prune_history()
    assert ctx.history == (history[0], *history[3:])
    assert [m.tool_call_id for m in ctx.history if m.role is Role.TOOL] == ["call_p1", "call_p2"]
    ctx2 = _context(history, 2)
    ctx2._prune_history()
    assert len(ctx2.history) == 7


def test_a_history_of_only_system_messages_or_nothing_is_kept_whole() -> None:
    systems = [Message.system(f"rule {i}") for i in range(4)]
    ctx = _context(systems, 1)
    ctx._prune_history()
    assert ctx.history == tuple(systems)
    empty = SessionContext("e", _Agent("A"), max_turns=1)
    empty._prune_history()
    assert empty.history == ()


def test_prune_drops_non_system_before_first_user_even_when_no_turn_goes() -> None:
    ctx = _context([Message.model("stray"), Message.system("sys"), Message.user("q"), Message.model("a")], 5)
    ctx._prune_history()
    assert [m.content for m in ctx.history] == ["sys", "q", "a"]


def test_prune_is_a_no_op_while_tool_calls_are_open() -> None:
    ctx = _context(
        [Message.user("1"), Message.model("a"), Message.user("2"), Message.model(None, [ToolCall("c1", "t")])], 1
    )
    before = ctx.history
    ctx._prune_history()
    assert ctx.history == before
    ctx.add_message(Message.tool("c1", "ok"))
    ctx._prune_history()
    assert [t.number for t in ctx.turns] == [2]


def test_system_message_mid_session_goes_after_leading_systems() -> None:
    ctx = _context([Message.system("s1"), Message.user("q"), Message.model("a")], 3)
    ctx.add_message(Message.system("s2"))
    assert [m.content for m in ctx.history] == ["s1", "s2", "q", "a"]
    assert history_problems(ctx.history) == []


@pytest.mark.parametrize("bad", [0, -1])
def test_max_turns_value_error(bad: int) -> None:
    with pytest.raises(ValueError):
        SessionContext("s", _Agent("A"), max_turns=bad)


@pytest.mark.parametrize("bad", [1.0, "3", True, None])
def test_max_turns_type_error(bad: object) -> None:
    with pytest.raises(TypeError):
        SessionContext("s", _Agent("A"), max_turns=bad)  # type: ignore[arg-type]


def test_history_is_read_only() -> None:
    ctx = _context(_weather_history(), 3)
    assert isinstance(ctx.history, tuple)
    with pytest.raises(AttributeError):
        ctx.history.append(Message.user("x"))  # type: ignore[attr-defined]


def test_add_message_refuses_broken_tool_pairs() -> None:
    ctx = _context([Message.user("q"), Message.model(None, [ToolCall("c1", "t")])], 3)
    with pytest.raises(InvalidHistoryError):
        ctx.add_message(Message.user("next"))
    with pytest.raises(InvalidHistoryError):
        ctx.add_message(Message.tool("other", "x"))
    ctx.add_message(Message.tool("c1", "x"))
    with pytest.raises(InvalidHistoryError):
        ctx.add_message(Message.tool("c1", "again"))
    ctx.add_message(Message.model("done"))
    ctx.add_message(Message.user("again"))
    with pytest.raises(InvalidHistoryError):
        ctx.add_message(Message.model(None, [ToolCall("c1", "t")]))


def test_turn_numbers_stable_across_pruning_and_rollback() -> None:
    ctx = SessionContext("s", _Agent("A"), max_turns=2)
    for n in range(1, 6):
        ctx.add_message(Message.user(f"u{n}"))
        ctx.add_message(Message.model(f"m{n}"))
        ctx.complete_turn(f"m{n}")
    assert [t.number for t in ctx.turns] == [4, 5]
    assert ctx.turn_count == 5
    ctx.rollback_to(2)  # reaches turns pruned out of the window
    assert [t.number for t in ctx.turns] == [1, 2]
    assert [m.content for m in ctx.history] == ["u1", "m1", "u2", "m2"]
    ctx.add_message(Message.user("new"))
    assert ctx.turn_count == 3
    assert ctx.turns[-1].number == 3
    rollback = [e for e in ctx.events if e.type == "rollback"]
    assert rollback[-1].payload == {"to_turn": 2, "removed_turns": [3, 4, 5], "active_agent": "A"}
    seqs = [e.seq for e in ctx.events]
    assert seqs == list(range(1, len(seqs) + 1))


def test_rollback_out_of_range_changes_nothing() -> None:
    ctx = _context(_weather_history(), 3)
    before, events = ctx.history, ctx.events
    for bad in (-1, 3):
        with pytest.raises(ValueError):
            ctx.rollback_to(bad)
    with pytest.raises(TypeError):
        ctx.rollback_to(True)  # type: ignore[arg-type]
    assert ctx.history == before and ctx.events == events


def test_rollback_to_zero_keeps_only_system() -> None:
    ctx = _context(_weather_history(), 3)
    ctx.rollback_to(0)
    assert ctx.history == (Message.system("Be brief."),)
    assert ctx.turn_count == 0


def test_interrupt_turn_answers_open_calls_and_keeps_partial_text() -> None:
    ctx = _context([Message.user("q"), Message.model(None, [ToolCall("c1", "slow"), ToolCall("c2", "slow")])], 3)
    ctx.add_message(Message.tool("c1", "done"))
    ctx.interrupt_turn(partial_text="I was say")
    tools = [m for m in ctx.history if m.role is Role.TOOL]
    assert tools[1].tool_call_id == "c2" and tools[1].interrupted and tools[1].is_error
    assert tools[1].content == INTERRUPTED_TOOL_RESULT
    assert ctx.history[-1] == Message.model("I was say", agent="A", interrupted=True)
    assert history_problems(ctx.history) == []
    assert ctx.events[-1].type == "turn.interrupted"
    assert ctx.events[-1].payload["tool_use_ids"] == ["c2"]


def test_fail_turn_removes_the_turn_and_reuses_its_number() -> None:
    ctx = _context([Message.user("1"), Message.model("a"), Message.user("2"), Message.model("b")], 3)
    ctx.fail_turn(RuntimeError("boom"))
    assert [m.content for m in ctx.history] == ["1", "a"]
    assert ctx.events[-1].payload == {"turn": 2, "error": "boom", "error_type": "RuntimeError"}
    ctx.add_message(Message.user("again"))
    assert ctx.turn_count == 2


def test_handoff_event_once_per_change() -> None:
    ctx = SessionContext("s", _Agent("Support"))
    billing = _Agent("Billing")
    ctx.set_active_agent(billing, tool_call_id="call_h")
    ctx.set_active_agent(billing)
    handoffs = [e for e in ctx.events if e.type == "handoff"]
    assert len(handoffs) == 1
    assert handoffs[0].payload["from_agent"] == "Support" and handoffs[0].payload["to_agent"] == "Billing"
    assert ctx.active_agent is billing


def test_complete_turn_refused_without_an_open_turn() -> None:
    ctx = SessionContext("s", _Agent("A"))
    ctx.add_message(Message.system("Be brief."))
    events = len(ctx.events)
    with pytest.raises(UsageError, match="no open turn"):
        ctx.complete_turn("hello")
    assert len(ctx.events) == events and ctx._journal[-1].type == "message.system"


def test_complete_turn_refused_while_tool_calls_wait() -> None:
    ctx = SessionContext("s", _Agent("A"))
    ctx.add_message(Message.user("two lookups"))
    ctx.add_message(Message.model(None, [ToolCall("c1", "lookup"), ToolCall("c2", "lookup")]))
    ctx.add_message(Message.tool("c1", "r1"))
    events = [e.type for e in ctx.events]
    with pytest.raises(PendingToolCallsError) as info:
        ctx.complete_turn("done")
    assert info.value.tool_use_ids == ["c2"] and "c1" not in str(info.value)
    assert [e.type for e in ctx.events] == events  # nothing journalled
    ctx.add_message(Message.tool("c2", "r2"))
    ctx.add_message(Message.model("done"))
    ctx.complete_turn("done")
    assert ctx.events[-1].type == "turn.completed" and ctx.events[-1].payload["turn"] == 1
