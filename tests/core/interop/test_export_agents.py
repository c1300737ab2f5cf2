"""Exports name the agent a rollback brought back: the header, the Markdown front matter and
each turn's starting agent follow the rollback as the store does, in logs written before
rollbacks recorded the agent too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chatflow_cli.core.events import Event
from chatflow_cli.core.interop.exporter import _state_of, _turn_agents, export_lines, session_header
from chatflow_cli.core.memory import SessionContext
from chatflow_cli.core.messages import Message, Role
from chatflow_cli.core.sqlite_store import SQLiteSessionStore


def _turn_with_handoff(target: str, n: int) -> Any:
    def change(ctx: SessionContext) -> None:
        ctx.add_message(Message.user(f"question {n}"))
        ctx.set_active_agent(target)
        ctx.add_message(Message(Role.MODEL, f"{target} answers {n}", agent=target))
    return change


def test_the_header_and_markdown_of_a_rolled_back_session_name_the_restored_agent(chatflow: Any,
                                                                                   tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    store = SQLiteSessionStore(db)
    store.edit("s", _turn_with_handoff("B", 1), create_agent="A")
    store.edit("s", _turn_with_handoff("C", 2))
    store.rollback("s", 1)
    assert store.active_agent_name("s") == "B"
    assert session_header(store, "s")["agent"] == "B"
    md = "".join(export_lines(store, "s", "md"))
    assert 'agent: "B"' in md.split("---")[1]
    store.rollback("s", 0)
    assert session_header(store, "s")["agent"] == "A"
    store.edit("s", _turn_with_handoff("C", 3))
    store.rollback("s", 1)
    assert session_header(store, "s")["agent"] == "C"
    store.close()

    source = tmp_path / "s.md"
    source.write_text("".join(export_lines(SQLiteSessionStore(db), "s", "md")), encoding="utf-8")
    other = tmp_path / "b.db"
    assert chatflow("--db", str(other), "sessions", "import", str(source), "--from", "md").returncode == 0
    assert [row["agent"] for row in chatflow("--db", str(other), "sessions", "ls", "--json").json()] == ["C"]


def _log(*events: tuple[str, dict[str, Any]]) -> list[Event]:
    return [Event("s", seq, kind, payload) for seq, (kind, payload) in enumerate(events, start=1)]


def test_a_log_written_before_rollbacks_recorded_the_agent_is_replayed() -> None:
    events = _log(
        ("session.created", {"agent": "A", "max_turns": 40, "metadata": {}}),
        ("message.user", {"turn": 1}),
        ("handoff", {"turn": 1, "from_agent": "A", "to_agent": "B"}),
        ("message.user", {"turn": 2}),
        ("handoff", {"turn": 2, "from_agent": "B", "to_agent": "C"}),
        ("rollback", {"to_turn": 1, "removed_turns": [2]}),  # no "active_agent": an older chatflow
        ("message.user", {"turn": 2}),
    )
    assert _state_of(events)["agent"] == "B"
    assert _turn_agents(events) == {1: "A", 2: "B"}
    cleared = [*events, Event("s", 8, "rollback", {"to_turn": 0, "removed_turns": [1, 2], "system": True})]
    assert _state_of(cleared)["agent"] == "A"


def test_an_openai_export_of_an_imported_llm_conversation_holds_what_llm_sent(tmp_path: Path) -> None:
    """llm sent its own system prompt (or none), never chatflow's agent instructions: the
    export of an imported llm conversation starts with llm's system prompt alone, or with
    the first prompt; a turn run by chatflow after the import gets its agent's instructions."""
    from chatflow_cli.core.interop import read_source
    from chatflow_cli.core.interop.importer import import_sessions
    from chatflow_cli.core.memory import SessionStore

    from .conftest import DATA

    store = SessionStore()
    fmt, sessions = read_source(str(DATA / "llm-0.27-logs.db"))
    first, second, _ = import_sessions(store, sessions, fmt=fmt, source="logs.db")
    instructions = {"Assistant": "You are chatflow's helpful assistant."}

    def exported(session_id: str) -> list[dict[str, Any]]:
        line = "".join(export_lines(store, session_id, "openai", instructions=instructions))
        return json.loads(line)["messages"]

    assert [m["role"] for m in exported(first.session_id)][:2] == ["system", "user"]
    assert exported(first.session_id)[0]["content"] == "Be brief."
    assert exported(second.session_id)[0] == {"role": "user", "content": "What is 2+3?"}
    # chatflow goes on with the conversation: its own turn was sent the instructions
    session = store.get_or_create(second.session_id, "Assistant")
    session.add_message(Message.user("And 3+4?"))
    session.add_message(Message.model("7"))
    session.complete_turn("7")
    store.save(session)
    per_turn = [json.loads(x)["messages"] for x in export_lines(store, second.session_id, "openai", per_turn=True,
                                                                instructions=instructions)]
    assert per_turn[0][0]["role"] == "user"
    assert per_turn[1][0] == {"role": "system", "content": "You are chatflow's helpful assistant."}
