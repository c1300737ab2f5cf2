"""core/model.py: the stream accumulator (pure) and ModelClient against the fake server over real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatflow_cli.core.errors import (
    AuthenticationError,
    BadRequestError,
    ConfigError,
    ModelNotFoundError,
    NetworkError,
    ProviderError,
    ProviderResponseError,
    ProviderTimeoutError,
    RateLimitedError,
)
from chatflow_cli.core.messages import Message, Role, ToolCall
from chatflow_cli.core.model import (
    NO_KEY_PLACEHOLDER,
    TRANSPORTS,
    ModelClient,
    ModelTurn,
    ReplyState,
    StreamAccumulator,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from tests.helpers.fakeserver import CLOSE, INVALID_JSON, FakeServer
from tests.helpers.wait import wait_until

USER = [{"role": "user", "content": "hi"}]


def text_chunk(text: str | None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def call_chunk(index: int | None, id_: str | None, name: str | None, args: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"function": {}}
    if index is not None:
        call["index"] = index
    if id_ is not None:
        call["id"] = id_
    if name is not None:
        call["function"]["name"] = name
    if args is not None:
        call["function"]["arguments"] = args
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


def feed_all(chunks: list[Any]) -> tuple[StreamAccumulator, list[Any]]:
    acc = StreamAccumulator()
    deltas = [d for c in chunks for d in acc.feed(c)]
    return acc, deltas


# ======================================================================================
# StreamAccumulator
# ======================================================================================
def test_quirky_chunks_give_hello_world_and_usage() -> None:
    acc, deltas = feed_all([
        text_chunk("Hello"),
        {"choices": []},
        {"choices": [{"index": 0, "finish_reason": None}]},  # no delta
        {"choices": [{"index": 0, "delta": None}]},
        text_chunk(None),  # content null
        text_chunk(" world"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}},
    ])
    assert deltas == [TextDelta("Hello"), TextDelta(" world")]
    turn = acc.result()
    assert turn == ModelTurn("Hello world", [], Usage(5, 2, 7), "stop", False)


def test_llama_cpp_repeats_id_and_name_in_every_chunk() -> None:
    pieces = ['{"ci', 'ty": ', '"Paris', '"}']
    acc, deltas = feed_all([call_chunk(0, "call_W", "get_weather", p) for p in pieces])
    assert acc.result().tool_calls == [ToolCall("call_W", "get_weather", '{"city": "Paris"}')]
    assert [d.arguments_fragment for d in deltas] == pieces
    assert all(d == ToolCallDelta(0, "call_W", "get_weather", d.arguments_fragment) for d in deltas)


def test_parallel_tool_calls_are_kept_per_index() -> None:
    acc, _ = feed_all([
        call_chunk(0, "call_W", "get_weather", ""),
        call_chunk(1, "call_T", "get_time", ""),
        call_chunk(0, None, None, '{"city":'),
        call_chunk(1, None, None, '{"tz":"UTC"}'),
        call_chunk(0, None, None, '"Oslo"}'),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ])
    turn = acc.result()
    assert turn.content is None and turn.finish_reason == "tool_calls"
    assert turn.tool_calls == [ToolCall("call_W", "get_weather", '{"city":"Oslo"}'),
                               ToolCall("call_T", "get_time", '{"tz":"UTC"}')]


def test_odd_tool_call_shapes() -> None:
    # no index: matched by id, else appended to the last call; arguments as an object; no id at all
    acc, _ = feed_all([
        call_chunk(None, "call_A", "a", '{"x":'),
        call_chunk(None, None, None, "1}"),
        call_chunk(None, "call_B", "b", {"y": 2}),
        call_chunk(None, "call_A", "a", ""),
        call_chunk(7, None, "c", "{}"),
    ])
    calls = acc.result().tool_calls
    assert [(c.id, c.name, c.arguments) for c in calls[:2]] == [("call_A", "a", '{"x":1}'), ("call_B", "b", '{"y": 2}')]
    assert calls[2].name == "c" and calls[2].id.startswith("call_") and len(calls[2].id) > 8
    assert acc.result().tool_calls[2].id == calls[2].id, "a generated id is stable"


def test_other_choices_and_openai_objects() -> None:
    from openai.types.chat import ChatCompletionChunk

    raw = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
           "choices": [{"index": 1, "delta": {"content": "ignored"}},
                       {"index": 0, "delta": {"content": "kept"}, "finish_reason": "length"}]}
    acc = StreamAccumulator()
    assert acc.feed(ChatCompletionChunk.model_validate(raw)) == [TextDelta("kept")]
    assert acc.result().finish_reason == "length"
    with pytest.raises(TypeError):
        acc.feed(["not", "a", "chunk"])


def test_partial_result_is_interrupted_and_becomes_an_interrupted_message() -> None:
    acc, _ = feed_all([text_chunk("Half a sent"), call_chunk(0, "call_1", "f", '{"a":')])
    turn = acc.result(interrupted=True)
    assert turn.interrupted and turn.finish_reason is None
    msg = turn.to_message(agent="helper")
    assert msg == Message(Role.MODEL, "Half a sent", (ToolCall("call_1", "f", '{"a":'),), agent="helper",
                          interrupted=True)


def test_usage_reading_and_sum() -> None:
    assert Usage.from_dict(None) is None
    assert Usage.from_dict({"prompt_tokens": 3, "completion_tokens": 4}) == Usage(3, 4, 7)
    assert Usage(1, 2, 3) + Usage(10, 20, 30) == Usage(11, 22, 33)
    assert Usage.from_dict(Usage(1, 2, 3).to_dict()) == Usage(1, 2, 3)


def _cuts(draw: st.DrawFn, text: str) -> list[str]:
    points = sorted(draw(st.sets(st.integers(min_value=1, max_value=max(1, len(text) - 1)), max_size=8)))
    points = [p for p in points if 0 < p < len(text)]
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@st.composite
def split_streams(draw: st.DrawFn) -> tuple[str, list[tuple[str, str, str]], list[dict[str, Any]]]:
    text = draw(st.text(max_size=40))
    n_calls = draw(st.integers(min_value=0, max_value=3))
    calls = [(f"call_{i}", draw(st.sampled_from(["get_weather", "f", "transfer_to_billing"])),
              draw(st.text(max_size=30))) for i in range(n_calls)]
    repeat = draw(st.booleans())
    events: list[tuple[int, dict[str, Any]]] = []  # (order key, chunk)
    for piece in _cuts(draw, text) if text else []:
        events.append((0, text_chunk(piece)))
    for index, (cid, name, args) in enumerate(calls):
        pieces = _cuts(draw, args) if args else [""]
        for k, piece in enumerate(pieces):
            head = k == 0 or repeat
            events.append((index + 1, call_chunk(index, cid if head else None, name if head else None, piece)))
    # interleave the per-source streams randomly but keep each source's own order
    order = draw(st.permutations(list(range(len(events)))))
    by_source: dict[int, list[dict[str, Any]]] = {}
    for key, chunk in events:
        by_source.setdefault(key, []).append(chunk)
    sources = [key for key, _ in (events[i] for i in order)]
    chunks = [by_source[s].pop(0) for s in sources]
    # sprinkle the quirks anywhere
    for quirk in draw(st.lists(st.sampled_from([{"choices": []}, {"choices": [{"index": 0}]}, text_chunk(None)]),
                               max_size=3)):
        chunks.insert(draw(st.integers(min_value=0, max_value=len(chunks))), quirk)
    return text, calls, chunks


@settings(max_examples=200, deadline=None)
@given(split_streams())
def test_any_split_gives_the_same_result(case: tuple[str, list[tuple[str, str, str]], list[dict[str, Any]]]) -> None:
    text, calls, chunks = case
    acc, deltas = feed_all(chunks)
    turn = acc.result()
    assert turn.content == (text or None)
    # a call that streamed no arguments (or only whitespace) gets "{}"
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        (cid, name, args if args.strip() else "{}") for cid, name, args in calls]
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["choices", "delta", "content", "tool_calls", "index", "id", "function", "name",
                         "arguments", "usage", "finish_reason", "prompt_tokens", "x"]), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["choices", "usage", "id", "error"]), JSON, max_size=3), max_size=6))
def test_fuzzed_chunks_never_break_the_accumulator(chunks: list[dict[str, Any]]) -> None:
    acc = StreamAccumulator()
    for chunk in chunks:
        for delta in acc.feed(chunk):
            assert isinstance(delta, (TextDelta, ToolCallDelta))
    turn = acc.result()
    assert turn.content is None or isinstance(turn.content, str)
    assert all(isinstance(c.id, str) and c.id and isinstance(c.name, str) and isinstance(c.arguments, str)
               for c in turn.tool_calls)


# ======================================================================================
# ModelClient over real HTTP
# ======================================================================================
@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each ModelClient test runs on both transports: ``ModelClient(transport=None)`` reads
    ``CHATFLOW_TRANSPORT``, so the clients the tests build use the one chosen here."""
    monkeypatch.setenv("CHATFLOW_TRANSPORT", request.param)
    return request.param


