"""Search in every script: every store finds the same turns for the same query.

A multilingual corpus (Chinese, Japanese with voiced marks, Hangul, Arabic with vowel
marks, accented Latin, full-width forms, emoji, NUL, identifiers glued to CJK) is stored
in each store kind (``any_store``: in memory, SQLite, PostgreSQL) and searched with the
same queries; each store must return exactly the expected turns. A property test then
stores random text in all three at once and checks that they agree on random queries.
Hostile queries (hundreds of exclusions, ORs, words) give hits or a UsageError on every
store, never a database error.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import UsageError
from chatflow_cli.core.memory import BaseSessionStore, SessionStore
from chatflow_cli.core.memory.search import (
    HIGHLIGHT_END,
    HIGHLIGHT_START,
    MAX_QUERY_WORDS,
    parse_query,
    word_spans,
    words_of,
)
from chatflow_cli.core.messages import Message
from chatflow_cli.core.sqlite_store import SQLiteSessionStore

#: session id -> the user message of its one turn
CORPUS = {
    "ko": "한국어 검색이 잘 되나요",
    "ja": "がぎぐ 濁点のテストです",
    "ja_nfd": "か\u3099いこく",  # が in decomposed form (NFD)
    "ja_half": "ｶﾞｲﾄﾞを読む",  # half-width katakana with voiced marks
    "zh": "我们明天部署新版本",
    "glued": "uuid_1234を確認してください",
    "ar": "مرحبا بالعالم العَرَبِيَّة",
    "latin": "Café crème brûlée",
    "emoji": "deploy🚀done 🎉",
    "nul": "before\x00after the nul",
    "full": "ＦＵＬＬ width ﬁle",
    "hi": "नमस्ते दुनिया",
}

#: query -> the sessions whose turn it finds
EXPECTED = {
    "한국어": {"ko"},
    "검색이": {"ko"},
    "검색*": {"ko"},
    "검": set(),  # Hangul: whole words (or prefixes), not any syllable
    "がぎぐ": {"ja"},
    "ぎぐ": {"ja"},
    "テスト": {"ja"},
    "濁点": {"ja"},
    "が": {"ja", "ja_nfd"},  # the voiced mark is kept, in composed and decomposed form
    "か": set(),
    "がいこく": {"ja_nfd"},
    "ガイド": {"ja_half"},
    "読む": {"ja_half"},
    "部署": {"zh"},
    "明天部署": {"zh"},
    "版本": {"zh"},
    "本": {"zh"},
    '"我们明天"': {"zh"},
    "uuid_1234": {"glued"},
    "確認": {"glued"},
    "確": {"glued"},
    "uuid_1234を確認": {"glued"},
    "を確認して": {"glued"},
    "確認 NOT 部署": {"glued"},
    "確認 OR 部署": {"glued", "zh"},
    "確認 部署": set(),
    "العربية": {"ar"},
    "بالعالم": {"ar"},
    "cafe": {"latin"},
    "CRÈME": {"latin"},
    "brulee": {"latin"},
    "deploy": {"emoji"},
    "done": {"emoji"},
    "after": {"nul"},
    "nul": {"nul"},
    '"before after"': {"nul"},
    "full": {"full"},
    "file": {"full"},
    "fi*": {"full"},
    "नमस्ते": {"hi"},
    "दुनिया": {"hi"},
    "1234": set(),
}


def _store_corpus(store: BaseSessionStore, agent: Agent) -> None:
    for session_id, text in CORPUS.items():
        ctx = store.get_or_create(session_id, agent)
        ctx.add_message(Message.user(text))
        ctx.add_message(Message.model("ok"))
        ctx.complete_turn("ok")
        store.save(ctx)


def test_every_store_finds_the_expected_turns_in_every_script(any_store, agent) -> None:
    _store_corpus(any_store, agent)
    found = {query: {h.session_id for h in any_store.search(query)} for query in EXPECTED}
    assert found == EXPECTED


def test_snippets_mark_the_matched_characters_on_every_store(any_store, agent) -> None:
    _store_corpus(any_store, agent)
    (hit,) = any_store.search("確認")
    assert hit.snippet == f"uuid_1234を{HIGHLIGHT_START}確認{HIGHLIGHT_END}してください"
    (hit,) = any_store.search("한국어")
    assert hit.snippet == f"{HIGHLIGHT_START}한국어{HIGHLIGHT_END} 검색이 잘 되나요"
    (hit,) = any_store.search("after")
    assert f"{HIGHLIGHT_START}after{HIGHLIGHT_END}" in hit.snippet


def test_folding_keeps_hangul_kana_marks_and_splits_cjk_runs() -> None:
    assert words_of("한국어") == ["한국어"]
    assert words_of("か\u3099") == words_of("が") == ["が"]
    assert words_of("uuid_1234を確認") == ["uuid_1234", "を確", "確認", "認"]
    assert words_of("a\x00b") == ["a", "b"]
    assert words_of("Crème ＦＵＬＬ") == ["creme", "full"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([*"aZ9_ é\u0301क्ि確認を한국がｶﾞ。、.-\x00🚀ßﬁ", "\u3099", "\u064e"]), max_size=30)
       .map("".join))
def test_words_of_is_word_spans_without_the_spans(text) -> None:
    # words_of takes a shortcut (one expression) when no mark follows a letter; it must give
    # the words word_spans (what snippets highlight) gives
    spans = word_spans(text)
    assert words_of(text) == [w for w, _s, _e in spans]
    assert all(0 <= s < e <= len(text) for _w, s, e in spans)


def test_an_sqlite_file_indexed_by_an_older_chatflow_is_reindexed(tmp_path: Path, agent) -> None:
    path = tmp_path / "old.db"
    store = SQLiteSessionStore(path)
    _store_corpus(store, agent)
    store.close()
    conn = sqlite3.connect(path)  # back to version 7: the unicode61 index of the old words
    conn.executescript(
        "DROP TABLE chatflow_messages_fts;"
        "CREATE VIRTUAL TABLE chatflow_messages_fts USING fts5(body, tools, "
        "tokenize = 'unicode61 remove_diacritics 2');"
        "INSERT INTO chatflow_messages_fts (rowid, body) SELECT message_id, "
        "json_extract(message_json, '$.content') FROM chatflow_messages;"
        "DELETE FROM chatflow_schema_migrations WHERE version >= 8;"
    )
    conn.close()
    for _ in range(2):  # the migration applies once; opening again changes nothing
        store = SQLiteSessionStore(path)
        try:
            assert {h.session_id for h in store.search("確認")} == {"glued"}
            assert {h.session_id for h in store.search("한국어")} == {"ko"}
            assert {h.session_id for h in store.search("after")} == {"nul"}
        finally:
            store.close()


def test_a_postgres_database_indexed_by_an_older_chatflow_is_reindexed(pg_dsn: str, agent) -> None:
    import psycopg

    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    store = PostgresSessionStore(pg_dsn)
    _store_corpus(store, agent)
    store.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # back to version 6: vectors of the old words
        conn.execute("UPDATE chatflow_messages SET search_vector = "
                     "to_tsvector('simple', 'words of an older folding')")
        conn.execute("DELETE FROM chatflow_schema_migrations WHERE version >= 7")
    for _ in range(2):
        store = PostgresSessionStore(pg_dsn)
        try:
            assert {h.session_id for h in store.search("確認")} == {"glued"}
            assert {h.session_id for h in store.search("cafe")} == {"latin"}
        finally:
            store.close()


# -- hostile queries: bounded, flat, never a database error ----------------------------------
def _chat_one(store: BaseSessionStore, agent: Agent) -> None:
    ctx = store.get_or_create("s", agent)
    ctx.add_message(Message.user("alpha beta gamma w5"))
    ctx.add_message(Message.model("ok"))
    ctx.complete_turn("ok")
    store.save(ctx)


@pytest.mark.parametrize("count", [93, 150, MAX_QUERY_WORDS - 2])
def test_many_exclusions_and_ors_are_searched(any_store, agent, count) -> None:
    _chat_one(any_store, agent)
    excluded = " ".join(f"-w{n}" for n in range(100, 100 + count))
    assert [h.session_id for h in any_store.search(f"alpha {excluded}")] == ["s"]
    assert [h.session_id for h in any_store.search(f"alpha {excluded} -w5")] == []
    not_words = " ".join(f"NOT w{n}" for n in range(100, 100 + count))
    assert [h.session_id for h in any_store.search(f"alpha {not_words}")] == ["s"]
    ors = " OR ".join(f"w{n}" for n in range(count))
    assert [h.session_id for h in any_store.search(ors)] == ["s"]
    ands = " ".join(["alpha"] * count)
    assert [h.session_id for h in any_store.search(ands)] == ["s"]


@pytest.mark.parametrize(
    "query",
    [
        " ".join(f"-w{n}" for n in range(1000)) + " alpha",
        " OR ".join(f"w{n}" for n in range(MAX_QUERY_WORDS + 1)),
        "確" * (MAX_QUERY_WORDS + 2),
        '"' + " ".join(["alpha"] * (MAX_QUERY_WORDS + 1)) + '"',
    ],
    ids=["1000-exclusions", "too-many-ors", "long-cjk-run", "long-phrase"],
)
def test_too_long_queries_are_usage_errors(any_store, agent, query) -> None:
    _chat_one(any_store, agent)
    with pytest.raises(UsageError) as err:
        any_store.search(query)
    assert f"more than {MAX_QUERY_WORDS}" in str(err.value) and "chatflow sessions search" in str(err.value)
    assert len(str(err.value)) < 600  # the query is not echoed whole


def test_a_word_too_long_to_index_is_a_usage_error(any_store, agent) -> None:
    _chat_one(any_store, agent)
    with pytest.raises(UsageError, match="over 500 characters"):
        any_store.search("x" * 501)


# -- the three stores agree ------------------------------------------------------------------
_ALPHABET = st.sampled_from(
    [*"ab確認を部署한국어がか\u3099ｶﾞéE\u0301 _-\x00🚀", "uuid_1", "Café", "ＦＵ", "العَ", " OR ", " NOT ", '"']
)
_TEXT = st.lists(_ALPHABET, min_size=1, max_size=12).map("".join)


@pytest.fixture
def three_stores(tmp_path: Path, pg_dsn: str):
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    stores: list[BaseSessionStore] = [
        SessionStore(), SQLiteSessionStore(tmp_path / "s.db"), PostgresSessionStore(pg_dsn),
    ]
    yield stores
    for store in stores:
        store.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_TEXT, min_size=1, max_size=6), queries=st.lists(_TEXT, min_size=1, max_size=6))
def test_the_three_stores_find_the_same_turns(three_stores, agent, texts, queries) -> None:
    session_id = f"p{abs(hash((tuple(texts), tuple(queries))))}"
    for store in three_stores:
        ctx = store.get_or_create(session_id, agent)
        for text in texts:
            ctx.add_message(Message.user(text))
            ctx.add_message(Message.model("ok"))
            ctx.complete_turn("ok")
        store.save(ctx)
    for query in [*queries, *texts]:
        try:
            parse_query(query)
        except UsageError:
            for store in three_stores:
                with pytest.raises(UsageError):
                    store.search(query, session_id=session_id)
            continue
        results = [sorted(h.turn for h in store.search(query, session_id=session_id, limit=100))
                   for store in three_stores]
        assert results[0] == results[1] == results[2], (query, texts)
