"""Full-text search, the same contract on every store (``store`` runs as in-memory and SQLite).

``store.search(query, session_id=, agent=, since=, limit=, include_tools=, include_removed=)``
returns one :class:`SearchHit` per matching turn, best first; rolled-back and failed turns
only with ``include_removed``; a query the syntax cannot parse is a UsageError with a hint.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import UsageError
from chatflow_cli.core.memory import BaseSessionStore, SearchHit, SessionContext, parse_query
from chatflow_cli.core.memory.search import HIGHLIGHT_END, HIGHLIGHT_START, plain_snippet, to_fts5
from chatflow_cli.core.messages import Message, ToolCall
from chatflow_cli.core.sqlite_store import SQLiteSessionStore


def _chat(store: BaseSessionStore, agent: Agent, session_id: str, *pairs: tuple[str, str]) -> None:
    ctx = store.get_or_create(session_id, agent)
    for user, model in pairs:
        ctx.add_message(Message.user(user))
        ctx.add_message(Message.model(model))
        ctx.complete_turn(model)
    store.save(ctx)


def _where(hits: list[SearchHit]) -> list[tuple[str, int]]:
    return [(h.session_id, h.turn) for h in hits]


def test_hits_are_turns_with_a_highlighted_snippet_and_age(any_store, agent) -> None:
    any_store.clock = lambda: 1_700_000_000.0
    _chat(any_store, agent, "a", ("how do I deploy the gateway", "run make deploy"), ("thanks", "you are welcome"))
    _chat(any_store, agent, "b", ("what is the weather", "sunny"))
    hits = any_store.search("deploy")
    assert _where(hits) == [("a", 1)]  # one hit for turn 1 though both of its messages match
    hit = hits[0]
    assert f"{HIGHLIGHT_START}deploy{HIGHLIGHT_END}" in hit.snippet
    assert hit.created_at == 1_700_000_000.0
    assert hit.agent == "Assistant" and hit.removed is None
    assert hit.to_dict()["snippet"].count("[deploy]") == 1


def test_phrase_or_not_prefix_and_accents(any_store, agent) -> None:
    _chat(
        any_store,
        agent,
        "s",
        ("connection reset by peer", "retry"),
        ("reset the connection", "done"),
        ("a timeout happened", "ok"),
        ("café au lait", "coffee"),
        ("deployment went fine", "good"),
    )
    assert _where(any_store.search('"connection reset"')) == [("s", 1)]
    assert sorted(_where(any_store.search("connection reset"))) == [("s", 1), ("s", 2)]
    assert sorted(_where(any_store.search("timeout OR lait"))) == [("s", 3), ("s", 4)]
    assert _where(any_store.search("connection NOT peer")) == [("s", 2)]
    assert _where(any_store.search("connection -peer")) == [("s", 2)]
    assert _where(any_store.search("deploym*")) == [("s", 5)]
    assert _where(any_store.search("CAFE")) == [("s", 4)]
    assert _where(any_store.search("connection AND peer")) == [("s", 1)]


def test_more_matches_rank_first(any_store, agent) -> None:
    _chat(any_store, agent, "one", ("alpha beta gamma delta", "x"))
    _chat(any_store, agent, "two", ("alpha alpha alpha delta", "x"))
    assert _where(any_store.search("alpha")) == [("two", 1), ("one", 1)]


def test_filters_session_agent_since_limit(any_store, agent) -> None:
    other = Agent(name="Support", instructions="x", model="gpt-4o")
    clock = [1_000.0]
    any_store.clock = lambda: clock[0]
    _chat(any_store, agent, "a", ("invoice late", "ok"))
    clock[0] = 2_000.0
    _chat(any_store, other, "b", ("invoice missing", "ok"), ("invoice again", "ok"))
    assert sorted(_where(any_store.search("invoice"))) == [("a", 1), ("b", 1), ("b", 2)]
    assert sorted(_where(any_store.search("invoice", session_id="a"))) == [("a", 1)]
    assert sorted(_where(any_store.search("invoice", agent="Support"))) == [("b", 1), ("b", 2)]
    assert sorted(_where(any_store.search("invoice", since=1_500.0))) == [("b", 1), ("b", 2)]
    assert len(any_store.search("invoice", limit=2)) == 2
    assert any_store.search("nothing-like-this") == []
    with pytest.raises(ValueError):
        any_store.search("invoice", limit=0)


def test_tool_arguments_and_results_only_with_the_flag(any_store, agent) -> None:
    ctx = any_store.get_or_create("t", agent)
    ctx.add_message(Message.user("look it up"))
    ctx.add_message(Message.model(None, [ToolCall("c1", "lookup_order", '{"order": "zebra42"}')]))
    ctx.add_message(Message.tool("c1", "status shipped via quokka express", name="lookup_order"))
    ctx.add_message(Message.model("It shipped."))
    ctx.complete_turn("It shipped.")
    any_store.save(ctx)
    assert any_store.search("zebra42") == [] and any_store.search("quokka") == []
    assert _where(any_store.search("zebra42", include_tools=True)) == [("t", 1)]
    hits = any_store.search("quokka", include_tools=True)
    assert _where(hits) == [("t", 1)] and hits[0].role == "tool"
    assert _where(any_store.search("lookup_order", include_tools=True)) == [("t", 1)]


def test_rollback_then_search_finds_the_text_only_with_include_removed(any_store, agent) -> None:
    _chat(any_store, agent, "s", ("keep this", "fine"), ("secret plan zeppelin", "noted"))
    assert _where(any_store.search("zeppelin")) == [("s", 2)]
    any_store.rollback("s", 1)
    assert any_store.search("zeppelin") == []
    hits = any_store.search("zeppelin", include_removed=True)
    assert [(h.turn, h.removed) for h in hits] == [(2, "rolled_back")]
    _chat(any_store, agent, "s", ("zeppelin again", "yes"))  # the new turn 2 is live, the old one marked
    hits = any_store.search("zeppelin", include_removed=True)
    assert sorted((h.turn, h.removed or "") for h in hits) == [(2, ""), (2, "rolled_back")]
    assert [(h.turn, h.removed) for h in any_store.search("zeppelin")] == [(2, None)]


def test_deleted_sessions_are_not_found(any_store, agent) -> None:
    _chat(any_store, agent, "s", ("ephemeral words", "ok"))
    any_store.delete("s")
    assert any_store.search("ephemeral", include_removed=True) == []


def test_system_messages_are_not_searched(any_store, agent) -> None:
    ctx = any_store.get_or_create("s", agent)
    ctx.add_message(Message.user("hello"))
    ctx.add_message(Message.model("hi"))
    ctx.complete_turn("hi")
    any_store.save(ctx)
    assert any_store.search("Helpful") == []  # the agent's instructions are not stored text to find


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ('"', "unbalanced"),
        ('say "hello', "unbalanced"),
        ("AND", "AND"),
        ("a AND", "AND"),
        ("OR b", "OR"),
        ("*", "no letters"),
        ("NOT", "NOT"),
        ("NOT x", "not only NOT"),
        ("-x", "not only NOT"),
        ("", "empty"),
        ("   ", "empty"),
        ('""', "empty phrase"),
        ("a*b", "'*' may only end"),
        ("...", "no letters"),
    ],
)
def test_unparsable_queries_are_usage_errors_with_a_hint(any_store, query, words) -> None:
    with pytest.raises(UsageError) as err:
        any_store.search(query)
    assert words in str(err.value)
    assert "prefix*" in str(err.value)  # the hint says how to write a query


_HOSTILE = st.lists(
    st.sampled_from(list('"*()-:^+{}[]/.,\'\\ \t') + ["AND", "OR", "NOT", "NEAR", " AND ", " OR ", " NOT ", "x", "é"]),
    max_size=15,
).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_HOSTILE)
def test_hostile_queries_give_hits_or_a_usage_error_never_anything_else(any_store, agent, query) -> None:
    if not any_store.search("x", limit=1) and any_store.get("s") is None:
        _chat(any_store, agent, "s", ("x near é AND (x)", "x"))
    try:
        hits = any_store.search(query)
    except UsageError as exc:
        assert "chatflow sessions search" in str(exc)
    else:
        assert all(isinstance(h, SearchHit) for h in hits)


@given(st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_every_parsed_query_is_valid_fts5(query) -> None:
    try:
        parsed = parse_query(query)
    except UsageError:
        return
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE f USING fts5(body, tools, tokenize = \"ascii tokenchars '_'\")")  # the store's
    conn.execute("INSERT INTO f VALUES ('some text', 'tool text')")
    for columns in (None, ("body",)):
        conn.execute("SELECT * FROM f WHERE f MATCH ?", (to_fts5(parsed, columns),)).fetchall()


def test_plain_snippet_replaces_the_marks() -> None:
    assert plain_snippet(f"a {HIGHLIGHT_START}b{HIGHLIGHT_END} c") == "a [b] c"


def test_a_database_written_before_the_index_is_indexed_by_the_migration(tmp_path: Path, agent) -> None:
    path = tmp_path / "old.db"
    store = SQLiteSessionStore(path)
    _chat(store, agent, "old", ("archaeopteryx fossils", "feathers"))
    store.close()
    conn = sqlite3.connect(path)  # back to the schema before the index: no FTS table, older version
    conn.executescript(
        "DROP TRIGGER chatflow_messages_fts_delete; DELETE FROM chatflow_schema_migrations WHERE version = 6;"
        "DROP TABLE chatflow_messages_fts; ALTER TABLE chatflow_sessions DROP COLUMN forked_from_json;"
        "ALTER TABLE chatflow_sessions DROP COLUMN title; ALTER TABLE chatflow_sessions DROP COLUMN archived_at_utc;"
        "ALTER TABLE chatflow_sessions DROP COLUMN agent_versions_json;"  # and what later migrations added
        "DELETE FROM chatflow_schema_migrations WHERE version >= 5;"
    )
    conn.close()
    store = SQLiteSessionStore(path)
    try:
        assert _where(store.search("archaeopteryx")) == [("old", 1)]
    finally:
        store.close()


def test_a_filter_that_keeps_few_of_many_matches_still_fills_the_page(any_store, agent) -> None:
    # 300 better-ranked matches in one agent's sessions: the page for the other agent must
    # still come back (the SQLite store widens its candidate set, then joins every match)
    other = Agent(name="Rare", instructions="x", model="gpt-4o")
    for n in range(300):
        _chat(any_store, agent, f"many{n:03d}", ("needle needle needle", "x"))
    _chat(any_store, other, "rare", ("a needle among many other words here", "x"))
    assert _where(any_store.search("needle", agent="Rare")) == [("rare", 1)]
    assert len(any_store.search("needle", limit=100)) == 100
    assert _where(any_store.search("needle", session_id="rare")) == [("rare", 1)]


def test_events_given_a_time_of_their_own_keep_it_and_search_since_follows_it(any_store, agent) -> None:
    """History copied from elsewhere (an import) gives its events their time in the source
    (``SessionContext.set_event_time``): every store writes that time, not its clock, so
    ``search(since=...)`` and a hit's time follow it; events after ``set_event_time(None)``
    take the clock again."""
    any_store.clock = lambda: 1_700_000_000.0
    then = 1_600_000_000.5

    def change(ctx) -> None:
        ctx.set_event_time(then)
        ctx.add_message(Message.user("an old question about pelicans"))
        ctx.add_message(Message.model("an old answer"))
        ctx.complete_turn("an old answer")
        ctx.set_event_time(None)
        ctx.record_event("session.imported", {"format": "test"})

    any_store.edit("old", change, create_agent=agent)
    times = {e.type: e.created_at for e in any_store.events("old")}
    assert times["message.user"] == times["message.model"] == times["turn.completed"] == then
    assert times["session.imported"] == times["session.created"] == 1_700_000_000.0
    assert any_store.search("pelicans", since=then + 1) == []
    [hit] = any_store.search("pelicans")
    assert hit.created_at == then
    with pytest.raises(ValueError):
        SessionContext("x", agent).set_event_time(float("nan"))
