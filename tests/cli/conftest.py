"""Fixtures for the command-line tests: they run the real ``chatflow`` process.

``tests/conftest.py`` (autouse ``isolated_home``) already points ``CHATFLOW_HOME`` and
``CHATFLOW_CONFIG`` at a temporary directory and clears the provider variables; the
subprocesses started here inherit that environment.

* ``chatflow`` -- a callable running ``chatflow ARGS...`` as a subprocess and returning a
  :class:`Result` (exit code, stdout/stderr as text and bytes). ``input=`` feeds stdin
  (``None``: ``/dev/null``), ``env=`` adds variables, ``timeout=`` bounds the run.
* ``provider`` -- the ``fake_server`` fixture (tests/fakeserver.py) wired in through
  ``OPENAI_BASE_URL`` and ``CHATFLOW_MODEL=fake-model``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

BIN = Path(sys.executable).with_name("chatflow")
#: How to start chatflow: the installed console script, else ``python -m chatflow_cli``.
COMMAND = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "chatflow_cli"]
REPO = Path(__file__).resolve().parents[2]


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
                 timeout: float = 60, cwd: str | os.PathLike[str] | None = None) -> Result:
    full_env = dict(os.environ)
    full_env.pop("COLUMNS", None)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH", "")]))
    if env:
        full_env.update(env)
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run(
        [*COMMAND, *args],
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
