"""The stream accumulator and its verdict (chatflow_cli.core.stream): whether a reply finished.

Examples first (each server pattern and each verdict), then hypothesis properties that feed
the accumulator the chunk orders and tool-call index/id patterns real servers send:
OpenAI (id and name once, then index-only fragments), llama.cpp (id and name repeated in
every chunk), Ollama (every call whole, all at index 0 with its own id), proxies that send
no index, arguments sent as a JSON object, finish reasons on their own chunk or riding on
the last delta, usage before or after the finish reason, and streams cut anywhere.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatflow_cli.core.stream import (
    ModelTurn,
    ReasoningDelta,
    ReplyState,
    StreamAccumulator,
    TextDelta,
    ToolCallDelta,
    judge,
)
from chatflow_cli.core.messages import Message, ToolCall, history_problems

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _choice(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    return {"choices": [choice]}


def _call(index: int | None, call_id: str | None, name: str | None, arguments: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"function": {"arguments": arguments}}
    if index is not None:
        call["index"] = index
    if call_id is not None:
        call["id"] = call_id
        call["type"] = "function"
    if name is not None:
        call["function"]["name"] = name
    return _choice({"tool_calls": [call]})


def _feed(chunks: list[dict[str, Any]]) -> tuple[StreamAccumulator, list[Any]]:
    acc = StreamAccumulator()
    deltas = [d for c in chunks for d in acc.feed(json.loads(json.dumps(c)))]
    return acc, deltas


# ======================================================================================
# verdicts
# ======================================================================================
def test_a_reply_with_stop_is_complete() -> None:
    acc, _ = _feed([_choice({"content": "Hi"}), _choice({}, "stop")])
    verdict = acc.result().verdict
    assert verdict.state is ReplyState.COMPLETE and verdict.complete and not verdict.truncated
    assert verdict.finish_reason == "stop" and verdict.reason == ""


def test_length_and_content_filter_are_truncated_and_name_the_cut() -> None:
    for sent, stored, phrase in (("length", "length", "cut by the token limit"),
                                 ("max_tokens", "length", "cut by the token limit"),
                                 ("content_filter", "content_filter", "stopped by a content filter")):
        acc, _ = _feed([_choice({"content": "cut"}), _choice({}, sent)])
        turn = acc.result()
        verdict = turn.verdict
        assert verdict.state is ReplyState.TRUNCATED and verdict.complete and verdict.truncated
        assert turn.finish_reason == verdict.finish_reason == stored
        assert verdict.reason == f"{phrase} (finish_reason {stored})"
        assert turn.to_message().finish_reason == stored


def test_no_finish_reason_is_broken_whatever_arrived() -> None:
    acc, _ = _feed([_choice({"content": "Hel"})])
    verdict = acc.result().verdict
    assert verdict.state is ReplyState.BROKEN and not verdict.complete and verdict.finish_reason is None
    assert verdict.reason == "the reply did not finish (the stream ended without a finish reason)"
    closed = acc.result(broken="the connection to X closed mid-reply: reset")
    assert closed.verdict.reason == "the reply did not finish (the connection to X closed mid-reply: reset)"


def test_a_finish_reason_wins_over_what_broke_after_it() -> None:
    acc, _ = _feed([_choice({"content": "whole"}, "stop")])
    turn = acc.result(broken="the connection closed")
    assert turn.broken is None and turn.verdict.state is ReplyState.COMPLETE


def test_usage_only_chunks_after_the_finish_reason_keep_it_complete() -> None:
    acc, _ = _feed([_choice({"content": "a"}), _choice({}, "stop"),
                    {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": None}]}])
    turn = acc.result()
    assert turn.verdict.state is ReplyState.COMPLETE and turn.usage is not None and turn.usage.total_tokens == 2


def test_interrupted_is_its_own_state() -> None:
    acc, _ = _feed([_choice({"content": "Hel"})])
    assert acc.result(interrupted=True).verdict.state is ReplyState.INTERRUPTED


def test_tool_arguments_cut_mid_json_are_an_invalid_tool_call() -> None:
    acc, _ = _feed([_call(0, "call_cut", "read", '{"path": "a.t'), _choice({}, "length")])
    verdict = acc.result().verdict
    assert verdict.state is ReplyState.INVALID_TOOL_CALL and not verdict.complete
    assert [c.id for c in verdict.invalid_calls] == ["call_cut"]
    assert verdict.reason == ("tool call read (call_cut): arguments '{\"path\": \"a.t' are not a complete JSON "
                              "object; cut by the token limit, finish_reason length")


def test_arguments_that_are_json_but_not_an_object_or_a_call_with_no_name_are_invalid() -> None:
    for arguments, what in (('"text"', "are a string, not a JSON object"), ("[1]", "are a list, not a JSON object"),
                            ("null", "are null, not a JSON object"), ("3", "are a number, not a JSON object"),
                            ('{"a": NaN}', "contain NaN, which is not JSON"), ("{} {}", "are not a complete JSON object")):
        acc, _ = _feed([_call(0, "c1", "f", arguments), _choice({}, "tool_calls")])
        verdict = acc.result().verdict
        assert verdict.state is ReplyState.INVALID_TOOL_CALL and what in verdict.reason
    acc, _ = _feed([_call(0, "c1", None, "{}"), _choice({}, "tool_calls")])
    assert acc.result().verdict.reason.startswith("tool call c1 has no function name")


def test_a_call_with_no_arguments_gets_an_empty_object() -> None:
    acc, _ = _feed([_call(0, "c1", "now", ""), _choice({}, "tool_calls")])
    turn = acc.result()
    assert turn.tool_calls == [ToolCall("c1", "now", "{}")] and turn.verdict.state is ReplyState.COMPLETE


def test_a_cut_reply_with_whole_tool_calls_is_a_normal_tool_round() -> None:
    acc, _ = _feed([_call(0, "c1", "f", '{"a": 1}'), _choice({}, "length")])
    assert acc.result().verdict.state is ReplyState.COMPLETE


def test_finish_reason_spellings_are_normalized() -> None:
    for sent, stored in (("function_call", "tool_calls"), ("tool_use", "tool_calls"), ("end_turn", "stop"),
                         ("  stop ", "stop"), ("", None), (None, None), (3, None)):
        acc, _ = _feed([_choice({"content": "x"}), {"choices": [{"index": 0, "delta": {}, "finish_reason": sent}]}])
        assert acc.result().finish_reason == stored, sent


def test_judge_of_a_hand_made_turn() -> None:
    assert judge(ModelTurn("x", [], None, "stop")).state is ReplyState.COMPLETE
    assert judge(ModelTurn("x", [], None, None)).state is ReplyState.BROKEN


# ======================================================================================
# reasoning
# ======================================================================================
def test_reasoning_content_and_reasoning_deltas_are_kept_apart_from_the_text() -> None:
    acc, deltas = _feed([
        _choice({"role": "assistant", "content": None, "reasoning_content": "Think "}),
        _choice({"content": None, "reasoning": "more. "}),
        _choice({"content": "Answer", "reasoning_content": None}),
        _choice({}, "stop"),
    ])
    assert deltas == [ReasoningDelta("Think "), ReasoningDelta("more. "), TextDelta("Answer")]
    turn = acc.result()
    assert (turn.content, turn.reasoning) == ("Answer", "Think more. ")
    assert turn.to_message().reasoning == "Think more. "
    assert "reasoning" not in json.dumps(turn.to_message().to_wire())


def test_a_reasoning_only_reply_says_nothing_on_the_wire() -> None:
    acc, _ = _feed([_choice({"content": None, "reasoning_content": "hmm"}), _choice({}, "stop")])
    turn = acc.result()
    message = turn.to_message()
    assert turn.content is None and turn.verdict.state is ReplyState.COMPLETE
    assert message.says_nothing and message.reasoning == "hmm"
    assert Message.from_dict(message.to_dict()) == message


# ======================================================================================
# tool-call index and id patterns
# ======================================================================================
def test_ollama_parallel_calls_at_index_0_are_two_calls() -> None:
    acc, deltas = _feed([_call(0, "call_a", "f", "{}"), _call(0, "call_b", "f", "{}"), _choice({}, "tool_calls")])
    assert acc.result().tool_calls == [ToolCall("call_a", "f", "{}"), ToolCall("call_b", "f", "{}")]
    assert [(d.index, d.id) for d in deltas] == [(0, "call_a"), (1, "call_b")]


def test_llama_cpp_same_id_and_name_in_every_chunk_is_one_call() -> None:
    pieces = ['{"ci', 'ty": ', '"Paris', '"}']
    acc, deltas = _feed([_call(0, "call_W", "get_weather", p) for p in pieces] + [_choice({}, "tool_calls")])
    assert acc.result().tool_calls == [ToolCall("call_W", "get_weather", '{"city": "Paris"}')]
    assert all(isinstance(d, ToolCallDelta) and d.index == 0 for d in deltas)


def test_a_fresh_id_on_a_fragment_of_an_unfinished_call_does_not_split_it() -> None:
    acc, _ = _feed([_call(0, "call_1", "f", '{"a": '), _call(0, "call_x", None, "1}"), _choice({}, "tool_calls")])
    assert acc.result().tool_calls == [ToolCall("call_1", "f", '{"a": 1}')]


def test_a_new_id_without_a_name_after_a_whole_call_starts_a_new_call() -> None:
    acc, _ = _feed([_call(0, "call_1", "f", '{"a": 1}'), _call(0, "call_2", None, "{}")])
    assert [c.id for c in acc.result().tool_calls] == ["call_1", "call_2"]


def test_an_earlier_id_again_goes_back_to_its_call() -> None:
    acc, _ = _feed([_call(0, "call_a", "f", '{"x": 1}'), _call(0, "call_b", "g", '{"y":'),
                    _call(0, "call_a", "f", ""), _call(0, "call_b", "g", " 2}")])
    assert acc.result().tool_calls == [ToolCall("call_a", "f", '{"x": 1}'), ToolCall("call_b", "g", '{"y": 2}')]


# ======================================================================================
# properties: real servers' chunk orders
# ======================================================================================
json_objects = st.dictionaries(st.text("abcxyz", min_size=1, max_size=4),
                               st.integers(-9, 99) | st.text(max_size=6) | st.booleans(), max_size=3)
call_specs = st.lists(st.tuples(st.from_regex(r"call_[a-z0-9]{1,6}", fullmatch=True),
                                st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True),
                                json_objects),
                      max_size=3, unique_by=lambda c: c[0])
PATTERNS = ["openai", "llama_cpp", "ollama", "no_index", "object_arguments"]


def _pieces(data: st.DataObject, text: str) -> list[str]:
    if len(text) < 2:
        return [text]
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text) - 1), max_size=4)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def _call_chunks(pattern: str, calls: list[tuple[str, str, dict[str, Any]]], data: st.DataObject) -> list[Any]:
    chunks: list[Any] = []
    for index, (call_id, name, arguments) in enumerate(calls):
        text = json.dumps(arguments)
        if pattern == "ollama":
            chunks.append(_call(0, call_id, name, text))
        elif pattern == "object_arguments":
            chunks.append(_call(index, call_id, name, arguments))
        else:
            for k, piece in enumerate(_pieces(data, text)):
                head = k == 0 or pattern == "llama_cpp"
                chunks.append(_call(None if pattern == "no_index" else index,
                                    call_id if head else None, name if head else None, piece))
    return chunks


@FUZZ
@given(text=st.text(max_size=40), reasoning=st.text(max_size=20), calls=call_specs, pattern=st.sampled_from(PATTERNS),
       finish=st.sampled_from(["stop", "length", "content_filter", "tool_calls"]),
       finish_on_last_delta=st.booleans(), usage_after=st.booleans(), data=st.data())
def test_every_server_pattern_folds_to_the_reply_and_the_right_verdict(
        text: str, reasoning: str, calls: list[tuple[str, str, dict[str, Any]]], pattern: str, finish: str,
        finish_on_last_delta: bool, usage_after: bool, data: st.DataObject) -> None:
    chunks: list[Any] = [_choice({"role": "assistant", "content": None})]
    chunks += [_choice({"content": None, "reasoning_content": p}) for p in _pieces(data, reasoning) if p]
    chunks += [_choice({"content": p}) for p in _pieces(data, text) if p]
    chunks += _call_chunks(pattern, calls, data)
    usage = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}
    if finish_on_last_delta and len(chunks) > 1:
        chunks[-1]["choices"][0]["finish_reason"] = finish
    else:
        chunks.append(_choice({}, finish))
    if usage_after:
        chunks.append(usage)
    acc, deltas = _feed(chunks)
    turn = acc.result()
    assert (turn.content or "") == text and (turn.reasoning or "") == reasoning
    assert [(c.id, c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [tuple(c) for c in calls]
    assert sorted({d.index for d in deltas if isinstance(d, ToolCallDelta)}) == list(range(len(calls)))
    verdict = turn.verdict
    if finish in ("length", "content_filter") and not calls:
        assert verdict.state is ReplyState.TRUNCATED and verdict.finish_reason == finish
    else:
        assert verdict.state is ReplyState.COMPLETE
    stored = turn.to_message()
    history = [Message.user("q"), stored, *(Message.tool(c[0], "r") for c in calls)]
    assert history_problems(history) == []
    assert Message.from_dict(stored.to_dict()) == stored


@FUZZ
@given(text=st.text(min_size=1, max_size=30), calls=call_specs, pattern=st.sampled_from(PATTERNS), data=st.data())
def test_a_stream_cut_anywhere_before_its_finish_reason_is_never_complete(
        text: str, calls: list[tuple[str, str, dict[str, Any]]], pattern: str, data: st.DataObject) -> None:
    chunks: list[Any] = [_choice({"content": p}) for p in _pieces(data, text)]
    chunks += _call_chunks(pattern, calls, data)
    chunks.append(_choice({}, "tool_calls" if calls else "stop"))
    cut = data.draw(st.integers(0, len(chunks)))
    acc, _ = _feed(chunks[:cut])
    verdict = acc.result(broken="the connection closed").verdict
    if cut == len(chunks):
        assert verdict.state is ReplyState.COMPLETE
    else:
        assert verdict.state is ReplyState.BROKEN and not verdict.complete


@FUZZ
@given(calls=call_specs.filter(bool), pattern=st.sampled_from(["openai", "llama_cpp", "no_index"]), data=st.data(),
       finish=st.sampled_from(["length", "tool_calls", "stop"]))
def test_arguments_cut_mid_json_are_never_a_usable_call(calls: list[tuple[str, str, dict[str, Any]]], pattern: str,
                                                        data: st.DataObject, finish: str) -> None:
    chunks = _call_chunks(pattern, calls, data)
    # drop the tail of the last call's arguments: the token limit struck mid-JSON
    last = chunks[-1]["choices"][0]["delta"]["tool_calls"][0]["function"]
    whole = json.dumps(calls[-1][2])
    if last["arguments"] == whole or len(last["arguments"]) > 1:
        last["arguments"] = last["arguments"][: data.draw(st.integers(0, max(0, len(last["arguments"]) - 1)))]
    chunks.append(_choice({}, finish))
    acc, _ = _feed(chunks)
    turn = acc.result()
    arguments = turn.tool_calls[-1].arguments
    try:
        whole_object = isinstance(json.loads(arguments), dict)
    except ValueError:
        whole_object = False
    verdict = turn.verdict
    if whole_object:  # the cut happened to leave an object (e.g. "{}" -> "{}" of an empty call)
        assert verdict.state is ReplyState.COMPLETE
    else:
        assert verdict.state is ReplyState.INVALID_TOOL_CALL and not verdict.complete
        assert turn.tool_calls[-1].id in [c.id for c in verdict.invalid_calls]
