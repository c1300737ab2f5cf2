"""A warm local model server shared by chatflow processes (see :mod:`chatflow_cli.core.local`).

Its files and health check are in :mod:`.state`; starting it is serialised by their lock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Unpack

from ..errors import LocalModelError
from ._process import PortInUse, file_tail, first_model, free_port, get_json, pid_alive, reap_when_done
from .state import (
    Flock,
    chatflow_version,
    exit_record,
    file_id,
    health,
    is_healthy,
    is_server,
    local_dir,
    read_state,
    write_private,
)
from .crash import LocalServerCrashedError, crash_error, stopped_error
from .options import DEFAULT_KEEP_ALIVE, TOKEN_ENV, ServerOptions, ServerSettings

__all__ = ["SharedLocalServer"]

log = logging.getLogger("chatflow_cli.core.local")


class SharedLocalServer:
    """A warm local model server shared by chatflow processes (see the module docstring).

    Args:
        options, settings: how to run the server, as for :class:`LocalServer`; processes
            share a server only when these, the model file and the chatflow version agree.
        data_dir: chatflow's data directory; the state, lock and log files go to
            ``<data_dir>/local/``.
        keep_alive: seconds the server waits for the next request before it stops itself
            (> 0).

    :meth:`start` reuses a healthy server with the same model file, options, chatflow
    version and keep-alive, or starts one (exactly one process does, under the lock).
    :meth:`stop` does *not* stop the server (others may use it); :func:`stop_local_servers`
    does.

    Attributes (after :meth:`start`): ``base_url``, ``model``, ``api_key`` (the token),
    ``pid`` (the supervisor's), ``started`` (``True``: this call started it; ``False``:
    reused), ``log_path``, ``n_ctx`` (the context size in tokens the model runs with, as the
    server reports it; ``None``: it did not say).

    Raises:
        ValueError: ``keep_alive`` is not above 0.
        LocalModelError: as :class:`LocalServer`.
        LocalServerCrashedError: the new server died during start-up.
    """

    def __init__(self, options: ServerOptions | None = None, *, data_dir: str | os.PathLike[str],
                 keep_alive: float = DEFAULT_KEEP_ALIVE, **settings: Unpack[ServerSettings]) -> None:
        if not keep_alive > 0:
            raise ValueError("keep_alive must be > 0 seconds (0 means a private LocalServer)")
        self.options = dataclasses.replace(options, **settings) if options is not None else ServerOptions(**settings)
        self.data_dir = Path(data_dir)
        self.keep_alive = float(keep_alive)
        self.host = "127.0.0.1"
        self.model: str = self.options.alias
        self.state: dict[str, Any] | None = None
        self.started = False
        self.n_ctx: int | None = None
        self.process: subprocess.Popen[bytes] | None = None  # when this process started it
        self._lock = threading.Lock()

    # -- identity -----------------------------------------------------------------------
    def _paths(self, path: Path) -> tuple[Path, Path, Path]:
        key = hashlib.sha256(json.dumps(self.options.identity(path), sort_keys=True).encode()).hexdigest()[:16]
        folder = local_dir(self.data_dir)
        return folder / f"server-{key}.json", folder / f"server-{key}.lock", folder / f"server-{key}.log"

    def _matches(self, state: dict[str, Any], path: Path) -> bool:
        return (state.get("version") == chatflow_version()
                and state.get("model_id") == file_id(path)
                and state.get("keep_alive") == self.keep_alive
                and state.get("options") == self.options.identity(path))

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
        """Reuse the warm server or start one; see the class docstring.

        Raises:
            LocalModelError: the extra is missing, no port could be bound, or no answer
                within ``startup_timeout`` (the message names the log file).
            LocalServerCrashedError: the new server died while starting.
        """
        with self._lock:
            path = self.options.model_file()
            state_path, lock_path, log_path = self._paths(path)
            with Flock(lock_path):
                state = read_state(state_path)
                if state is not None and self._matches(state, path) and is_healthy(state, reserve=secrets.token_hex(8)):
                    self.state, self.started = state, False
                    self.model = str(state.get("served_model") or self.options.alias)
                    self.n_ctx = _positive_int(state.get("n_ctx"))
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
        if unhealthy and isinstance(pid, int) and instance and pid_alive(pid) and is_server(pid, instance):
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
            port = free_port(self.host)
            argv = self.options.argv(
                path, host=self.host, port=port,
                chatflow_options=["--chatflow-state", str(state_path), "--chatflow-lock", str(lock_path),
                                  "--chatflow-keep-alive", repr(self.keep_alive), "--chatflow-instance", instance,
                                  "--chatflow-version", chatflow_version()],
            )
            try:
                log_path.unlink()  # a server still running keeps writing to its own (unlinked) file
            except OSError:
                pass
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            state = {"pid": 0, "port": port, "token": token, "instance": instance, "version": chatflow_version(),
                     "model": str(path), "model_id": file_id(path), "keep_alive": self.keep_alive,
                     "options": self.options.identity(path), "log": str(log_path), "state": str(state_path),
                     "started_at": time.time()}
            try:
                with os.fdopen(fd, "wb") as out:
                    self.process = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=True, close_fds=True, env={**os.environ, TOKEN_ENV: token},
                    )
                reap_when_done(self.process)
                state["pid"] = self.process.pid
                self.state = state
                self._wait_ready(state, state_path, log_path)
            except PortInUse:
                self._kill_started()
                if attempt == 2:
                    raise LocalModelError(f"the local model server could not bind a port on {self.host}")
                continue
            except BaseException:
                self._kill_started()  # Ctrl-C or an error during start-up: no orphan
                raise
            write_private(state_path, state)
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
        deadline = time.monotonic() + self.options.startup_timeout
        delay = 0.05
        assert self.process is not None
        while True:
            record = exit_record(state_path, state["instance"], wait=0)
            if record is not None or self.process.poll() is not None:
                tail = file_tail(log_path)
                if "address already in use" in tail.lower():
                    raise PortInUse()
                code = record.get("returncode") if record else None
                raise crash_error(code if isinstance(code, int) else None, tail, phase="starting",
                                  log_path=str(log_path), model=Path(str(state["model"])))
            answer = health(state, timeout=1.0, reserve=state["instance"])
            if answer is not None:
                status, data = get_json(f"http://{self.host}:{state['port']}/v1/models", state["token"], 5.0)
                self.model = first_model(data, self.options.alias) if status == 200 else self.options.alias
                state["served_model"] = self.model
                self.n_ctx = state["n_ctx"] = _positive_int(answer.get("n_ctx"))
                return
            if time.monotonic() >= deadline:
                err = LocalModelError(f"the local model server did not answer on 127.0.0.1:{state['port']} "
                                      f"within {self.options.startup_timeout:g} s (its log: {log_path})")
                err.output_tail = file_tail(log_path)  # type: ignore[attr-defined]
                raise err
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def ensure_running(self) -> bool:
        """Before a request: when the server is gone, reuse or start another (``True`` then).

        Raises:
            LocalModelError, LocalServerCrashedError: as :meth:`start`.
        """
        state = self.state
        if (state is not None and pid_alive(int(state["pid"]))
                and exit_record(Path(str(state["state"])), str(state["instance"]), wait=0) is None):
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
            record = exit_record(state_path, str(state["instance"]), wait=0)
            model = Path(str(state["model"])) if state.get("model") else None
            if record is not None:
                code = record.get("returncode")
                if code == 0 or record.get("stopped_by"):
                    return stopped_error(str(path), returncode=code if isinstance(code, int) else None)
                return crash_error(code if isinstance(code, int) else None, file_tail(path), phase="answering",
                                   log_path=str(path), model=model)
            if not pid_alive(int(state["pid"])):
                if self.process is not None and self.process.poll() is not None:
                    code = self.process.returncode
                    return crash_error(None if code in (0, 1) else code, file_tail(path), phase="answering",
                                       log_path=str(path), model=model)
                return crash_error(None, file_tail(path), phase="answering", log_path=str(path), model=model)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def stop(self) -> None:
        """Nothing: the warm server keeps running for others (and for the next chatflow)."""

    close = stop


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
