"""Fixtures of the REPL tests: ``repl_driver`` runs the REPL in process against the fake server.

The driver itself (:class:`tests.helpers.repl_driver.Driver`) and ``recording_output`` live in
tests/helpers/repl_driver.py; ``pty_chatflow`` (the real process in a pseudo-terminal) is in
tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.repl_driver import Driver


@pytest.fixture
def repl_driver(fake_server: Any, isolated_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Driver:
    monkeypatch.setenv("OPENAI_BASE_URL", fake_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("CHATFLOW_MODEL", "fake-model")
    monkeypatch.setenv("EDITOR", "false")
    monkeypatch.delenv("VISUAL", raising=False)
    config = tmp_path / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    return Driver(fake_server, isolated_home, config)
