"""@tool: every type-hint mapping, docstring descriptions, argument checking, invocation (issue 4)."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
from typing import Annotated, Any, Literal, Optional, Union

import pytest

from chatflow_cli.core.tools import Tool, ToolArgumentsError, ToolDefinitionError, tool


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def schema_of(hint: Any, **default: Any) -> dict[str, Any]:
    """The property schema of a one-parameter function ``f(x: hint [= default])``."""
    if default:
        def f(x: hint = default["value"]) -> None:  # type: ignore[valid-type]
            pass
    else:
        def f(x: hint) -> None:  # type: ignore[valid-type]
            pass
    f.__annotations__["x"] = hint
    return tool(f).parameters["properties"]["x"]


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (type(None), {"type": "null"}),
        (Optional[str], {"type": ["string", "null"]}),  # noqa: UP045 - the typing spelling is the case
        (int | None, {"type": ["integer", "null"]}),
        (Union[int, str], {"type": ["integer", "string"]}),  # noqa: UP007
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (list[list[str]], {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}),
        (list, {"type": "array"}),
        (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
        (tuple[int, str], {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                           "minItems": 2, "maxItems": 2}),
        (set[str], {"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        (dict, {"type": "object"}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (dict[str, Any], {"type": "object"}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1, 2, 3], {"type": "integer", "enum": [1, 2, 3]}),
        (Literal["a", 1], {"enum": ["a", 1]}),
        (Color, {"type": "string", "enum": ["red", "blue"]}),
        (Level, {"type": "integer", "enum": [1, 2]}),
        (Optional[Color], {"anyOf": [{"type": "string", "enum": ["red", "blue"]}, {"type": "null"}]}),  # noqa: UP045
        (list[int] | None, {"anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}]}),
        (Any, {}),
        (Annotated[int, "how many"], {"type": "integer", "description": "how many"}),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_type_mapping(hint: Any, expected: dict[str, Any]) -> None:
    assert schema_of(hint) == expected


def test_unannotated_parameter_accepts_anything() -> None:
    @tool
    def f(x):  # type: ignore[no-untyped-def]
        return x

    assert f.parameters["properties"]["x"] == {}
    assert f.invoke('{"x": [1, {"a": 2}]}') == '[1, {"a": 2}]'


def test_defaults_are_not_required_and_are_shown() -> None:
    @tool
    def f(a: str, b: int = 3, c: Color = Color.BLUE, d: str | None = None, e: object = object()) -> str:
        return "x"

    params = f.parameters
    assert params["type"] == "object"
    assert params["required"] == ["a"]
    assert params["additionalProperties"] is False
    assert params["properties"]["b"] == {"type": "integer", "default": 3}
    assert params["properties"]["c"]["default"] == "blue"
    assert params["properties"]["d"] == {"type": ["string", "null"], "default": None}
    assert "default" not in params["properties"]["e"]  # not JSON: left out


class Thing:
    pass


def test_unsupported_hints_are_refused_at_definition() -> None:
    with pytest.raises(ToolDefinitionError, match="no JSON Schema mapping"):
        @tool
        def f(x: Thing) -> None:
            pass

    with pytest.raises(ToolDefinitionError, match="keys are strings"):
        @tool
        def g(x: dict[int, str]) -> None:
            pass

    with pytest.raises(ToolDefinitionError, match=r"\*args"):
        @tool
        def h(*names: str) -> None:
            pass


def test_google_docstring_gives_descriptions() -> None:
    @tool
    def get_weather(city: str, unit: Literal["C", "F"] = "C", days: int = 1) -> str:
        """Get the weather forecast for a city.

        Longer explanation that is not part of the description.

        Args:
            city: The city name, e.g.
                "Lisbon" or "Porto".
            unit (str): Temperature unit.
            days: How many days ahead.

        Returns:
            A short forecast.
        """
        return f"{city} {unit} {days}"

    assert get_weather.name == "get_weather"
    assert get_weather.description == "Get the weather forecast for a city."
    props = get_weather.parameters["properties"]
    assert props["city"]["description"] == 'The city name, e.g. "Lisbon" or "Porto".'
    assert props["unit"]["description"] == "Temperature unit."
    assert props["days"]["description"] == "How many days ahead."


def test_sphinx_params_and_missing_docstring() -> None:
    @tool
    def f(a: int) -> int:
        """Double a number.

        :param a: the number
        """
        return a * 2

    @tool
    def g(a: int) -> int:
        return a

    assert f.description == "Double a number."
    assert f.parameters["properties"]["a"]["description"] == "the number"
    assert g.description == ""
    assert "description" not in g.to_wire()["function"]


def test_decorator_forms_and_wire_shape() -> None:
    @tool()
    def plain(x: int) -> int:
        """Plain."""
        return x

    @tool(name="renamed", description="Custom text.")
    def other(x: int) -> int:
        """Ignored."""
        return x

    assert plain.name == "plain" and plain.description == "Plain."
    assert other.name == "renamed" and other.description == "Custom text."
    assert other(4) == 4  # still callable like the function
    assert other.__name__ == "other" and other.__doc__ == "Ignored."
    assert other.to_wire() == {
        "type": "function",
        "function": {
            "name": "renamed",
            "description": "Custom text.",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
                           "additionalProperties": False},
        },
    }
    json.dumps(other.to_wire())  # JSON all the way down
    with pytest.raises(ToolDefinitionError):
        tool(name="has space")(lambda: None)


def test_results_text_stays_text_everything_else_is_json() -> None:
    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    @tool
    def as_text() -> str:
        return "plain text, not JSON"

    @tool
    def as_dict(order_id: str) -> dict:
        return {"order_id": order_id, "status": "IN_TRANSIT", "eta": "Tomorrow"}

    @tool
    def as_number() -> float:
        return 1.5

    @tool
    def as_none() -> None:
        return None

    @tool
    def as_dataclass() -> Point:
        return Point(1, 2)

    assert as_text.invoke("{}") == "plain text, not JSON"
    assert json.loads(as_dict.invoke('{"order_id": "404"}')) == {
        "order_id": "404", "status": "IN_TRANSIT", "eta": "Tomorrow"}
    assert as_number.invoke("") == "1.5"
    assert as_none.invoke(None) == "null"
    assert json.loads(as_dataclass.invoke("{}")) == {"x": 1, "y": 2}


def test_arguments_are_checked_and_converted() -> None:
    seen: dict[str, Any] = {}

    @tool
    def f(n: int, ratio: float, flag: bool, color: Color, tags: list[str], pair: tuple[int, str],
          level: Literal["lo", "hi"] = "lo", maybe: int | None = None, scores: dict[str, float] | None = None) -> str:
        seen.update(locals())
        return "done"

    args = {"n": 2.0, "ratio": 1, "flag": True, "color": "blue", "tags": ["a"], "pair": [1, "x"],
            "maybe": None, "scores": {"a": 1}}
    assert f.invoke(json.dumps(args)) == "done"
    assert seen["n"] == 2 and type(seen["n"]) is int
    assert seen["ratio"] == 1.0 and type(seen["ratio"]) is float
    assert seen["color"] is Color.BLUE
    assert seen["pair"] == (1, "x")
    assert seen["level"] == "lo"
    assert seen["scores"] == {"a": 1.0}

    bad = [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"ratio": 1}', "missing required argument"),
        (json.dumps({**args, "extra": 1}), "unknown argument"),
        (json.dumps({**args, "n": "2"}), "'n': expected an integer"),
        (json.dumps({**args, "n": 2.5}), "'n': expected an integer"),
        (json.dumps({**args, "n": True}), "'n': expected an integer"),
        (json.dumps({**args, "flag": 1}), "'flag': expected a boolean"),
        (json.dumps({**args, "color": "green"}), "'color': expected one of"),
        (json.dumps({**args, "tags": ["a", 3]}), r"'tags\[1\]': expected a string"),
        (json.dumps({**args, "pair": [1]}), "'pair': expected an array of 2 items"),
        (json.dumps({**args, "level": "mid"}), "'level': expected one of"),
        (json.dumps({**args, "maybe": "x"}), "'maybe'"),
    ]
    for text, message in bad:
        with pytest.raises(ToolArgumentsError, match=message):
            f.invoke(text)


def test_tool_exceptions_propagate() -> None:
    @tool
    def broken() -> str:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        broken.invoke("{}")


def test_async_tools_run_to_completion() -> None:
    @tool
    async def slow_double(x: int) -> dict:
        """Double slowly."""
        await asyncio.sleep(0.01)
        return {"x": x * 2}

    assert slow_double.is_async
    assert slow_double.invoke('{"x": 21}') == '{"x": 42}'
    assert asyncio.run(slow_double.ainvoke('{"x": 2}')) == '{"x": 4}'


def test_async_tool_runs_on_a_given_loop_from_another_thread() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    @tool
    async def where() -> str:
        loops.append(asyncio.get_running_loop())
        return "ok"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert await asyncio.to_thread(where.invoke, "{}", loop=loop) == "ok"
        assert loops == [loop]

    asyncio.run(main())


def test_sync_tool_ainvoke_runs_in_a_thread() -> None:
    import threading

    threads: list[int] = []

    @tool
    def which() -> int:
        threads.append(threading.get_ident())
        return 1

    assert asyncio.run(which.ainvoke("{}")) == "1"
    assert threads and threads[0] != threading.get_ident()


def test_custom_tool_has_schema_and_no_implementation() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    weather = Tool.custom("get_weather", "Weather for a city.", schema)
    assert weather.is_custom and weather.function is None
    assert weather.to_wire()["function"] == {"name": "get_weather", "description": "Weather for a city.",
                                            "parameters": schema}
    assert weather.parse_arguments('{"city": "X"}') == {"city": "X"}
    with pytest.raises(TypeError, match="submit_tool_result"):
        weather.invoke('{"city": "X"}')
    with pytest.raises(ToolDefinitionError, match="type 'object'"):
        Tool.custom("bad", "", {"type": "string"})
    assert Tool.custom("noargs").parameters == {"type": "object", "properties": {}}


def test_return_values_become_strict_json_text() -> None:
    """Defect: a set became "{1, 2, 3}", bytes "b'...'", NaN bare NaN, a nested Enum "Color.RED"."""
    import dataclasses
    import enum
    import math

    from chatflow_cli.core.tools import to_json_text

    class Color(enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    @dataclasses.dataclass
    class Point:
        x: int
        tags: frozenset[str]

    class Model:  # pydantic-like
        def model_dump(self, mode: str = "python") -> dict[str, Any]:
            return {"mode": mode, "color": Color.RED}

    value = {
        "set": {3, 1, 2},
        "tuple": (1, "a"),
        "bytes": b"caf\xc3\xa9",
        "binary": b"\xff\x00",
        "nan": math.nan,
        "inf": -math.inf,
        "nested": [{"c": Color.RED}],
        Color.RED: Level.HIGH,
        "point": Point(1, frozenset({"b", "a"})),
        "model": Model(),
    }
    text = to_json_text(value)
    assert "NaN" not in text and "Infinity" not in text and "Color." not in text
    assert json.loads(text) == {
        "set": [1, 2, 3],
        "tuple": [1, "a"],
        "bytes": "café",
        "binary": {"base64": "/wA="},
        "nan": None,
        "inf": None,
        "nested": [{"c": "red"}],
        "red": 3,
        "point": {"x": 1, "tags": ["a", "b"]},
        "model": {"mode": "json", "color": "red"},
    }
    assert to_json_text("plain") == "plain" and to_json_text(math.nan) == "null"
    loop: list[Any] = [1]
    loop.append(loop)
    assert json.loads(to_json_text(loop)) == [1, "[circular]"]

    @tool
    def f() -> Any:
        """Return a set."""
        return {Color.RED, Color.RED}

    assert f.invoke("{}") == '["red"]'


def test_sequential_tools_run_in_the_reply_order_beside_the_others(fake_server: Any, make_runner: Any) -> None:
    import threading
    import time

    from chatflow_cli.core.agents import Agent

    done: list[int] = []
    pinged = threading.Event()

    @tool(sequential=True)
    def step(n: int) -> str:
        """A step that must follow the one before it."""
        if n == 1:
            time.sleep(0.3)  # run at once, step 2 would finish first
            if not pinged.wait(5):  # the other tool runs at the same time, not after the steps
                return "ping did not run beside"
        done.append(n)
        return f"step {n} after {done[:-1]}"

    @tool
    def ping() -> str:
        """Not sequential: runs on its own thread."""
        pinged.set()
        return "pong"

    assert step.sequential and not ping.sequential
    fake_server.add_tool_calls([("a", "step", json.dumps({"n": 1})), ("b", "step", json.dumps({"n": 2})),
                                ("c", "ping", "{}")])
    fake_server.add_text("ok")
    runner = make_runner(Agent(name="A", instructions="x", model="fake-model", tools=[step, ping]))
    assert runner.run("s", "go").content == "ok"
    results = [m["content"] for m in fake_server.requests[-1]["messages"] if m["role"] == "tool"]
    assert results == ["step 1 after []", "step 2 after [1]", "pong"]
