"""The SQLite store's schema and its versioned migrations.

``_MIGRATIONS`` lists ``(version, name, statements)`` in order. :func:`apply_migrations`
runs each missing one in its own ``BEGIN IMMEDIATE`` transaction together with its row in
``chatflow_schema_migrations``, so a migration is applied wholly or not at all, and many
processes opening a fresh file at once apply each exactly once (a process that waited for
the write lock finds the version recorded and skips it). A file whose recorded version is
newer than :data:`SCHEMA_VERSION` was written by a newer chatflow: the store refuses it
before writing anything.

Columns ending in ``_utc`` hold UTC epoch seconds; ``*_json`` columns hold compact JSON.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from typing import Union

from .resources import MIGRATION as MEMORY_STORES
from .vaults import MIGRATION as VAULTS
from .attachments import MIGRATION as ATTACHMENTS

__all__ = ["SCHEMA_VERSION", "MigrationFailed", "apply_migrations", "schema_version"]

# What the full-text index holds of a chatflow_messages row ``{m}``: the text of user and
# model messages; tool results and the model's tool calls ("name arguments").
_FTS_BODY = "CASE WHEN {m}.role IN ('user', 'model') THEN json_extract({m}.message_json, '$.content') END"
_FTS_TOOLS = (
    "CASE WHEN {m}.role = 'tool' THEN json_extract({m}.message_json, '$.content') "
    "WHEN {m}.role = 'model' THEN (SELECT group_concat(json_extract(c.value, '$.name') || ' ' || "
    "json_extract(c.value, '$.arguments'), ' ') FROM json_each({m}.message_json, '$.tool_calls') AS c) END"
)

def _fill_token_estimates(conn: sqlite3.Connection) -> None:
    """Give every message row without a token count the estimate of its message."""
    from ...messages import Message
    from ...tokens import estimate_tokens

    rows = conn.execute("SELECT message_id, message_json FROM chatflow_messages WHERE tokens IS NULL").fetchall()
    conn.executemany(
        "UPDATE chatflow_messages SET tokens = ? WHERE message_id = ?",
        [(estimate_tokens(Message.from_json(text)), message_id) for message_id, text in rows],
    )


#: A migration step: an SQL statement, or a function run on the connection inside the
#: migration's transaction (for data that SQL alone cannot compute).
_Step = Union[str, Callable[[sqlite3.Connection], None]]

_MIGRATIONS: list[tuple[int, str, list[_Step]]] = [
    (
        1,
        "sessions, messages, events, idempotency keys, processed messages",
        [
            """CREATE TABLE IF NOT EXISTS chatflow_sessions (
    session_id        TEXT PRIMARY KEY,
    -- random per creation: a task holding a deleted session's context gets
    -- SessionDeletedError even if the same id was created again meanwhile
    incarnation       TEXT NOT NULL,
    -- only the name is stored; the agent resolver maps it back to an Agent
    active_agent_name TEXT NOT NULL,
    metadata_json     TEXT NOT NULL DEFAULT '{}',
    -- the context window holds the newest max_turns live turns
    max_turns         INTEGER NOT NULL CHECK (max_turns > 0),
    -- number of the last live turn: the window query is "turn > turn_count - max_turns",
    -- so loading a session never reads its whole history
    turn_count        INTEGER NOT NULL DEFAULT 0,
    -- latest status event, cached so listing needs no scan of the log
    status            TEXT NOT NULL DEFAULT 'idle'
                      CHECK (status IN ('idle', 'running', 'rescheduled', 'terminated')),
    -- the running turn's owner (pid, process start time, host, token); NULL unless running,
    -- so a dead owner's turn can be recovered even when its pid was reused
    owner_json        TEXT,
    created_at_utc    REAL NOT NULL,  -- epoch seconds
    updated_at_utc    REAL NOT NULL   -- epoch seconds; latest_session_id orders by it
)""",
            """CREATE INDEX IF NOT EXISTS chatflow_sessions_by_update
    ON chatflow_sessions (updated_at_utc DESC, session_id)""",
            """CREATE TABLE IF NOT EXISTS chatflow_messages (
    message_id     INTEGER PRIMARY KEY,  -- insertion order
    session_id     TEXT NOT NULL REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    -- user-visible turn number (1, 2, 3...); 0 holds the system messages
    turn           INTEGER NOT NULL,
    position       INTEGER NOT NULL,     -- order inside the turn
    -- copy of the JSON's role, so the window query picks system messages without parsing JSON
    role           TEXT NOT NULL,
    message_json   TEXT NOT NULL,        -- one Message.to_json() a row
    event_seq      INTEGER NOT NULL,     -- seq of the event that recorded the message
    -- NULL while live; else the seq of the rollback / turn.failed event that took it out.
    -- Rows are never deleted, so rollback can reach any turn still in the log.
    removed_at_seq INTEGER,
    removed_reason TEXT CHECK (removed_reason IN ('rolled_back', 'failed'))
)""",
            # The context-window query: live rows of one session from a turn on, in order.
            """CREATE INDEX IF NOT EXISTS chatflow_messages_live ON chatflow_messages (session_id, turn, position)
    WHERE removed_at_seq IS NULL""",
            "CREATE INDEX IF NOT EXISTS chatflow_messages_all ON chatflow_messages (session_id, turn, message_id)",
            """CREATE TABLE IF NOT EXISTS chatflow_events (
    event_id        INTEGER PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    -- per-session cursor 1, 2, 3...: MAX(seq) + 1 inside the inserting write transaction
    seq             INTEGER NOT NULL,
    event_type      TEXT NOT NULL,
    turn            INTEGER,             -- payload's turn, indexed to find a turn's outcome
    payload_json    TEXT NOT NULL,
    idempotency_key TEXT,                -- the caller's key, when the event was sent with one
    created_at_utc  REAL NOT NULL,       -- epoch seconds
    UNIQUE (session_id, seq)             -- backstop: a seq is never used twice
)""",
            "CREATE INDEX IF NOT EXISTS chatflow_events_by_type ON chatflow_events (session_id, event_type, seq)",
            """CREATE TABLE IF NOT EXISTS chatflow_idempotency_keys (
    session_id      TEXT NOT NULL REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    idempotency_key TEXT NOT NULL,
    -- sha256 of the request: same key + same request replays, another request is refused
    request_sha256  TEXT NOT NULL,
    turn            INTEGER,             -- the turn a begin_turn key started; NULL for events
    event_seq       INTEGER NOT NULL,    -- the first event the key produced
    created_at_utc  REAL NOT NULL,
    PRIMARY KEY (session_id, idempotency_key)
)""",
            """CREATE TABLE IF NOT EXISTS chatflow_processed_messages (
    -- inbound message ids (webhooks) already handled: a duplicate while
    -- now < processed_at_utc + 192 h; expired rows are purged
    message_id       TEXT PRIMARY KEY,
    processed_at_utc REAL NOT NULL       -- epoch seconds
)""",
            "CREATE INDEX IF NOT EXISTS chatflow_processed_by_time ON chatflow_processed_messages (processed_at_utc)",
        ],
    ),
    (
        2,
        "message claims with their holder and turn; the queue of turns waiting for a busy session",
        [
            # Rows written before this version were marked processed: they stay 'completed'.
            """ALTER TABLE chatflow_processed_messages ADD COLUMN state TEXT NOT NULL DEFAULT 'completed'
    CHECK (state IN ('in_progress', 'completed'))""",
            # the claim's holder (pid, process start time, host, token), as owner_json of a
            # running session; NULL once completed. A dead holder's claim is free again.
            "ALTER TABLE chatflow_processed_messages ADD COLUMN holder_json TEXT",
            # the turn the claim started: its turn.completed completes the claim in the same
            # transaction, its turn.failed / turn.interrupted frees it
            "ALTER TABLE chatflow_processed_messages ADD COLUMN session_id TEXT",
            "ALTER TABLE chatflow_processed_messages ADD COLUMN turn INTEGER",
            """CREATE INDEX IF NOT EXISTS chatflow_processed_by_turn ON chatflow_processed_messages (session_id, turn)
    WHERE session_id IS NOT NULL""",
            """CREATE TABLE IF NOT EXISTS chatflow_turn_queue (
    -- callers waiting for a busy session start their turns in ticket (arrival) order
    ticket          INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id      TEXT NOT NULL,
    owner_json      TEXT NOT NULL,       -- the waiter; a dead waiter's ticket is skipped and removed
    enqueued_at_utc REAL NOT NULL
)""",
            "CREATE INDEX IF NOT EXISTS chatflow_turn_queue_by_session ON chatflow_turn_queue (session_id, ticket)",
        ],
    ),
    (
        3,
        "the model and endpoint each session talks to",
        [
            """CREATE TABLE IF NOT EXISTS chatflow_session_endpoints (
    -- what a front-end resumes the session with; never an API key
    session_id     TEXT PRIMARY KEY REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    model          TEXT,                 -- NULL: not stored
    base_url       TEXT,                 -- NULL: not stored
    updated_at_utc REAL NOT NULL         -- epoch seconds
)""",
        ],
    ),
    (
        4,
        "a token count with every message; summaries of turns 1..K",
        [
            # the message's tokens as sent to a model: the provider's completion_tokens for a
            # reply that reported usage, else the estimate of chatflow_cli.core.tokens. Stored
            # so that choosing a token-budget window reads only the window's rows.
            "ALTER TABLE chatflow_messages ADD COLUMN tokens INTEGER",
            # K for a SYSTEM message (turn 0) that summarises turns 1..K (a compaction); NULL
            # for every other message. A rollback to n < K marks it removed like a turn.
            "ALTER TABLE chatflow_messages ADD COLUMN summary_through INTEGER",
            """CREATE INDEX IF NOT EXISTS chatflow_messages_summaries ON chatflow_messages (session_id, summary_through)
    WHERE summary_through IS NOT NULL AND removed_at_seq IS NULL""",
            # rows written before this version get the estimate
            _fill_token_estimates,
        ],
    ),
    (
        5,
        "full-text index of message text (FTS5), kept in step by triggers; existing messages indexed; fork origin, title, archive",
        [
            # {"session_id", "turn", "seq"} of the session this one was forked from; NULL otherwise
            "ALTER TABLE chatflow_sessions ADD COLUMN forked_from_json TEXT",
            # set by the user; NULL: the title shown is the first user message's first line
            "ALTER TABLE chatflow_sessions ADD COLUMN title TEXT",
            # epoch seconds it was archived; NULL: not archived (listed, takes new turns)
            "ALTER TABLE chatflow_sessions ADD COLUMN archived_at_utc REAL",
            # body: user and model text; tools: tool results and the model's tool calls
            # (name and arguments). rowid = chatflow_messages.message_id; removed (rolled
            # back, failed) messages stay indexed and are filtered by the join.
            """CREATE VIRTUAL TABLE IF NOT EXISTS chatflow_messages_fts USING fts5(
    body, tools, tokenize = 'unicode61 remove_diacritics 2'
)""",
            f"""CREATE TRIGGER IF NOT EXISTS chatflow_messages_fts_insert AFTER INSERT ON chatflow_messages BEGIN
    INSERT INTO chatflow_messages_fts (rowid, body, tools)
    VALUES (new.message_id, {_FTS_BODY.format(m="new")}, {_FTS_TOOLS.format(m="new")});
