"""Compaction summaries in every store: the window they make, rollback across them, the lease."""

from __future__ import annotations

from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import SessionBusyError
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.messages import Message, Role


def test_every_store_stores_a_compaction_summary(any_store: Any) -> None:
    _turns(any_store, 2)
    _summarise(any_store, 1)
    stored = any_store.summaries("s")
    assert [(m.content, m.summary_through) for m, *_ in stored] == [("S1", 1)]
    assert stored[0][0].tokens is not None and stored[0][0].tokens > 0
    assert any_store.session_summary("s").status.value == "idle"


def _turns(store: Any, n: int) -> None:
    ctx = store.get_or_create("s", Agent("A"))
    ctx.add_message(Message.system("Be brief."))
    for i in range(1, n + 1):
        ctx.add_message(Message.user(f"q{i}"))
        ctx.add_message(Message.model(f"a{i}"))
        ctx.complete_turn(f"a{i}")
    store.save(ctx)


def _summarise(store: Any, through: int) -> list[Any]:
    session = store.begin_compaction("s", owner=Owner.current())
    return store.finish_compaction(session, Message.summary(f"S{through}", through), {"model": "m",
                                                                                      "tokens_before": 1})


def test_window_is_system_newest_summary_and_turns_after(any_store: Any) -> None:
    _turns(any_store, 5)
    events = _summarise(any_store, 2)
    assert [e.type for e in events] == ["context.compacted", "status"]
    assert events[0].payload["through"] == 2 and events[0].payload["tokens_after"] > 0
    _summarise(any_store, 3)
    ctx = any_store.get("s")
    assert [m.content for m in ctx.history] == ["Be brief.", "S3", "q4", "a4", "q5", "a5"]
    assert ctx.history[1].role is Role.SYSTEM and ctx.history[1].summary_through == 3
    assert [t.number for t in ctx.turns] == [4, 5]
    tokens, turns = any_store.window_tokens("s")
    assert [n for n, _ in turns] == [4, 5] and tokens == sum(m.tokens for m in ctx.history)
    # every original turn stays in the log, the summaries are not turns
    assert [t.number for t in any_store.load_turns("s", first=0)] == [0, 1, 2, 3, 4, 5]
    assert [m.content for t in any_store.load_turns("s", first=0)[:1] for m in t.messages] == ["Be brief."]


def test_rollback_marks_summaries_beyond_and_falls_back(any_store: Any) -> None:
    _turns(any_store, 5)
    _summarise(any_store, 2)
    _summarise(any_store, 4)
    any_store.rollback("s", 3)
    assert [(m.summary_through, r) for m, r in any_store.summaries("s", include_removed=True)] == [(2, False),
                                                                                                  (4, True)]
    assert [m.content for m in any_store.get("s").history] == ["Be brief.", "S2", "q3", "a3"]
    any_store.rollback("s", 0)
    assert [m.content for m in any_store.get("s").history] == ["Be brief."]
    assert any_store.summaries("s") == []


def test_compaction_holds_the_session(any_store: Any) -> None:
    _turns(any_store, 2)
    session = any_store.begin_compaction("s", owner=Owner.current())
    assert any_store.session_summary("s").status.value == "running"
    with pytest.raises(SessionBusyError):
        any_store.begin_compaction("s", owner=Owner.current())
    with pytest.raises(SessionBusyError):
        any_store.rollback("s", 1)
    any_store.finish_compaction(session, Message.summary("S1", 1), {"model": "m", "tokens_before": 1})
    assert any_store.session_summary("s").status.value == "idle"
    with pytest.raises(SessionBusyError):  # the lease is spent
        any_store.finish_compaction(session, Message.summary("S1", 1), {"model": "m", "tokens_before": 1})


def test_fork_copies_the_summaries_within_the_copied_turns(any_store: Any) -> None:
    _turns(any_store, 5)
    _summarise(any_store, 2)
    _summarise(any_store, 4)
    source_events = [e for e in any_store.events("s") if e.type == "context.compacted"]
    any_store.fork("s", 3, into="f3")
    assert [(m.content, m.summary_through, r) for m, r in any_store.summaries("f3", include_removed=True)] == [
        ("S2", 2, False)]  # K <= N only: the summary of 1..4 covers a turn the fork does not have
    assert [m.content for m in any_store.get("f3").history] == ["Be brief.", "S2", "q3", "a3"]
    copied = [e for e in any_store.events("f3") if e.type == "context.compacted"]
    assert len(copied) == 1 and copied[0].payload["through"] == 2
    assert copied[0].payload["copied_from"] == {"session_id": "s", "seq": source_events[0].seq}
    any_store.fork("s", 5, into="f5")
    assert [m.content for m in any_store.get("f5").history] == ["Be brief.", "S4", "q5", "a5"]
    assert any_store.window_tokens("f5")[1] == any_store.window_tokens("s")[1]
    any_store.fork("s", 1, into="f1")
    assert any_store.summaries("f1") == [] and [m.content for m in any_store.get("f1").history] == [
        "Be brief.", "q1", "a1"]
    # a rolled-back summary is not copied
    any_store.rollback("s", 3)
    any_store.fork("s", 3, into="g3")
    assert [m.summary_through for m, _ in any_store.summaries("g3")] == [2]
