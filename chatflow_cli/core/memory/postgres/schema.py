"""The PostgreSQL store's schema, its versioned migrations and the other names every worker
shares in the database: the advisory lock namespaces and the ``NOTIFY`` channel.

``_MIGRATIONS`` lists ``(version, name, statements)`` in order; a statement named in
``_MIGRATION_STEPS`` is a function run on the connection instead (for data SQL alone cannot
compute). The store applies each missing migration in one transaction with its row in
``chatflow_schema_migrations``, serialised by the ``_LOCK_MIGRATE`` advisory lock
(:meth:`~.store.PostgresSessionStore._migrate`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...messages import stored_message
from .resources import MIGRATION as MEMORY_STORES
from .vaults import MIGRATION as VAULTS
from .attachments import MIGRATION as ATTACHMENTS
from .search import _search_vector

if TYPE_CHECKING:
    import psycopg

#: The channel every commit that appends events notifies (payload: md5 of the session id).
NOTIFY_CHANNEL = "chatflow_events"

# Advisory lock namespaces (the first key of pg_advisory_xact_lock(int4, int4)).
_LOCK_MIGRATE = (0x63686174, 1)  # "chat"
_NS_SESSION = 0x63660001
_NS_MESSAGE = 0x63660002


_MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "sessions with their seq counter and owner lease, messages, events, idempotency keys, message claims, "
        "the turn queue, session endpoints",
        [
            """CREATE TABLE IF NOT EXISTS chatflow_sessions (
    session_id        text PRIMARY KEY,
    -- random per creation: a task holding a deleted session's context gets SessionDeletedError
    incarnation       text NOT NULL,
    active_agent_name text NOT NULL,
    metadata          jsonb,              -- NULL when kept as text (metadata_text)
    metadata_text     text,               -- JSON jsonb cannot hold (a NUL character, NaN)
    max_turns         integer NOT NULL CHECK (max_turns > 0),
    turn_count        integer NOT NULL DEFAULT 0,
    status            text NOT NULL DEFAULT 'idle'
                      CHECK (status IN ('idle', 'running', 'rescheduled', 'terminated')),
    -- the running turn's owner (pid, process start time, host, token) and its lease on the
    -- database clock; NULL unless running
    owner             jsonb,
    owner_token       text,
    lease_expires_at  timestamptz,
    -- the event seq counter: advanced under the row lock in the inserting transaction
    last_seq          bigint NOT NULL DEFAULT 0,
    created_at_utc    double precision NOT NULL,  -- epoch seconds, database clock
    updated_at_utc    double precision NOT NULL
)""",
            """CREATE INDEX IF NOT EXISTS chatflow_sessions_by_update
    ON chatflow_sessions (updated_at_utc DESC, session_id)""",
            """CREATE INDEX IF NOT EXISTS chatflow_sessions_by_owner ON chatflow_sessions (owner_token)
    WHERE owner_token IS NOT NULL""",
            """CREATE TABLE IF NOT EXISTS chatflow_messages (
    message_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id     text NOT NULL REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    turn           integer NOT NULL,    -- user-visible turn number; 0 holds the system messages
    role           text NOT NULL,
    message        jsonb,               -- one Message.to_dict(); NULL when kept as text
    message_text   text,
    event_seq      bigint NOT NULL,     -- seq of the event that recorded it: the order in the turn
    removed_at_seq bigint,              -- NULL while live; rows are never deleted
    removed_reason text CHECK (removed_reason IN ('rolled_back', 'failed'))
)""",
            """CREATE INDEX IF NOT EXISTS chatflow_messages_live ON chatflow_messages (session_id, turn, event_seq)
    WHERE removed_at_seq IS NULL""",
            "CREATE INDEX IF NOT EXISTS chatflow_messages_all ON chatflow_messages (session_id, turn, message_id)",
            """CREATE TABLE IF NOT EXISTS chatflow_events (
    event_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id      text NOT NULL REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    seq             bigint NOT NULL,
    event_type      text NOT NULL,
    turn            bigint,
    payload         jsonb,
    payload_text    text,
    idempotency_key text,
    created_at_utc  double precision NOT NULL,
    UNIQUE (session_id, seq)            -- backstop: a seq is never used twice
)""",
            "CREATE INDEX IF NOT EXISTS chatflow_events_by_type ON chatflow_events (session_id, event_type, seq)",
            """CREATE TABLE IF NOT EXISTS chatflow_idempotency_keys (
    session_id      text NOT NULL REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    idempotency_key text NOT NULL,
    request_sha256  text NOT NULL,
    turn            bigint,
    event_seq       bigint NOT NULL,
    created_at_utc  double precision NOT NULL,
    PRIMARY KEY (session_id, idempotency_key)
)""",
            "CREATE INDEX IF NOT EXISTS chatflow_idempotency_by_turn ON chatflow_idempotency_keys (session_id, turn)",
            """CREATE TABLE IF NOT EXISTS chatflow_processed_messages (
    -- inbound message ids: a claim in progress (a holder with a lease) or completed; a
    -- duplicate while processed_at_utc + 192 h is in the future
    message_id       text PRIMARY KEY,
    state            text NOT NULL CHECK (state IN ('in_progress', 'completed')),
    processed_at_utc double precision NOT NULL,
    holder           jsonb,
    holder_token     text,
    lease_expires_at timestamptz,
    session_id       text,
    turn             bigint
)""",
            "CREATE INDEX IF NOT EXISTS chatflow_processed_by_time ON chatflow_processed_messages (processed_at_utc)",
            """CREATE INDEX IF NOT EXISTS chatflow_processed_by_turn ON chatflow_processed_messages (session_id, turn)
    WHERE session_id IS NOT NULL""",
            """CREATE INDEX IF NOT EXISTS chatflow_processed_by_holder ON chatflow_processed_messages (holder_token)
    WHERE holder_token IS NOT NULL""",
            """CREATE TABLE IF NOT EXISTS chatflow_turn_queue (
    ticket           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id       text NOT NULL,
    owner            jsonb NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    enqueued_at_utc  double precision NOT NULL
)""",
            "CREATE INDEX IF NOT EXISTS chatflow_turn_queue_by_session ON chatflow_turn_queue (session_id, ticket)",
            """CREATE TABLE IF NOT EXISTS chatflow_session_endpoints (
    session_id     text PRIMARY KEY REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
    model          text,
    base_url       text,
    updated_at_utc double precision NOT NULL
)""",
        ],
    ),
    (
        2,
        "a token count with every message; summaries of turns 1..K",
        [
            # the message's tokens as sent to a model: the provider's completion_tokens for a
            # reply that reported usage, else the estimate of chatflow_cli.core.tokens. Stored
            # so that choosing a token-budget window reads only the window's rows.
            "ALTER TABLE chatflow_messages ADD COLUMN IF NOT EXISTS tokens integer",
            # K for a SYSTEM message (turn 0) that summarises turns 1..K (a compaction); NULL
            # for every other message. A rollback to n < K marks it removed like a turn.
            "ALTER TABLE chatflow_messages ADD COLUMN IF NOT EXISTS summary_through integer",
            """CREATE INDEX IF NOT EXISTS chatflow_messages_summaries ON chatflow_messages (session_id, summary_through)
    WHERE summary_through IS NOT NULL AND removed_at_seq IS NULL""",
            # rows written before this version get the estimate
            "_fill_token_estimates",
        ],
    ),
    (
        3,
        "fork origin, titles and archive of sessions",
        [
            # {"session_id", "turn", "seq"} of the session this one was forked from; NULL otherwise
            "ALTER TABLE chatflow_sessions ADD COLUMN IF NOT EXISTS forked_from jsonb",
            # set by the user; NULL: derived from the first user message
            "ALTER TABLE chatflow_sessions ADD COLUMN IF NOT EXISTS title text",
            # epoch seconds (database clock); NULL: not archived
            "ALTER TABLE chatflow_sessions ADD COLUMN IF NOT EXISTS archived_at_utc double precision",
        ],
    ),
    (
        4,
        "full-text search over messages: a tsvector per message with a GIN index",
        [
            # the message's searchable words (chatflow_cli.core.memory.search.words_of, the
            # same folding as the other stores) with their positions: weight A for user and
            # model text, B for tool results and the model's tool calls; written with the row
            "ALTER TABLE chatflow_messages ADD COLUMN IF NOT EXISTS search_vector tsvector",
            "CREATE INDEX IF NOT EXISTS chatflow_messages_search ON chatflow_messages USING gin (search_vector)",
            # rows written before this version are indexed now
            "_fill_search_vectors",
        ],
    ),
    (
        5,
        "the latest version of each agent that ran in a session",
        [
            # {agent name: {"version", "turn"}}: the latest version each agent ran in the
            # session and the last turn it ran that version in; NULL: none known (sessions
            # stored before this version). Each reply's version is in its message JSON.
            "ALTER TABLE chatflow_sessions ADD COLUMN IF NOT EXISTS agent_versions jsonb",
        ],
    ),
    (
        6,
        "messages, event payloads, metadata, fork origins and agent versions kept as their exact JSON text",
        [
            # jsonb reorders object keys and rewrites numbers (1e16 becomes 10000000000000000,
            # -0.0 becomes 0): the *_text columns now hold every value's JSON as it was
            # written, and are what is read. Messages and payloads are never queried by their
            # content, so their jsonb copy goes; metadata keeps one for --metadata filters.
            # Rows written before keep what jsonb made of them (the original text is gone).
            "UPDATE chatflow_messages SET message_text = COALESCE(message_text, message::text), message = NULL "
            "WHERE message IS NOT NULL",
            "UPDATE chatflow_events SET payload_text = COALESCE(payload_text, payload::text), payload = NULL "
            "WHERE payload IS NOT NULL",
            "UPDATE chatflow_sessions SET metadata_text = metadata::text WHERE metadata_text IS NULL",
            # a fork's origin and the agents' versions are read whole, never queried into
            "ALTER TABLE chatflow_sessions ALTER COLUMN forked_from TYPE text USING forked_from::text",
            "ALTER TABLE chatflow_sessions ALTER COLUMN agent_versions TYPE text USING agent_versions::text",
        ],
    ),
    (
        7,
        "search vectors of the words every store searches, in every script: recomputed",
        [
            # words_of now keeps Hangul whole, splits runs of Chinese and Japanese characters
            # into overlapping pairs and words glued to them apart; every vector is redone
            "_fill_search_vectors",
        ],
    ),
    (8, MEMORY_STORES[0], list(MEMORY_STORES[1])),  # the tables are written beside their primitives
    (9, VAULTS[0], list(VAULTS[1])),
    (10, ATTACHMENTS[0], list(ATTACHMENTS[1])),
]
def _fill_token_estimates(conn: psycopg.Connection[Any]) -> None:
    """Give every message row without a token count the estimate of its message."""
    from ...tokens import estimate_tokens

    rows = conn.execute(
        "SELECT message_id, message, message_text FROM chatflow_messages WHERE tokens IS NULL"
    ).fetchall()
    if rows:
        conn.cursor().executemany(
            "UPDATE chatflow_messages SET tokens = %s WHERE message_id = %s",
            [(estimate_tokens(stored_message(m if x is None else x)), message_id) for message_id, m, x in rows],
        )


def _fill_search_vectors(conn: psycopg.Connection[Any]) -> None:
    """Give every message row its search vector."""
    rows = conn.execute("SELECT message_id, message, message_text FROM chatflow_messages").fetchall()
    if rows:
        conn.cursor().executemany(
            "UPDATE chatflow_messages SET search_vector = %s::tsvector WHERE message_id = %s",
            [(_search_vector(stored_message(m if x is None else x)), message_id) for message_id, m, x in rows],
        )


#: Migration steps that SQL alone cannot compute, named in ``_MIGRATIONS`` and run on the
#: connection inside the migration's transaction.
_MIGRATION_STEPS: dict[str, Callable[[psycopg.Connection[Any]], None]] = {
    "_fill_token_estimates": _fill_token_estimates,
    "_fill_search_vectors": _fill_search_vectors,
}

#: The newest schema version this chatflow knows.
SCHEMA_VERSION = _MIGRATIONS[-1][0]

_MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS chatflow_schema_migrations (
    version        integer PRIMARY KEY,
    name           text NOT NULL,
    applied_at_utc double precision NOT NULL
)"""


def _channel_key(session_id: str) -> str:
    return hashlib.md5(session_id.encode("utf-8"), usedforsecurity=False).hexdigest()
