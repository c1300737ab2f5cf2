"""PostgresSessionStore: sessions, their messages and their event log in PostgreSQL.

``PostgresSessionStore("postgresql://user@host/db")`` is the store for a fleet: many worker
processes on many hosts share one database with every guarantee of the SQLite store. The
session rules are those of :class:`~chatflow_cli.core.memory.base.BaseSessionStore`; this module
supplies transactions over PostgreSQL, with patterns that hold when writers really run at
the same time (SQLite serialises every writer, PostgreSQL does not):

* every write transaction that touches a session takes a transaction-scoped advisory lock
  on the session id first (``pg_advisory_xact_lock``), then the row ``FOR UPDATE``: writers
  of one session queue, writers of different sessions run in parallel, and creating a new
  session cannot race another creator;
* event ``seq`` is a counter on the session row (``last_seq``), advanced under that lock in
  the transaction that inserts the events: gap-free, never read-max-plus-one;
* ``claim_message`` is one ``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE <free> RETURNING``
  under an advisory lock on the message id; the 192-hour TTL and claim leases are evaluated
  on the database's clock;
* the owner of a running turn holds a *lease*: ``lease_expires_at`` on the database clock,
  renewed every ``lease_s / 3`` seconds by a thread of the owning process while its turn
  runs (until the Runner ends the turn, by whatever path, and never past the life of the
  turn's context; a turn that ended with its ending unwritten has its lease expired as soon
  as the database answers). An owner counts as alive while its lease
  has not expired -- and, on the same host name, while its pid lives (a dead local worker is
  recovered at once). A worker that died on another host is recovered once its lease
  expired; a running turn is never taken over before. Claims of message ids and places in
  the turn queue hold leases the same way;
* the store's ``clock`` is the database server's clock (its offset from this host's steady
  clock is measured when the store opens: a step of this host's wall clock does not move
  it), so TTLs and timestamps agree across hosts; a message claim and the purge of expired
  message ids judge the 192-hour TTL on ``clock_timestamp()`` in the statement itself;
* versioned migrations, each in one transaction, serialised by an advisory lock so many
  workers starting at once migrate once; a database written by a newer chatflow is refused
  (:class:`SchemaTooNewError`) before anything is written;
* messages, event payloads, metadata, fork origins and agent versions are kept as the exact
  JSON text they were written as (``jsonb`` would reorder object keys and rewrite numbers:
  ``1e16``, ``-0.0``), so every value comes back as it was given; metadata also has a ``jsonb`` copy, which only
  the ``--metadata`` filter reads;
* every commit that appends events sends ``NOTIFY chatflow_events`` (payload: the md5 of the
  session id): :meth:`PostgresSessionStore.wait_for_events` is how ``replay --follow``
  is pushed new events instead of polling.

Connections come from a ``psycopg_pool.ConnectionPool`` (``pool_size`` connections at most,
one kept open; a process forked with the store open gets a pool of its own on first use,
and the parent's connections are left to the parent) with server-side prepared statements
off (``prepare_threshold=None``) and no
session state between transactions, so the store works behind PgBouncer in transaction
mode. Async twins run the same SQL on a private thread pool (as the SQLite store does for
files). Passwords come from the URL, ``PGPASSWORD`` or ``~/.pgpass`` as libpq reads them;
the store never prints, logs or stores them (:func:`redact_dsn` is what error messages and
``repr`` show).

Every ``psycopg`` error surfaces as :class:`StoreError` with one line: the server refused
the connection, bad credentials, the connection was lost (the transaction rolled back:
nothing of it was written; or, lost once the COMMIT was sent, the write may have been
committed: ``StoreError.written`` is None), and so on. A transaction PostgreSQL rolls back
as a serialization failure or a deadlock is run again (``begin_turn``, ``save``, the
claim writes: 4 attempts in all); lease renewals lock rows one table at a time, in key
order, so they never deadlock with a turn start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from .._dsn import is_postgres_url, redact_dsn
from ..errors import SchemaTooNewError, SessionNotFoundError, StoreError, StoreUnreachableError
from ..events import Event, SessionStatus
from ..messages import Message, Role
from ..tokens import message_tokens
from ._checks import DEFAULT_MAX_TURNS, metadata_matches
from ._fork import SharedPool, fork_lock, keep_inherited
from ._port import ListFilter, SearchFilter, title_of, _MessageRecord, _SessionRow, _StoredMessage, _Tx
from .base import BaseSessionStore
from .postgres_vaults import MIGRATION as VAULTS_MIGRATION, PgVaultTx
from .search import UNSEARCHABLE, Query, SearchHit, memory_snippet, searchable_texts, words_of
from .owner import Owner
from .protocol import MessageState, TurnStart

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from .context import SessionContext

    import psycopg

__all__ = ["DEFAULT_LEASE_S", "NOTIFY_CHANNEL", "SCHEMA_VERSION", "PostgresSessionStore", "is_postgres_url",
           "redact_dsn"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

# psycopg_pool logs each connection it drops and each failed reconnection as a warning
# ("error connecting in 'pool-1'..."), many while a server restarts. With no logging set up
# Python would print them on stderr, between the application's own lines; a handler that
# drops them keeps them in logging only (an application that configures logging, or
# ``chatflow --debug``, still gets them). What matters reaches the caller as a StoreError.
if not any(isinstance(h, logging.NullHandler) for h in logging.getLogger("psycopg").handlers):
    logging.getLogger("psycopg").addHandler(logging.NullHandler())

#: Seconds a running turn's owner (and a claim's holder, and a queued waiter) stays alive
#: without renewing its lease; renewed every third of it while the owner works.
DEFAULT_LEASE_S = 30.0
#: The channel every commit that appends events notifies (payload: md5 of the session id).
NOTIFY_CHANNEL = "chatflow_events"
_CONNECT_TIMEOUT_S = 10
_POOL_TIMEOUT_S = 30.0
_POOL_QUICK_S = 1.0

# Advisory lock namespaces (the first key of pg_advisory_xact_lock(int4, int4)).
_LOCK_MIGRATE = (0x63686174, 1)  # "chat"
_NS_SESSION = 0x63660001
_NS_MESSAGE = 0x63660002


# ----------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------

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
]


def _fill_token_estimates(conn: psycopg.Connection[Any]) -> None:
    """Give every message row without a token count the estimate of its message."""
    from ..tokens import estimate_tokens

    rows = conn.execute(
        "SELECT message_id, message, message_text FROM chatflow_messages WHERE tokens IS NULL"
    ).fetchall()
    if rows:
        conn.cursor().executemany(
            "UPDATE chatflow_messages SET tokens = %s WHERE message_id = %s",
            [(estimate_tokens(_message(m, x)), message_id) for message_id, m, x in rows],
        )


def _fill_search_vectors(conn: psycopg.Connection[Any]) -> None:
    """Give every message row its search vector."""
    rows = conn.execute("SELECT message_id, message, message_text FROM chatflow_messages").fetchall()
    if rows:
        conn.cursor().executemany(
            "UPDATE chatflow_messages SET search_vector = %s::tsvector WHERE message_id = %s",
            [(_search_vector(_message(m, x)), message_id) for message_id, m, x in rows],
        )


#: Bytes of lexemes a message's vector holds at most (PostgreSQL refuses a tsvector over 1 MB);
#: words first seen after that are not indexed.
_MAX_VECTOR_BYTES = 768 * 1024


def _search_vector(message: Message) -> str | None:
    """The ``tsvector`` literal of ``message``: its folded words (the same words the other
    stores search) with positions, weight A for user and model text, B for tool text; the
    tool text starts two positions after the body so no phrase spans the two. None when
    the message has no searchable text."""
    body = message.content if message.role in (Role.USER, Role.MODEL) and message.content else ""
    tools = ""
    if message.role is Role.TOOL and message.content:
        tools = message.content
    elif message.role is Role.MODEL and message.tool_calls:
        tools = " ".join(f"{c.name} {c.arguments}" for c in message.tool_calls)
    positions: dict[str, list[str]] = {}
    size = 0
    pos = 0
    for text, weight in ((body, "A"), (tools, "B")):
        if weight == "B":
            pos += 1
        for word in words_of(text):
            pos += 1
            if word == UNSEARCHABLE or pos > 16383:  # PostgreSQL's largest position
                continue
            seen = positions.get(word)
            if seen is None:
                size += len(word.encode()) + 8
                if size > _MAX_VECTOR_BYTES:
                    continue
                positions[word] = seen = []
            if len(seen) < 255:  # PostgreSQL keeps at most 256 positions of a lexeme
                seen.append(f"{pos}{weight}")
    if not positions:
        return None
    return " ".join(f"'{_quote_lexeme(w)}':{','.join(p)}" for w, p in positions.items())


def _quote_lexeme(word: str) -> str:
    return word.replace("\\", "\\\\").replace("'", "''")


def _ts_term(term: Any, weights: str) -> str:
    words = [f"'{_quote_lexeme(w)}':" + ("*" if term.prefix and i == len(term.words) - 1 else "") + weights
             for i, w in enumerate(term.words)]
    return "(" + " <-> ".join(words) + ")"


def to_tsquery(query: Query, include_tools: bool) -> str:
    """The ``tsquery`` literal of ``query``: every word quoted (no syntax error is possible),
    limited to user and model text (weight A) unless ``include_tools``."""
    weights = "AB" if include_tools else "A"
    parts = []
    for positive, negative in query.clauses:
        expr = " & ".join(_ts_term(t, weights) for t in positive)
        if negative:  # flat, as to_fts5: one nesting level, not one per word
            expr = f"({expr}) & !(" + " | ".join(_ts_term(t, weights) for t in negative) + ")"
        parts.append(f"({expr})")
    return " | ".join(parts)


_MIGRATIONS.append(VAULTS_MIGRATION)

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


# ----------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _LeasedOwner(Owner):
    """An owner read from the database with its lease verdict (``live``: the lease had not
    expired on the database clock when read)."""

    live: bool = True

    def alive(self) -> bool:
        """Alive while the lease holds; on this host name also only while the pid runs."""
        return self.live and Owner.alive(self)


def _owner(data: Any, live: Any) -> Owner | None:
    if not data:
        return None
    base = Owner.from_dict(data)
    return _LeasedOwner(base.pid, base.start_time, base.host, base.token, bool(live))


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _metadata_columns(data: Any) -> tuple[str | None, str]:
    """(``jsonb`` text, exact text) of a session's metadata. The exact JSON text is what is
    read back; the ``jsonb`` copy only serves ``--metadata`` filters (which keys a row has),
    and is None for JSON that ``jsonb`` cannot hold (``\\u0000``, NaN, Infinity)."""
    text = _dumps(data)
    try:
        strict = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return None, text
    return (None if "\\u0000" in strict else strict), text


def _joined(jsonb: Any, text: str | None) -> Any:
    """The stored value: the exact JSON text when there is one; else (rows written before
    schema version 6, with no text) the ``jsonb`` value."""
    return json.loads(text) if text is not None else jsonb


_ROW_COLUMNS = (
    "session_id, incarnation, active_agent_name, metadata, metadata_text, max_turns, turn_count, status, owner, "
    "lease_expires_at > clock_timestamp(), created_at_utc, updated_at_utc, last_seq, forked_from, title, "
    "archived_at_utc, agent_versions"
)


def _row(r: tuple[Any, ...]) -> _SessionRow:
    return _SessionRow(
        session_id=r[0],
        incarnation=r[1],
        active_agent_name=r[2],
        metadata=_joined(r[3], r[4]),
        max_turns=r[5],
        turn_count=r[6],
        status=SessionStatus(r[7]),
        owner=_owner(r[8], r[9]),
        created_at=r[10],
        updated_at=r[11],
        forked_from=json.loads(r[13]) if r[13] is not None else None,
        title=r[14],
        archived_at=r[15],
        agent_versions=json.loads(r[16]) if r[16] else {},
    )


_EVENT_COLUMNS = "seq, event_type, payload, payload_text, created_at_utc, idempotency_key"


def _event(session_id: str, r: tuple[Any, ...]) -> Event:
    return Event(session_id, int(r[0]), r[1], _joined(r[2], r[3]), r[4], r[5])


def _message(jsonb: Any, text: str | None, tokens: int | None = None) -> Message:
    """A stored message with its stored token count."""
    message = Message.from_dict(_joined(jsonb, text))
    if tokens is not None:
        object.__setattr__(message, "tokens", tokens)
    return message


# ----------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------


#: SQLSTATEs of a transaction PostgreSQL rolled back and says may simply run again:
#: serialization_failure and deadlock_detected.
_RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
#: Seconds between renewals while leases of ended runs (turns, claims, queue tickets) wait
#: to be expired: they are expired this soon after a run ends, or after the database is
#: back, instead of holding a session or a message until they run out.
_EXPIRE_RETRY_S = 1.0
#: Attempts of a write whose transaction PostgreSQL rolled back as retryable.
_WRITE_ATTEMPTS = 4


def _store_error(exc: BaseException, label: str, *, committing: bool = False, broken: bool = False) -> StoreError:
    """One clear line for a psycopg error on database ``label`` (never a password).

    ``committing``: the error came once the COMMIT was sent. An error the server reported
    (it has a SQLSTATE) rolled the transaction back; a lost connection then leaves the
    commit's outcome unknown, and the error says the write may have happened
    (``written=None``); before the COMMIT, nothing of it was written (``written=False``).

    ``broken``: the connection the error came on turned out lost (psycopg's
    ``conn.broken`` / ``conn.closed`` after the error). Whatever the error says -- psycopg's
    own "cannot exit pipeline mode while busy" on a terminated connection, say -- it is then
    a :class:`StoreUnreachableError`, as is an error whose SQLSTATE -- or that of an error
    it was raised while handling -- says the connection ended (class 08, connection
    exception; 57P, the server shut the session down).
    """
    import psycopg

    cause = _connection_ended(exc)
    if cause is not None and cause is not exc:  # say the server's reason, not what psycopg met next
        exc = cause
    text = redact_dsn(" ".join(str(exc).split()))
    low = text.lower()
    sqlstate = getattr(exc, "sqlstate", None) or ""
    retryable = sqlstate in _RETRYABLE_SQLSTATES
    lost = broken or cause is not None
    # the COMMIT was sent and no answer of the server says it was rolled back
    unknown = committing and (not sqlstate or lost)
    unreachable = False
    if (isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.InterfaceError)) and not broken and (
            "authentication" in low or "no password supplied" in low):
        message = f"cannot connect to {label}: authentication failed ({text})"
    elif (isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.InterfaceError)) and not broken and (
            "does not exist" in low):
        message = f"cannot connect to {label}: {text}"
    elif (isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.InterfaceError)) and not broken and (
            "connection refused" in low or "could not connect" in low or "connection failed" in low):
        # StoreUnreachableError: the server may come back (a restart); a follower retries
        message, unreachable = f"cannot connect to {label}: {text}", True
    elif unknown and (lost or isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))):
        message, unreachable = (f"lost the connection to {label} once the commit was sent ({text}); the write "
                                "may have been committed or not: read the session again to know"), True
    elif lost or (isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and (
            "closed" in low or "terminat" in low or "lost" in low or "eof" in low)):
        message, unreachable = (f"lost the connection to {label} ({text}); the transaction was rolled back, "
                                "nothing of it was written"), True
    elif unknown:
        message = (f"database error on {label} while committing ({text}); the write may have been committed "
                   "or not: read the session again to know")
    elif isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and not retryable:
        message = f"database error on {label}: {text}; nothing of it was written"
    else:
        message = f"database error on {label}: {text}; the transaction was rolled back, nothing of it was written"
    kind = StoreUnreachableError if unreachable else StoreError
    return kind(message, written=None if unknown else False, retryable=retryable)


#: SQLSTATE classes of a session the server ended or lost: connection exception (08) and
#: the server shutting the session down (57P: admin_shutdown, crash_shutdown, cannot_connect_now).
_LOST_SQLSTATES = ("08", "57P")


def _connection_ended(exc: BaseException) -> BaseException | None:
    """The error of ``exc``'s chain (itself, or what it was raised while handling) whose
    SQLSTATE says the server ended the connection, or None. psycopg raises "cannot exit
    pipeline mode while busy" while handling the server's "terminating connection due to
    administrator command", before the connection itself is seen closed."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if str(getattr(current, "sqlstate", None) or "").startswith(_LOST_SQLSTATES):
            return current
        current = current.__cause__ or current.__context__
    return None


