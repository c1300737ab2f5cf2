"""Forking a session at a turn, the same contract on every store.

``store.fork(ID, at=N, into=NEW)`` copies turns 1..N (not re-run) into a new session whose
log starts with ``session.created`` carrying ``forked_from`` (session, turn, seq); the source
is untouched; a running turn is never copied.
"""

from __future__ import annotations

import pytest

from chatflow_cli.core.errors import SessionNotFoundError, UsageError
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.memory import BaseSessionStore, Owner
from chatflow_cli.core.messages import Message, ToolCall


def _chat(store: BaseSessionStore, agent, session_id: str, count: int, system: str | None = None) -> None:
    ctx = store.get_or_create(session_id, agent)
    if system:
        ctx.add_message(Message.system(system))
    for n in range(1, count + 1):
        ctx.add_message(Message.user(f"u{n}"))
        if n == 2:
            ctx.add_message(Message.model(None, [ToolCall(f"c{n}", "lookup", '{"q": 2}')]))
            ctx.add_message(Message.tool(f"c{n}", "r2", name="lookup"))
        ctx.add_message(Message.model(f"m{n}"))
        ctx.complete_turn(f"m{n}")
    store.save(ctx)


def _texts(store: BaseSessionStore, session_id: str) -> list[list[str | None]]:
    return [[m.content for m in r.messages] for r in store.load_turns(session_id, first=0)]


def test_fork_copies_turns_1_to_n_and_records_its_origin(any_store, agent) -> None:
    _chat(any_store, agent, "src", 4, system="be brief")
    source_events = any_store.events("src")
    summary = any_store.fork("src", 2, into="branch")
    assert summary.session_id == "branch" and summary.turn_count == 2
    # the point the fork was taken from: turn 2's last event, not the source's newest one
    [end_of_2] = [e.seq for e in source_events if e.type == "turn.completed" and e.payload["turn"] == 2]
    assert summary.forked_from == {"session_id": "src", "turn": 2, "seq": end_of_2}
    assert any_store.forked_from("branch") == summary.forked_from and any_store.forked_from("src") is None
    assert _texts(any_store, "branch") == [["be brief"], ["u1", "m1"], ["u2", None, "r2", "m2"]]
    first = any_store.events("branch")[0]
    assert first.seq == 1 and first.type == "session.created"
    assert first.payload["forked_from"] == summary.forked_from
    types = [e.type for e in any_store.events("branch")]
    assert types.count("turn.completed") == 2 and types.count("message.user") == 2
    assert any_store.events("src") == source_events  # the source is untouched
    # the fork goes on by itself: its next turn is 3
    ctx = any_store.get("branch")
    ctx.add_message(Message.user("u3 in the fork"))
    ctx.add_message(Message.model("m3 in the fork"))
    any_store.save(ctx)
    assert [r.number for r in any_store.load_turns("branch")] == [1, 2, 3]
    assert _texts(any_store, "src")[3] == ["u3", "m3"]


def test_forked_from_seq_is_the_last_event_of_the_turn_forked(any_store, agent) -> None:
    _chat(any_store, agent, "src", 3, system="be brief")
    ctx = any_store.get("src")
    any_store.rollback("src", 2)  # turn 3 is taken back and run again: the fork point is the live run's
    ctx = any_store.get("src")
    ctx.add_message(Message.user("u3 again"))
    ctx.add_message(Message.model("m3 again"))
    ctx.complete_turn("m3 again")
    any_store.save(ctx)
    ctx = any_store.get("src")
    ctx.add_message(Message.user("u4"))
    ctx.add_message(Message.model("m4"))
    ctx.complete_turn("m4")
    any_store.save(ctx)
    events = any_store.events("src")
    ends = {e.payload["turn"]: e.seq for e in events if e.type == "turn.completed"}  # the newest per turn
    for turn in (1, 2, 3, 4):
        fork = any_store.fork("src", turn, into=f"at-{turn}")
        assert fork.forked_from["seq"] == ends[turn], turn
    first_user = min(e.seq for e in events if e.type == "message.user")
    assert any_store.fork("src", 0, into="at-0").forked_from["seq"] == first_user - 1


def test_fork_defaults(any_store, agent) -> None:
    _chat(any_store, agent, "src", 3)
    summary = any_store.fork("src")
    assert summary.session_id.startswith("src-fork-") and summary.turn_count == 3
    assert any_store.fork("src", 0, into="empty").turn_count == 0
    assert any_store.load_turns("empty") == []


def test_fork_then_rollback_of_the_fork_leaves_the_source_untouched(any_store, agent) -> None:
    _chat(any_store, agent, "src", 3)
    before = (any_store.events("src"), _texts(any_store, "src"), any_store.search("u3"))
    any_store.fork("src", 3, into="f")
    any_store.rollback("f", 1)
    assert _texts(any_store, "f") == [["u1", "m1"]]
    assert (any_store.events("src"), _texts(any_store, "src")) == before[:2]
    assert [(h.session_id, h.turn) for h in any_store.search("u3")] == [("src", 3)]


