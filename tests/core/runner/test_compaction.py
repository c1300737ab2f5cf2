"""Compaction against the fake server: the request, the event, the stored summary, the
window after; idempotency, a busy session, rollback across a compaction, automatic
compaction before a turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.compaction import DEFAULT_PROMPT, compact_session, compaction_point
from chatflow_cli.core.errors import (
    ProviderResponseError,
    RateLimitedError,
    SessionBusyError,
    SummaryTooLongError,
    UsageError,
)
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.messages import Message, Role
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.tools import tool


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


def _chat(runner: Runner, fake_server: Any, n: int, session: str = "s") -> None:
    for i in range(1, n + 1):
        fake_server.add_text(f"answer {i}")
        runner.run(session, f"question {i}")


def test_compaction_request_event_summary_and_window(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any, client: Any
) -> None:
    runner = make_runner(Agent("A", instructions="Be brief.", tools=[lookup]), default_model="m")
    fake_server.add_tool_calls([("call_1", "lookup", '{"order_id": "A-7"}')])
    fake_server.add_text("A-7 shipped.")
    runner.run("s", "where is order A-7?")
    _chat(runner, fake_server, 3)  # turns 2..4
    fake_server.add_text("The user asked about order A-7 (shipped) and questions 1 and 2.")
    done = compact_session(sqlite_store, "s", client, "m", through=3, instructions="keep order ids",
                           tools=[lookup.to_wire()])
    body = fake_server.requests[-1]
    # one tool-free request: the tools are shown, tool_choice none
    assert body["tool_choice"] == "none" and [t["function"]["name"] for t in body["tools"]] == ["lookup"]
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"] == DEFAULT_PROMPT
    asked = body["messages"][1]["content"]
    assert "## Turn 1" in asked and "Assistant called lookup" in asked and "order A-7: shipped" in asked
    assert "## Turn 3" in asked and "## Turn 4" not in asked and "Focus: keep order ids" in asked
    # the event
    event = done.events[0]
    assert event.type == "context.compacted"
    assert event.payload["through"] == 3 and event.payload["model"] == "m"
    assert event.payload["instructions"] == "keep order ids"
    assert event.payload["tokens_after"] < event.payload["tokens_before"]
    assert [e.type for e in done.events] == ["context.compacted", "status"]
    assert sqlite_store.session_summary("s").status.value == "idle"
    # the stored summary, flagged, and nothing deleted
    ((summary, removed),) = sqlite_store.summaries("s")
    assert summary.role is Role.SYSTEM and summary.summary_through == 3 and not removed
    assert summary.content == "The user asked about order A-7 (shipped) and questions 1 and 2."
    assert [t.number for t in sqlite_store.load_turns("s")] == [1, 2, 3, 4]
    # the window after: real system messages, the summary, live turns after K
    ctx = sqlite_store.get("s")
    assert [m.role for m in ctx.history] == [Role.SYSTEM, Role.USER, Role.MODEL]
    assert ctx.history[0].summary_through == 3 and ctx.history[1].content == "question 3"
    # the next turn sends it
    fake_server.add_text("ok")
    runner.run("s", "and now?")
    sent = fake_server.requests[-1]["messages"]
    assert [m["content"] for m in sent] == ["Be brief.", summary.content, "question 3", "answer 3", "and now?"]


def test_same_through_and_instructions_is_not_compacted_twice(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any, client: Any
) -> None:
    runner = make_runner(Agent("A"), default_model="m")
    _chat(runner, fake_server, 3)
    fake_server.add_text("summary one")
    first = compact_session(sqlite_store, "s", client, "m", through=2)
    requests = len(fake_server.requests)
    again = compact_session(sqlite_store, "s", client, "m", through=2)
    assert again.repeated and again.summary == "summary one" and again.events == ()
    assert len(fake_server.requests) == requests and len(sqlite_store.summaries("s")) == 1
    fake_server.add_text("summary two")
    other = compact_session(sqlite_store, "s", client, "m", through=2, instructions="names only")
    assert not other.repeated and other.summary == "summary two" and not first.repeated
    with pytest.raises(UsageError, match="already summarised through turn 2"):
        compact_session(sqlite_store, "s", client, "m", through=1)
    with pytest.raises(UsageError, match="turns are 1..3"):
        compact_session(sqlite_store, "s", client, "m", through=4)


def test_compaction_takes_the_session_like_a_turn(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any, client: Any
) -> None:
    runner = make_runner(Agent("A"), default_model="m")
    _chat(runner, fake_server, 2)
    session = sqlite_store.begin_compaction("s", owner=Owner.current())
    with pytest.raises(SessionBusyError):
        runner.run("s", "meanwhile", wait=0)
    with pytest.raises(SessionBusyError):
        compact_session(sqlite_store, "s", client, "m", through=1)
    sqlite_store.release(session, reason="compaction failed")
    fake_server.add_text("fine")
    assert runner.run("s", "now").content == "fine"


def test_a_failed_compaction_leaves_the_session_as_it_was(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any, client: Any
) -> None:
    runner = make_runner(Agent("A"), default_model="m")
    _chat(runner, fake_server, 3)
    before = [m.content for m in sqlite_store.get("s").history]
    fake_server.add_error(500, {"error": {"message": "boom", "type": "server_error"}})
    with pytest.raises(RateLimitedError):  # a 500 with no retries left
        compact_session(sqlite_store, "s", client, "m", through=2)
    assert sqlite_store.summaries("s") == [] and sqlite_store.session_summary("s").status.value == "idle"
    assert [m.content for m in sqlite_store.get("s").history] == before


def test_rollback_across_a_compaction_falls_back(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any, client: Any
) -> None:
    runner = make_runner(Agent("A"), default_model="m")
    _chat(runner, fake_server, 6)
    fake_server.add_text("summary of 1..2")
    compact_session(sqlite_store, "s", client, "m", through=2)
    fake_server.add_text("summary of 1..4")
    compact_session(sqlite_store, "s", client, "m", through=4)
    assert [m.content for m in sqlite_store.get("s").history][:2] == ["summary of 1..4", "question 5"]
    sqlite_store.rollback("s", 3)  # 3 < 4: the newer summary is marked, the older one applies again
    listed = sqlite_store.summaries("s", include_removed=True)
    assert [(m.summary_through, removed) for m, removed in listed] == [(2, False), (4, True)]
    assert [m.content for m in sqlite_store.get("s").history] == ["summary of 1..2", "question 3", "answer 3"]
    sqlite_store.rollback("s", 1)  # below every summary: plain turns
    assert [m.content for m in sqlite_store.get("s").history] == ["question 1", "answer 1"]
    assert [(m.summary_through, removed) for m, removed in sqlite_store.summaries("s", include_removed=True)] == [
        (2, True), (4, True)]
    fake_server.add_text("again")
    runner.run("s", "next")
    assert [m["content"] for m in fake_server.requests[-1]["messages"]] == ["question 1", "answer 1", "next"]


def test_compaction_point_keeps_the_newest_turns() -> None:
    assert compaction_point([(1, 100)], 1000) is None
    assert compaction_point([(1, 400), (2, 400), (3, 100), (4, 100)], 1000) == 2
    assert compaction_point([(5, 400), (6, 900)], 1000) == 5  # the newest turn stays, even when large


def test_automatic_compaction_before_the_next_request(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any
) -> None:
    runner = make_runner(Agent("A"), default_model="m", max_context_tokens=1000, max_tokens=200)
    for i in range(1, 5):
        fake_server.add_text(f"answer {i} " + "detail " * 60)
        runner.run("s", f"question {i} " + "word " * 60)
    assert sqlite_store.summaries("s") == []
    fake_server.add_text("SUMMARY: questions 1..3 answered")
    fake_server.add_text("the reply")
    result = runner.run("s", "question 5")
    compaction, turn = fake_server.requests[-2], fake_server.requests[-1]
    assert compaction["messages"][0]["content"] == DEFAULT_PROMPT and "tools" not in compaction
    assert result.content == "the reply"
    ((summary, _),) = sqlite_store.summaries("s")
    assert turn["messages"][0] == {"role": "system", "content": "SUMMARY: questions 1..3 answered"}
    assert turn["messages"][1]["content"].startswith(f"question {summary.summary_through + 1}")
    assert any(e.type == "context.compacted" for e in result.events)
    assert result.context is not None and result.context["tokens"] <= 0.8 * 800


def test_automatic_compaction_off_switch(make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any) -> None:
    runner = make_runner(Agent("A"), default_model="m", max_context_tokens=1000, max_tokens=200, compact_at=None)
    for i in range(1, 6):
        fake_server.add_text(f"answer {i} " + "detail " * 60)
        runner.run("s", f"question {i} " + "word " * 60)
    assert sqlite_store.summaries("s") == [] and len(fake_server.requests) == 5


def _long_summary(words: int) -> tuple[str, list[str]]:
    """A summary of ``words`` words, one chunk a word (the fake server counts a completion
    token per chunk, so the stored summary counts about ``words`` tokens)."""
    pieces = [f"fact{i} " for i in range(words)]
    return "".join(pieces), pieces


def test_a_summary_that_saves_no_room_is_refused(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any, client: Any
) -> None:
    runner = make_runner(Agent("A"), default_model="m")
    _chat(runner, fake_server, 3)  # three short turns: a few dozen tokens
    before = [m.content for m in sqlite_store.get("s").history]
    text, chunks = _long_summary(300)
    fake_server.add_text(text, chunks=chunks)
    with pytest.raises(SummaryTooLongError, match=r"the summary \(about \d+ tokens\) is not shorter than what it "
                       r"would replace \(about \d+ tokens\); nothing was compacted") as info:
        compact_session(sqlite_store, "s", client, "m", through=2)
    assert info.value.exit_code == 5
    assert sqlite_store.summaries("s") == [] and sqlite_store.session_summary("s").status.value == "idle"
    assert [m.content for m in sqlite_store.get("s").history] == before
    assert not any(e.type == "context.compacted" for e in sqlite_store.events("s"))


@pytest.mark.parametrize("kind", ["no finish reason", "interrupted by the server"])
def test_a_summary_whose_stream_did_not_finish_is_refused(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any, client: Any, kind: str
) -> None:
    runner = make_runner(Agent("A"), default_model="m")
    _chat(runner, fake_server, 3)
    if kind == "no finish reason":
        fake_server.add_text("S: the first two questions were", finish_reason=None)
    else:
        fake_server.add_text("S: the first two questions were", finish_reason="error")
    with pytest.raises(ProviderResponseError, match="nothing was compacted") as info:
        compact_session(sqlite_store, "s", client, "m", through=2, cancel=None)
    assert "did not finish" in info.value.message or "unknown finish reason" in info.value.message
    assert sqlite_store.summaries("s") == [] and sqlite_store.session_summary("s").status.value == "idle"
    # streamed (a cancel event given): the same refusal
    fake_server.add_text("S: the first two questions were", finish_reason=None)
    import threading

    with pytest.raises(ProviderResponseError, match="nothing was compacted"):
        compact_session(sqlite_store, "s", client, "m", through=2, cancel=threading.Event())
    assert sqlite_store.summaries("s") == []


def _stopped(result: Any) -> list[Any]:
    return [e for e in result.events if e.type == "context.compaction_stopped"]


def test_automatic_compaction_whose_summary_saves_no_room_stops_and_says_so_once(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any, client: Any
) -> None:
    runner = make_runner(Agent("A"), default_model="m", max_context_tokens=1000, max_tokens=200)
    for i in range(1, 5):
        fake_server.add_text(f"answer {i} " + "detail " * 60)
        runner.run("s", f"question {i} " + "word " * 60)
    text, chunks = _long_summary(900)
    fake_server.add_text(text, chunks=chunks)  # longer than the turns it would replace: refused
    fake_server.add_text("reply 5")
    fifth = runner.run("s", "question 5")
    assert fifth.content == "reply 5" and sqlite_store.summaries("s") == []
    [stop] = _stopped(fifth)
    assert "is not shorter than what it would replace" in stop.payload["reason"] and stop.seq is not None
    requests = len(fake_server.requests)
    for i in range(6, 9):  # no compaction request again, and nothing said again
        fake_server.add_text(f"reply {i} " + "detail " * 60)
        later = runner.run("s", f"question {i} " + "word " * 60)
        assert _stopped(later) == [] and not any(e.type == "context.compacted" for e in later.events)
    assert len(fake_server.requests) == requests + 3
    assert all(m["content"] != DEFAULT_PROMPT for r in fake_server.requests[requests:] for m in r["messages"])
    # a compaction by hand starts it again
    fake_server.add_text("short summary")
    compact_session(sqlite_store, "s", client, "m")
    from chatflow_cli.core.compaction import compaction_stopped

    assert not compaction_stopped(sqlite_store, "s")


def test_automatic_compaction_that_leaves_the_window_too_full_stops_instead_of_repeating(
    make_runner: Callable[..., Runner], fake_server: Any, sqlite_store: Any
) -> None:
    """A summary shorter than what it replaces, but so long that every next turn would pass
    compact_at again: it is stored, said once, and the next turns do not compact."""
    building = make_runner(Agent("A"), default_model="m", max_context_tokens=1000, max_tokens=200, compact_at=None)
    for i in range(1, 6):
        fake_server.add_text(f"answer {i} " + "detail " * 60)
        building.run("s", f"question {i} " + "word " * 60)
    runner = make_runner(Agent("A"), default_model="m", max_context_tokens=1000, max_tokens=200, compact_at=0.5)
    text, chunks = _long_summary(250)
    fake_server.add_text(text, chunks=chunks)
    fake_server.add_text("answer 6")
    result = runner.run("s", "question 6 " + "word " * 60)
    assert fake_server.requests[-2]["messages"][0]["content"] == DEFAULT_PROMPT
    assert [e.type for e in result.events].count("context.compacted") == 1 and result.content == "answer 6"
    [stop] = _stopped(result)
    assert "every next turn would compact again" in stop.payload["reason"]
    asked = len(fake_server.requests)
    for i in range(7, 10):
        fake_server.add_text(f"answer {i} " + "detail " * 60)
        later = runner.run("s", f"question {i} " + "word " * 60)
        assert later.content.startswith(f"answer {i}") and _stopped(later) == []
    assert len(fake_server.requests) == asked + 3 and len(sqlite_store.summaries("s")) == 1


from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=300, deadline=None)
@given(fixed=st.integers(0, 500), costs=st.lists(st.integers(1, 1500), min_size=1, max_size=12),
       new_turn=st.integers(1, 1500), budget=st.integers(100, 4000), compact_at=st.floats(0.1, 1.0))
def test_no_turn_leaves_the_request_without_a_summary(fixed, costs, new_turn, budget, compact_at) -> None:
    """Whatever the sizes: every turn that does not fit beside the newer ones and the new
    message is summarised (K reaches it), K is a stored turn, and no compaction is skipped
    unless everything fits (under compact_at, or already within the 30 % kept verbatim)."""
    from chatflow_cli.core.compaction import compaction_through

    turns = [(n, cost) for n, cost in enumerate(costs, start=1)]
    through = compaction_through(fixed, turns, new_turn, budget, compact_at)
    room, fitting = budget - fixed - new_turn, 0
    for _number, cost in reversed(turns):  # the newest turns that fit, as the request selects them
        if cost > room:
            break
        room -= cost
        fitting += 1
    dropped = len(turns) - fitting
    if through is None:  # everything fits: under compact_at, or the turns are already few and small
        assert dropped == 0
        assert fixed + new_turn + sum(costs) <= compact_at * budget or new_turn + sum(costs) <= 0.3 * budget
    else:
        assert 1 <= through <= len(turns) and through >= dropped
