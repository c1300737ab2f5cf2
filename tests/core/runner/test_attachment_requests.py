"""An image in a request: made base64 once, and on the http transport written into the body
as bytes (never a str of several MB, never scanned by the JSON encoder); the openai transport
and any other client get the URL as a str. What the server receives is the same."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

from chatflow_cli.core import attachments
from chatflow_cli.core._provider import http
from chatflow_cli.core.agents import Agent
from chatflow_cli.core.attachments import DataURL, attachment_from_bytes
from chatflow_cli.core.messages import Message
from chatflow_cli.core.model import TRANSPORTS, ModelClient
from chatflow_cli.core.runner import Runner
from tests.helpers.fakeserver import FakeServer

Image = pytest.importorskip("PIL.Image")
MODEL = "fake-model"


def png(size: tuple[int, int]) -> bytes:
    import io

    buffer = io.BytesIO()
    Image.new("RGB", size, (10, 200, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_image_reaches_the_server_and_only_openai_makes_its_url_a_str(
        transport: str, fake_server: FakeServer, make_runner: Callable[..., Runner],
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    real = DataURL.__str__

    def as_str(self: DataURL) -> str:
        made.append(self.media_type)
        return real(self)

    monkeypatch.setattr(DataURL, "__str__", as_str)
    data = png((40, 30))
    client = ModelClient(fake_server.url, "test-key", max_retries=0, timeout=20, transport=transport)
    runner = make_runner(Agent("A", "x", model=MODEL), model_client=client)
    fake_server.add_text("A green square.")
    fake_server.add_text("Still green.")
    runner.run("s", Message.user("what is it?", [attachment_from_bytes(data, "g.png")]))
    runner.run("s", "and now?")  # the image again, its bytes read back from the store
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    for request in fake_server.requests:
        [image] = [p for m in request["messages"] if isinstance(m["content"], list) for p in m["content"]
                   if p["type"] == "image_url"]
        assert image == {"type": "image_url", "image_url": {"url": url}}
    assert made == ([] if transport == "http" else ["image/png", "image/png"])
    assert not any("transfer-encoding" in r.headers for r in fake_server.log)  # its length said, not chunked
    client.close()


def test_a_client_that_does_not_say_it_takes_data_urls_gets_strs(
        fake_server: FakeServer, make_runner: Callable[..., Runner], client: ModelClient) -> None:
    seen: list[Any] = []

    class Plain:  # any object with stream(): no takes_data_urls
        def stream(self, model: str, messages: Any, *args: Any, **kwargs: Any) -> Any:
            seen.extend(messages)
            return client.stream(model, messages, *args, **kwargs)

    fake_server.add_text("ok")
    runner = make_runner(Agent("A", "x", model=MODEL), model_client=Plain())
    runner.run("p", Message.user("look", [attachment_from_bytes(png((2, 2)), "d.png")]))
    [part] = [p for m in seen if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"]
    assert type(part["image_url"]["url"]) is str and part["image_url"]["url"].startswith("data:image/png;base64,")


def test_the_request_body_is_byte_for_byte_the_json_of_the_urls_as_strs(monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = png((3, 3)), png((5, 1))
    message = Message.user("two pictures \u00e9 \"quoted\"", [attachment_from_bytes(one, "1.png"),
                                                            attachment_from_bytes(two, "2.png")])
    body = {"model": MODEL, "messages": [{"role": "system", "content": "</x>\n"}, message.to_wire(data_urls=True)],
            "stream": True}
    expected = json.dumps({**body, "messages": [body["messages"][0], message.to_wire()]},
                          ensure_ascii=False).encode("utf-8")
    assert b"".join(http.request_body(body)) == expected
    assert http.request_body({"model": MODEL}) == [b'{"model": "fake-model"}']
    # a body that holds the placeholder itself (it is random: made to collide here) is
    # written the slow way, and the same
    monkeypatch.setattr(http.os, "urandom", lambda n: b"\x00" * n)
    clash = {**body, "metadata": {"note": "chatflow-data-url-" + "00" * 8}}
    assert http.request_body(clash) == [json.dumps(
        {**clash, "messages": [body["messages"][0], message.to_wire()]}, ensure_ascii=False).encode("utf-8")]
    with pytest.raises(TypeError, match="not JSON serializable"):
        http.request_body({"x": object()})
    assert attachments.DataURL("image/gif", b"R0lG").prefix == b"data:image/gif;base64,"


def test_a_retried_request_sends_the_image_pieces_again(fake_server: FakeServer) -> None:
    data = png((4, 4))
    fake_server.add_error(503, {"error": {"message": "busy", "type": "server_error"}})
    fake_server.add_text("seen")
    client = ModelClient(fake_server.url, "test-key", max_retries=1, timeout=20, transport="http")
    wire = Message.user("x", [attachment_from_bytes(data, "r.png")]).to_wire(data_urls=True)
    assert client.complete(MODEL, [wire]).content == "seen"
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert [r["messages"][0]["content"][1]["image_url"]["url"] for r in fake_server.requests] == [url, url]
    client.close()


class _EmbeddedModelClient(ModelClient):
    """A client on the fake server that says it is the embedded model, as the local one does."""

    local = True


def test_an_image_to_the_embedded_model_is_refused_before_anything_is_sent_or_stored(
        fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any) -> None:
    """Every way a message reaches the Runner (chat -f, the REPL's /attach and /retry, the
    library) meets the one check: nothing is sent, nothing stored; a text file still goes."""
    from chatflow_cli.core.errors import ImagesNotAcceptedError

    client = _EmbeddedModelClient(fake_server.url, "test-key", max_retries=0, timeout=20)
    runner = make_runner(Agent("A", "x", model=MODEL), model_client=client)
    image = attachment_from_bytes(png((8, 8)), "g.png")
    with pytest.raises(ImagesNotAcceptedError, match="reads text only") as caught:
        runner.run("s", Message.user("what is it?", [image]))
    assert caught.value.exit_code == 5
    assert fake_server.requests == [] and sqlite_store.list_sessions() == []
    fake_server.add_text("A note.")
    result = runner.run("s", Message.user("read it", [attachment_from_bytes(b"hello\n", "n.txt")]))
    assert result.final_output == "A note." and len(fake_server.requests) == 1
    client.close()