def client_for(server: FakeServer, **kwargs: Any) -> ModelClient:
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("timeout", 5)
    return ModelClient(server.url, kwargs.pop("api_key", None), **kwargs)


def test_streams_text_and_sends_the_request_it_was_given(fake_server: FakeServer, transport: str) -> None:
    fake_server.add_text("Hello world", chunks=["Hel", "lo", " world"])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    items = list(client_for(fake_server).stream("fake-model", USER, tools=tools, tool_choice="auto", max_tokens=20,
                                                temperature=0.0))
    assert items[:-1] == [TextDelta("Hel"), TextDelta("lo"), TextDelta(" world")]
    turn = items[-1]
    assert isinstance(turn, ModelTurn) and turn.content == "Hello world" and turn.finish_reason == "stop"
    assert turn.usage is not None and turn.usage.total_tokens > 0
    body = fake_server.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["model"], body["messages"], body["tools"], body["tool_choice"], body["max_tokens"],
            body["temperature"]) == ("fake-model", USER, tools, "auto", 20, 0.0)


def test_tool_calls_with_llama_style_repeats_and_invalid_arguments(fake_server: FakeServer, transport: str) -> None:
    fake_server.add_tool_calls([("call_W", "get_weather", '{"city":"X"}'), ("call_T", "get_time", '{"tz": "U')],
                               split=3, repeat_id_name=True)
    turn = client_for(fake_server).complete("fake-model", USER)
    assert turn.finish_reason == "tool_calls" and turn.content is None
    assert turn.tool_calls == [ToolCall("call_W", "get_weather", '{"city":"X"}'), ToolCall("call_T", "get_time",
                                                                                           '{"tz": "U')]


