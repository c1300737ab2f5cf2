"""The SQLite store: :class:`SQLiteSessionStore`, sessions with their messages and event log in one file.

The session rules are :class:`~chatflow_cli.core.memory.base.BaseSessionStore`'s; this
package supplies what SQLite adds. The PostgreSQL store (:mod:`..postgres`) has the same
shape, module for module:

==============  ==========================================================================
module          holds
==============  ==========================================================================
``store``       :class:`SQLiteSessionStore`: connections per thread, migrating on open,
                transactions, the writer thread of the async twins, the full-text indexer
``tx``          :class:`_SQLiteTx`, the transaction port (``_Tx``) over one connection
``schema``      the tables, their versioned migrations and :data:`SCHEMA_VERSION`
``rows``        stored rows to Python values and back (sessions, events, messages)
``search``      the FTS5 index's columns of a message, snippets, the best hit of a turn
``errors``      a ``sqlite3`` or OS error as one :class:`StoreError` line
``connection``  the busy timeout, ephemeral paths, the thread pool of async reads
==============  ==========================================================================
"""

from __future__ import annotations

from .schema import SCHEMA_VERSION
from .store import SQLiteSessionStore

__all__ = ["SCHEMA_VERSION", "SQLiteSessionStore"]
