"""The fake provider itself: its replies over real HTTP and the 400 rules of a real provider."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fakeserver import FakeServer, validate_messages

ROOT = Path(__file__).resolve().parent.parent


def post(url: str, body: Any, *, headers: dict[str, str] | None = None, timeout: float = 5) -> tuple[int, dict, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + "/chat/completions", data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def sse_payloads(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": list(messages), **extra}


U = {"role": "user", "content": "hi"}


def test_default_reply_echoes_last_user_message(fake_server: FakeServer) -> None:
    messages = ({"role": "system", "content": "s"}, {"role": "user", "content": "ping"})
    status, _, body = post(fake_server.url, chat(*messages))
    assert status == 200
    reply = json.loads(body)
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "ok: ping"}
    assert reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"]
    assert fake_server.requests[0]["messages"][-1]["content"] == "ping"


def test_streamed_text_with_and_without_usage(fake_server: FakeServer) -> None:
    fake_server.add_text("Hello world", chunks=["Hel", "lo", " world"])
    fake_server.add_text("Hello world", chunks=["Hello world"])
    status, headers, raw = post(fake_server.url, chat(U, stream=True, stream_options={"include_usage": True}))
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_payloads(raw)
    assert events[-1] == "[DONE]"
    text = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])
    assert text == "Hello world"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] > 0
    _, _, raw = post(fake_server.url, chat(U, stream=True))
    assert all("usage" not in e for e in sse_payloads(raw)[:-1])


def test_scripted_replies_are_consumed_in_order(fake_server: FakeServer) -> None:
    fake_server.add_text("one")
    fake_server.add_text("two")
    answers = [json.loads(post(fake_server.url, chat(U))[2])["choices"][0]["message"]["content"] for _ in range(3)]
    assert answers == ["one", "two", "ok: hi"]
    assert fake_server.pending == 0


def test_tool_calls_stream_with_repeated_ids_like_llama_cpp(fake_server: FakeServer) -> None:
    fake_server.add_tool_calls([("call_W", "get_weather", '{"city":"Lisbon"}')], split=4, repeat_id_name=True)
    _, _, raw = post(fake_server.url, chat(U, stream=True))
    deltas = [tc for e in sse_payloads(raw)[:-1] for c in e["choices"] for tc in c["delta"].get("tool_calls", [])]
    assert len(deltas) == 4
    assert all(d["id"] == "call_W" and d["function"]["name"] == "get_weather" for d in deltas)
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city":"Lisbon"}'
    # the same reply, not streamed, is one merged message
    fake_server.add_tool_calls([("call_1", "f", "not json"), ("call_2", "g", "{}")], split=3)
    msg = json.loads(post(fake_server.url, chat(U))[2])["choices"][0]
    assert msg["finish_reason"] == "tool_calls"
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg["message"]["tool_calls"]] == [
        ("call_1", "f", "not json"), ("call_2", "g", "{}")]


def test_http_errors_carry_status_body_and_headers(fake_server: FakeServer) -> None:
    fake_server.add_error(429, headers={"Retry-After": "7"}, message="slow down")
    fake_server.add_error(500, body="boom")
    status, headers, body = post(fake_server.url, chat(U))
    assert status == 429 and headers["Retry-After"] == "7"
    assert json.loads(body)["error"]["message"] == "slow down"
    status, _, body = post(fake_server.url, chat(U))
    assert (status, body) == (500, b"boom")


def test_api_key_and_strict_models() -> None:
    with FakeServer(api_key="sk-right", strict_models=True, models=["a"]) as server:
        assert post(server.url, chat(U))[0] == 401
        assert post(server.url, chat(U), headers={"Authorization": "Bearer sk-wrong"})[0] == 401
        status, _, body = post(server.url, chat(U), headers={"Authorization": "Bearer sk-right"})
        assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
        ok = post(server.url, {**chat(U), "model": "a"}, headers={"Authorization": "Bearer sk-right"})
        assert ok[0] == 200
        req = urllib.request.Request(server.url + "/models", headers={"Authorization": "Bearer sk-right"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert [m["id"] for m in json.load(resp)["data"]] == ["a"]
        assert [r.status for r in server.log] == [401, 401, 404, 200, 200]


def test_reset_is_a_fresh_server_on_the_same_port() -> None:
    """``reset`` (the shared_fake_server fixture between tests): records, queued replies and
    changed settings are gone, and a reply left hanging is released at once."""
    with FakeServer(models=["a"]) as server:
        url = server.url
        server.add_hang()
        answers: list[int] = []
        hung = threading.Thread(target=lambda: answers.append(post(url, chat(U), timeout=30)[0]))
        hung.start()
        while not server.requests:
            threading.Event().wait(0.01)
        server.add_text("queued")
        server.api_key, server.strict_models, server.reply_delay = "sk-x", True, 5.0
        server.models.append("b")
        server.reset()
        hung.join(timeout=5)
        assert not hung.is_alive() and answers == [503], "the hanging reply was not released"
        assert (server.url, server.requests, server.log, server.pending) == (url, [], [], 0)
        assert (server.api_key, server.strict_models, server.reply_delay, server.models) == (None, False, 0.0, ["a"])
        status, _, body = post(url, chat(U))
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "ok: hi"


def test_html_page_and_hang(fake_server: FakeServer) -> None:
    fake_server.add_html()
    status, headers, body = post(fake_server.url, chat(U, stream=True))
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"<html>" in body
    fake_server.add_hang()
    with pytest.raises(TimeoutError):
        post(fake_server.url, chat(U), timeout=0.3)


def test_invalid_json_and_close_midstream(fake_server: FakeServer) -> None:
    fake_server.add_invalid_json()
    _, _, raw = post(fake_server.url, chat(U, stream=True))
    with pytest.raises(ValueError):
        sse_payloads(raw)
    fake_server.add_close_midstream(after=["Hel"])
    with pytest.raises(http.client.IncompleteRead) as info:
        post(fake_server.url, chat(U, stream=True))
    assert b'"Hel"' in info.value.partial and b"[DONE]" not in info.value.partial


def test_requests_are_recorded_from_many_threads(fake_server: FakeServer) -> None:
    def worker(k: int) -> None:
        for j in range(5):
            post(fake_server.url, chat({"role": "user", "content": f"{k}-{j}"}))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = sorted(r["messages"][0]["content"] for r in fake_server.requests)
    assert seen == sorted(f"{k}-{j}" for k in range(8) for j in range(5))


# -- the 400 rules ----------------------------------------------------------------------
A_CALLS = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_W", "type": "function", "function": {"name": "w", "arguments": "{}"}},
    {"id": "call_T", "type": "function", "function": {"name": "t", "arguments": "{}"}}]}
T_W = {"role": "tool", "tool_call_id": "call_W", "content": "sunny"}
T_T = {"role": "tool", "tool_call_id": "call_T", "content": "noon"}

VALID = [
    [U],
    [{"role": "system", "content": "s"}, U, {"role": "assistant", "content": "a"}, U],
    [U, A_CALLS, T_W, T_T, {"role": "assistant", "content": "done"}, U],
    [U, A_CALLS, T_T, T_W],  # results in any order, only tool messages in between
]
INVALID = {
    "empty": [],
    "unknown role": [{"role": "robot", "content": "x"}],
    "first is assistant": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}, U],
    "tool without call": [U, T_W],
    "tool after plain assistant": [U, {"role": "assistant", "content": "a"}, T_W],
    "tool after a user message": [U, A_CALLS, T_W, T_T, U, T_W],
    "unanswered call before user": [U, A_CALLS, T_W, U],
    "unanswered call at end": [U, A_CALLS, T_W],
    "answered twice": [U, A_CALLS, T_W, T_W, T_T],
    "tool separated by assistant": [U, A_CALLS, {"role": "assistant", "content": "x"}, T_W, T_T],
}


@pytest.mark.parametrize("messages", VALID)
def test_valid_message_lists_are_accepted(fake_server: FakeServer, messages: list[dict[str, Any]]) -> None:
    assert validate_messages(messages) is None
    assert post(fake_server.url, chat(*messages))[0] == 200


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_message_lists_get_openai_style_400(fake_server: FakeServer, case: str) -> None:
    fake_server.add_text("scripted")
    status, _, body = post(fake_server.url, chat(*INVALID[case]))
    assert status == 400
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and "messages" in error["param"]
    assert fake_server.pending == 1, "a refused request must not consume a scripted reply"
    assert fake_server.requests[-1]["messages"] == INVALID[case]


@pytest.mark.parametrize("module", ["tests.helpers.fakeserver", "tests.fakeserver"])
def test_command_line_server_serves_a_script(tmp_path: Path, module: str) -> None:
    """``python -m tests.helpers.fakeserver``, and the older ``python -m tests.fakeserver``."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"type": "text", "text": "from a script"}, {"type": "error", "status": 401}]))
    proc = subprocess.Popen([sys.executable, "-m", module, "--port", "0", "--script", str(script)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert json.loads(post(url, chat(U))[2])["choices"][0]["message"]["content"] == "from a script"
        assert post(url, chat(U))[0] == 401
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        proc.stdout.close()  # type: ignore[union-attr]


def test_image_parts_are_checked_as_a_provider_checks_them(fake_server: FakeServer) -> None:
    """An ``image_url`` part must hold a base64 data URL of a real image, in a user message;
    a model without vision refuses it. Each broken case is a 400 that names the part."""
    import base64
    import io

    image = pytest.importorskip("PIL.Image")
    buffer = io.BytesIO()
    image.new("RGB", (4, 4)).save(buffer, format="PNG")
    png = base64.b64encode(buffer.getvalue()).decode()

    def user(url: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [{"type": "text", "text": "see"},
                                             {"type": "image_url", "image_url": {"url": url}}]}]

    ok, _, _ = post(fake_server.url, {"model": "fake-model", "messages": user(f"data:image/png;base64,{png}")})
    assert ok == 200
    for url, model, words in [
        (f"data:image/png;base64,{png[:-9]}!!", "fake-model", "Invalid base64"),
        ("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode(), "fake-model",
         "unsupported image"),
        (f"data:image/jpeg;base64,{png}", "fake-model", "unsupported image"),  # a PNG called a JPEG
        (f"data:text/plain;base64,{png}", "fake-model", "Invalid image URL"),
        (f"data:image/png;base64,{png}", "fake-text-only", "only supported by certain models"),
    ]:
        status, _, body = post(fake_server.url, {"model": model, "messages": user(url)})
        error = json.loads(body)["error"]
        assert status == 400 and words in error["message"] and error["param"] == "messages.[0].content.[1]", url
