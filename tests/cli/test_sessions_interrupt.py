"""``chatflow sessions interrupt ID``: another process asks the running turn to stop; it stops
at its next chunk, keeps the partial reply, and the session is idle -- on SQLite and on
PostgreSQL, with real chatflow processes on both sides."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.conftest import COMMAND, REPO


def _start_chat(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)


@pytest.fixture(params=["sqlite", "postgres"])
def db_args(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "sqlite":
        return ["--db", str(tmp_path / "chat.db")]
    return ["--db", request.getfixturevalue("pg_dsn")]


def test_interrupt_stops_another_process_turn_and_keeps_the_partial_reply(
    chatflow: Callable[..., Any], provider: Any, db_args: list[str]
) -> None:
    chunks = ["First part. "] + [f"part {i}. " for i in range(60)]
    provider.add_text("".join(chunks), chunks=chunks, delay=[0] + [0.25] * 60)
    chat = _start_chat(*db_args, "chat", "-s", "long", "--output", "jsonl", "tell me everything")
    assert chat.stdout is not None
    for raw in chat.stdout:  # wait until the reply has started
        if json.loads(raw).get("type") == "text.delta":
            break
    asked = chatflow(*db_args, "sessions", "interrupt", "long", "--json")
    assert asked.returncode == 0, asked
    report = asked.json()
    assert report == {"session_id": "long", "turn": 1, "requested": True, "outcome": "turn.interrupted"}
    rest, err = chat.communicate(timeout=60)
    assert chat.returncode == 130, err.decode()
    assert "at another process's request" in err.decode()

    shown = chatflow(*db_args, "sessions", "show", "long", "--json").json()
    [turn] = shown["turns"]
    reply = turn["messages"][-1]
    assert reply["interrupted"] is True and reply["content"].startswith("First part.")
    assert len(reply["content"]) < len("".join(chunks))
    [summary] = chatflow(*db_args, "sessions", "ls", "--json").json()
    assert summary["status"] == "idle"
    types = [e["type"] for e in chatflow(*db_args, "replay", "long", "--json").jsonl()]
    assert types.index("turn.interrupt_requested") < types.index("turn.interrupted")
    text = chatflow(*db_args, "replay", "long").stdout.splitlines()
    [requested] = [line for line in text if "turn.interrupt_requested" in line]
    assert "turn.interrupt_requested turn 1" in requested, requested  # the type, a space, its text
    nothing = chatflow(*db_args, "sessions", "interrupt", "long")
    assert nothing.returncode == 0 and "nothing to interrupt" in nothing.stderr


def test_interrupt_of_an_unknown_session_is_not_found(chatflow: Callable[..., Any], tmp_path: Path) -> None:
    r = chatflow("--db", str(tmp_path / "x.db"), "sessions", "interrupt", "nope")
    assert r.returncode == 3, r