def test_quirky_stream_over_http(fake_server: FakeServer, transport: str) -> None:
    fake_server.add_chunks([text_chunk("Hello"), {"choices": []}, {"choices": [{"index": 0}]}, text_chunk(" world"),
                            {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}])
    turn = client_for(fake_server).complete("fake-model", USER)
    assert (turn.content, turn.usage) == ("Hello world", Usage(9, 2, 11))


def test_a_server_rejecting_stream_options_is_asked_again_without_them(fake_server: FakeServer,
                                                                       transport: str) -> None:
    fake_server.add_error(400, message="Unrecognized request argument supplied: stream_options")
    client = client_for(fake_server)
    assert client.complete("fake-model", USER).content == "ok: hi"
    assert client.complete("fake-model", USER).content == "ok: hi"
    sent = [("stream_options" in body) for body in fake_server.requests]
    assert sent == [True, False, False]


def test_a_server_that_ignores_stream_true_is_read_as_one_chunk(fake_server: FakeServer, transport: str) -> None:
    message = {"role": "assistant", "content": "plain"}
    completion = {"choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    fake_server.add_error(200, body=completion)
    items = list(client_for(fake_server).stream("fake-model", USER))
    assert items == [TextDelta("plain"), ModelTurn("plain", [], Usage(1, 1, 2), "stop")]


@pytest.mark.parametrize(
    ("status", "error"),
    [(401, AuthenticationError), (403, AuthenticationError), (404, ModelNotFoundError), (400, BadRequestError),
     (422, BadRequestError), (409, ProviderError)],
)
def test_http_errors_map_to_chatflow_errors(fake_server: FakeServer, status: int, error: type, transport: str) -> None:
    fake_server.add_error(status, message=f"problem {status}", headers={"x-should-retry": "false"})
    with pytest.raises(error) as info:
        client_for(fake_server).complete("fake-model", USER)
    assert info.value.status_code == status
    assert f"HTTP {status}" in info.value.message and f"problem {status}" in info.value.message
    assert "\n" not in info.value.message and fake_server.url in info.value.message


def test_unknown_model_names_the_model(fake_server: FakeServer, transport: str) -> None:
    with FakeServer(strict_models=True, models=["real"]) as server:
        with pytest.raises(ModelNotFoundError, match="model 'nope' not found"):
            client_for(server).complete("nope", USER)


def test_429_retries_honour_retry_after_then_give_retry_at(fake_server: FakeServer, transport: str) -> None:
    for _ in range(2):
        fake_server.add_error(429, headers={"Retry-After": "1"}, message="slow down")
    client = client_for(fake_server, max_retries=1)
    before = time.time()
    with pytest.raises(RateLimitedError) as info:
        client.complete("fake-model", USER)
    log = fake_server.log
    assert len(log) == 2, "openai retried once"
    assert log[1].received_at - log[0].received_at >= 0.95, "the retry waited for Retry-After"
    assert info.value.status_code == 429 and "after 2 attempts" in info.value.message
    assert info.value.retry_at is not None and before + 1 <= info.value.retry_at <= time.time() + 1.5


def test_5xx_and_long_retry_after(fake_server: FakeServer, transport: str) -> None:
    for _ in range(3):
        fake_server.add_error(500, body="<html><head><title>502 Bad Gateway</title></head></html>",
                              headers={"retry-after-ms": "10"})
    with pytest.raises(RateLimitedError) as info:
        client_for(fake_server, max_retries=2).complete("fake-model", USER)
    assert len(fake_server.requests) == 3 and info.value.status_code == 500
    assert "HTML page (502 Bad Gateway)" in info.value.message and "<" not in info.value.message
    # a Retry-After beyond openai's 2-minute cap is not waited for: no retry, retry_at from the header
    fake_server.add_error(429, headers={"Retry-After": "600"})
    start = time.time()
    with pytest.raises(RateLimitedError) as info:
        client_for(fake_server, max_retries=2).complete("fake-model", USER)
    assert len(fake_server.requests) == 4
    assert start + 590 <= (info.value.retry_at or 0) <= time.time() + 600


def test_timeout_when_the_server_never_answers(fake_server: FakeServer, transport: str) -> None:
    fake_server.add_hang()
    with pytest.raises(ProviderTimeoutError, match="within 0.5 s"):
        client_for(fake_server, timeout=0.5).complete("fake-model", USER)


def test_timeout_between_chunks_ends_the_stream_with_a_broken_turn(fake_server: FakeServer, transport: str) -> None:
    fake_server.add_text("slow reply", chunks=["slow", " reply"], delay=[0, 0, 2.0])
    turn = client_for(fake_server, timeout=0.5).complete("fake-model", USER)
    assert (turn.content, turn.finish_reason, turn.interrupted) == ("slow", None, False)
    assert turn.verdict.state is ReplyState.BROKEN
    assert turn.verdict.reason == f"the reply did not finish (no data from {fake_server.url} for 0.5 s mid-reply)"


def test_a_connection_closed_mid_stream_ends_it_with_a_broken_turn(fake_server: FakeServer, transport: str) -> None:
    fake_server.add_chunks([text_chunk("Hel"), CLOSE])
    items = list(client_for(fake_server).stream("fake-model", USER))
    assert items[0] == TextDelta("Hel")
    turn = items[-1]
    assert isinstance(turn, ModelTurn) and turn.content == "Hel" and turn.verdict.state is ReplyState.BROKEN
    assert turn.broken is not None and turn.broken.startswith(f"the connection to {fake_server.url} closed mid-reply")


@pytest.mark.parametrize("hostile", ["html", "invalid_json", "error_event", "empty", "plain_text"])
def test_hostile_streams_are_provider_response_errors(fake_server: FakeServer, hostile: str, transport: str) -> None:
    if hostile == "html":
        fake_server.add_html()
    elif hostile == "invalid_json":
        fake_server.add_chunks([text_chunk("Hel"), INVALID_JSON])
    elif hostile == "error_event":
        fake_server.add_chunks([text_chunk("Hel"), {"error": {"message": "model overloaded"}}])
    elif hostile == "empty":
        fake_server.add_error(200, body="", headers={"Content-Type": "text/event-stream"})
    else:
        fake_server.add_error(200, body="hello, this is not an API")
    client = client_for(fake_server)
    stream = client.stream("fake-model", USER)
    with pytest.raises(ProviderResponseError) as info:
        for _ in stream:
            pass
    assert "\n" not in info.value.message and "<" not in info.value.message
    if hostile in ("invalid_json", "error_event"):
        assert stream.partial().content == "Hel" and stream.partial().interrupted


def test_connection_refused_is_a_network_error(transport: str) -> None:
    with pytest.raises(NetworkError) as info:
        ModelClient("http://127.0.0.1:9/v1", "sk-x", max_retries=0).complete("m", USER)
    assert not isinstance(info.value, ProviderTimeoutError)
    assert "cannot connect to http://127.0.0.1:9/v1" in info.value.message


def test_the_api_key_never_appears_in_errors_or_repr(transport: str) -> None:
    secret = "sk-SECRET-0123456789abcdef"
    with FakeServer(api_key="sk-the-right-one") as server:
        client = ModelClient(server.url, secret, max_retries=0, timeout=5)
        assert secret not in repr(client)
        with pytest.raises(AuthenticationError) as info:
            client.complete("fake-model", USER)
        assert secret not in str(info.value)
        assert server.log[0].headers["authorization"] == f"Bearer {secret}"
    with FakeServer() as server:  # a provider that echoes the key back
        server.add_error(401, message=f"Incorrect API key provided: {secret}. Bearer {secret}")
        server.add_error(500, body=f"upstream said Authorization: Bearer {secret}", headers={"x-should-retry": "false"})
        client = ModelClient(server.url, secret, max_retries=0, timeout=5)
        for expected in (AuthenticationError, RateLimitedError):
            with pytest.raises(expected) as info:
                client.complete("fake-model", USER)
            assert secret not in str(info.value) and "[redacted]" in str(info.value)
    with pytest.raises(NetworkError) as net:
        ModelClient(f"http://user:{secret}@127.0.0.1:9/v1", secret, max_retries=0).complete("m", USER)
    assert secret not in str(net.value)


def test_environment_fallback_and_placeholder_key(fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch,
                                                 transport: str) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", fake_server.url)
    assert ModelClient(None, None, max_retries=0).complete("fake-model", USER).content == "ok: hi"
    assert fake_server.log[-1].headers["authorization"] == f"Bearer {NO_KEY_PLACEHOLDER}"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    ModelClient(None, None, max_retries=0).complete("fake-model", USER)
    assert fake_server.log[-1].headers["authorization"] == "Bearer sk-from-env"
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        ModelClient(None, None).complete("gpt", USER)


def test_cancel_event_between_chunks_returns_the_partial_turn(fake_server: FakeServer, transport: str) -> None:
    fake_server.add_text("one two three four", chunks=["one", " two", " three", " four"])
    cancel = threading.Event()
    stream = client_for(fake_server).stream("fake-model", USER, cancel=cancel)
    seen = []
    for item in stream:
        seen.append(item)
        if item == TextDelta(" two"):
            cancel.set()
    assert seen[-1] == ModelTurn("one two", [], None, None, interrupted=True)
    assert stream.turn == seen[-1]


def test_cancel_from_another_thread_wakes_a_waiting_read(fake_server: FakeServer, transport: str) -> None:
    fake_server.add_chunks([text_chunk("first"), text_chunk(" late")], delay=[0.0, 4.0])
    stream = client_for(fake_server, timeout=30).stream("fake-model", USER)
    items = [next(stream)]
    assert items == [TextDelta("first")]
    timer = threading.Timer(0.3, stream.cancel)
    start = time.monotonic()
    timer.start()
    items += list(stream)
    elapsed = time.monotonic() - start
    timer.join()
    assert items[-1] == ModelTurn("first", [], None, None, interrupted=True)
    assert elapsed < 3.0, "cancel() must not wait for the next chunk (4 s away)"


def test_an_exception_while_iterating_leaves_the_partial_turn(fake_server: FakeServer, transport: str) -> None:
    fake_server.add_text("one two three", chunks=["one", " two", " three"])
    stream = client_for(fake_server).stream("fake-model", USER)
    with pytest.raises(KeyboardInterrupt):
        for item in stream:
            if item == TextDelta(" two"):
                raise KeyboardInterrupt
    assert stream.partial() == ModelTurn("one two", [], None, None, interrupted=True)


def test_list_models(fake_server: FakeServer) -> None:
    assert client_for(fake_server).list_models() == ["fake-model"]


def test_importing_the_module_does_not_import_openai() -> None:
    code = "import sys, chatflow_cli.core.model; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ModelClient("http://x/v1", "k", timeout=0)
    with pytest.raises(ValueError):
        ModelClient("http://x/v1", "k", max_retries=-1)


def test_messages_round_trip_through_the_wire(fake_server: FakeServer, transport: str) -> None:
    history = [Message.system("be brief"), Message.user("weather?"),
               Message.model(None, [ToolCall("call_W", "get_weather", '{"city":"X"}')]),
               Message.tool("call_W", "sunny"), Message.model("It is sunny."), Message.user("thanks")]
    client_for(fake_server).complete("fake-model", [m.to_wire() for m in history])
    assert json.loads(json.dumps(fake_server.requests[0]["messages"])) == [m.to_wire() for m in history]


def cancel_once_the_request_waits(server: FakeServer, cancel: Any, after: float = 0.3) -> dict[str, float]:
    """Call ``cancel()`` ``after`` seconds after the server received the request; returns
    ``{"at": monotonic time of the call}`` once it happened."""
    done: dict[str, float] = {}

    def run() -> None:
        wait_until(lambda: server.requests, what="the request to reach the server")
        time.sleep(after)  # the scenario: the client has been waiting this long
        done["at"] = time.monotonic()
        cancel()

    threading.Thread(target=run, daemon=True).start()
    return done


def request_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "chatflow-request" and t.is_alive()]


