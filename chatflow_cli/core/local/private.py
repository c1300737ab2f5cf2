"""A local model server private to one process (see :mod:`chatflow_cli.core.local`)."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Unpack

from ..errors import LocalModelError
from ._process import PortInUse, first_model, free_port, get_json, pdeathsig_setter, reap_when_done
from .crash import LocalServerCrashedError, crash_error
from .options import HEALTH_PATH, ServerOptions, ServerSettings

__all__ = ["LocalServer"]

log = logging.getLogger("chatflow_cli.core.local")


class LocalServer:
    """llama.cpp's OpenAI-compatible server with SmolLM2, as a child private to this process.

    Args:
        options: how to run the server (:class:`ServerOptions`); keyword ``settings``
            (its field names: ``model_path``, ``n_ctx``, ``alias``, ``startup_timeout``,
            ``extra_args``, ``extra_bufts``, ``app``…) replace single fields.
        host: the address to listen on.
        port: default a free port on ``host``.

    Attributes (after :meth:`start`):
        base_url: ``http://127.0.0.1:<port>/v1``.
        model: the model id to send.
        pid: the child's process id.
        api_key: ``None`` (a private server takes any key).
        n_ctx: the context size in tokens the model runs with, as the server reports it
            (``None``: it did not say).

    Raises:
        LocalModelError: the extra is not installed, or the server was not ready within
            ``startup_timeout``.
        LocalServerCrashedError: the child died during start-up (the message says how and
            ends with the useful end of its output; ``.output_tail`` has more).
    """

    api_key: str | None = None
    started = True  # a private server is always started by its owner

    def __init__(self, options: ServerOptions | None = None, *, host: str = "127.0.0.1", port: int | None = None,
                 **settings: Unpack[ServerSettings]) -> None:
        self.options = dataclasses.replace(options, **settings) if options is not None else ServerOptions(**settings)
        self.host = host
        self.port = port
        self._requested_port = port
        self.model: str = self.options.alias
        self.n_ctx: int | None = None
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
        return self.options.argv(self.options.model_file(), host=self.host, port=port,
                                 chatflow_options=["--chatflow-watch-fd", str(watch_fd)])

    def start(self) -> "LocalServer":
        """Start the child and wait until it answers. Idempotent while running.

        A free port that another process takes before the child binds it is tried again,
        three times in all; a fixed ``port`` is tried once. The child never outlives a
        failed start (Ctrl-C included).

        Raises:
            LocalModelError: the extra is missing, no port could be bound, or no answer
                within ``startup_timeout`` (``.output_tail`` has the child's output).
            LocalServerCrashedError: the child died while starting.
        """
        with self._lock:
            if self.running:
                return self
            self.options.model_file()
            fixed = self._requested_port
            attempts = 1 if fixed is not None else 3  # a free port may be taken before the child binds it
            for attempt in range(attempts):
                port = fixed if fixed is not None else free_port(self.host)
                try:
                    self._spawn(port)
                    self._wait_ready(port)
                    self.port = port
                    atexit.register(self.stop)
                    log.debug("local model server: started a private one, pid %s on %s", self.pid, self.base_url)
                    return self
                except PortInUse:
                    self._stop_locked()
                    if attempt == attempts - 1:
                        raise LocalModelError(f"the local model server could not bind a port on {self.host}")
                except BaseException:
                    self._stop_locked()  # Ctrl-C or an error during start-up: no orphan
                    raise
            raise AssertionError("unreachable")

    def ensure_running(self) -> bool:
        """Start a new child when the last one died (``True`` then). Used before each request.

        Raises:
            LocalModelError, LocalServerCrashedError: as :meth:`start`.
        """
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
                preexec_fn=pdeathsig_setter(),  # noqa: PLW1509 - only calls a prctl looked up before fork
                close_fds=True,
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        reap_when_done(self.process)
        self._watch_fd = write_fd
        self.port = port

    def _wait_ready(self, port: int) -> None:
        url = f"http://{self.host}:{port}/v1/models"
        deadline = time.monotonic() + self.options.startup_timeout
        delay = 0.05
        assert self.process is not None
        while True:
            code = self.process.poll()
            if code is not None:
                tail = self.output_tail()
                if "address already in use" in tail.lower():
                    raise PortInUse()
                raise crash_error(code, tail, phase="starting", model=self.options.model_file())
            status, data = get_json(url, None, 1.0)
            if status == 200:
                self.model = first_model(data, self.options.alias)
                _, info = get_json(f"http://{self.host}:{port}{HEALTH_PATH}", None, 5.0)
                n_ctx = info.get("n_ctx") if isinstance(info, dict) else None
                self.n_ctx = n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None
                return
            if time.monotonic() >= deadline:
                err = LocalModelError(
                    f"the local model server did not answer on {url} within {self.options.startup_timeout:g} s"
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
        try:
            model: Path | None = self.options.model_file()
        except LocalModelError:
            model = None
        return crash_error(code, self.output_tail(), phase="answering", model=model)

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
