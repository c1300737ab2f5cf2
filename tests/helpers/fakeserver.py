"""A fake OpenAI-compatible Chat Completions server for tests, over real HTTP on 127.0.0.1.

Built on werkzeug's threaded WSGI server (Nagle's algorithm off, so each SSE event leaves
at once). It serves:

* ``POST /v1/chat/completions`` -- the next scripted reply, streamed as SSE when the body
  has ``"stream": true`` (with a final usage-only chunk when
  ``stream_options.include_usage`` is true), or as one JSON completion otherwise;
* ``GET /v1/models`` -- the models the server was given.

Use it as a context manager or through the ``fake_server`` pytest fixture::

    with FakeServer() as server:
        server.add_text("Hello world", chunks=["Hello", " world"])
        server.add_tool_calls([("call_W", "get_weather", '{"city":"X"}')])
        client = openai.OpenAI(base_url=server.url, api_key="test")
        ...
        assert server.requests[0]["messages"][-1]["content"] == "hi"

Replies are consumed in order, one per valid chat request. When the queue is empty the
server answers ``"ok: <last user message>"`` so many-turn tests need no script, after
``reply_delay`` seconds (0 unless set: a model that takes its time).

Like a real provider (issue 2), a request whose message list is invalid is refused with
HTTP 400 and an OpenAI-style error body *before* a scripted reply is consumed: unknown
roles, a first non-system message that is not ``user``, a ``tool`` message that does not
answer an id of the nearest preceding assistant ``tool_calls`` (with only tool messages in
between), a tool call answered twice, assistant ``tool_calls`` left unanswered before
the next non-tool message or the end of the list, an assistant message with neither text
nor tool calls (content ``""`` or ``null``: Anthropic-compatible gateways refuse it), and
tool-call ``arguments`` that are not the text of a JSON object (vLLM parses them). Content
parts are checked as OpenAI checks them (:func:`validate_content_parts`): an ``image_url``
part must hold a base64 ``data:`` URL of a real image (decoded with Pillow), in a user
message; a model named in :data:`TEXT_ONLY_MODELS` refuses images as a model without vision
does.

Replies that did not finish, as real servers send them on a bad day: ``finish_reason``
``length``/``content_filter`` (``add_text(..., finish_reason=...)``, also on tool calls),
no finish reason at all (``finish_reason=None``), no ``data: [DONE]`` (``done=False``), a
connection closed mid-stream (``CLOSE``), several calls all at ``index`` 0
(``add_tool_calls(..., same_index=True)``, as Ollama does) and ``reasoning_content``
deltas (``add_reasoning``).

Hostile behaviours for issue 7 (each is a scripted reply): HTTP errors with any status,
body and headers; per-chunk delays; a reply that never comes (``add_hang``); invalid JSON
in an SSE event; a connection closed mid-stream; HTTP 200 with an HTML page; tool
arguments that are not JSON (just pass them to ``add_tool_calls``); and raw chunk lists
for the quirks of real servers (empty ``choices``, no ``delta``, ``content: null``,
usage-only chunks, ``id``/``name`` repeated in every chunk as llama.cpp does).

From another process: ``python -m tests.helpers.fakeserver --port 0 --script script.json`` prints
the base URL on its first stdout line and serves until SIGTERM/SIGINT. The script is a JSON
list of reply specs, e.g. ``[{"type": "text", "text": "Hi", "chunks": ["H", "i"]},
{"type": "tool_calls", "calls": [["call_1", "f", "{}"]]}, {"type": "error", "status": 500}]``
(see :func:`reply_from_spec`).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from werkzeug.serving import WSGIRequestHandler, make_server

__all__ = [
    "DEFAULT_MODEL",
    "FakeServer",
    "RecordedRequest",
    "Reply",
    "fake_server",
    "reply_from_spec",
    "validate_content_parts",
    "validate_messages",
]

DEFAULT_MODEL = "fake-model"
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_SYSTEM_ROLES = frozenset({"system", "developer"})

# Marker objects usable inside raw chunk lists (``add_chunks``).
INVALID_JSON = object()  #: an SSE event whose data is not JSON
CLOSE = object()  #: drop the connection right here, mid-stream


# --------------------------------------------------------------------------------------
# message-list validation (what a real provider refuses)
# --------------------------------------------------------------------------------------
def validate_messages(messages: Any) -> tuple[str, str] | None:
    """Return ``(problem, param)`` for the first rule ``messages`` breaks, or ``None``.

    The rules are those of a real Chat Completions provider (issue 2); ``param`` names the
    offending field the way OpenAI's error bodies do (``messages.[3].role``).
    """
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array.", "messages"
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            return f"Invalid type for 'messages[{i}]': expected an object.", f"messages.[{i}]"
        if msg.get("role") not in KNOWN_ROLES:
            return f"Invalid value for 'messages[{i}].role': {msg.get('role')!r}.", f"messages.[{i}].role"
    first = next((i for i, m in enumerate(messages) if m["role"] not in _SYSTEM_ROLES), None)
    if first is not None and messages[first]["role"] != "user":
        return (
            f"The first non-system message must be a user message; messages[{first}] is "
            f"{messages[first]['role']!r}.",
            f"messages.[{first}].role",
        )
    open_ids: list[str] = []  # tool_call ids of the nearest assistant message still unanswered
    open_from: int | None = None
    seen: set[str] = set()
    for i, msg in enumerate(messages):
        role = msg["role"]
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id not in open_ids:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                    f"with 'tool_calls'; messages[{i}] answers {call_id!r}.",
                    f"messages.[{i}].role",
                )
            open_ids.remove(call_id)
            continue
        if open_ids:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: "
                f"{', '.join(open_ids)} (messages[{open_from}]).",
                f"messages.[{open_from}].role",
            )
        open_ids, open_from = [], None
        if role == "assistant":
            calls = msg.get("tool_calls") or []
            if not isinstance(calls, list):
                return f"Invalid type for 'messages[{i}].tool_calls'.", f"messages.[{i}].tool_calls"
            for call in calls:
                call_id = call.get("id") if isinstance(call, dict) else None
                if not isinstance(call_id, str) or not call_id:
                    return f"Missing 'messages[{i}].tool_calls[].id'.", f"messages.[{i}].tool_calls"
                if call_id in seen:
                    return f"Duplicate tool_call id {call_id!r} in messages[{i}].", f"messages.[{i}].tool_calls"
                seen.add(call_id)
                open_ids.append(call_id)
            open_from = i
            for k, call in enumerate(calls):
                arguments = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
                try:
                    parsed = json.loads(arguments) if isinstance(arguments, str) else None
                except ValueError:
                    parsed = None
                if not isinstance(parsed, dict):
                    return (f"Invalid 'messages[{i}].tool_calls[{k}].function.arguments': expected the text of a JSON "
                            f"object, got {arguments!r}.", f"messages.[{i}].tool_calls")
            content = msg.get("content")
            if not calls and (content is None or (isinstance(content, str) and not content.strip())):
                return (f"messages[{i}]: an assistant message needs non-empty 'content' or 'tool_calls'.",
                        f"messages.[{i}]")
    if open_ids:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(open_ids)} "
            f"(messages[{open_from}]).",
            f"messages.[{open_from}].role",
        )
    return None


#: Models the fake server serves that take no images: a request to one with an ``image_url``
#: part gets OpenAI's 400 for a model without vision.
TEXT_ONLY_MODELS = frozenset({"fake-text-only"})

_IMAGE_MAGIC = {"image/png": (b"\x89PNG\r\n\x1a\n",), "image/jpeg": (b"\xff\xd8\xff",),
                "image/gif": (b"GIF87a", b"GIF89a"), "image/webp": (b"RIFF",)}


def _decodes_as_image(media_type: str, data: bytes) -> bool:
    """The bytes are a real image of ``media_type``: Pillow decodes them when it is installed
    (the test extra), else the file's magic bytes are checked."""
    if not any(data.startswith(magic) for magic in _IMAGE_MAGIC.get(media_type, ())):
        return False
    try:
        from io import BytesIO

        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is in the test extra
        return True
    try:
        with Image.open(BytesIO(data)) as image:
            image.load()
            return (image.format or "").lower() == media_type.split("/")[1]
    except Exception:
        return False


