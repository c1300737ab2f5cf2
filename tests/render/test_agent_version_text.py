"""The words of the agent-changed notice and the per-turn marks of ``sessions show``."""

from __future__ import annotations

from chatflow_cli.core.memory import TurnRecord
from chatflow_cli.core.messages import Message
from chatflow_cli.render import AgentVersionMarks, agent_changed_text


def test_the_notice_names_the_last_turn_of_the_old_version_only_when_it_is_earlier() -> None:
    data = {"turn": 13, "agent": "Support", "version": "b" * 12, "previous_version": "a" * 12, "since_turn": 12}
    assert agent_changed_text(data) == f"agent Support changed since turn 12 ({'a' * 12} -> {'b' * 12})"
    # a turn continued after tool results, or turn numbers used again after a rollback
    assert agent_changed_text({**data, "since_turn": 13}) == f"agent Support changed ({'a' * 12} -> {'b' * 12})"
    assert agent_changed_text({**data, "since_turn": 20}) == f"agent Support changed ({'a' * 12} -> {'b' * 12})"
    assert "\x1b" not in agent_changed_text({**data, "agent": "Sup\x1b[31mport"})


def _turn(number: int, version: str | None, *, rolled_back: bool = False) -> TurnRecord:
    reply = Message.model("ok", agent="Support", agent_version=version)
    return TurnRecord(number, (Message.user("q"), reply), True, rolled_back=rolled_back)


def test_marks_compare_with_the_latest_known_live_version() -> None:
    marks = AgentVersionMarks()
    assert marks.changes(_turn(1, None)) == []  # unknown: nothing to compare
    assert marks.changes(_turn(2, "v1")) == []  # the first known version
    assert marks.changes(_turn(3, None)) == []
    assert marks.changes(_turn(4, "v2", rolled_back=True)) == [{"agent": "Support", "from": "v1", "to": "v2"}]
    assert marks.changes(_turn(4, "v1")) == []  # the rolled-back turn did not move the live history
    assert marks.changes(_turn(5, "v2")) == [{"agent": "Support", "from": "v1", "to": "v2"}]
    assert marks.changes(_turn(6, "v2")) == []