def test_forking_a_running_session_copies_completed_turns_only(any_store, agent) -> None:
    _chat(any_store, agent, "src", 2)
    started = any_store.begin_turn(
        "src", default_agent=agent, user_message=Message.user("u3 still running"), owner=Owner.current()
    )
    assert started.turn == 3 and any_store.session_summary("src").status is SessionStatus.RUNNING
    summary = any_store.fork("src", into="mid")
    assert summary.turn_count == 2 and summary.forked_from["turn"] == 2
    assert all("running" not in (m.content or "") for r in any_store.load_turns("mid") for m in r.messages)
    with pytest.raises(ValueError, match="still running"):
        any_store.fork("src", 3, into="too-far")


def test_bad_forks_change_nothing(any_store, agent) -> None:
    _chat(any_store, agent, "src", 2)
    _chat(any_store, agent, "taken", 1)
    with pytest.raises(SessionNotFoundError):
        any_store.fork("missing", 1)
    with pytest.raises(ValueError, match="turns 1..2"):
        any_store.fork("src", 5)
    with pytest.raises(ValueError):
        any_store.fork("src", -1)
    with pytest.raises(UsageError, match="already exists"):
        any_store.fork("src", 1, into="taken")
    with pytest.raises(TypeError):
        any_store.fork("src", "1")  # type: ignore[arg-type]
    assert sorted(s.session_id for s in any_store.list_sessions()) == ["src", "taken"]


def test_a_fork_keeps_endpoint_title_and_message_times_but_not_metadata(any_store, agent) -> None:
    clock = [1_000.0]
    any_store.clock = lambda: clock[0]
    ctx = any_store.get_or_create("src", agent, metadata={"ticket": "T-42"})
    for n in range(1, 3):
        clock[0] += 100
        ctx.add_message(Message.user(f"airship u{n}"))
        ctx.add_message(Message.model(f"m{n}"))
        ctx.complete_turn(f"m{n}")
        any_store.save(ctx)
    any_store.set_session_endpoint("src", "gpt-x", "http://127.0.0.1:9/v1")
    any_store.set_title("src", "Airship plans")
    source_times = {h.turn: h.created_at for h in any_store.search("airship")}
    assert source_times == {1: 1_100.0, 2: 1_200.0}
    clock[0] = 5_000.0
    any_store.fork("src", 2, into="plain")
    any_store.fork("src", 1, into="tagged", metadata={"ticket": "T-42-b"})
    # the model and endpoint go with the fork, so resuming it talks to the same server
    assert any_store.session_endpoint("plain") == ("gpt-x", "http://127.0.0.1:9/v1")
    # metadata names the external conversation: not copied, unless given
    assert any_store.session_summary("plain").metadata == {}
    assert [s.session_id for s in any_store.list_sessions(metadata={"ticket": "T-42"})] == ["src"]
    assert [s.session_id for s in any_store.list_sessions(metadata={"ticket": "T-42-b"})] == ["tagged"]
    # a title the user set is kept, marked as a fork
    assert any_store.session_summary("plain").title == "Airship plans (fork)"
    assert any_store.session_summary("plain").title_set is True
    # copies keep the source's times; hits of copied turns name where they were copied from
    hits = {(h.session_id, h.turn): h for h in any_store.search("airship", limit=10)}
    assert {k: h.created_at for k, h in hits.items()} == {
        ("src", 1): 1_100.0, ("src", 2): 1_200.0, ("plain", 1): 1_100.0, ("plain", 2): 1_200.0,
        ("tagged", 1): 1_100.0}
    assert hits[("src", 1)].forked_from is None
    assert hits[("plain", 2)].forked_from == {"session_id": "src", "turn": 2}
    assert hits[("plain", 2)].to_dict()["forked_from"] == {"session_id": "src", "turn": 2}
    assert {(h.session_id, h.turn) for h in any_store.search("airship", since=1_150.0, limit=10)} == {
        ("src", 2), ("plain", 2)}
    # a turn the fork ran itself is no copy
    ctx = any_store.get("plain")
    ctx.add_message(Message.user("airship u3 in the fork"))
    ctx.add_message(Message.model("m3"))
    any_store.save(ctx)
    [own] = any_store.search("fork")
    assert (own.session_id, own.turn, own.forked_from) == ("plain", 3, None)


def test_renaming_keeps_updated_at(any_store, agent) -> None:
    clock = [1_000.0]
    any_store.clock = lambda: clock[0]
    _chat(any_store, agent, "src", 1)
    clock[0] = 2_000.0
    any_store.set_title("src", "Renamed")
    summary = any_store.session_summary("src")
    assert (summary.title, summary.updated_at) == ("Renamed", 1_000.0)
