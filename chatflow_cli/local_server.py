"""The process of the embedded local model: llama.cpp's OpenAI-compatible server, made safe.

:mod:`chatflow_cli.core.local` starts this module as a child (``python -m
chatflow_cli.local_server [--chatflow-* options] [llama_cpp.server options]``); it is
never imported by chatflow itself. It runs llama-cpp-python's server app under uvicorn,
with these additions:

* **Extra CPU buffer types off** (``--chatflow-extra-bufts off``, the default chatflow
  passes). llama.cpp, built natively, picks an extra CPU buffer type for the weights when
  the CPU advertises it -- AMX tiles on recent Xeons, or repacked layouts for AVX2/AVX-512
  -- and loads them there. Many hypervisors advertise AMX in ``cpuid`` without enabling
  its tile state, and the first AMX instruction (``tilezero`` in ggml's AMX matmul) then
  kills the server with SIGILL. Loading the model with ``use_extra_bufts = False`` in
  ``llama_model_params`` keeps the weights in the plain CPU buffer, which runs on every
  machine; SmolLM2-135M Q4_1 loses little or nothing by it (measured by
  ``tests/benchmarks/bench_local_model.py``). llama-cpp-python does not expose the field,
  so this module sets it on the parameters of every model load
  (``llama_cpp.llama_model_load_from_file``) and reports what the load really used at
  ``GET /chatflow/health`` (``"use_extra_bufts"``).
* **Requests take turns, never cut each other** (:func:`llama_settings`): llama.cpp's one
  model instance answers one request at a time, and a request that arrives meanwhile waits
  for the reply being streamed to end instead of interrupting it (``interrupt_requests``
  off, whatever the options say).
* **A streamed reply that fails says why** (:func:`report_stream_errors`): an exception
  after the event stream began -- a prompt over the context, above all -- ends the stream
  with an ``{"error": ...}`` event (``code: "context_length_exceeded"``, ``prompt_tokens``
  and ``n_ctx`` for the context) instead of an empty stream.
* **How it died is known to every chatflow**: the exit status (``Popen`` for a private
  server, the supervisor's record for a warm one) names the signal -- SIGILL or SIGSEGV
  where a VM traps AMX, depending on the hypervisor.
* **A guard** in front of the app: with a token (environment variable
  ``CHATFLOW_LOCAL_TOKEN``) every request must carry ``Authorization: Bearer <token>``
  (401 otherwise); ``GET /chatflow/health`` answers ``{"instance", "pid", "version",
  "model", "use_extra_bufts", "n_ctx", "in_flight", "reservations"}`` (``n_ctx``: the context
  size in tokens of the loaded model, as llama.cpp set it up); requests in flight and the time
  of the last one are counted for the idle shutdown. ``GET /chatflow/health?lease=SECONDS&id=ID``
  also *reserves* the server for a process about to use it: the idle clock does not run out
  while a reservation is open, and each reservation ends at the next completion request
  (``POST``) or after ``SECONDS`` (at most :data:`MAX_LEASE`), whichever comes first. So a
  keep-alive shorter than the time a chatflow takes between finding (or starting) the server
  and sending its first request never stops the server under it.
* **Its lifetime.** ``--chatflow-watch-fd FD`` (a server private to one chatflow
  process): exit as soon as that pipe reports EOF, i.e. when chatflow is gone.
  ``--chatflow-state PATH --chatflow-keep-alive SECONDS`` (a shared warm server): the
  process forks; the parent is a small supervisor that waits for the server, writes how
  it ended (``<state>.exit``: instance and return code, a negative code being the signal,
  and ``stopped_by``: the signal's name when the supervisor itself was signalled -- ``chatflow
  local stop`` -- so that the server was stopped, not crashed)
  and removes the state file when it still names this server; the server stops itself
  when no request came for the keep-alive time, when its model file changed, or when the
  state file names another server (a chatflow of another version, options or model took
  the slot), each only while no request is in flight, under the slot's lock.

``--chatflow-app MODULE:FUNCTION`` replaces llama.cpp's app: ``MODULE`` is imported and
``FUNCTION(argv)`` called with the command-line options left once chatflow's own
``--chatflow-*`` ones are removed (``--model PATH --model_alias NAME --chat_format F --host H
--port P --n_ctx N`` ...); it must return ``(asgi_app, host, port)``, and uvicorn serves
``asgi_app`` on ``host:port`` behind the same guard, signals and lifetime rules. The tests
run a stand-in server so (``CHATFLOW_LOCAL_SERVER_APP`` in chatflow).
"""

