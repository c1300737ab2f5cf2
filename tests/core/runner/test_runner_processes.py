"""The Runner across real processes: Ctrl-C and kill -9 mid-tool (issue 4 case 3), a busy session,
and seed 000's no-exec webhook example run as written (the example text lives in
tests/core/test_seed_examples.py, checked word for word against the seed there)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import SessionBusyError, SessionNotFoundError
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.messages import check_history
from chatflow_cli.core.memory import INTERRUPTED_TOOL_RESULT
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.tools import tool
from tests.core.test_seed_examples import WEBHOOK
from tests.helpers.fakeserver import FakeServer
from tests.helpers.wait import wait_until

from .conftest import open_sqlite_store

REPO = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent(
    """
    import sys, time, pathlib
    from chatflow_cli import Agent, Runner, SQLiteSessionStore, tool
    from chatflow_cli.core.errors import RunInterrupted
    from chatflow_cli.core.model import ModelClient

    db, url, marker, session_id, message = sys.argv[1:6]

    @tool
    def deploy(service: str) -> str:
        \"\"\"Deploy a service.\"\"\"
        pathlib.Path(marker).write_text("started")
        time.sleep(60)
        return "deployed"

    agent = Agent("Ops", "Run deployments.", model="fake-model", tools=[deploy])
    runner = Runner(agent, SQLiteSessionStore(db), model_client=ModelClient(url, "k", max_retries=0))
    pathlib.Path(marker + ".ready").write_text("ready")
    try:
        result = runner.run(session_id, message)
    except RunInterrupted as exc:
        print("interrupted:", exc, flush=True)
        sys.exit(130)
    print("result:", result.content, result.turn, flush=True)
    """
)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_child(tmp_path: Path, db: Path, server: FakeServer, session_id: str, message: str) -> tuple[Any, Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    marker = tmp_path / f"marker-{session_id}"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db), server.url, str(marker), session_id, message],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path,
    )
    return proc, marker


def wait_for(predicate: Any, timeout: float = 20.0, proc: Any = None) -> None:
    wait_until(predicate, timeout, "the child to get there", proc=proc)


@pytest.mark.parametrize("how", ["ctrl-c", "kill-9"])
def test_interrupt_while_a_tool_runs_then_a_new_user_message(
    how: str, tmp_path: Path, fake_server: FakeServer, client: Any
) -> None:
    db = tmp_path / "case3.db"
    fake_server.add_tool_calls([("call_D", "deploy", '{"service": "api"}')])
    proc, marker = start_child(tmp_path, db, fake_server, "case-3", "Deploy the api")
    wait_for(marker.exists, proc=proc)
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 130, err
        assert "interrupted: turn 1 was interrupted" in out
    else:
        proc.kill()  # a killed process is found later, by the next run
        proc.communicate(timeout=20)

    @tool
    def deploy(service: str) -> str:
        return "deployed"

    store = open_sqlite_store(db)
    runner = Runner(Agent("Ops", "Run deployments.", model="fake-model", tools=[deploy]), store,
                    model_client=client)
    fake_server.add_text("The deploy was interrupted; shall I check its status?")
    result = runner.run("case-3", "Never mind. Is the api up?")
    assert result.turn == 2
    sent = fake_server.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[2]["tool_calls"][0]["id"] == "call_D"
    assert sent[3] == {"role": "tool", "tool_call_id": "call_D", "content": INTERRUPTED_TOOL_RESULT}
    assert sent[4] == {"role": "user", "content": "Never mind. Is the api up?"}
    interrupted = [e for e in store.events("case-3") if e.type == "turn.interrupted"]
    assert len(interrupted) == 1 and interrupted[0].payload["tool_use_ids"] == ["call_D"]
    synthetic = [m for m in store.get("case-3").history if m.role.value == "tool"]
    assert len(synthetic) == 1 and synthetic[0].interrupted and synthetic[0].is_error
    if how == "kill-9":
        assert [e.type for e in store.events("case-3")].count("session.recovered") == 1
    check_history(store.get("case-3").history)


def test_busy_session_across_two_processes(tmp_path: Path, fake_server: FakeServer, client: Any) -> None:
    db = tmp_path / "busy.db"
    fake_server.add_text("a slow answer in four chunks", chunks=["a slow", " answer", " in four", " chunks"],
                         delay=0.4)
    proc, _ = start_child(tmp_path, db, fake_server, "shared", "first question")
    store = open_sqlite_store(db)

    def running() -> bool:
        try:
            return any(e.type == "message.user" for e in store.events("shared"))
        except SessionNotFoundError:  # not created yet
            return False

    wait_for(running, proc=proc)
    runner = Runner(Agent("Ops", "Run deployments.", model="fake-model"), store, model_client=client)
    seq = store.last_seq("shared")
    started = time.monotonic()
    with pytest.raises(SessionBusyError, match="is running"):
        runner.run("shared", "second question", wait=0)
    assert time.monotonic() - started < 1.0, "no wait with wait=0"
    assert store.last_seq("shared") == seq, "a refused run writes nothing"
    [summary] = store.list_sessions()
    assert summary.status is SessionStatus.RUNNING

    result = runner.run("shared", "second question", wait=30)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "result: a slow answer in four chunks 1" in out
    assert result.turn == 2 and result.content == "ok: second question"
    sent = fake_server.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]


def test_the_webhook_example_runs_as_written(tmp_path: Path, fake_server: FakeServer) -> None:
    script = tmp_path / "webhook.py"
    script.write_text(WEBHOOK.lstrip("\n"))
    env = child_env()
    env.update(OPENAI_BASE_URL=fake_server.url, OPENAI_API_KEY="test-key")
    fake_server.add_tool_calls([("call_1", "check_order_status", '{"order_id": "404"}')])
    fake_server.add_text("Order 404 is in transit and arrives tomorrow.")

    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Webhook Response: Order 404 is in transit and arrives tomorrow."
    first, second = fake_server.requests
    assert first["model"] == "gemini-2.5-flash"
    assert first["messages"] == [
        {"role": "system", "content": "Assist customers with order queries. Use check_order_status."},
        {"role": "user", "content": "Where is order 404?"},
    ]
    assert first["tools"][0]["function"]["name"] == "check_order_status"
    assert first["tools"][0]["function"]["description"] == "Check shipment tracking for an order ID."
    assert second["messages"][-1] == {
        "role": "tool", "tool_call_id": "call_1",
        "content": '{"order_id": "404", "status": "IN_TRANSIT", "eta": "Tomorrow"}',
    }
    store = open_sqlite_store(tmp_path / "chat_sessions.db")
    session = store.get("+15550199")
    assert session is not None and session.metadata == {"channel": "whatsapp", "phone": "+15550199"}
    assert session.max_turns == 30 and session.status is SessionStatus.IDLE

    # the same webhook delivered again (a new process, the same database): skipped, no model call
    again = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60, check=False)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["Skipping duplicate webhook: msg_id_001", "Webhook Response: None"]
    assert len(fake_server.requests) == 2
