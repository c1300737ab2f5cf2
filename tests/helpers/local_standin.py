"""A stand-in for llama.cpp's server app, run by ``chatflow_cli.local_server`` in its place
(``CHATFLOW_LOCAL_SERVER_APP=tests.helpers.local_standin:create_app``).

It goes through the same process, guard (token, ``/chatflow/health``), lifetime rules and
signals as the real model, and answers in milliseconds, so the tests can start many
servers and make them die on purpose. Behaviour from environment variables:

* ``STANDIN_MODE``: ``ok`` (default) streams :data:`REPLY` in words;
  ``crash-startup`` dies by SIGILL before listening; ``exit-startup`` exits with code 3
  before listening; ``crash-midstream`` sends two chunks then dies by SIGILL;
  ``crash-first-midstream``: like ``crash-midstream`` for the first server started
  (``STANDIN_MARKER`` file absent, then created), ``ok`` for the next ones.
* ``STANDIN_STARTS``: a file each start appends its pid to (a line each).
* ``STANDIN_DELAY``: seconds between two chunks (default 0). A request whose last message
  contains ``(slow)`` waits 1 s between chunks whatever the server was started with (a warm
  server outlives the environment of the process that started it).

On SIGTERM (``chatflow local stop``) the replies being streamed end at once without a
finish reason, as llama-cpp-python's do.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

REPLY = "Hello from the stand-in server."

#: Set when uvicorn is told to exit (SIGTERM, as ``chatflow local stop`` sends): like
#: llama-cpp-python's server (its event streams end on uvicorn's exit), every reply being
#: streamed then ends at once, without a finish reason, and the process ends by the signal.
_exiting: list[int] = []


def _end_streams_on_exit() -> None:
    import uvicorn

    original = uvicorn.Server.handle_exit
    if getattr(original, "_standin", False):
        return

    def handle_exit(self: Any, sig: int, frame: Any) -> None:
        _exiting.append(sig)
        original(self, sig, frame)

    setattr(handle_exit, "_standin", True)  # noqa: B010
    setattr(uvicorn.Server, "handle_exit", handle_exit)  # noqa: B010


def _arg(argv: list[str], name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else default


def _die(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGILL)
    time.sleep(10)  # pragma: no cover - the signal ends the process first


def create_app(argv: list[str]) -> tuple[Any, str, int]:
    host, port = _arg(argv, "--host", "127.0.0.1"), int(_arg(argv, "--port", "8000"))
    alias = _arg(argv, "--model_alias", "local")
    mode = os.environ.get("STANDIN_MODE", "ok")
    starts = os.environ.get("STANDIN_STARTS")
    if starts:
        with open(starts, "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n")
    if mode == "crash-first-midstream":
        marker = os.environ["STANDIN_MARKER"]
        if os.path.exists(marker):
            mode = "ok"
        else:
            open(marker, "w").close()
            mode = "crash-midstream"
    if mode == "crash-startup":
        _die("standin: loading the model with an instruction this CPU traps")
    if mode == "exit-startup":
        sys.stderr.write("standin: cannot open the model file\n")
        sys.stderr.flush()
        os._exit(3)
    delay = float(os.environ.get("STANDIN_DELAY", "0") or 0)
    _end_streams_on_exit()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": alias, "object": "model"}]})
            return
        if method == "POST" and path == "/v1/chat/completions":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            request = json.loads(body or b"{}")
            asked = (request.get("messages") or [{}])[-1].get("content")
            pause = 1.0 if isinstance(asked, str) and "(slow)" in asked else delay
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            words = REPLY.split(" ")
            for index, word in enumerate(words):
                if mode == "crash-midstream" and index == 2:
                    _die("standin: decoding hit an instruction this CPU traps")
                piece = word if index == 0 else " " + word
                chunk = {"id": "c1", "object": "chat.completion.chunk", "model": request.get("model", alias),
                         "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                            "more_body": True})
                if pause:
                    await asyncio.sleep(pause)
                if _exiting:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
            last = {"id": "c1", "object": "chat.completion.chunk", "model": alias,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": len(words), "total_tokens": 5 + len(words)}}
            await send({"type": "http.response.body", "body": f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode(),
                        "more_body": False})
            return
        await _json(send, 404, {"error": {"message": f"no route {method} {path}"}})

    return app, host, port


async def _json(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})
