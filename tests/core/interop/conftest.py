"""Fixtures of the interop tests: an llm ``logs.db`` written by the real ``llm`` CLI.

``llm_logs_db`` runs the installed ``llm`` (the ``bench`` extra; llm 0.3x writes the
threads/messages/parts schema) against the fake OpenAI-compatible server over real HTTP,
with its own ``LLM_USER_PATH``: a conversation of two prompts with a system prompt, a
prompt whose model calls a tool (``--functions``), and one with a fragment (``-f``).
``data/llm-0.27-logs.db`` is the same session made by llm 0.27.1, which wrote the older
responses/conversations schema (see ``data/README.md``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fakeserver import FakeServer
from tests.helpers.snapshot import built_once

DATA = Path(__file__).parent / "data"
ADD_TOOL = 'def add(a: int, b: int) -> int:\n    "Add two numbers."\n    return a + b\n'


def run_llm_session(home: Path, url: str, llm: list[str], env_extra: dict[str, str] | None = None) -> None:
    """The four ``llm`` calls both fixtures are made of, against the fake server at ``url``."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "extra-openai-models.yaml").write_text(
        f'- model_id: fake\n  model_name: fake-model\n  api_base: "{url}"\n  api_key_name: fakekey\n'
        "  supports_tools: true\n"
    )
    (home / "keys.json").write_text('{"fakekey": "test"}')
    notes = home / "notes.txt"
    notes.write_text("Notes: the meeting is at noon.\n")
    env = {**os.environ, "LLM_USER_PATH": str(home), **(env_extra or {})}
    env.pop("OPENAI_API_KEY", None)
    for args in (
        ["-m", "fake", "What is the capital of France?", "-s", "Be brief."],
        ["-m", "fake", "-c", "How many people live there?"],
        ["-m", "fake", "--functions", ADD_TOOL, "What is 2+3?"],
        ["-m", "fake", "-f", str(notes), "When is the meeting?"],
    ):
        subprocess.run([*llm, *args], env=env, check=True, capture_output=True, timeout=120)


def script_replies(server: FakeServer) -> None:
    server.add_text("Paris is the capital.")
    server.add_text("About 2.1 million people.")
    server.add_tool_calls([("call_1", "add", '{"a": 2, "b": 3}')])
    server.add_text("2 + 3 = 5")
    server.add_text("At noon.")


@pytest.fixture(scope="session")
def llm_logs_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if importlib.util.find_spec("llm") is None:
        pytest.skip("the llm CLI is not installed (pip install -e '.[bench]')")

    def build(home: Path) -> None:
        with FakeServer() as server:
            script_replies(server)
            run_llm_session(home, server.url, [sys.executable, "-m", "llm"])

    yield built_once(tmp_path_factory, "llm-home", build) / "logs.db"


@pytest.fixture(scope="session")
def upgraded_llm_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``data/llm-0.27-logs.db`` after the installed llm (0.3x) migrated it and continued its
    first conversation with one prompt (``--cid``): the older turns stay in the responses
    tables, and a thread with the conversation's id holds the whole conversation."""
    if importlib.util.find_spec("llm") is None:
        pytest.skip("the llm CLI is not installed (pip install -e '.[bench]')")

    def build(home: Path) -> None:
        shutil.copy(DATA / "llm-0.27-logs.db", home / "logs.db")
        first = sqlite3.connect(home / "logs.db").execute(
            "select conversation_id from responses order by datetime_utc limit 1").fetchone()[0]
        with FakeServer() as server:
            server.add_text("Lyon is second.")
            (home / "extra-openai-models.yaml").write_text(
                f'- model_id: fake\n  model_name: fake-model\n  api_base: "{server.url}"\n  api_key_name: fakekey\n')
            (home / "keys.json").write_text('{"fakekey": "test"}')
            env = {**os.environ, "LLM_USER_PATH": str(home)}
            env.pop("OPENAI_API_KEY", None)
            subprocess.run([sys.executable, "-m", "llm", "-m", "fake", "--cid", first, "And the second city?"],
                           env=env, check=True, capture_output=True, timeout=120)

    yield built_once(tmp_path_factory, "llm-upgraded", build) / "logs.db"


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Stores of the kind under test; SQLite stores with the same name share one real file."""
    from chatflow_cli.core.memory import SessionStore
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    opened: list[Any] = []
    memory: dict[str, Any] = {}

    def make(name: str = "target") -> Any:
        if request.param == "memory":
            store = memory.setdefault(name, SessionStore())
        else:
            store = SQLiteSessionStore(tmp_path / f"{name}.db")
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