END""",
            """CREATE TRIGGER IF NOT EXISTS chatflow_messages_fts_delete AFTER DELETE ON chatflow_messages BEGIN
    DELETE FROM chatflow_messages_fts WHERE rowid = old.message_id;
END""",
            f"""INSERT INTO chatflow_messages_fts (rowid, body, tools)
    SELECT m.message_id, {_FTS_BODY.format(m="m")}, {_FTS_TOOLS.format(m="m")} FROM chatflow_messages AS m
    WHERE m.message_id NOT IN (SELECT rowid FROM chatflow_messages_fts)""",
        ],
    ),
    (
        6,
        "full-text index filled when searched: a write indexes nothing",
        [
            # FTS5 writes a segment (and merges) in every transaction that indexes a row: most
            # of the cost of a small write. The index now holds every message up to its highest
            # rowid; a search first indexes the messages written since, in one batch
            # (SQLiteSessionStore.index_pending). Message ids only grow (max + 1), so nothing
            # below that rowid is ever left out; the delete trigger stays.
            "DROP TRIGGER IF EXISTS chatflow_messages_fts_insert",
        ],
    ),
    (
        7,
        "the latest version of each agent that ran in a session",
        [
            # {agent name: {"version": str, "turn": int}}: the latest version (a short hash of
            # the agent's definition) each agent ran in the session, and the last turn it ran
            # that version in. NULL: none known (sessions stored before this version: their
            # agents' versions are unknown until their next reply). The version of each
            # reply is stored in its message_json ("agent_version").
            "ALTER TABLE chatflow_sessions ADD COLUMN agent_versions_json TEXT",
        ],
    ),
    (
        8,
        "full-text index of the words every store searches, in every script: rebuilt",
        [
            # The index holds each message's words as chatflow_cli.core.memory.search.words_of
            # gives them (the folding and word splitting of every store: Hangul kept whole,
            # Chinese and Japanese as overlapping pairs of characters, no word lost after a
            # NUL), one space between words; the ascii tokenizer only splits at the spaces
            # (every non-ASCII character is a token character; '_' is made one). The table
            # starts empty: the next search indexes every message (index_pending), in batches.
            "DROP TABLE chatflow_messages_fts",
            """CREATE VIRTUAL TABLE chatflow_messages_fts USING fts5(
    body, tools, tokenize = "ascii tokenchars '_'"
)""",
        ],
    ),
    (9, MEMORY_STORES[0], list(MEMORY_STORES[1])),  # the tables are written beside their primitives
    (10, VAULTS[0], list(VAULTS[1])),
    (11, ATTACHMENTS[0], list(ATTACHMENTS[1])),
]

#: The messages not yet in the full-text index (migration 6): above its highest rowid.
FTS_HIGH_WATER = "SELECT COALESCE((SELECT rowid FROM chatflow_messages_fts ORDER BY rowid DESC LIMIT 1), 0)"
#: Messages indexed in one write transaction (index_pending): the words of each are found
#: before the transaction starts, so it stays short.
INDEX_BATCH = 2000
#: The newest schema version this chatflow knows.
SCHEMA_VERSION = _MIGRATIONS[-1][0]

_MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS chatflow_schema_migrations (
    version        INTEGER PRIMARY KEY,  -- applied in order, each in one transaction with its row
    name           TEXT NOT NULL,
    applied_at_utc REAL NOT NULL
)"""


