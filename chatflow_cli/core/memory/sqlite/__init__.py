"""The SQLite store: :class:`SQLiteSessionStore`, sessions with their messages and event log in one file.

The session rules are :class:`~chatflow_cli.core.memory.base.BaseSessionStore`'s; this
package supplies what SQLite adds. The PostgreSQL store (:mod:`..postgres`) has the same
shape, module for module:

==============  ==========================================================================
module          holds
==============  ==========================================================================
``store``       :class:`SQLiteSessionStore`: a connection per running transaction, migrating
                on open, transactions, the writer thread of the async twins, the full-text
                indexer; ephemeral paths, the thread pool of async reads
``tx``          :class:`_SQLiteTx`, the transaction port (``_Tx``) over one connection, and
                stored rows to Python values and back (sessions, events, messages)
``schema``      the tables, their versioned migrations and :data:`SCHEMA_VERSION`
``search``      the FTS5 index's columns of a message, snippets, the best hit of a turn
``errors``      a ``sqlite3`` or OS error as one :class:`StoreError` line; the busy timeout
``resources``   the memory-store tables (documents, versioned writes, their search) and
                their primitives, mixed into the transaction class
``vaults``      the vault catalogue (vault and entry names, where each value lives; never a
                value) and its primitives, mixed into the transaction class
==============  ==========================================================================
"""

from __future__ import annotations

from .schema import SCHEMA_VERSION
from .store import SQLiteSessionStore

__all__ = ["SCHEMA_VERSION", "SQLiteSessionStore"]
