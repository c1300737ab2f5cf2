"""SIGKILL a compaction at each of its commits: the session stays valid and usable.

A compaction is two write transactions: taking the session (``running`` under the
compacting process) and storing the summary with its ``context.compacted`` event (and
``idle``). A child process compacts against the fake server and kills itself just before
or just after either COMMIT (``tests/hardening/faults``); then the stored window passes the
validity checks, the log has no gap, a summary exists only when its commit happened, and
the next turn runs (recovering the dead compaction's hold on the session).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.model import ModelClient
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from tests.hardening.harness import FAULTS_DIR, assert_seq_gap_free, env_for, read_events, window_problems
from tests.helpers.fakeserver import FakeServer

CHILD = """
import sys
from chatflow_cli.core.compaction import compact_session
from chatflow_cli.core.model import ModelClient
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
store = SQLiteSessionStore(sys.argv[1])
client = ModelClient(sys.argv[2], "test-key", max_retries=0, timeout=20)
compact_session(store, "s", client, "m", through=2)
print("compacted")
"""


@pytest.mark.parametrize("kill", ["before:1", "after:1", "before:2", "after:2"])
def test_sigkill_during_compaction_leaves_the_session_valid(kill: str, tmp_path: Path,
                                                            fake_server: FakeServer) -> None:
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(str(db))
    client = ModelClient(fake_server.url, "test-key", max_retries=0, timeout=20)
    runner = Runner(Agent("A"), store, model_client=client, default_model="m")
    for i in range(1, 4):
        fake_server.add_text(f"answer {i}")
        runner.run("s", f"question {i}")
    fake_server.add_text("the summary")
    child = subprocess.run([sys.executable, "-c", CHILD, str(db), fake_server.url], capture_output=True, timeout=60,
                           env=env_for({"CHATFLOW_HARDEN_KILL": kill}, pythonpath=[FAULTS_DIR]))
    assert child.returncode == -9, child.stderr.decode()
    assert window_problems(db, "s") == []
    events = read_events(db, "s")
    assert_seq_gap_free(events)
    summarised = kill == "after:2"
    assert (store.summaries("s") != []) is summarised
    assert ("context.compacted" in [t for _, t, _ in events]) is summarised
    # the next turn runs: a dead compaction's hold is recovered like a dead turn's
    if fake_server.pending:
        fake_server.clear()
    fake_server.add_text("still here")
    result = runner.run("s", "question 4")
    assert result.content == "still here" and result.turn == 4
    sent = [m["content"] for m in fake_server.requests[-1]["messages"]]
    assert sent[0] == ("the summary" if summarised else "question 1")
    assert window_problems(db, "s") == []
    # the dead compaction interrupted no turn: turn 3 was complete and stays so
    after = read_events(db, "s")
    assert "turn.interrupted" not in [t for _, t, _ in after]
    recovered = [json.loads(p) for _, t, p in after if t == "session.recovered"]
    taken = kill in ("after:1", "before:2")  # the compaction held the session when it died
    assert [r.get("during") for r in recovered] == (["compaction"] if taken else [])
    assert [t.number for t in store.load_turns("s")][-2:] == [3, 4]
    client.close()
    store.close()