from __future__ import annotations

import hmac
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, cast

from .core.local.state import Flock, file_id, read_state, write_private

TOKEN_ENV = "CHATFLOW_LOCAL_TOKEN"
HEALTH_PATH = "/chatflow/health"
#: The longest reservation (seconds) one ``/chatflow/health?lease=`` may take.
MAX_LEASE = 120.0

#: What the model loads really used (``None`` until a model was loaded).
_loaded: dict[str, Any] = {"use_extra_bufts": None, "n_ctx": None}


class _Options:
    def __init__(self) -> None:
        self.watch_fd: int | None = None
        self.state: str | None = None
        self.lock: str | None = None
        self.keep_alive: float = 0.0
        self.instance: str = ""
        self.extra_bufts: bool = False
        self.app: str | None = None
        self.version: str = ""
        self.model_path: str | None = None


def _split_args(argv: list[str]) -> tuple[_Options, list[str]]:
    """Our ``--chatflow-NAME VALUE`` options, and the rest (for the server app)."""
    opts = _Options()
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--chatflow-") and i + 1 < len(argv):
            name, value = arg[len("--chatflow-"):], argv[i + 1]
            i += 2
            if name == "watch-fd":
                opts.watch_fd = int(value)
            elif name == "state":
                opts.state = value
            elif name == "lock":
                opts.lock = value
            elif name == "keep-alive":
                opts.keep_alive = float(value)
            elif name == "instance":
                opts.instance = value
            elif name == "extra-bufts":
                opts.extra_bufts = value == "on"
            elif name == "app":
                opts.app = value
            elif name == "version":
                opts.version = value
            else:
                raise SystemExit(f"chatflow local server: unknown option --chatflow-{name}")
            continue
        if arg == "--model" and i + 1 < len(argv):
            opts.model_path = argv[i + 1]
        rest.append(arg)
        i += 1
    return opts, rest


def _option_int(argv: list[str], name: str) -> int | None:
    """The positive int value of the last ``name VALUE`` in ``argv``, else ``None``."""
    value = None
    for i, arg in enumerate(argv[:-1]):
        if arg == name:
            value = argv[i + 1]
    try:
        number = int(value) if value is not None else 0
    except ValueError:
        return None
    return number if number > 0 else None


# ---------------------------------------------------------------------------------------
# extra buffer types off
# ---------------------------------------------------------------------------------------
def disable_extra_buffer_types() -> bool:
    """Make every model load of llama-cpp-python use ``use_extra_bufts = False``.

    Wraps ``llama_cpp.llama_cpp.llama_model_load_from_file`` (the call through which
    ``Llama`` loads a GGUF) so the parameter struct it receives has the field cleared, and
    records the value each load used. Returns ``False`` when this llama-cpp-python has no
    such field (an old llama.cpp, which has no extra buffer types to turn off either).
    """
    import llama_cpp.llama_cpp as lib

    fields = {name for name, *_ in getattr(lib.llama_model_params, "_fields_", ())}
    if "use_extra_bufts" not in fields:
        return False
    original = lib.llama_model_load_from_file
    if getattr(original, "_chatflow_wrapped", False):
        return True

    def load(path_model: bytes, params: Any) -> Any:
        params.use_extra_bufts = False
        _loaded["use_extra_bufts"] = bool(params.use_extra_bufts)
        return original(path_model, params)

    setattr(load, "_chatflow_wrapped", True)  # noqa: B010 - a mark on a function object
    lib.llama_model_load_from_file = load
    return True


def _record_loads() -> None:
    """With extra buffer types on, still record what each load used (for the health answer)."""
    import llama_cpp.llama_cpp as lib

    original = lib.llama_model_load_from_file

    def load(path_model: bytes, params: Any) -> Any:
        _loaded["use_extra_bufts"] = bool(getattr(params, "use_extra_bufts", True))
        return original(path_model, params)

    lib.llama_model_load_from_file = load