def _lost(conn: psycopg.Connection[Any]) -> bool:
    """The connection turned out lost: the server ended it, or it was closed."""
    return bool(conn.broken or conn.closed)


# ----------------------------------------------------------------------------------------
# Transactions
# ----------------------------------------------------------------------------------------


class _PgTx(_Tx, PgVaultTx):
    """Primitives over one connection inside one transaction."""

    def __init__(self, conn: psycopg.Connection[Any], store: PostgresSessionStore, writable: bool) -> None:
        self._conn = conn
        self._store = store
        self._writable = writable
        self._lease_s = store.lease_s
        self._locked: set[str] = set()
        self._messages_locked: set[str] = set()
        self._seq: dict[str, int] = {}
        self._seq_dirty: set[str] = set()
        self._events: list[tuple[Any, ...]] = []
        self._message_rows: list[tuple[Any, ...]] = []

    # -- plumbing ------------------------------------------------------------------------
    def _x(self, sql: str, params: Any = None) -> psycopg.Cursor[Any]:
        if self._events or self._message_rows:
            self.flush_inserts()
        return self._conn.execute(sql, params)

    def flush_inserts(self) -> None:
        if self._events:
            rows, self._events = self._events, []
            self._conn.cursor().executemany(
                "INSERT INTO chatflow_events (session_id, seq, event_type, turn, payload_text, "
                "idempotency_key, created_at_utc) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
        if self._message_rows:
            rows, self._message_rows = self._message_rows, []
            self._conn.cursor().executemany(
                "INSERT INTO chatflow_messages (session_id, turn, role, message_text, event_seq, tokens, "
                "summary_through, search_vector) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::tsvector)",
                rows,
            )

    def flush(self) -> None:
        """Before COMMIT: the batched inserts, then each session's seq counter that no
        update_row carried, with its NOTIFY."""
        self.flush_inserts()
        for session_id in list(self._seq_dirty):
            self._conn.execute(
                "UPDATE chatflow_sessions SET last_seq = %s WHERE session_id = %s",
                (self._seq[session_id], session_id),
            )
            self._notify(session_id)
        self._seq_dirty.clear()

    def _notify(self, session_id: str) -> None:
        self._conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, _channel_key(session_id)))

    def _lock_session(self, session_id: str) -> None:
        if self._writable and session_id not in self._locked and not self._locked:
            # one session per write transaction is locked (a second one is only read): no
            # two transactions can wait for each other's session locks
            self._x("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_NS_SESSION, session_id))
            self._locked.add(session_id)

    def _lock_message(self, message_id: str) -> None:
        if self._writable and message_id not in self._messages_locked and not self._messages_locked:
            self._x("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_NS_MESSAGE, message_id))
            self._messages_locked.add(message_id)

    # -- sessions --------------------------------------------------------------------------
    def get_row(self, session_id: str) -> _SessionRow | None:
        self._lock_session(session_id)
        r = self._x(
            f"SELECT {_ROW_COLUMNS} FROM chatflow_sessions WHERE session_id = %s"
            + (" FOR UPDATE" if session_id in self._locked else ""),
            (session_id,),
        ).fetchone()
        if r is None:
            return None
        self._seq.setdefault(session_id, int(r[12]))
        return _row(r)

    def insert_row(self, row: _SessionRow) -> None:
        self._lock_session(row.session_id)
        meta, meta_text = _metadata_columns(row.metadata)
        self._x(
            "INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, metadata, metadata_text, "
            "max_turns, turn_count, status, owner, owner_token, lease_expires_at, last_seq, created_at_utc, "
            "updated_at_utc, forked_from, title, archived_at_utc, agent_versions) VALUES (%s, %s, %s, %s::jsonb, %s, "
            "%s, %s, %s, %s::jsonb, %s, CASE WHEN %s::text IS NULL THEN NULL ELSE clock_timestamp() + %s * "
            "interval '1 second' END, 0, %s, %s, %s, %s, %s, %s)",
            (
                row.session_id, row.incarnation, row.active_agent_name, meta, meta_text, row.max_turns,
                row.turn_count, row.status.value, _dumps(row.owner.to_dict()) if row.owner else None,
                row.owner.token if row.owner else None, row.owner.token if row.owner else None, self._lease_s,
                row.created_at, row.updated_at, _dumps(row.forked_from) if row.forked_from is not None else None,
                row.title, row.archived_at, _dumps(row.agent_versions) if row.agent_versions else None,
            ),
        )
        self._seq[row.session_id] = 0

    def update_row(self, row: _SessionRow) -> None:
        meta, meta_text = _metadata_columns(row.metadata)
        token = row.owner.token if row.owner else None
        dirty = row.session_id in self._seq_dirty
        self._x(
            "UPDATE chatflow_sessions SET incarnation = %s, active_agent_name = %s, metadata = %s::jsonb, "
            "metadata_text = %s, max_turns = %s, turn_count = %s, status = %s, owner = %s::jsonb, "
            # a new owner gets a fresh lease; the same owner keeps its own (only it renews it)
            "lease_expires_at = CASE WHEN %s::text IS NULL THEN NULL "
            "WHEN owner_token IS NOT DISTINCT FROM %s THEN lease_expires_at "
            "ELSE clock_timestamp() + %s * interval '1 second' END, "
            "owner_token = %s, last_seq = %s, created_at_utc = %s, updated_at_utc = %s, forked_from = %s, "
            "title = %s, archived_at_utc = %s, agent_versions = %s "
            "WHERE session_id = %s" + (" RETURNING pg_notify(%s, %s)" if dirty else ""),
            (
                row.incarnation, row.active_agent_name, meta, meta_text, row.max_turns, row.turn_count,
                row.status.value, _dumps(row.owner.to_dict()) if row.owner else None, token, token, self._lease_s,
                token, self._seq.get(row.session_id, 0), row.created_at, row.updated_at,
                _dumps(row.forked_from) if row.forked_from is not None else None, row.title, row.archived_at,
                _dumps(row.agent_versions) if row.agent_versions else None, row.session_id,
                *((NOTIFY_CHANNEL, _channel_key(row.session_id)) if dirty else ()),
            ),
        )
        self._seq_dirty.discard(row.session_id)

    def delete_row(self, session_id: str) -> bool:
        self._lock_session(session_id)
        # RETURNING, not rowcount: in pipeline mode a count is known only once results are read
        gone = self._x("DELETE FROM chatflow_sessions WHERE session_id = %s RETURNING 1", (session_id,)).fetchall()
        self._x("DELETE FROM chatflow_turn_queue WHERE session_id = %s", (session_id,))
        return bool(gone)

    def list_rows(self, agent: str | None) -> list[_SessionRow]:
        sql = f"SELECT {_ROW_COLUMNS} FROM chatflow_sessions"
        args: tuple[Any, ...] = ()
        if agent is not None:
            sql += " WHERE active_agent_name = %s"
            args = (agent,)
        sql += " ORDER BY updated_at_utc DESC, session_id"
        return [_row(r) for r in self._x(sql, args)]

    def list_summaries(self, where: ListFilter) -> list[tuple[_SessionRow, str, bool | None]]:
        # One statement: the rows with their previews (correlated subqueries on the
        # messages' indexes: the first live user message of turn 1, else the newest user
        # message of a failed turn) and whether the last turn failed, filtered and ordered
        # in SQL. A metadata value is matched exactly here (the stored string, or its compact
        # JSON, as every store does) after SQL kept only the rows holding the key.
        cols = ", ".join(f"s.{c}" if "(" not in c and ">" not in c else c.replace("lease_expires_at",
                         "s.lease_expires_at") for c in _ROW_COLUMNS.split(", "))
        preview = (
            "(SELECT p.message, p.message_text FROM chatflow_messages AS p WHERE p.session_id = s.session_id "
            "AND p.turn = 1 AND p.role = 'user' AND p.removed_at_seq IS NULL ORDER BY p.event_seq LIMIT 1)"
        )
        failed_preview = (
            "(SELECT p.message, p.message_text FROM chatflow_messages AS p WHERE p.session_id = s.session_id "
            "AND p.role = 'user' AND p.removed_reason = 'failed' ORDER BY p.message_id DESC LIMIT 1)"
        )
        last_end = (
            "(SELECT g.event_type FROM chatflow_events AS g WHERE g.session_id = s.session_id AND g.event_type IN "
            "('turn.failed', 'turn.completed', 'turn.interrupted', 'rollback') ORDER BY g.seq DESC LIMIT 1)"
        )
        conds = ["s.archived_at_utc IS NOT NULL" if where.archived else "s.archived_at_utc IS NULL"]
        args: list[Any] = []
        if where.agent is not None:
            conds.append("s.active_agent_name = %s")
            args.append(where.agent)
        for key, _value in where.metadata:
            conds.append("(s.metadata IS NULL OR jsonb_exists(s.metadata, %s))")
            args.append(key)
        if where.since is not None:
            conds.append("s.updated_at_utc >= %s")
            args.append(where.since)
        if where.until is not None:
            conds.append("s.updated_at_utc < %s")
            args.append(where.until)
        if where.after is not None:
            conds.append("(s.updated_at_utc < %s OR (s.updated_at_utc = %s AND s.session_id > %s))")
            args += [where.after[0], where.after[0], where.after[1]]
        sql = (
            f"SELECT {cols}, pv.message, pv.message_text, fp.message, fp.message_text, {last_end} "
            f"FROM chatflow_sessions AS s LEFT JOIN LATERAL {preview} AS pv ON true "
            f"LEFT JOIN LATERAL {failed_preview} AS fp ON pv.message IS NULL AND pv.message_text IS NULL "
            f"WHERE {' AND '.join(conds)} ORDER BY s.updated_at_utc DESC, s.session_id"
        )
        exact = where.title is None and not where.metadata
        if exact and where.limit is not None:
            sql += " LIMIT %s"
            args.append(where.limit)
        out: list[tuple[_SessionRow, str, bool | None]] = []
        needle = where.title.casefold() if where.title is not None else None
        for r in self._x(sql, args):
            row = _row(r)
            if not all(metadata_matches(row.metadata, k, v) for k, v in where.metadata):
                continue
            n = len(r)
            if r[n - 5] is not None or r[n - 4] is not None:
                text = _message(r[n - 5], r[n - 4]).content or ""
            elif r[n - 3] is not None or r[n - 2] is not None:
                text = _message(r[n - 3], r[n - 2]).content or ""
            else:
                text = ""
            if needle is not None and needle not in title_of(row.title, text).casefold():
                continue
            out.append((row, text, r[n - 1] == "turn.failed"))
            if where.limit is not None and len(out) >= where.limit:
                break
        return out

    def latest_session_id(self) -> str | None:
        r = self._x("SELECT session_id FROM chatflow_sessions ORDER BY updated_at_utc DESC, session_id LIMIT 1").fetchone()
        return None if r is None else str(r[0])

    # -- events ----------------------------------------------------------------------------
    def next_seq(self, session_id: str) -> int:
        seq = self._seq.get(session_id)
        if seq is None:
            r = self._x("SELECT last_seq FROM chatflow_sessions WHERE session_id = %s", (session_id,)).fetchone()
            seq = int(r[0]) if r is not None else 0
            self._seq[session_id] = seq
        return seq + 1

    def insert_event(self, event: Event, turn: int | None, payload_json: str | None = None) -> None:
        text = _dumps(event.payload) if payload_json is None else payload_json
        self._events.append(
            (event.session_id, event.seq, event.type, turn, text, event.idempotency_key, event.created_at)
        )
        self._seq[event.session_id] = event.seq
        self._seq_dirty.add(event.session_id)

    def events(self, session_id: str, after_seq: int, limit: int | None) -> list[Event]:
        sql = f"SELECT {_EVENT_COLUMNS} FROM chatflow_events WHERE session_id = %s AND seq > %s ORDER BY seq"
        args: tuple[Any, ...] = (session_id, after_seq)
        if limit is not None:
            sql += " LIMIT %s"
            args += (limit,)
        return [_event(session_id, r) for r in self._x(sql, args)]

    def last_event(self, session_id: str, type: str, turn: int | None = None, after_seq: int = 0) -> Event | None:
        sql = f"SELECT {_EVENT_COLUMNS} FROM chatflow_events WHERE session_id = %s AND event_type = %s AND seq > %s"
        args: tuple[Any, ...] = (session_id, type, after_seq)
        if turn is not None:
            sql += " AND turn = %s"
            args += (turn,)
        r = self._x(sql + " ORDER BY seq DESC LIMIT 1", args).fetchone()
        return None if r is None else _event(session_id, r)

    def events_of_type(self, session_id: str, type: str, after_seq: int) -> list[Event]:
        rows = self._x(
            f"SELECT {_EVENT_COLUMNS} FROM chatflow_events WHERE session_id = %s AND event_type = %s AND seq > %s "
            "ORDER BY seq",
            (session_id, type, after_seq),
        )
        return [_event(session_id, r) for r in rows]

    def turn_events(self, session_id: str, type: str, first: int, last: int | None) -> list[Event]:
        sql = f"SELECT {_EVENT_COLUMNS} FROM chatflow_events WHERE session_id = %s AND event_type = %s AND turn >= %s"
        args: tuple[Any, ...] = (session_id, type, first)
        if last is not None:
            sql += " AND turn <= %s"
            args += (last,)
        return [_event(session_id, r) for r in self._x(sql + " ORDER BY seq", args)]

    # -- messages --------------------------------------------------------------------------
    def insert_message(self, session_id: str, turn: int, message: Message, seq: int,
                       message_json: str | None = None) -> None:
        text = _dumps(message.to_dict()) if message_json is None else message_json
        self._message_rows.append(
            (session_id, turn, message.role.value, text, seq, message_tokens(message), message.summary_through,
             _search_vector(message))
        )

    def remove_turns(self, session_id: str, first: int, last: int | None, reason: str, seq: int) -> None:
        self._x(
            "UPDATE chatflow_messages SET removed_at_seq = %s, removed_reason = %s "
            "WHERE session_id = %s AND removed_at_seq IS NULL AND turn >= %s AND turn <= %s",
            (seq, reason, session_id, max(0, first), last if last is not None else 2**31 - 1),
        )

    def latest_summary_through(self, session_id: str) -> int | None:
        r = self._x(
            "SELECT MAX(summary_through) FROM chatflow_messages WHERE session_id = %s "
            "AND summary_through IS NOT NULL AND removed_at_seq IS NULL",
            (session_id,),
        ).fetchone()
        return None if r is None or r[0] is None else int(r[0])

    def remove_summaries(self, session_id: str, after_turn: int, seq: int) -> None:
        self._x(
            "UPDATE chatflow_messages SET removed_at_seq = %s, removed_reason = 'rolled_back' "
            "WHERE session_id = %s AND summary_through > %s AND removed_at_seq IS NULL",
            (seq, session_id, after_turn),
        )

    def summaries(self, session_id: str, include_removed: bool) -> list[_StoredMessage]:
        rows = self._x(
            "SELECT message, message_text, tokens, removed_reason, removed_at_seq FROM chatflow_messages "
            "WHERE session_id = %s AND summary_through IS NOT NULL"
            + ("" if include_removed else " AND removed_at_seq IS NULL") + " ORDER BY message_id",
            (session_id,),
        )
        return [_StoredMessage(0, _message(m, x, n), reason, seq) for m, x, n, reason, seq in rows]

    def window(self, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        rows = self._x(
            # index ranges (an OR of them would scan the whole session's history): the real
            # system messages, the newest live summary, the live turns from first_turn
            "(SELECT 0 AS k, turn, message, message_text, tokens, event_seq, message_id FROM chatflow_messages "
            "WHERE session_id = %s AND removed_at_seq IS NULL AND turn = 0 AND role = 'system' "
            "AND summary_through IS NULL) UNION ALL "
            "(SELECT 1, turn, message, message_text, tokens, 0, 0 FROM chatflow_messages WHERE session_id = %s "
            "AND summary_through IS NOT NULL AND removed_at_seq IS NULL "
            "ORDER BY summary_through DESC, message_id DESC LIMIT 1) UNION ALL "
            "(SELECT 2, turn, message, message_text, tokens, event_seq, message_id FROM chatflow_messages "
            "WHERE session_id = %s AND removed_at_seq IS NULL AND turn >= %s) ORDER BY 1, 2, 6, 7",
            (session_id, session_id, session_id, max(1, first_turn)),
        ).fetchall()
        return [(t, _message(m, x, n)) for _k, t, m, x, n, _seq, _id in rows]

    def turn_messages(
        self, session_id: str, first: int, last: int | None, include_removed: bool
    ) -> list[_StoredMessage]:
        sql = (
            "SELECT turn, message, message_text, removed_reason, removed_at_seq, role, tokens "
            "FROM chatflow_messages WHERE session_id = %s AND turn >= %s AND turn <= %s AND summary_through IS NULL"
        )
        if not include_removed:
            sql += " AND removed_at_seq IS NULL"
        rows = self._x(
            sql + " ORDER BY turn, message_id", (session_id, first, last if last is not None else 2**31 - 1)
        )
        return [
            _StoredMessage(t, _message(m, x, n), reason, seq)
            for t, m, x, reason, seq, role, n in rows
            if t > 0 or role == Role.SYSTEM.value
        ]

    def search(self, query: Query, where: SearchFilter) -> list[SearchHit]:
        # The GIN index finds the matching messages; ts_rank_cd ranks them (cover density:
        # more and closer matched words rank higher); DISTINCT ON keeps the best message of
        # each (session, turn, removal); the page is the best of those.
        conditions = ["m.search_vector @@ q.q", "m.turn > 0"]
        args: list[Any] = [to_tsquery(query, where.include_tools)]
        if not where.include_removed:
            conditions.append("m.removed_at_seq IS NULL")
        if where.session_id is not None:
            conditions.append("m.session_id = %s")
            args.append(where.session_id)
        if where.agent is not None:
            conditions.append("s.active_agent_name = %s")
            args.append(where.agent)
        if where.since is not None:
            conditions.append("e.created_at_utc >= %s")
            args.append(where.since)
        args.append(where.limit)
        rows = self._x(
            "SELECT session_id, turn, message, message_text, role, created_at_utc, agent, removed_reason, r FROM ("
            "SELECT DISTINCT ON (m.session_id, m.turn, m.removed_at_seq) m.session_id, m.turn, m.message, "
            "m.message_text, m.role, e.created_at_utc, s.active_agent_name AS agent, m.removed_reason, "
            "ts_rank_cd(m.search_vector, q.q) AS r, m.message_id "
            "FROM (SELECT %s::tsquery AS q) AS q, chatflow_messages AS m "
            "JOIN chatflow_sessions AS s ON s.session_id = m.session_id "
            "JOIN chatflow_events AS e ON e.session_id = m.session_id AND e.seq = m.event_seq "
            f"WHERE {' AND '.join(conditions)} "
            "ORDER BY m.session_id, m.turn, m.removed_at_seq, r DESC, e.created_at_utc DESC, m.message_id) AS best "
            "ORDER BY r DESC, created_at_utc DESC, session_id, turn LIMIT %s",
            args,
        ).fetchall()
        hits = []
        for sid, turn, m, x, role, created, agent, reason, rank in rows:
            texts = searchable_texts(_message(m, x), where.include_tools)
            text = max(texts, key=lambda t: query.score(words_of(t)), default="")
            hits.append(SearchHit(sid, turn, memory_snippet(query, text), role, float(created), -float(rank), agent,
                                  reason))
        return hits

    def preview(self, session_id: str) -> str:
        r = self._x(
            "SELECT message, message_text FROM chatflow_messages WHERE session_id = %s AND turn = 1 "
            "AND role = 'user' AND removed_at_seq IS NULL ORDER BY event_seq LIMIT 1",
            (session_id,),
        ).fetchone()
        if r is None:
            r = self._x(
                "SELECT message, message_text FROM chatflow_messages WHERE session_id = %s AND role = 'user' "
                "AND removed_reason = 'failed' ORDER BY message_id DESC LIMIT 1",
                (session_id,),
            ).fetchone()
        return "" if r is None else (_message(r[0], r[1]).content or "")

    # -- idempotency keys ------------------------------------------------------------------
    def idempotency_get(self, session_id: str, key: str) -> tuple[str, int | None, int] | None:
        r = self._x(
            "SELECT request_sha256, turn, event_seq FROM chatflow_idempotency_keys "
            "WHERE session_id = %s AND idempotency_key = %s",
            (session_id, key),
        ).fetchone()
        return None if r is None else (r[0], None if r[1] is None else int(r[1]), int(r[2]))

    def idempotency_put(self, session_id: str, key: str, digest: str, turn: int | None, seq: int, now: float) -> None:
        self._x(
            "INSERT INTO chatflow_idempotency_keys (session_id, idempotency_key, request_sha256, turn, event_seq, "
            "created_at_utc) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (session_id, idempotency_key) DO UPDATE "
            "SET request_sha256 = excluded.request_sha256, turn = excluded.turn, event_seq = excluded.event_seq, "
            "created_at_utc = excluded.created_at_utc",
            (session_id, key, digest, turn, seq, now),
        )

    def idempotency_turn_keyed(self, session_id: str, turn: int) -> bool:
        r = self._x(
            "SELECT 1 FROM chatflow_idempotency_keys WHERE session_id = %s AND turn = %s LIMIT 1", (session_id, turn)
        ).fetchone()
        return r is not None

    # -- inbound message ids ---------------------------------------------------------------
    def processed_get(self, message_id: str) -> _MessageRecord | None:
        self._lock_message(message_id)
        r = self._x(
            "SELECT state, processed_at_utc, holder, lease_expires_at > clock_timestamp(), session_id, turn "
            "FROM chatflow_processed_messages WHERE message_id = %s",
            (message_id,),
        ).fetchone()
        if r is None:
            return None
        return _MessageRecord(r[0], r[1], _owner(r[2], r[3]), r[4], None if r[5] is None else int(r[5]))

    def processed_put(self, message_id: str, record: _MessageRecord) -> None:
        token = record.holder.token if record.holder else None
        self._x(
            "INSERT INTO chatflow_processed_messages AS p (message_id, state, processed_at_utc, holder, holder_token, "
            "lease_expires_at, session_id, turn) VALUES (%s, %s, %s, %s::jsonb, %s, "
            "CASE WHEN %s::text IS NULL THEN NULL ELSE clock_timestamp() + %s * interval '1 second' END, %s, %s) "
            "ON CONFLICT (message_id) DO UPDATE SET state = excluded.state, processed_at_utc = "
            "excluded.processed_at_utc, holder = excluded.holder, holder_token = excluded.holder_token, "
            "lease_expires_at = CASE WHEN p.holder_token IS NOT DISTINCT FROM excluded.holder_token "
            "AND excluded.holder_token IS NOT NULL THEN p.lease_expires_at ELSE excluded.lease_expires_at END, "
            "session_id = excluded.session_id, turn = excluded.turn",
            (
                message_id, record.state, record.at, _dumps(record.holder.to_dict()) if record.holder else None,
                token, token, self._lease_s, record.session_id, record.turn,
            ),
        )

    def _db_clock(self) -> bool:
        """True when the store's clock is the database's own (not one a caller installed):
        then message records are judged on ``clock_timestamp()`` in the statement, never on
        this host's clock (a host whose clock stepped forward would re-claim processed ids)."""
        return isinstance(self._store.clock, _DatabaseClock)

    def claim(self, message_id: str, holder: Owner, now: float, ttl_s: float) -> tuple[bool, float]:
        """Claim ``message_id`` for ``holder`` in one statement when it is new, expired, or
        its holder's lease expired; (claimed, the time it was judged at -- the database's
        clock, or ``now`` under a clock the caller installed). Not claimed: the statement
        left it to another holder."""
        self._lock_message(message_id)
        r = self._x(
            "WITH t AS (SELECT COALESCE(%s::float8, extract(epoch FROM clock_timestamp())::float8) AS now), "
            "c AS (INSERT INTO chatflow_processed_messages AS p (message_id, state, processed_at_utc, holder, "
            "holder_token, lease_expires_at) SELECT %s, 'in_progress', t.now, %s::jsonb, %s, "
            "clock_timestamp() + %s * interval '1 second' FROM t "
            "ON CONFLICT (message_id) DO UPDATE SET state = 'in_progress', processed_at_utc = "
            "excluded.processed_at_utc, holder = excluded.holder, holder_token = excluded.holder_token, "
            "lease_expires_at = excluded.lease_expires_at, "
            # an attempt whose holder died keeps naming its turn, so recovery knows it is retried
            "session_id = CASE WHEN p.state = 'in_progress' THEN p.session_id END, "
            "turn = CASE WHEN p.state = 'in_progress' THEN p.turn END "
            "WHERE p.processed_at_utc + %s <= excluded.processed_at_utc "
            "OR (p.state = 'in_progress' AND (p.lease_expires_at IS NULL OR p.lease_expires_at <= clock_timestamp())) "
            "RETURNING 1) "
            "SELECT t.now, EXISTS (SELECT 1 FROM c) FROM t",
            (None if self._db_clock() else now, message_id, _dumps(holder.to_dict()), holder.token, self._lease_s,
             ttl_s),
        ).fetchone()
        assert r is not None
        return bool(r[1]), float(r[0])

    def processed_turn_claimed(self, session_id: str, turn: int) -> bool:
        r = self._x(
            "SELECT 1 FROM chatflow_processed_messages WHERE session_id = %s AND turn = %s "
            "AND state = 'in_progress' LIMIT 1",
            (session_id, turn),
        ).fetchone()
        return r is not None

    def processed_finish_turn(self, session_id: str, turn: int, holder: str | None, now: float) -> None:
        self._x(
            "UPDATE chatflow_processed_messages SET state = 'completed', processed_at_utc = %s, holder = NULL, "
            "holder_token = NULL, lease_expires_at = NULL WHERE session_id = %s AND turn = %s "
            "AND state = 'in_progress' AND (%s::text IS NULL OR holder_token = %s)",
            (now, session_id, turn, holder, holder),
        )

    def processed_drop_turn(self, session_id: str, turn: int, holder: str | None) -> None:
        self._x(
            "DELETE FROM chatflow_processed_messages WHERE session_id = %s AND turn = %s AND state = 'in_progress' "
            "AND (%s::text IS NULL OR holder_token = %s)",
            (session_id, turn, holder, holder),
        )

    def processed_purge(self, now: float, ttl_s: float) -> None:
        if self._db_clock():
            self._x("DELETE FROM chatflow_processed_messages WHERE processed_at_utc <= "
                    "extract(epoch FROM clock_timestamp())::float8 - %s", (ttl_s,))
        else:
            self._x("DELETE FROM chatflow_processed_messages WHERE processed_at_utc <= %s", (now - ttl_s,))

    def processed_release(self, message_id: str) -> bool:
        self._lock_message(message_id)
        gone = self._x("DELETE FROM chatflow_processed_messages WHERE message_id = %s RETURNING 1", (message_id,))
        return len(gone.fetchall()) == 1

    # -- endpoints -------------------------------------------------------------------------
    def endpoint_get(self, session_id: str) -> tuple[str | None, str | None] | None:
        r = self._x(
            "SELECT model, base_url FROM chatflow_session_endpoints WHERE session_id = %s", (session_id,)
        ).fetchone()
        return None if r is None else (r[0], r[1])

    def endpoint_put(self, session_id: str, model: str | None, base_url: str | None, now: float) -> None:
        self._x(
            "INSERT INTO chatflow_session_endpoints (session_id, model, base_url, updated_at_utc) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (session_id) DO UPDATE SET model = excluded.model, "
            "base_url = excluded.base_url, updated_at_utc = excluded.updated_at_utc",
            (session_id, model, base_url, now),
        )

    # -- the turn queue --------------------------------------------------------------------
    def queue_add(self, session_id: str, owner: Owner, now: float) -> int:
        r = self._x(
            "INSERT INTO chatflow_turn_queue (session_id, owner, lease_expires_at, enqueued_at_utc) "
            "VALUES (%s, %s::jsonb, clock_timestamp() + %s * interval '1 second', %s) RETURNING ticket",
            (session_id, _dumps(owner.to_dict()), self._lease_s, now),
        ).fetchone()
        assert r is not None
        return int(r[0])

    def queue_list(self, session_id: str) -> list[tuple[int, Owner]]:
        rows = self._x(
            "SELECT ticket, owner, lease_expires_at > clock_timestamp() FROM chatflow_turn_queue "
            "WHERE session_id = %s ORDER BY ticket",
            (session_id,),
        )
        out: list[tuple[int, Owner]] = []
        for ticket, owner, live in rows:
            leased = _owner(owner, live)
            assert leased is not None
            out.append((int(ticket), leased))
        return out

    def queue_remove(self, session_id: str, ticket: int) -> None:
        self._x("DELETE FROM chatflow_turn_queue WHERE session_id = %s AND ticket = %s", (session_id, ticket))


def _channel_key(session_id: str) -> str:
    return hashlib.md5(session_id.encode("utf-8"), usedforsecurity=False).hexdigest()


# ----------------------------------------------------------------------------------------
# Leases
# ----------------------------------------------------------------------------------------


class _Leases:
    """The leases this process holds in one database, renewed by one daemon thread every
    ``lease_s / 3`` seconds while any is held.

    A turn owner is renewed while its turn runs: until :meth:`end` (the Runner ends every
    turn so, by whatever path), and never past the life of the turn's context (a caller
    that dropped it, or a process that died, stops renewing and the lease runs out). The
    claim on the turn's message id is renewed with it. Message claims and queue tickets are
    renewed until the row is gone or held by another token. A token the database no longer
    shows is forgotten. A run that ended without its ending stored (and a waiter that
    could not leave the queue) has its leases expired (on the database clock) by the next
    renewal that reaches the database, tried every :data:`_EXPIRE_RETRY_S` seconds while
    there are such leases.

    Each renewal is three one-statement transactions -- queue tickets, session rows, message
    claims -- each locking its rows in key order: a renewal never holds a lock of one table
    while it waits for another, so it cannot deadlock with a transaction that locks the same
    rows in another order (a turn start takes its session, queue and claim rows in turn).
    """

    def __init__(self, store: PostgresSessionStore) -> None:
        self._store = weakref.ref(store)
        self._lock = threading.Lock()
        self._turns: dict[str, Callable[[], object]] = {}  # owner token -> weakref to the turn's context
        self._claims: set[str] = set()
        self._tickets: set[int] = set()
        self._expire: set[str] = set()  # tokens of runs that ended with their ending unstored
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def hold_turn(self, token: str, context: object) -> None:
        with self._lock:
            self._turns[token] = weakref.ref(context)
        self._start()

    def hold_claim(self, token: str) -> None:
        with self._lock:
            self._claims.add(token)
        self._start()

    def drop_claim(self, token: str) -> None:
        with self._lock:
            self._claims.discard(token)

    def hold_ticket(self, ticket: int) -> None:
        with self._lock:
            self._tickets.add(ticket)
        self._start()

    def drop_ticket(self, ticket: int) -> None:
        with self._lock:
            self._tickets.discard(ticket)

    def end(self, token: str, *, expire: bool) -> None:
        """Stop renewing the turn or claim ``token`` holds; ``expire``: also expire its leases."""
        with self._lock:
            self._turns.pop(token, None)
            self._claims.discard(token)
            if expire:
                self._expire.add(token)
        if expire:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="chatflow-pg-leases", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._wake.set()

    def _sleep(self, interval: float) -> bool:
        """Wait ``interval`` seconds, or only :data:`_EXPIRE_RETRY_S` while leases of ended
        runs wait to be expired; True when the thread is to stop."""
        waited = 0.0
        while waited < interval:
            step = min(_EXPIRE_RETRY_S, interval - waited)
            if self._wake.wait(step):
                return True
            waited += step
            with self._lock:
                if self._expire:
                    return False
        return False

    def _run(self) -> None:
        while True:
            store = self._store()
            if store is None or store._closed:
                return
            interval = store.lease_s / 3
            del store
            if self._sleep(interval):
                return
            store = self._store()
            if store is None or store._closed:
                return
            try:
                self.renew(store)
            except Exception as exc:  # noqa: BLE001 - the next renewal tries again; the lease runs out otherwise
                logger.warning("could not renew the leases held in %s: %s", store._label, redact_dsn(str(exc)))
            del store

    def renew(self, store: PostgresSessionStore) -> None:
        """One renewal: every lease still held, and the expiry of those of ended runs."""
        import psycopg

        with self._lock:
            turns = sorted(t for t, ref in self._turns.items() if ref() is not None)
            self._turns = {t: ref for t, ref in self._turns.items() if ref() is not None}
            claims = sorted(self._claims)
            tickets = sorted(self._tickets)
            expire = sorted(self._expire)
        if not (turns or claims or tickets or expire):
            return
        lease = store.lease_s
        conn: psycopg.Connection[Any] | None = None
        try:
            with store._connection() as conn:  # autocommit: each statement is its own transaction
                kept_tickets = {int(r[0]) for r in conn.execute(
                    "UPDATE chatflow_turn_queue AS q SET lease_expires_at = clock_timestamp() + %s * "
                    "interval '1 second' FROM (SELECT ticket FROM chatflow_turn_queue WHERE ticket = ANY(%s) "
                    "ORDER BY ticket FOR UPDATE) AS l WHERE q.ticket = l.ticket RETURNING q.ticket",
                    (lease, tickets))} if tickets else set()
                if expire:  # the tickets of waiters that could not leave the queue
                    conn.execute(
                        "UPDATE chatflow_turn_queue AS q SET lease_expires_at = clock_timestamp() FROM (SELECT "
                        "ticket FROM chatflow_turn_queue WHERE owner->>'token' = ANY(%s) ORDER BY ticket FOR UPDATE) "
                        "AS l WHERE q.ticket = l.ticket", (expire,))
                kept_turns = {r[0] for r in conn.execute(
                    "UPDATE chatflow_sessions AS s SET lease_expires_at = CASE WHEN s.owner_token = ANY(%s) "
                    "THEN clock_timestamp() ELSE clock_timestamp() + %s * interval '1 second' END "
                    "FROM (SELECT session_id FROM chatflow_sessions WHERE owner_token = ANY(%s) "
                    "ORDER BY session_id FOR UPDATE) AS l WHERE s.session_id = l.session_id RETURNING s.owner_token",
                    (expire, lease, turns + expire))} if turns or expire else set()
                kept_claims = {r[0] for r in conn.execute(
                    "UPDATE chatflow_processed_messages AS p SET lease_expires_at = CASE WHEN p.holder_token = "
                    "ANY(%s) THEN clock_timestamp() ELSE clock_timestamp() + %s * interval '1 second' END "
                    "FROM (SELECT message_id FROM chatflow_processed_messages WHERE holder_token = ANY(%s) "
                    "AND state = 'in_progress' ORDER BY message_id FOR UPDATE) AS l "
                    "WHERE p.message_id = l.message_id RETURNING p.holder_token",
                    (expire, lease, claims + turns + expire))} if claims or turns or expire else set()
        except psycopg.Error as exc:
            raise _store_error(exc, store._label, broken=conn is not None and _lost(conn)) from None
        with self._lock:
            for token in turns:
                if token not in kept_turns:
                    self._turns.pop(token, None)
            self._claims -= set(claims) - kept_claims
            self._tickets -= set(tickets) - kept_tickets
            self._expire -= set(expire)


# ----------------------------------------------------------------------------------------
# Store
# ----------------------------------------------------------------------------------------

_pool = SharedPool("chatflow-pg")


def _blocking_executor(workers: int) -> ThreadPoolExecutor:
    return _pool.get(workers)


def _steady() -> float:
    """Seconds of a clock that is never stepped: Linux's ``CLOCK_BOOTTIME`` (counts time
    suspended too), else ``time.monotonic()``."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if _BOOTTIME else time.monotonic()


_BOOTTIME = hasattr(time, "CLOCK_BOOTTIME")


class _DatabaseClock:
    """UTC epoch seconds on the database server's clock: this host's steady clock
    (:func:`_steady`) plus the offset measured when the store opened. A step of this host's
    wall clock (a wrong time set, a jump back) does not move it."""

    def __init__(self, offset: float) -> None:
        self.offset = offset  # database epoch seconds minus _steady()

    def __call__(self) -> float:
        return _steady() + self.offset


class PostgresSessionStore(BaseSessionStore):
    """Sessions in a PostgreSQL database, shared by many processes on many hosts.

    ``dsn``: a ``postgresql://`` (or ``postgres://``) URL or a libpq key=value string; the
    password may be in it, in ``PGPASSWORD`` or in ``~/.pgpass``. ``default_max_turns``: int
    > 0. ``lease_s``: seconds a running turn's owner stays alive without renewing its lease
    (default :data:`DEFAULT_LEASE_S`; a worker that died on another host is recovered after
    this long). ``pool_size``: connections this store opens at most (default 8).

    The schema is created (or migrated) on first use. Raises :class:`StoreError` when the
    server cannot be reached or refuses the credentials (the message never holds the
    password), and :class:`SchemaTooNewError` when a newer chatflow wrote the database.
    """

    _ephemeral = False

    def __init__(
        self,
        dsn: str,
        default_max_turns: int = DEFAULT_MAX_TURNS,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        pool_size: int = 8,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise TypeError("dsn must be a non-empty str (a postgresql:// URL or a libpq key=value string)")
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not lease_s > 0:
            raise ValueError(f"lease_s must be a number of seconds > 0, got {lease_s!r}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
        super().__init__(default_max_turns)
        self.dsn = dsn
        self.lease_s = float(lease_s)
        self.pool_size = pool_size
        self._label = _label(dsn)
        self._closed = False
        self._pool: Any = None
        self._listen_conn: psycopg.Connection[Any] | None = None
        self._leases = _Leases(self)
        self._pid = os.getpid()  # the process whose connections the pool holds
        try:
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError as exc:
            raise StoreError(
                f"a PostgreSQL store needs psycopg 3 and psycopg_pool: pip install 'chatflow-cli[postgres]' ({exc})"
            ) from None
        offset = self._migrate()
        self.clock = _DatabaseClock(offset)
        self._open_pool()

    # -- connections -------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        try:
            return psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None,
                                   connect_timeout=_CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise _store_error(exc, self._label) from None

    def _open_pool(self) -> None:
        from psycopg_pool import ConnectionPool

        self._pool = ConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self.pool_size,
            kwargs={"autocommit": True, "prepare_threshold": None, "connect_timeout": _CONNECT_TIMEOUT_S},
            open=False,
            timeout=_POOL_TIMEOUT_S,
            name="chatflow",
        )
        self._pool.open(wait=False)

    def _own_connections(self) -> None:
        """In a process forked since the pool opened: leave the parent's connections alone
        (kept, never used nor closed here: closing would end the parent's sessions) and
        open a pool of this process's own; the parent's leases stay the parent's."""
        if self._pid == os.getpid():
            return
        with fork_lock():
            if self._pid == os.getpid():
                return
            keep_inherited(self._pool, self._listen_conn, self._leases)
            self._pool, self._listen_conn = None, None
            self._leases = _Leases(self)
            self._pid = os.getpid()
            if not self._closed:
                self._open_pool()

    def close(self) -> None:
        """Close the pool and stop renewing leases. Idempotent. In a forked child, the
        connections inherited from the parent are left to the parent."""
        self._closed = True
        self._own_connections()  # a child: set the parent's aside, open none
        self._leases.stop()
        self._drop_listener()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                pool.close(timeout=5)
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:  # noqa: BLE001
            pass

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        import psycopg
        from psycopg_pool import PoolTimeout

        self._own_connections()
        pool = self._pool
        if self._closed or pool is None:
            raise StoreError(f"the store for {self._label} is closed")
        try:
            try:
                conn = pool.getconn(timeout=_POOL_QUICK_S)
            except PoolTimeout:
                # None idle and none made at once: a server that is down or refuses us is
                # said now, with libpq's reason; a reachable one only has every connection busy
                probe = self._connect()
                probe.close()
                conn = pool.getconn(timeout=_POOL_TIMEOUT_S)
        except PoolTimeout:
            raise StoreError(
                f"no free connection to {self._label} after {_POOL_TIMEOUT_S:.0f} s ({self.pool_size} in use)"
            ) from None
        except psycopg.Error as exc:
            raise _store_error(exc, self._label) from None
        try:
            yield conn
        finally:
            pool.putconn(conn)

    # -- migrations --------------------------------------------------------------------
    def _migrate(self) -> float:
        """Create or migrate the schema (serialised by an advisory lock); the database clock's
        offset from this host, in seconds."""
        import psycopg

        conn = self._connect()
        try:
            before = _steady()
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
            assert row is not None
            db_now = float(row[0])
            offset = db_now - (before + _steady()) / 2
            version = self._schema_version(conn)  # a read first: refuses a newer schema before writing
            if version > SCHEMA_VERSION:
                raise self._too_new(version)
            if version == SCHEMA_VERSION:
                return offset
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", _LOCK_MIGRATE)
                conn.execute(_MIGRATIONS_TABLE)
                version = self._schema_version(conn)
                if version > SCHEMA_VERSION:
                    raise self._too_new(version)
                for number, name, statements in _MIGRATIONS:
                    if number <= version:
                        continue
                    try:
                        self._apply_migration(conn, number, name, statements)
                    except psycopg.Error as exc:
                        raise self._migration_failed(exc, number, name, version) from None
            return offset
        except psycopg.Error as exc:
            raise _store_error(exc, self._label) from None
        finally:
            conn.close()

    @staticmethod
    def _apply_migration(conn: psycopg.Connection[Any], number: int, name: str, statements: list[str]) -> None:
        """One migration and its version row, in a savepoint (committed with the lock held).
        Every statement is idempotent (``IF NOT EXISTS``, updates of what is not done yet), so
        a schema that got a migration's changes but not its version row is finished here."""
        with conn.transaction():
            for statement in statements:
                step = _MIGRATION_STEPS.get(statement)
                if step is not None:
                    step(conn)
                else:
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO chatflow_schema_migrations (version, name, applied_at_utc) "
                "VALUES (%s, %s, extract(epoch FROM clock_timestamp()))",
                (number, name),
            )

    def _migration_failed(self, exc: BaseException, number: int, name: str, version: int) -> StoreError:
        reason = redact_dsn(" ".join(str(exc).split())).rstrip(" .")  # its own full stop is ours
        return StoreError(
            f"schema migration {number} ({name}) of {self._label} failed: {reason}. It was rolled back: the "
            f"database stays at schema version {version}. Fix the cause and start chatflow again (a migration "
            "is applied whole and skips what already exists)"
        )

    @staticmethod
    def _schema_version(conn: psycopg.Connection[Any]) -> int:
        exists = conn.execute("SELECT to_regclass('chatflow_schema_migrations')").fetchone()
        if exists is None or exists[0] is None:
            return 0
        r = conn.execute("SELECT COALESCE(MAX(version), 0) FROM chatflow_schema_migrations").fetchone()
        return int(r[0]) if r else 0

    def _too_new(self, version: int) -> SchemaTooNewError:
        return SchemaTooNewError(
            f"{self._label} has schema version {version}, newer than this chatflow's {SCHEMA_VERSION}: "
            "upgrade chatflow (the database was not changed)"
        )

    # -- transactions ------------------------------------------------------------------
    @contextmanager
    def _tx(self, write: bool) -> Iterator[_PgTx]:
        import psycopg

        begin = "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        for attempt in range(3):
            with self._connection() as conn:
                try:
                    conn.execute(begin)
                except psycopg.OperationalError as exc:
                    # a connection the server closed while it sat in the pool (a restart):
                    # nothing was sent yet, so another connection may try again
                    if attempt < 2 and conn.broken:
                        self._pool.check()
                        continue
                    raise _store_error(exc, self._label, broken=_lost(conn)) from None
                committing = False
                try:
                    # pipeline mode: statements whose results are not read yet (the writes, the
                    # COMMIT) travel together with the next read, one round trip
                    with conn.pipeline():
                        tx = _PgTx(conn, self, write)
                        yield tx
                        tx.flush()
                        committing = write  # from here a lost connection leaves the outcome unknown
                        conn.execute("COMMIT")
                except BaseException as exc:
                    if not conn.broken:
                        try:
                            conn.execute("ROLLBACK")
                        except psycopg.Error:
                            pass
                    if isinstance(exc, psycopg.Error):
                        # judged once the ROLLBACK was tried: a connection the server ended
                        # may say so only then (the error itself can be psycopg's own, as
                        # "cannot exit pipeline mode while busy")
                        raise _store_error(exc, self._label, committing=committing, broken=_lost(conn)) from None
                    raise
                return
        raise StoreError(f"cannot reach {self._label}")  # pragma: no cover - the loop returns or raises

    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        with self._tx(write=False) as tx:
            yield tx

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        with self._tx(write=True) as tx:
            yield tx

    async def _run_blocking(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
        """Run ``fn`` on a private thread pool (as many threads as connections)."""
        import asyncio

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_blocking_executor(max(4, self.pool_size)), partial(fn, *args, **kwargs))

    # -- leases ------------------------------------------------------------------------
    def _retrying(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` -- one write transaction -- run again, at most
        ``_WRITE_ATTEMPTS`` times in all, while PostgreSQL rolls it back as retryable (a
        serialization failure or a deadlock), after a short random pause; then its error."""
        for attempt in range(1, _WRITE_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except StoreError as exc:
                if not exc.retryable or attempt == _WRITE_ATTEMPTS:
                    raise
                logger.info("retrying a write to %s rolled back as retryable (%s)", self._label, exc)
                time.sleep(random.uniform(0.01, 0.05) * attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def save(self, session: SessionContext) -> list[Event]:
        """:meth:`BaseSessionStore.save`, run again when PostgreSQL rolls it back as retryable."""
        return self._retrying(super().save, session)

    def end_lease(self, owner_token: str, *, stored: bool) -> None:
        """:meth:`BaseSessionStore.end_lease`: the lease is no longer renewed; when ``stored``
        is False it is also expired on the database clock by the next renewal that reaches
        the database, so other hosts recover the turn (or take the claim) without waiting
        for it to run out."""
        self._leases.end(owner_token, expire=not stored)
        super().end_lease(owner_token, stored=stored)

    def begin_turn(self, session_id: str, **kwargs: Any) -> TurnStart:
        """:meth:`BaseSessionStore.begin_turn`; the started turn's owner lease (or the queued
        waiter's ticket) is then renewed by this process while the turn runs (until
        :meth:`end_lease`). Run again when PostgreSQL rolls it back as retryable."""
        start = self._retrying(super().begin_turn, session_id, **kwargs)
        owner = kwargs.get("owner")
        ticket = kwargs.get("ticket")
        if start.queued is not None:
            self._leases.hold_ticket(start.queued)
        elif start.replayed is None and owner is not None:
            self._leases.hold_turn(owner.token, start.session)
            if ticket is not None:
                self._leases.drop_ticket(ticket)
            claim = kwargs.get("message_claim")
            if claim is not None:
                self._leases.drop_claim(claim)
        return start

    def leave_turn_queue(self, session_id: str, ticket: int) -> None:
        self._leases.drop_ticket(ticket)
        super().leave_turn_queue(session_id, ticket)

    def _claim(self, message_id: str, owner: Owner | None) -> str | None:
        """claim_message's transaction: one ``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE
        <new, expired or lease run out> RETURNING``; when it leaves the id to a holder on this
        host whose pid died, the shared rules free it (as on SQLite)."""
        self._check_message_id(message_id)
        holder = owner if owner is not None else Owner.current()
        return self._retrying(self._claim_once, message_id, holder)

    def _claim_once(self, message_id: str, holder: Owner) -> str | None:
        now = self.clock()
        with self._tx(write=True) as tx:
            # the message's lock first, then the purge's rows, as begin_turn takes them
            claimed, now = tx.claim(message_id, holder, now, self._dedup_ttl_s)
            tx.processed_purge(now, self._dedup_ttl_s)
            if not claimed:
                old = tx.processed_get(message_id)
                if self._state_of(old, now) is MessageState.NEW:
                    tx.processed_put(message_id, self._new_claim(old, holder, now))
                    claimed = True
        if claimed:
            self._leases.hold_claim(holder.token)
        return holder.token if claimed else None

    def _release_held(self, message_id: str, token: str) -> bool:
        released = self._retrying(super()._release_held, message_id, token)
        self._leases.drop_claim(token)
        return released

    def _mark(self, message_id: str) -> str:
        token = self._retrying(super()._mark, message_id)
        self._leases.hold_claim(token)
        return token

    def renew_leases(self) -> None:
        """Renew now every lease this process holds (the lease thread does it every
        ``lease_s / 3`` seconds)."""
        self._leases.renew(self)

    # -- notifications -----------------------------------------------------------------
    def wait_for_events(self, session_id: str, after_seq: int, timeout: float) -> bool:
        """Block until the session has an event with ``seq > after_seq`` or ``timeout``
        seconds passed; True when there is one. Pushed by ``LISTEN chatflow_events`` on a
        connection of its own (behind PgBouncer in transaction mode, where notifications
        do not arrive, this still answers within ``timeout``, by reading the log)."""
        import psycopg

        deadline = time.monotonic() + max(0.0, timeout)
        key = _channel_key(session_id)
        conn: psycopg.Connection[Any] | None = None

        def arrived() -> bool:
            try:
                return self.last_seq(session_id) > after_seq
            except SessionNotFoundError:  # deleted: the caller's next read says so
                return True

        try:
            conn = self._listener()
            if arrived():
                return True
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return arrived()
                for note in conn.notifies(timeout=min(remaining, 1.0), stop_after=1):
                    if note.payload == key:
                        break
                if arrived():
                    return True
        except psycopg.Error as exc:
            broken = conn is None or _lost(conn)  # None: LISTEN failed on a new connection
            self._drop_listener()
            raise _store_error(exc, self._label, broken=broken) from None

    def _listener(self) -> psycopg.Connection[Any]:
        self._own_connections()
        conn = self._listen_conn
        if conn is None or conn.closed:
            conn = self._connect()
            try:
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            except BaseException:
                conn.close()
                raise
            self._listen_conn = conn
        return conn

    def _drop_listener(self) -> None:
        conn, self._listen_conn = self._listen_conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def __repr__(self) -> str:
        return f"PostgresSessionStore(dsn={redact_dsn(self.dsn)!r}, default_max_turns={self.default_max_turns})"


def _label(dsn: str) -> str:
    """How the database is named in messages: the DSN without its password."""
    return f"PostgreSQL database {redact_dsn(dsn)}"