@pytest.mark.parametrize("how", ["cancel()", "event"])
def test_cancel_aborts_a_request_whose_server_never_sends_headers(fake_server: FakeServer, how: str,
                                                                  transport: str) -> None:
    """A hung server (no status line, no headers): cancelling ends the stream at once as an
    interrupted turn -- not at the 30 s read timeout --, the request's connection is shut
    (its thread ends) and openai does not retry it."""
    fake_server.add_hang()
    fake_server.add_text("a retry must not be sent")
    cancel = threading.Event()
    stream = client_for(fake_server, timeout=30, max_retries=2).stream("fake-model", USER, cancel=cancel)
    cancelled = cancel_once_the_request_waits(fake_server, stream.cancel if how == "cancel()" else cancel.set)
    items = list(stream)
    ended = time.monotonic()
    assert items == [ModelTurn(None, [], None, None, interrupted=True)]
    assert stream.turn == items[-1] and stream.partial().interrupted
    assert ended - cancelled["at"] < 1.0, f"the stream ended {ended - cancelled['at']:.1f} s after the cancel"
    wait_until(lambda: request_threads() == [], 2, "the pending request to be aborted, not left waiting")
    # retries are sent from the request's own thread: with it gone, none can follow
    assert len(fake_server.requests) == 1 and fake_server.pending == 1, "the cancelled request was retried"