def schema_version(conn: sqlite3.Connection) -> int:
    """The newest migration version recorded in the database (0 for a file with none).

    A read only: a file that is not a SQLite database fails here (``sqlite3.DatabaseError``)
    before anything is written.
    """
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chatflow_schema_migrations'"
    ).fetchone()
    if not exists:
        return 0
    return int(conn.execute("SELECT COALESCE(MAX(version), 0) FROM chatflow_schema_migrations").fetchone()[0])


class MigrationFailed(Exception):
    """Migration ``number`` (``name``) failed with ``cause`` and was rolled back; the file stays
    at the version before it."""

    def __init__(self, number: int, name: str, cause: BaseException) -> None:
        super().__init__(f"schema migration {number} ({name}) failed: {cause}")
        self.number = number
        self.name = name
        self.cause = cause


_ADD_COLUMN = re.compile(r"\s*ALTER TABLE (\w+) ADD COLUMN (\w+)", re.IGNORECASE)


def _run_step(conn: sqlite3.Connection, statement: _Step) -> None:
    """Run one migration step; an ``ADD COLUMN`` of a column the table already has (a
    migration applied before without its version row) is skipped -- SQLite has no
    ``ADD COLUMN IF NOT EXISTS``; every other statement is idempotent as written."""
    if callable(statement):
        statement(conn)
        return
    add = _ADD_COLUMN.match(statement)
    if add is not None:
        table, column = add.groups()
        if any(row[1] == column for row in conn.execute(f"PRAGMA table_info({table})")):
            return
    conn.execute(statement)


def apply_migrations(conn: sqlite3.Connection) -> None:
    """Apply every migration not yet recorded, each in one ``BEGIN IMMEDIATE`` transaction.

    ``conn`` must be in autocommit mode (``isolation_level=None``). Every step is idempotent,
    so a file that got a migration's changes without its version row is finished. A
    migration that fails is rolled back with its version row and :class:`MigrationFailed`
    names it (its ``cause`` is the ``sqlite3.Error``); those before it stay applied.
    """
    for number, name, statements in _MIGRATIONS:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_MIGRATIONS_TABLE)
            done = conn.execute("SELECT 1 FROM chatflow_schema_migrations WHERE version = ?", (number,))
            if done.fetchone() is None:
                try:
                    for statement in statements:
                        _run_step(conn, statement)
                except sqlite3.Error as exc:
                    raise MigrationFailed(number, name, exc) from exc
                conn.execute(
                    "INSERT INTO chatflow_schema_migrations (version, name, applied_at_utc) VALUES (?, ?, ?)",
                    (number, name, time.time()),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
