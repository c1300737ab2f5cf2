"""Property-based fuzzing (hypothesis) of the SSE accumulator and of ``--input jsonl`` parsing (issue 7).

``StreamAccumulator`` (chatflow_cli.core.model):

* any chunk shaped like a mapping — whatever its fields hold — is fed without an error,
  and ``result()`` always gives a usable answer (string ids, text arguments);
* the same reply (text plus tool calls) cut into chunks at random places, with ``id`` and
  ``name`` sent once or repeated in every chunk (llama.cpp), and with noise chunks between
  (empty ``choices``, no ``delta``, ``content: null``, usage only), always folds back to
  the same text, the same calls and the last usage; names are never concatenated;
* the stored form of the answer plus one result per call passes the validity checks.

``parse_input_line`` (chatflow_cli.commands.chat), the parser behind ``chat --input jsonl``:

* any text gives ``None`` (blank), an :class:`InputItem`, or a ``UsageError`` naming the
  line — never any other exception;
* valid objects round-trip: the message text, session, metadata, ids; a tool result's
  output stays text, anything else becomes its JSON text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from chatflow_cli.commands.chat import MAX_MESSAGE_BYTES, parse_input_line
from chatflow_cli.core.errors import UsageError
from chatflow_cli.core.messages import Message, history_problems
from chatflow_cli.core.model import StreamAccumulator, TextDelta, ToolCallDelta

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------
# hostile chunks: any JSON value where the fields go
# ---------------------------------------------------------------------------------------
json_scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def _maybe(strategy: Any) -> Any:
    return st.one_of(strategy, json_values)


tool_call_deltas = st.fixed_dictionaries(
    {},
    optional={
        "index": _maybe(st.integers(-1, 3)),
        "id": _maybe(st.text(max_size=6)),
        "type": _maybe(st.just("function")),
        "function": _maybe(st.fixed_dictionaries({}, optional={
            "name": _maybe(st.text(max_size=6)),
            "arguments": _maybe(st.text(max_size=10)),
        })),
    },
)
deltas = st.fixed_dictionaries({}, optional={
    "role": _maybe(st.just("assistant")),
    "content": _maybe(st.text(max_size=10)),
    "tool_calls": _maybe(st.lists(_maybe(tool_call_deltas), max_size=3)),
})
choices = st.fixed_dictionaries({}, optional={
    "index": _maybe(st.integers(0, 2)),
    "delta": _maybe(deltas),
    "finish_reason": _maybe(st.sampled_from(["stop", "tool_calls", "length"])),
})
usages = st.fixed_dictionaries({}, optional={
    "prompt_tokens": _maybe(st.integers(0, 100)),
    "completion_tokens": _maybe(st.integers(0, 100)),
    "total_tokens": _maybe(st.integers(0, 200)),
})
hostile_chunks = st.fixed_dictionaries({}, optional={
    "id": json_values,
    "object": json_values,
    "choices": _maybe(st.lists(_maybe(choices), max_size=3)),
    "usage": _maybe(usages),
})


@FUZZ
@given(st.lists(hostile_chunks, max_size=12))
def test_accumulator_takes_any_mapping_chunk(chunks: list[dict[str, Any]]) -> None:
    acc = StreamAccumulator()
    text: list[str] = []
    for chunk in chunks:
        for delta in acc.feed(chunk):
            assert isinstance(delta, (TextDelta, ToolCallDelta))
            if isinstance(delta, TextDelta):
                assert isinstance(delta.text, str) and delta.text
                text.append(delta.text)
            else:
                assert isinstance(delta.index, int) and delta.index >= 0
                assert isinstance(delta.arguments_fragment, str)
    turn = acc.result()
    assert (turn.content or "") == "".join(text)
    ids = [c.id for c in turn.tool_calls]
    for call in turn.tool_calls:
        assert isinstance(call.id, str) and call.id
        assert isinstance(call.name, str)
        assert isinstance(call.arguments, str)
    if len(set(ids)) == len(ids):  # then the stored answer plus its results is a valid history
        history = [Message.user("q"), turn.to_message(), *(Message.tool(i, "r") for i in ids)]
        assert history_problems(history) == []
    assert acc.result() == turn  # result() is stable


# ---------------------------------------------------------------------------------------
# one reply, cut anywhere, with noise: always the same answer
# ---------------------------------------------------------------------------------------
ids = st.text(alphabet="abcdefghij0123456789_", min_size=1, max_size=10)
names = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)
calls_strategy = st.lists(st.tuples(ids, names, st.text(max_size=30)), max_size=3, unique_by=lambda c: c[0])
NOISE = [
    {"choices": []},
    {"choices": [{"index": 0}]},
    {"choices": [{"index": 0, "delta": None}]},
    {"choices": [{"index": 0, "delta": {"content": None}}]},
    {"choices": [{"index": 0, "delta": {}}]},
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"index": 1, "delta": {"content": "another choice"}}]},
]


def _cuts(data: st.DataObject, text: str) -> list[str]:
    if not text:
        return []
    points = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=5)))
    pieces, start = [], 0
    for p in [*points, len(text)]:
        if p > start:
            pieces.append(text[start:p])
            start = p
    return pieces


@FUZZ
@given(text=st.text(max_size=60), calls=calls_strategy, repeat=st.booleans(), data=st.data(),
       usage=st.none() | st.tuples(st.integers(0, 999), st.integers(0, 999)))
def test_any_chunking_of_a_reply_folds_to_the_same_answer(text: str, calls: list[tuple[str, str, str]], repeat: bool,
                                                          data: st.DataObject, usage: tuple[int, int] | None) -> None:
    chunks: list[dict[str, Any]] = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    for piece in _cuts(data, text):
        chunks.append({"choices": [{"index": 0, "delta": {"content": piece}}]})
    for index, (call_id, name, arguments) in enumerate(calls):
        pieces = _cuts(data, arguments) or [""]
        for k, piece in enumerate(pieces):
            delta: dict[str, Any] = {"index": index, "function": {"arguments": piece}}
            if k == 0 or repeat:
                delta["id"] = call_id
                delta["type"] = "function"
                delta["function"]["name"] = name
            chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}]})
    if usage is not None:
        chunks.append({"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})
    # noise anywhere
    for _ in range(data.draw(st.integers(0, 4))):
        chunks.insert(data.draw(st.integers(0, len(chunks))), data.draw(st.sampled_from(NOISE)))

    acc = StreamAccumulator()
    streamed: list[str] = []
    for chunk in chunks:
        streamed += [d.text for d in acc.feed(json.loads(json.dumps(chunk))) if isinstance(d, TextDelta)]
    turn = acc.result()
    assert "".join(streamed) == text
    assert (turn.content or "") == text
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        (cid, name, args if args.strip() else "{}") for cid, name, args in calls]  # no arguments: "{}"
    assert turn.finish_reason == ("tool_calls" if calls else "stop")
    if usage is None:
        assert turn.usage is None
    else:
        assert (turn.usage.prompt_tokens, turn.usage.completion_tokens, turn.usage.total_tokens) == (
            usage[0], usage[1], usage[0] + usage[1])
    history = [Message.user("q"), turn.to_message(), *(Message.tool(c[0], "r") for c in calls)]
    assert history_problems(history) == []


# ---------------------------------------------------------------------------------------
# --input jsonl
# ---------------------------------------------------------------------------------------
#: Any code point, lone surrogates included (hypothesis leaves them out unless asked).
ANY_CHAR = st.characters() | st.characters(categories=["Cs"])


def _parse(number: int, line: str) -> Any:
    try:
        return parse_input_line(number, line)
    except UsageError as exc:
        assert f"line {number}" in exc.message, exc.message
        assert "\n" not in exc.message.strip(), "an error message must be one line"
        return exc


@FUZZ
@given(number=st.integers(1, 10**6), line=st.text(max_size=200))
def test_any_text_line_parses_or_is_a_usage_error_naming_the_line(number: int, line: str) -> None:
    out = _parse(number, line)
    if out is None:
        assert not line.strip()


@FUZZ
@given(number=st.integers(1, 1000), message=st.text(ANY_CHAR, min_size=1, max_size=20),
       output=st.text(ANY_CHAR, max_size=20), tool=st.booleans())
def test_every_accepted_line_can_be_stored(number: int, message: str, output: str, tool: bool) -> None:
    """JSON may escape lone surrogates (``"\\ud800"``); SQLite and the model need real UTF-8 text.

    A line is either refused (UsageError naming the line) or yields text that encodes as UTF-8.
    """
    obj = {"tool_use_id": "call_1", "output": output} if tool else {"message": message}
    out = _parse(number, json.dumps(obj, ensure_ascii=True))
    if isinstance(out, UsageError) or out is None:
        return
    for text in (out.message, out.output):
        if text is not None:
            text.encode("utf-8")  # raises UnicodeEncodeError for a lone surrogate


@FUZZ
@given(number=st.integers(1, 1000), value=json_values)
def test_any_json_value_parses_or_is_a_usage_error(number: int, value: Any) -> None:
    out = _parse(number, json.dumps(value))
    if not isinstance(value, dict):
        assert isinstance(out, UsageError)


printable = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=80)


@FUZZ
@given(number=st.integers(1, 1000), message=printable, session=st.none() | ids,
       metadata=st.none() | st.dictionaries(st.text(max_size=5), json_values, max_size=3),
       message_id=st.none() | ids, key=st.none() | ids, use_content=st.booleans())
def test_valid_message_lines_round_trip(number: int, message: str, session: str | None, metadata: Any,
                                        message_id: str | None, key: str | None, use_content: bool) -> None:
    assume(message.strip())
    obj: dict[str, Any] = {"content" if use_content else "message": message}
    if use_content:
        obj["role"] = "user"
    for name, value in (("session", session), ("metadata", metadata), ("message_id", message_id),
                        ("idempotency_key", key)):
        if value is not None:
            obj[name] = value
    item = parse_input_line(number, json.dumps(obj, ensure_ascii=bool(number % 2)))
    assert item is not None and item.line == number
    assert item.message == message and item.tool_use_id is None
    assert item.session == session
    assert item.metadata == metadata
    assert item.message_id == message_id and item.idempotency_key == key


@FUZZ
@given(number=st.integers(1, 1000), tool_use_id=ids, output=json_values, nested=st.booleans())
def test_valid_tool_result_lines_round_trip(number: int, tool_use_id: str, output: Any, nested: bool) -> None:
    body = {"tool_use_id": tool_use_id, "output": output}
    obj = {"tool_result": body} if nested else body
    item = parse_input_line(number, json.dumps(obj))
    assert item is not None and item.message is None
    assert item.tool_use_id == tool_use_id
    expected = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    assert item.output == expected
    if not isinstance(output, str):
        assert json.loads(item.output) == output


def test_an_over_long_message_line_is_refused_with_its_line_number() -> None:
    line = json.dumps({"message": "x" * (MAX_MESSAGE_BYTES + 1)})
    with pytest.raises(UsageError, match="line 7"):
        parse_input_line(7, line)