def validate_content_parts(messages: list[Any], model: str | None = None) -> tuple[str, str] | None:
    """Return ``(problem, param)`` for the first content part a real provider refuses.

    A list ``content`` holds ``{"type": "text", "text": str}`` parts and, in a user message
    only, ``{"type": "image_url", "image_url": {"url": ...}}`` parts whose URL is a base64
    ``data:image/<png|jpeg|gif|webp>;base64,...`` URL of a real image of that type (or an
    ``https://`` URL); a model in :data:`TEXT_ONLY_MODELS` refuses every image part.
    """
    import base64
    import binascii

    for i, msg in enumerate(messages):
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for k, part in enumerate(content):
            param = f"messages.[{i}].content.[{k}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    return f"Invalid type for 'messages[{i}].content[{k}].text': expected a string.", param
                continue
            if kind != "image_url":
                return (f"Invalid value: {kind!r}. Supported values are: 'text' and 'image_url'.", f"{param}.type")
            if msg.get("role") != "user":
                return (f"Invalid 'messages[{i}]': image_url content parts are only allowed in user messages.",
                        param)
            if model in TEXT_ONLY_MODELS:
                return ("Invalid content type. image_url is only supported by certain models.", param)
            url = (part.get("image_url") or {}).get("url") if isinstance(part.get("image_url"), dict) else None
            if not isinstance(url, str):
                return f"Missing required parameter: 'messages[{i}].content[{k}].image_url.url'.", param
            if url.startswith("https://"):
                continue
            head, comma, payload = url.partition(",")
            media_type = head[5:].removesuffix(";base64") if head.startswith("data:") else ""
            if not comma or not head.endswith(";base64") or media_type not in _IMAGE_MAGIC:
                return ("Invalid image URL: expected a base64-encoded data URL with an image MIME type "
                        "(e.g. 'data:image/png;base64,...').", param)
            try:
                data = base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                return "Invalid base64 image data.", param
            if not _decodes_as_image(media_type, data):
                return ("You uploaded an unsupported image. Please make sure your image is valid and of type "
                        f"{media_type}.", param)
    return None


