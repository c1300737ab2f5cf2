"""The PostgreSQL store: :class:`PostgresSessionStore`, sessions, their messages and their event log
in PostgreSQL, for many workers on many hosts (needs the ``postgres`` extra).

The session rules are :class:`~chatflow_cli.core.memory.base.BaseSessionStore`'s; this
package supplies what PostgreSQL adds. It has the SQLite store's shape (:mod:`..sqlite`),
module for module, plus the leases that concurrent writers on many hosts need:

==============  ==========================================================================
module          holds
==============  ==========================================================================
``store``       :class:`PostgresSessionStore`: the pool, migrating on open, transactions
                (run again when rolled back as retryable), leases of turns and claims,
                ``wait_for_events`` (``LISTEN``, for ``replay --follow``); timeouts, the
                thread pool of async calls, the database's name in messages (never its
                password)
``tx``          :class:`_PgTx`, the transaction port (``_Tx``) over one connection;
                stored rows to Python values and back (sessions, events, messages); the
                database clock; and ``_Store``: what ``tx`` and ``leases`` use of the
                store (so neither imports it)
``schema``      the tables, their versioned migrations and :data:`SCHEMA_VERSION`; the
                advisory lock namespaces and :data:`NOTIFY_CHANNEL`
``search``      a message's ``tsvector`` and a query's ``tsquery``
``errors``      a ``psycopg`` error as one :class:`StoreError` line; retryable SQLSTATEs
``resources``   the memory-store tables (documents, versioned writes, their search) and
                their primitives, mixed into the transaction class
``vaults``      the vault catalogue (vault and entry names, where each value lives; never a
                value) and its primitives, mixed into the transaction class
``leases``      :data:`DEFAULT_LEASE_S` and the thread that renews this process's leases
==============  ==========================================================================

psycopg is imported only inside the store's methods: importing this package costs nothing
until a store is opened.
"""

from __future__ import annotations

from ...dsn import is_postgres_url, redact_dsn
from .leases import DEFAULT_LEASE_S
from .schema import NOTIFY_CHANNEL, SCHEMA_VERSION
from .store import PostgresSessionStore

__all__ = ["DEFAULT_LEASE_S", "NOTIFY_CHANNEL", "SCHEMA_VERSION", "PostgresSessionStore", "is_postgres_url",
           "redact_dsn"]
