"""Looking a stored session up for a front-end reads it and changes nothing about the store."""

from __future__ import annotations

from pathlib import Path

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from chatflow_cli.lookup import find_session


def test_find_session_reads_the_summary_and_leaves_the_runners_agents_in_place(tmp_path: Path) -> None:
    """The store a Runner resolves agents through is looked up before a turn (``chat -s``, the
    REPL): its sessions still load with the Runner's own agents afterwards."""
    store = SQLiteSessionStore(tmp_path / "s.db")
    try:
        support = Agent("Support", "Answer.", model="m")
        runner = Runner(support, store, model_client=lambda: None)  # no request is made
        store.save(store.get_or_create("s1", support, max_turns=7))

        found = find_session(store, "s1")

        assert found is not None and (found.session_id, found.max_turns) == ("s1", 7)
        assert found.active_agent_name == "Support"
        loaded = store.get("s1")
        assert loaded is not None and loaded.active_agent is runner.agents["Support"]
        assert find_session(store, "nobody") is None
    finally:
        store.close()