def llama_settings(argv: list[str]) -> tuple[Any, list[Any]]:
    """llama-cpp-python's ``(ServerSettings, [ModelSettings])`` from its command-line options
    (``python -m llama_cpp.server``'s), with the settings chatflow's server always runs with.

    ``interrupt_requests`` is always off, whatever ``argv`` says: llama-cpp-python's default
    ends the reply being streamed (``data: [DONE]`` without a finish reason) as soon as
    another request arrives, and its one model instance answers one request at a time. Off,
    a request that arrives while another is answered waits for it (its response has started,
    and the server's SSE pings every 15 s keep the waiting client's read timeout from running
    out), so several chatflow processes on one warm server take turns instead of cutting each
    other's replies.
    """
    import argparse

    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings

    parser = argparse.ArgumentParser(prog="chatflow-local-server")
    add_args_from_model(parser, Settings)
    args = parser.parse_args(argv)
    # parse_model_from_args returns an instance of the model class it is given
    server_settings = cast(ServerSettings, parse_model_from_args(ServerSettings, args))
    server_settings.interrupt_requests = False
    model_settings = [cast(ModelSettings, parse_model_from_args(ModelSettings, args))]
    return server_settings, model_settings


def _llama_app(argv: list[str]) -> tuple[Any, str, int]:
    """llama-cpp-python's server app from its command-line options (see :func:`llama_settings`)."""
    from llama_cpp.server import app as server_app

    server_settings, model_settings = llama_settings(argv)
    report_stream_errors()
    app = server_app.create_app(server_settings=server_settings, model_settings=model_settings)
    _loaded["n_ctx"] = _served_n_ctx(server_app)
    return app, server_settings.host, int(server_settings.port)


def _served_n_ctx(server_app: Any) -> int | None:
    """The context size (tokens) of the model the app loaded: what llama.cpp made of
    ``--n_ctx`` (``0`` is the model's own training context), or ``None`` if unknown."""
    try:
        proxy = getattr(server_app, "_llama_proxy", None)
        value = proxy().n_ctx() if proxy is not None else None
    except Exception:  # noqa: BLE001 - another llama-cpp-python layout: the option is the next best
        return None
    return value if isinstance(value, int) and value > 0 else None


#: llama.cpp's words for a prompt longer than the context (``Llama._create_completion``).
_OVER_CONTEXT = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")


def stream_error(exc: Exception) -> dict[str, Any]:
    """The ``{"error": ...}`` event that ends a streamed reply which failed with ``exc``.

    A prompt over the context is ``code: "context_length_exceeded"`` with ``prompt_tokens``
    and ``n_ctx``; anything else ``type: "server_error"`` with the exception's text.
    """
    match = _OVER_CONTEXT.search(str(exc))
    if match is not None:
        prompt, n_ctx = int(match.group(1)), int(match.group(2))
        return {"error": {"message": f"the prompt has {prompt} tokens, over the model's context of {n_ctx}",
                          "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded",
                          "prompt_tokens": prompt, "n_ctx": n_ctx}}
    return {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error", "param": None,
                      "code": None}}