def _openai_error(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
                  code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# --------------------------------------------------------------------------------------
# scripted replies
# --------------------------------------------------------------------------------------
@dataclass
class Reply:
    """One scripted answer to a chat request.

    Fields:
        kind: ``"stream"`` (chunk events; also rendered as one JSON completion when the
            request is not streaming), ``"error"``, ``"hang"`` or ``"html"``.
        events: for ``stream``, the ``delta``-level chunk payloads: each is a dict (a full
            chunk object: ``choices`` etc.), ``INVALID_JSON`` or ``CLOSE``.
        delay: seconds to sleep before each event, or a list: ``delay[i]`` before event
            ``i`` (0 after the list ends); a non-streamed body waits for the sum.
        status, body, headers: for ``error`` and ``html``.
        usage: the usage object reported (streamed only when ``include_usage`` asked).
        report_usage: False leaves the usage chunk out of a stream even when ``include_usage``
            asked for it (llama-cpp-python's server sends none).
        gate: when set, a streamed reply sends event ``gate_at`` (0: its first) only once the
            gate is set (a model that answers, or goes on, when the test says so).
    """

    kind: str = "stream"
    events: list[Any] = field(default_factory=list)
    delay: float | Sequence[float] = 0.0
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    gate: threading.Event | None = None
    gate_at: int = 0
    report_usage: bool = True  # False: no usage chunk even when asked, as llama-cpp-python's server streams


def _chunk(delta: dict[str, Any] | None, finish_reason: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason}
    if delta is not None:
        choice["delta"] = delta
    return {"choices": [choice]}


def _text_events(chunks: Sequence[str], finish_reason: str | None = "stop") -> list[Any]:
    events: list[Any] = [_chunk({"role": "assistant", "content": ""})]
    events += [_chunk({"content": piece}) for piece in chunks]
    if finish_reason is not None:
        events.append(_chunk({}, finish_reason))
    return events


def _split(text: str, parts: int) -> list[str]:
    if parts <= 1 or len(text) <= 1:
        return [text]
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _tool_call_events(
    calls: Sequence[tuple[str, str, str]],
    *,
    content: str | None,
    split: int,
    repeat_id_name: bool,
    finish_reason: str | None = "tool_calls",
    same_index: bool = False,
) -> list[Any]:
    events: list[Any] = [_chunk({"role": "assistant", "content": content})]
    for index, (call_id, name, arguments) in enumerate(calls):
        for k, piece in enumerate(_split(arguments, split) or [""]):
            head = k == 0 or repeat_id_name
            call: dict[str, Any] = {"index": 0 if same_index else index}
            function: dict[str, Any] = {"arguments": piece}
            if head:
                call["id"] = call_id
                call["type"] = "function"
                function["name"] = name
            call["function"] = function
            events.append(_chunk({"tool_calls": [call]}))
    if finish_reason is not None:
        events.append(_chunk({}, finish_reason))
    return events


def _usage_for(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _count_prompt_tokens(body: dict[str, Any]) -> int:
    words = 0
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            words += len(content.split())
        words += 3
    return words


def _merge_events(events: Iterable[Any]) -> tuple[str | None, list[dict[str, Any]], str | None]:
    """Fold chunk events into (content, tool_calls, finish_reason) for a non-streamed reply."""
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for event in events:
        if not isinstance(event, dict):
            continue
        for choice in event.get("choices") or []:
            finish = choice.get("finish_reason") or finish
            delta = choice.get("delta") or {}
            if delta.get("content"):
                text.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                key = tc.get("index", 0)
                if key in calls and tc.get("id") and calls[key]["id"] not in ("", tc["id"]):
                    key = max(calls) + 1  # a new call at a reused index
                slot = calls.setdefault(
                    key, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] = fn["name"]
                slot["function"]["arguments"] += fn.get("arguments") or ""
    return ("".join(text) if text else None), [calls[i] for i in sorted(calls)], finish


def reply_from_spec(spec: dict[str, Any]) -> Reply:
    """Build a :class:`Reply` from a JSON spec (the ``--script`` file format).

    ``{"type": "text", "text": str, "chunks": [str]?, "delay": float?, "finish_reason": str | null?,
    "done": bool?, "usage": {...}?}`` (``usage`` also for ``reasoning``: the usage reported),
    ``{"type": "tool_calls", "calls": [[id, name, arguments]], "content": str?, "split": int?,
    "repeat_id_name": bool?, "same_index": bool?, "finish_reason": str | null?}``,
    ``{"type": "reasoning", "reasoning": [str], "text": str?, "finish_reason": str?}``,
    ``{"type": "chunks", "chunks": [dict | "INVALID_JSON" | "CLOSE"], "done": bool?}``,
    ``{"type": "error", "status": int, "body": any?, "headers": {}?}``, ``{"type": "hang"}``,
    ``{"type": "html"}``.
    """
    kind = spec.get("type")
    raw_delay = spec.get("delay", 0.0)
    delay: float | list[float] = [float(d) for d in raw_delay] if isinstance(raw_delay, list) else float(raw_delay)
    done = bool(spec.get("done", True))
    if kind == "text":
        return FakeServer.make_text(spec["text"], chunks=spec.get("chunks"), delay=delay,
                                    finish_reason=spec.get("finish_reason", "stop"), done=done, usage=spec.get("usage"))
    if kind == "tool_calls":
        return FakeServer.make_tool_calls(
            [tuple(c) for c in spec["calls"]],  # type: ignore[misc]
            content=spec.get("content"),
            split=int(spec.get("split", 1)),
            repeat_id_name=bool(spec.get("repeat_id_name", False)),
            delay=delay,
            finish_reason=spec.get("finish_reason", "tool_calls"),
            same_index=bool(spec.get("same_index", False)),
        )
    if kind == "reasoning":
        return FakeServer.make_reasoning(spec["reasoning"], text=spec.get("text"),
                                         finish_reason=spec.get("finish_reason", "stop"), usage=spec.get("usage"))
    if kind == "chunks":
        markers = {"INVALID_JSON": INVALID_JSON, "CLOSE": CLOSE}
        events = [markers.get(c, c) if isinstance(c, str) else c for c in spec["chunks"]]
        if not done:
            events.append(_NO_DONE)
        return Reply(events=events, delay=delay, usage=spec.get("usage"))
    if kind == "error":
        return Reply(kind="error", status=int(spec["status"]), body=spec.get("body"),
                     headers=dict(spec.get("headers") or {}))
    if kind == "hang":
        return Reply(kind="hang")
    if kind == "html":
        return Reply(kind="html", status=int(spec.get("status", 200)))
    raise ValueError(f"unknown reply type {kind!r}")


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request the server received: ``method``, ``path``, ``headers`` (lower-case
    names), ``body`` (parsed JSON, or ``None``), ``status`` (what the server answered) and
    ``received_at`` (``time.monotonic()`` when it arrived)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int
    received_at: float = 0.0


# --------------------------------------------------------------------------------------
# the server
# --------------------------------------------------------------------------------------
class _QuietHandler(WSGIRequestHandler):
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class FakeServer:
    """A scripted OpenAI-compatible server on ``127.0.0.1`` (see the module docstring).

    Args:
        models: model ids listed by ``GET /v1/models``.
        strict_models: answer HTTP 404 (``model_not_found``) for a chat request naming a
            model not in ``models``.
        api_key: when set, requests without ``Authorization: Bearer <api_key>`` get HTTP 401.
        port: 0 picks a free port.
        validate: refuse invalid message lists with HTTP 400 (on by default).

    Attributes:
        url: base URL ending in ``/v1`` (``http://127.0.0.1:<port>/v1``).
        requests: JSON bodies of every chat request received, valid or not, in order.
        log: every request as :class:`RecordedRequest` (headers, status answered).
    """

    def __init__(
        self,
        *,
        models: Sequence[str] = (DEFAULT_MODEL,),
        strict_models: bool = False,
        api_key: str | None = None,
        port: int = 0,
        validate: bool = True,
    ) -> None:
        self._settings = (list(models), strict_models, api_key, validate)
        self.models = list(models)
        self.strict_models = strict_models
        self.api_key = api_key
        self.validate = validate
        self.reply_delay = 0.0  # seconds before the first event of an unscripted reply
        self._lock = threading.Lock()
        self._replies: deque[Reply] = deque()
        self._requests: list[Any] = []
        self._log: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._server = make_server("127.0.0.1", port, self._app, threaded=True, request_handler=_QuietHandler)
        self.port: int = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> "FakeServer":
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fakeserver", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; hanging replies are released. Idempotent."""
        self._stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- records ------------------------------------------------------------------------
    @property
    def requests(self) -> list[Any]:
        with self._lock:
            return list(self._requests)

    @property
    def log(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._log)

    @property
    def pending(self) -> int:
        """How many scripted replies are still queued."""
        with self._lock:
            return len(self._replies)

    def clear(self) -> None:
        """Forget recorded requests and queued replies."""
        with self._lock:
            self._requests.clear()
            self._log.clear()
            self._replies.clear()

    def reset(self) -> None:
        """Back to the state of a server just started on the same port: records and queued
        replies forgotten, hanging and delayed replies released, the constructor's settings
        and ``reply_delay`` restored (the :func:`shared_fake_server` fixture between tests)."""
        with self._lock:
            self._requests.clear()
            self._log.clear()
            self._replies.clear()
            released, self._stopping = self._stopping, threading.Event()
            models, self.strict_models, self.api_key, self.validate = self._settings
            self.models = list(models)
            self.reply_delay = 0.0
        released.set()

    # -- scripting ----------------------------------------------------------------------
    def add(self, reply: Reply) -> Reply:
        with self._lock:
            self._replies.append(reply)
        return reply

    @staticmethod
    def make_text(text: str, *, chunks: Sequence[str] | None = None, delay: float | Sequence[float] = 0.0,
                  finish_reason: str | None = "stop", done: bool = True,
                  usage: dict[str, Any] | None = None) -> Reply:
        pieces = list(chunks) if chunks is not None else _split_words(text)
        if "".join(pieces) != text:
            raise ValueError("chunks must join to text")
        events = _text_events(pieces, finish_reason)
        if not done:
            events.append(_NO_DONE)
        return Reply(events=events, delay=delay, usage=usage)

    @staticmethod
    def make_tool_calls(calls: Sequence[tuple[str, str, str]], *, content: str | None = None, split: int = 1,
                        repeat_id_name: bool = False, delay: float | Sequence[float] = 0.0,
                        finish_reason: str | None = "tool_calls", same_index: bool = False) -> Reply:
        return Reply(
            events=_tool_call_events(calls, content=content, split=split, repeat_id_name=repeat_id_name,
                                     finish_reason=finish_reason, same_index=same_index),
            delay=delay,
        )

    @staticmethod
    def make_reasoning(reasoning: Sequence[str], *, text: str | None = None,
                       finish_reason: str | None = "stop", usage: dict[str, Any] | None = None) -> Reply:
        events: list[Any] = [_chunk({"role": "assistant", "content": None})]
        events += [_chunk({"content": None, "reasoning_content": piece}) for piece in reasoning]
        if text:
            events += [_chunk({"content": piece, "reasoning_content": None}) for piece in _split_words(text)]
        if finish_reason is not None:
            events.append(_chunk({}, finish_reason))
        return Reply(events=events, usage=usage)

    def add_text(self, text: str, *, chunks: Sequence[str] | None = None, delay: float | Sequence[float] = 0.0,
                 finish_reason: str | None = "stop", done: bool = True, usage: dict[str, Any] | None = None) -> Reply:
        """Queue a text reply; ``chunks`` (default: word by word) must join to ``text``;
        ``delay`` seconds before each event (event 0 is the ``role`` chunk, then one per
        chunk, then the finish chunk). ``finish_reason=None`` sends no finish chunk at all
        (a reply that never finished); ``done=False`` leaves out ``data: [DONE]``. ``usage``:
        the usage object reported instead of the counted one (e.g. with
        ``completion_tokens_details.reasoning_tokens``, as OpenAI's reasoning models report)."""
        return self.add(self.make_text(text, chunks=chunks, delay=delay, finish_reason=finish_reason, done=done,
                                       usage=usage))

    def add_tool_calls(self, calls: Sequence[tuple[str, str, str]], *, content: str | None = None, split: int = 1,
                       repeat_id_name: bool = False, delay: float | Sequence[float] = 0.0,
                       finish_reason: str | None = "tool_calls", same_index: bool = False) -> Reply:
        """Queue a reply calling tools: ``calls`` is ``[(id, name, arguments_text), ...]``
        (arguments need not be JSON). Each call's arguments stream in ``split`` pieces;
        ``repeat_id_name`` repeats id and name in every piece, as llama.cpp does;
        ``same_index`` sends every call at ``index`` 0, as Ollama does with parallel calls;
        ``finish_reason`` ends the reply (``"length"``: cut by the token limit; ``None``: no
        finish chunk)."""
        return self.add(self.make_tool_calls(calls, content=content, split=split, repeat_id_name=repeat_id_name,
                                             delay=delay, finish_reason=finish_reason, same_index=same_index))

    def add_reasoning(self, reasoning: Sequence[str], *, text: str | None = None,
                      finish_reason: str | None = "stop", usage: dict[str, Any] | None = None) -> Reply:
        """Queue a reply whose ``reasoning_content`` deltas (``content: null``) come first,
        then ``text`` (none: a reasoning-only reply), as DeepSeek, vLLM and llama.cpp send;
        ``usage`` as :meth:`add_text`'s."""
        return self.add(self.make_reasoning(reasoning, text=text, finish_reason=finish_reason, usage=usage))

    def add_chunks(self, chunks: Sequence[Any], *, delay: float | Sequence[float] = 0.0,
                   usage: dict[str, int] | None = None, done: bool = True) -> Reply:
        """Queue raw chunk objects, sent as they are (``id``/``object``/``model`` are filled in
        when missing). Items may be ``INVALID_JSON`` or ``CLOSE`` markers (or the strings of
        the same names). ``done=False`` leaves out ``data: [DONE]``."""
        markers = {"INVALID_JSON": INVALID_JSON, "CLOSE": CLOSE}
        events = [markers.get(c, c) if isinstance(c, str) else c for c in chunks]
        if not done:
            events.append(_NO_DONE)
        return self.add(Reply(events=events, delay=delay, usage=usage))

    def add_error(self, status: int, body: Any = None, *, headers: dict[str, str] | None = None,
                  message: str | None = None) -> Reply:
        """Queue an HTTP error. ``body`` defaults to an OpenAI-style error object built from
        ``message``; a ``str`` body is sent as is (``text/plain``)."""
        if body is None:
            body = _openai_error(message or f"fake error {status}", type_=_ERROR_TYPES.get(status, "api_error"),
                                 code=_ERROR_CODES.get(status))
        return self.add(Reply(kind="error", status=status, body=body, headers=dict(headers or {})))

    def add_hang(self) -> Reply:
        """Queue a reply that never comes (the request is held until the server stops)."""
        return self.add(Reply(kind="hang"))

    def add_html(self, status: int = 200) -> Reply:
        """Queue an HTML page with the given status, as a web server in front of nothing would send."""
        return self.add(Reply(kind="html", status=status))

    def add_invalid_json(self, after: Sequence[str] = ("Hel",)) -> Reply:
        """Queue a stream of text chunks ``after`` followed by an SSE event that is not JSON."""
        return self.add_chunks([*_text_events(after)[:-1], INVALID_JSON])

    def add_close_midstream(self, after: Sequence[str] = ("Hel",)) -> Reply:
        """Queue a stream of text chunks ``after`` then drop the connection (no ``[DONE]``)."""
        return self.add_chunks([*_text_events(after)[:-1], CLOSE])

    # -- WSGI ---------------------------------------------------------------------------
    def _record(self, environ: dict[str, Any], body: Any, status: int, chat: bool) -> None:
        now = time.monotonic()
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        with self._lock:
            self._log.append(RecordedRequest(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), headers,
                                             body, status, now))
            if chat:
                self._requests.append(body)

    def _app(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        raw = b""
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length:
            raw = environ["wsgi.input"].read(length)
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")

        def respond(status: int, payload: Any, headers: dict[str, str] | None = None) -> list[bytes]:
            data = json.dumps(payload).encode() if not isinstance(payload, (bytes, str)) else (
                payload.encode() if isinstance(payload, str) else payload)
            ctype = "application/json" if not isinstance(payload, (bytes, str)) else "text/plain; charset=utf-8"
            hdrs = {"Content-Type": ctype, "Content-Length": str(len(data))}
            hdrs.update(headers or {})
            start_response(f"{status} {_REASONS.get(status, 'Status')}", list(hdrs.items()))
            return [data]

        chat = method == "POST" and path.rstrip("/") == "/v1/chat/completions"
        if self.api_key is not None:
            auth = environ.get("HTTP_AUTHORIZATION", "")
            if auth != f"Bearer {self.api_key}":
                self._record(environ, body, 401, chat)
                return respond(401, _openai_error("Incorrect API key provided.", code="invalid_api_key"))
        if method == "GET" and path.rstrip("/") == "/v1/models":
            self._record(environ, body, 200, False)
            return respond(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "fakeserver"} for m in self.models]})
        if not chat:
            self._record(environ, body, 404, False)
            return respond(404, _openai_error(f"Unknown path {method} {path}", code="not_found"))
        if not isinstance(body, dict):
            self._record(environ, body, 400, chat)
            return respond(400, _openai_error("We could not parse the JSON body of your request."))
        if not isinstance(body.get("model"), str) or not body["model"]:
            self._record(environ, body, 400, chat)
            return respond(400, _openai_error("you must provide a model parameter", param="model"))
        if self.strict_models and body["model"] not in self.models:
            self._record(environ, body, 404, chat)
            return respond(404, _openai_error(f"The model `{body['model']}` does not exist or you do not have "
                                              "access to it.", code="model_not_found"))
        if self.validate:
            problem = validate_messages(body.get("messages"))
            if problem is None:
                problem = validate_content_parts(body["messages"], body["model"])
            if problem is not None:
                self._record(environ, body, 400, chat)
                return respond(400, _openai_error(problem[0], param=problem[1]))
        with self._lock:
            reply = self._replies.popleft() if self._replies else None
        if reply is None:
            reply = self.make_text(f"ok: {_last_user_text(body.get('messages') or [])}", delay=[self.reply_delay])
        self._record(environ, body, reply.status if reply.kind in ("error", "html") else 200, chat)

        if reply.kind == "error":
            return respond(reply.status, reply.body if reply.body is not None else "", reply.headers)
        if reply.kind == "html":
            page = b"<!DOCTYPE html><html><head><title>Welcome</title></head><body><h1>It works!</h1></body></html>"
            start_response(f"{reply.status} {_REASONS.get(reply.status, 'Status')}",
                           [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(page)))])
            return [page]
        if reply.kind == "hang":
            self._stopping.wait(600)
            return respond(503, _openai_error("server stopping"))

        usage = reply.usage or _usage_for(_count_prompt_tokens(body), sum(
            1 for e in reply.events if isinstance(e, dict)))
        model = body["model"]
        created = int(time.time())
        cid = f"chatcmpl-fake{len(self._requests)}"
        if not body.get("stream"):
            pause = sum(reply.delay) if isinstance(reply.delay, (list, tuple)) else reply.delay
            if pause:
                self._stopping.wait(pause)
            content, tool_calls, finish = _merge_events(reply.events)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return respond(200, {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish or "stop"}],
                "usage": usage,
            })
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        sock = environ.get("werkzeug.socket")
        stopping = self._stopping

        def generate() -> Iterator[bytes]:
            yield b""  # werkzeug sends the status line and headers now, as real servers do
            done = True
            for i, event in enumerate(reply.events):
                if reply.gate is not None and i == reply.gate_at:
                    while not reply.gate.wait(0.05) and not stopping.is_set():
                        pass
                pause = _delay_at(reply.delay, i)
                if pause and not stopping.is_set():
                    stopping.wait(pause)
                if event is _NO_DONE:
                    done = False
                    continue
                if event is CLOSE:
                    if sock is not None:
                        try:
                            sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    raise _ClosedMidStream()
                if event is INVALID_JSON:
                    yield b'data: {"choices": [{"index": 0, "delta": {"content": "oops"\n\n'
                    continue
                chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
                chunk.update(event)
                if "choices" not in event:
                    chunk["choices"] = []
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            if include_usage and reply.report_usage and not any(isinstance(e, dict) and "usage" in e
                                                                for e in reply.events):
                chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                         "choices": [], "usage": usage}
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            if done:
                yield b"data: [DONE]\n\n"

        start_response("200 OK", [("Content-Type", "text/event-stream; charset=utf-8"),
                                  ("Cache-Control", "no-cache")])
        return generate()


