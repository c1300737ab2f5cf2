"""A brand-new session's model and endpoint are stored when its first turn begins, so a
process that resumes or waits on it while that turn still runs talks to the same place."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess

from tests.cli.conftest import COMMAND, REPO, db_path
from tests.helpers.wait import wait_until


def test_a_session_whose_first_turn_runs_already_has_its_model_and_endpoint(chatflow, provider):
    provider.add_hang()
    provider.add_text("second answer")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    first = subprocess.Popen([*COMMAND, "chat", "-s", "fresh", "-m", "fake-first", "--base-url", provider.url,
                              "--timeout", "60", "first"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, env=env)
    second = None
    try:
        wait_until(lambda: provider.requests, 60, "the first turn's request to reach the server", proc=first)
        head = chatflow("sessions", "show", "fresh", "--json").json()["session"]
        assert (head["model"], head["base_url"]) == ("fake-first", provider.url)
        # a process started now, with other defaults, waits for the turn and then uses the session's
        elsewhere = dict(env, OPENAI_BASE_URL="http://127.0.0.1:9/v1", CHATFLOW_MODEL="fake-default")
        second = subprocess.Popen([*COMMAND, "chat", "-s", "fresh", "--wait", "60", "second"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                  env=elsewhere)
        wait_until(lambda: _queued(), 60, "the second process to wait in the session's queue", proc=second)
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=30)
        out, err = second.communicate(timeout=60)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert second.returncode == 0, err
    assert out == b"second answer\n"
    assert provider.requests[-1]["model"] == "fake-first"


def _queued() -> int:
    """How many callers wait in the session's turn queue (read from the SQLite file)."""
    with sqlite3.connect(db_path(), timeout=30) as db:
        return db.execute("SELECT count(*) FROM chatflow_turn_queue WHERE session_id = 'fresh'").fetchone()[0]
