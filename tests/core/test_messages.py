"""Messages: exact JSON round trip, the wire form, shape checks, and the validity checks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatflow_cli.core.errors import InvalidHistoryError
from chatflow_cli.core.messages import Message, Role, ToolCall, check_history, history_problems

text = st.text(max_size=40)
tool_calls = st.lists(
    st.builds(ToolCall, id=st.text(min_size=1, max_size=8), name=st.text(min_size=1, max_size=8), arguments=text),
    max_size=3,
).map(tuple)
messages = st.builds(
    Message,
    role=st.sampled_from(list(Role)),
    content=st.none() | text,
    tool_calls=tool_calls,
    tool_call_id=st.none() | text,
    name=st.none() | text,
    agent=st.none() | text,
    interrupted=st.booleans(),
    is_error=st.booleans(),
)


@given(messages)
def test_json_round_trip_is_exact(message: Message) -> None:
    assert Message.from_dict(message.to_dict()) == message
    assert Message.from_json(message.to_json()) == message
    assert Message.from_dict(json.loads(json.dumps(message.to_dict()))) == message


def test_wire_form_uses_assistant_and_string_content() -> None:
    call = ToolCall("call_a", "get_weather", '{"city": "CityA"}')
    assert Message.model(None, [call]).to_wire() == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "CityA"}'}}],
    }
    assert Message.tool("call_a", "12C").to_wire() == {"role": "tool", "tool_call_id": "call_a", "content": "12C"}
    assert Message.system("Be brief.").to_wire() == {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: Message("bogus"), ValueError),
        (lambda: Message.user(123), TypeError),  # type: ignore[arg-type]
        (lambda: Message.from_json("[1, 2]"), ValueError),
        (lambda: Message.from_dict({"content": "no role"}), ValueError),
        (lambda: Message(Role.MODEL, None, ("not a call",)), TypeError),  # type: ignore[arg-type]
    ],
)
def test_bad_shapes_fail_where_the_message_is_made(make, error) -> None:
    with pytest.raises(error):
        make()


def test_role_given_as_text_becomes_the_enum() -> None:
    assert Message("user", "hi").role is Role.USER


def _weather_history() -> list[Message]:
    return [
        Message.system("Be brief."),
        Message.user("Weather in CityA?"),
        Message.model(None, [ToolCall("call_a", "get_weather", '{"city": "CityA"}')]),
        Message.tool("call_a", "12C"),
        Message.model("12C in CityA."),
    ]


def test_valid_history_has_no_problems() -> None:
    assert history_problems(_weather_history()) == []
    assert history_problems([]) == []
    assert history_problems([Message.system("a"), Message.system("b")]) == []


@pytest.mark.parametrize(
    ("history", "check"),
    [
        ([Message.system("s"), Message.model("hi")], "first_after_system_is_user"),
        ([Message.user("u"), Message.tool("call_x", "r")], "tool_result_follows_call"),
        (
            [Message.user("u"), Message.model(None, [ToolCall("c1", "f")]), Message.user("again")],
            "tool_call_answered_once",
        ),
        (
            [
                Message.user("u"),
                Message.model(None, [ToolCall("c1", "f")]),
                Message.tool("c1", "r"),
                Message.model(None, [ToolCall("c1", "f")]),
                Message.tool("c1", "r"),
            ],
            "tool_call_id_unique",
        ),
        ([Message.user("u"), Message.system("late")], "system_leading"),
        (
            [Message.user("u"), Message.model(None, [ToolCall("c1", "f")]), Message.tool("c1", "r"), Message.tool("c1", "r")],
            "tool_result_follows_call",
        ),
    ],
)
def test_each_broken_check_is_named(history: list[Message], check: str) -> None:
    problems = history_problems(history)
    assert any(p.startswith(check + ":") for p in problems), problems
    with pytest.raises(InvalidHistoryError) as info:
        check_history(history)
    assert info.value.problems == problems


def test_pending_calls_at_the_end_are_valid_to_store_not_to_send() -> None:
    history = [Message.user("u"), Message.model(None, [ToolCall("c1", "approve_refund")])]
    assert history_problems(history, pending_ok=True) == []
    assert history_problems(history) != []


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_the_stores_encoder_writes_strict_json_only(number: float) -> None:
    from chatflow_cli.core.errors import NonFiniteNumberError
    from chatflow_cli.core.events import Event
    from chatflow_cli.core.messages import compact_json, strict_dumps

    with pytest.raises(ValueError, match="Out of range float"):
        compact_json({"score": [1.0, number]})
    with pytest.raises(ValueError, match="Out of range float"):
        Message(Role.USER, "q", items=({"score": number},)).to_json()
    with pytest.raises(ValueError, match="Out of range float"):
        Event("s", 1, "note", {"score": number}, 0.0).to_json()
    with pytest.raises(NonFiniteNumberError, match="NaN or Infinity"):
        strict_dumps({"score": number})
    assert compact_json({"score": 1e308, "t": "é"}) == '{"score":1e+308,"t":"é"}'