def report_stream_errors() -> None:
    """Make a streamed completion that fails end with an error event, never an empty stream.

    llama-cpp-python's server answers a streamed request with HTTP 200 and its event stream
    before the model sees the prompt; an exception raised then (a prompt over the context,
    a chat template that cannot format the messages) ends that stream with no event at all.
    This wraps ``Llama.create_chat_completion`` (what ``/v1/chat/completions`` calls) so
    that, for ``stream=True``, such an exception becomes one last chunk ``{"error": ...}``
    (:func:`stream_error`), which OpenAI-compatible clients, chatflow's included, read as
    the server's error. (Not ``create_completion``: the chat handlers consume its chunks
    themselves, and an error chunk there would break them.)
    """
    import llama_cpp

    original = llama_cpp.Llama.create_chat_completion
    if getattr(original, "_chatflow_wrapped", False):
        return

    def create_chat_completion(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("stream"):
            return original(self, *args, **kwargs)
        return _events_or_error(lambda: original(self, *args, **kwargs))

    setattr(create_chat_completion, "_chatflow_wrapped", True)  # noqa: B010 - a mark on a function object
    setattr(llama_cpp.Llama, "create_chat_completion", create_chat_completion)  # noqa: B010 - a patch


def _events_or_error(start: Callable[[], Any]) -> Any:
    """The chunks of ``start()``'s stream, then, if it failed, its error event."""
    try:
        yield from start()
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none ends the stream silently
        sys.stderr.write(f"chatflow: the streamed reply failed: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        yield stream_error(exc)


# ---------------------------------------------------------------------------------------
# the guard
# ---------------------------------------------------------------------------------------
class Guard:
    """ASGI middleware: the token check, ``/chatflow/health``, and the activity count."""

    def __init__(self, app: Any, *, token: str | None, info: dict[str, Any]) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.info = info
        self.in_flight = 0
        self.last_activity = time.monotonic()
        self.leases: dict[str, float] = {}  # open reservations: id -> when it expires (monotonic s)
        self.lock = threading.Lock()

    def idle_for(self) -> float | None:
        """Seconds since the last request ended, or ``None`` while one is in flight or a
        reservation is open."""
        with self.lock:
            now = time.monotonic()
            self.leases = {key: until for key, until in self.leases.items() if until > now}
            if self.in_flight or self.leases:
                return None
            return now - self.last_activity

    def _reserve(self, scope: dict[str, Any]) -> None:
        """``?lease=SECONDS&id=ID`` on the health check: open (or renew) reservation ``ID``."""
        from urllib.parse import parse_qs

        query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
        try:
            seconds = float(query["lease"][-1]) if "lease" in query else 0.0
        except ValueError:
            return
        if seconds > 0:
            key = query.get("id", [""])[-1]  # a retried health check renews its reservation, never adds one
            with self.lock:
                self.leases[key] = time.monotonic() + min(seconds, MAX_LEASE)

    def _use_reservation(self) -> None:
        """A completion request arrived: it is what the oldest open reservation was for."""
        with self.lock:
            if self.leases:
                del self.leases[min(self.leases, key=self.leases.__getitem__)]

    def _authorized(self, scope: dict[str, Any]) -> bool:
        if self.token is None:
            return True
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.token)
        return False

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        with self.lock:
            self.in_flight += 1
            self.last_activity = time.monotonic()
        try:
            if not self._authorized(scope):
                await _send_json(send, 401, {"error": {"message": "invalid API key", "type": "invalid_request_error",
                                                       "code": "invalid_api_key"}})
            elif scope.get("path") == HEALTH_PATH:
                self._reserve(scope)
                body = dict(self.info, pid=os.getpid(), in_flight=self.in_flight - 1,
                            reservations=len(self.leases), use_extra_bufts=_loaded["use_extra_bufts"],
                            n_ctx=_loaded["n_ctx"])
                await _send_json(send, 200, body)
            else:
                if scope.get("method") == "POST":
                    self._use_reservation()
                await self.app(scope, receive, send)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.last_activity = time.monotonic()


async def _send_json(send: Callable[..., Any], status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


# ---------------------------------------------------------------------------------------
# lifetime
# ---------------------------------------------------------------------------------------
def _watch_pipe(fd: int) -> None:
    """Exit at once when chatflow, which holds the only write end of the pipe, is gone."""

    def watch() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass
        os._exit(0)

    threading.Thread(target=watch, name="chatflow-parent-watch", daemon=True).start()


def _read_json(path: str) -> dict[str, Any] | None:
    return read_state(Path(path))


def _file_id(path: str | None) -> list[int] | None:
    return file_id(Path(path)) if path else None


def _forget_state(state: str, instance: str) -> None:
    """Remove the state file when it still names ``instance`` (caller holds the lock)."""
    data = _read_json(state)
    if data is not None and data.get("instance") == instance:
        try:
            os.unlink(state)
        except OSError:
            pass


def _keep_alive_watch(guard: Guard, opts: _Options) -> None:
    """Stop the server when idle, when its model file changed, or when superseded."""
    assert opts.state is not None and opts.lock is not None
    model_id = _file_id(opts.model_path)
    interval = max(0.05, min(1.0, opts.keep_alive / 5))
    born = time.time()  # before chatflow could write our state file; a later one's started_at is after

    def reason(seen: list[bool]) -> str | None:
        if not os.path.isdir(os.path.dirname(opts.state or "") or "."):
            return "its data directory is gone"  # nobody can find this server again
        data = _read_json(opts.state or "")
        mine = data is not None and data.get("instance") == opts.instance
        seen[0] = seen[0] or mine
        if data is not None and not mine:
            started = data.get("started_at")
            # it named us and now names another, or names one started after us (it took the slot
            # before this loop ever saw our own state)
            if seen[0] or (isinstance(started, (int, float)) and started > born):
                return "another server took its place"
        if opts.model_path and _file_id(opts.model_path) != model_id:
            return "its model file changed"
        idle = guard.idle_for()
        if idle is not None and idle >= opts.keep_alive:
            return f"no request for {opts.keep_alive:g} s"
        return None

    def stop(why: str) -> None:
        sys.stderr.write(f"chatflow: the local model server stops: {why}\n")
        sys.stderr.flush()
        os._exit(0)  # the lock goes with the process

    def watch() -> None:
        seen = [False]
        while True:
            time.sleep(interval)
            try:
                why = reason(seen)
                if why is None or guard.idle_for() is None:
                    continue
                with Flock(Path(opts.lock or "")):
                    why = reason(seen)
                    if why is None or guard.idle_for() is None:
                        continue
                    _forget_state(opts.state or "", opts.instance)
                    stop(why)
            except OSError as exc:
                # the lock or state cannot be reached (the data directory was removed, the disk
                # went read-only): the watch must not die with it, or the server outlives its
                # idle time; once idle it stops without the lock, which nobody else can take either
                if guard.idle_for() is not None:
                    stop(f"its state in {os.path.dirname(opts.state or '')} cannot be reached "
                         f"({exc.strerror or exc})")

    threading.Thread(target=watch, name="chatflow-keep-alive", daemon=True).start()


def _set_pdeathsig() -> None:
    """Linux: die with SIGKILL when the supervisor dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _supervise(opts: _Options) -> None:
    """Fork: the child returns and becomes the server; this process waits for it and
    records how it ended, then exits with the same status."""
    pid = os.fork()
    if pid == 0:
        _set_pdeathsig()
        return

    asked: list[str] = []  # the signals this supervisor was sent: the server was stopped on purpose

    def forward(signum: int, frame: Any) -> None:
        asked.append(signal.Signals(signum).name)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    assert opts.state is not None and opts.lock is not None
    record: dict[str, Any] = {"instance": opts.instance, "pid": os.getpid(), "server_pid": pid,
                              "returncode": code, "time": time.time()}
    if asked and code != 0:
        record["stopped_by"] = asked[0]  # ``chatflow local stop`` (SIGTERM), not a crash
    # the record first, without the lock: a chatflow starting this server holds the lock and
    # waits for either the server's health or this record
    write_private(Path(f"{opts.state}.exit"), record)
    state = _read_json(opts.state)
    if state is not None and state.get("instance") == opts.instance:  # else never written: no lock needed
        with Flock(Path(opts.lock)):
            _forget_state(opts.state, opts.instance)
    os._exit(0 if code == 0 else 1)


def main(argv: list[str] | None = None) -> None:
    """Run the server (see the module docstring)."""
    opts, rest = _split_args(list(sys.argv[1:] if argv is None else argv))
    if opts.watch_fd is not None:
        _watch_pipe(opts.watch_fd)
    if opts.state is not None:
        _supervise(opts)
    token = os.environ.pop(TOKEN_ENV, None) or None
    if opts.app:
        import importlib

        module, _, function = opts.app.partition(":")
        factory = getattr(importlib.import_module(module), function)
    else:
        if opts.extra_bufts:
            _record_loads()
        else:
            disable_extra_buffer_types()
        factory = _llama_app
    app, host, port = factory(rest)
    if _loaded["n_ctx"] is None:  # another app (the tests' stand-in): the option it was given
        _loaded["n_ctx"] = _option_int(rest, "--n_ctx")
    info = {"instance": opts.instance, "version": opts.version, "model": opts.model_path,
            "keep_alive": opts.keep_alive}
    guard = Guard(app, token=token, info=info)
    if opts.state is not None:
        _keep_alive_watch(guard, opts)
    import uvicorn

    uvicorn.run(guard, host=host, port=port, log_level="warning", access_log=False, lifespan="auto")


if __name__ == "__main__":
    main()