class _ClosedMidStream(ConnectionError):
    """Raised inside the WSGI iterator to make werkzeug drop the connection."""


_NO_DONE = object()

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            408: "Request Timeout", 422: "Unprocessable Entity", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
                404: "invalid_request_error", 429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}
_ERROR_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}


def _delay_at(delay: float | Sequence[float], i: int) -> float:
    if isinstance(delay, (list, tuple)):
        return float(delay[i]) if i < len(delay) else 0.0
    return float(delay)


def _split_words(text: str) -> list[str]:
    """``"Hello big world"`` -> ``["Hello", " big", " world"]`` (joins back to the text)."""
    if not text:
        return [""]
    pieces: list[str] = []
    start = 0
    for i in range(1, len(text)):
        if text[i] == " " and text[i - 1] != " ":
            pieces.append(text[start:i])
            start = i
    pieces.append(text[start:])
    return pieces


def _last_user_text(messages: list[Any]) -> str:
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


# --------------------------------------------------------------------------------------
# pytest fixture (tests/conftest.py imports it, or a test module does)
# --------------------------------------------------------------------------------------
try:
    import pytest
except ImportError:  # pragma: no cover - the CLI entry point works without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def fake_server() -> Iterator[FakeServer]:
        """A running :class:`FakeServer`, stopped after the test."""
        with FakeServer() as server:
            yield server

    @pytest.fixture(scope="module")
    def module_fake_server() -> Iterator[FakeServer]:
        """One running :class:`FakeServer` for a test module (see :func:`shared_fake_server`)."""
        with FakeServer() as server:
            yield server

    @pytest.fixture
    def shared_fake_server(module_fake_server: FakeServer) -> Iterator[FakeServer]:
        """The module's server, :meth:`~FakeServer.reset` before and after each test: what a fresh
        ``fake_server`` is, on a port that stays the same. A module whose tests start from a
        stored home built once (the ``home_snapshot`` fixture) uses it as its ``fake_server``,
        because a session keeps the endpoint it was written through."""
        module_fake_server.reset()
        yield module_fake_server
        module_fake_server.reset()


# --------------------------------------------------------------------------------------
# command line: python -m tests.helpers.fakeserver --port N --script script.json
# --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.fakeserver", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--script", help="JSON file: a list of reply specs, served in order")
    parser.add_argument("--api-key", help="require this bearer key")
    parser.add_argument("--model", action="append", help="model id listed by /v1/models (repeatable)")
    args = parser.parse_args(argv)
    server = FakeServer(port=args.port, api_key=args.api_key, models=args.model or (DEFAULT_MODEL,))
    if args.script:
        with open(args.script, encoding="utf-8") as fh:
            for spec in json.load(fh):
                server.add(reply_from_spec(spec))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    print(server.url, flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