def test_the_client_works_after_a_cancelled_pending_request(fake_server: FakeServer, transport: str) -> None:
    client = client_for(fake_server, timeout=30)
    fake_server.add_hang()
    stream = client.stream("fake-model", USER)
    cancel_once_the_request_waits(fake_server, stream.cancel, after=0.1)
    assert list(stream)[-1].interrupted
    fake_server.add_text("fine again")
    assert client.complete("fake-model", USER).content == "fine again"


def test_the_api_key_is_in_no_part_of_the_traceback_chain(transport: str) -> None:
    """Defect: the mapped error's message was redacted but ``__cause__`` (the openai error)
    still held the key the server echoed. The mapped error now carries no cause or context;
    the non-secret details (status code, request id) are on the chatflow error."""
    import traceback

    secret = "sk-ECHOED-0123456789abcdef"
    with FakeServer() as server:
        server.add_error(400, message=f"bad key {secret} in request",
                         headers={"x-should-retry": "false", "x-request-id": "req_123"})
        server.add_error(401, body=f"Authorization: Bearer {secret}", headers={"x-should-retry": "false"})
        client = ModelClient(server.url, secret, max_retries=0, timeout=5)
        for expected in (BadRequestError, AuthenticationError):
            with pytest.raises(expected) as info:
                client.complete("fake-model", USER)
            ex = info.value
            text = "".join(traceback.format_exception(ex))
            assert secret not in text
            assert ex.__cause__ is None and ex.__context__ is None
            assert "[redacted]" in ex.message
        assert info.value.status_code == 401
    with FakeServer() as server:
        server.add_error(400, message=f"bad key {secret}", headers={"x-should-retry": "false", "x-request-id": "req_123"})
        with pytest.raises(BadRequestError) as info:
            ModelClient(server.url, secret, max_retries=0, timeout=5).complete("fake-model", USER)
        assert info.value.request_id == "req_123" and "req_123" in info.value.message


@pytest.mark.parametrize("key", ["k", "test", "short7!"])
def test_short_keys_are_not_redacted_so_messages_stay_readable(key: str, transport: str) -> None:
    """Defect: a plain substring replace of key "k" turned "check" into "chec[redacted]".
    Only keys of at least 8 characters (REDACT_MIN_KEY_LEN) are redacted."""
    with FakeServer() as server:
        server.add_error(401, message="please check the test token", headers={"x-should-retry": "false"})
        with pytest.raises(AuthenticationError) as info:
            ModelClient(server.url, key, max_retries=0, timeout=5).complete("fake-model", USER)
    assert "please check the test token" in info.value.message
    assert "[redacted]" not in info.value.message


def test_long_keys_are_redacted_inside_words_too(transport: str) -> None:
    key = "sk-longkey-1234"
    with FakeServer() as server:
        server.add_error(401, message=f"token=<{key}> check", headers={"x-should-retry": "false"})
        with pytest.raises(AuthenticationError) as info:
            ModelClient(server.url, key, max_retries=0, timeout=5).complete("fake-model", USER)
    assert key not in info.value.message and "token=<[redacted]> check" in info.value.message
