"""Sessions and their stores: one module per concern.

========================  =================================================================
module                    holds
========================  =================================================================
``protocol``              what callers need of a store, a protocol a role, each written
                          beside its rules: :class:`TurnStore` (the Runner),
                          :class:`ListingStore` (list, show, search, fork),
                          :class:`EditStore` (imports, edits, rollback),
                          :class:`ClaimStore` (webhook message ids), and their union
                          :class:`SessionStoreProtocol`
``values``                what a store hands back: :class:`SessionSummary`,
                          :class:`TurnRecord`, :class:`TurnStart`, :class:`MessageState`
``context``               :class:`SessionContext` (one conversation's window and journal)
                          and :class:`Turn`
``base``                  :class:`BaseSessionStore`: the session rules over the ``_Tx``
                          transaction port, written once for every backend, composed
                          of one mixin per concern over the ``_core`` helpers, with
                          async twins derived by ``_twins``:
                          ``_journal`` (get/save/edit, the event log), ``_turns``
                          (turn start, interrupts, the turn queue), ``_claims``
                          (de-duplication, idempotency keys), ``_tool_results``,
                          ``_rollback`` (and :func:`rollback_target`), ``_listing``
                          (list, summaries, titles, archive), ``_forking``,
                          ``_searching``, ``_compaction`` (summaries, token counts)
``_port``                 the ``_Tx`` port and the records it carries, among them
                          :class:`Owner`, the lease record of a running turn
``inmemory``              :class:`SessionStore` (alias ``InMemorySessionStore``): dicts
                          behind a lock
``sqlite``                :class:`SQLiteSessionStore`: a package -- ``store``, ``tx`` (the
                          port and its rows), ``schema`` (versioned migrations),
                          ``search``, ``errors``, ``resources``, ``vaults``,
                          ``attachments``
``postgres``              :class:`PostgresSessionStore`, for many workers on many hosts
                          (its own schema and migrations; needs the ``postgres`` extra)
``search``                the search query syntax and :class:`SearchHit`
``_checks``               argument checks and small helpers shared by all of the above;
                          those the Agents SDK session uses too are exported here
                          (:func:`check_wait`, :func:`json_problem`, :func:`json_sha256`)
``_process_fork``         stores in a process that forks (inherited connections, the
                          shared thread pools)
========================  =================================================================

Every name below is importable from ``chatflow_cli.core.memory``. ``SQLiteSessionStore`` and
``PostgresSessionStore`` are resolved on first use, so importing this package imports
neither ``sqlite3`` nor ``psycopg``; so are the in-memory store and the search's
``SearchHit`` and ``parse_query``, which a program on the SQLite store may never need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import SessionDeletedError
from ..events import RESERVED_EVENT_PREFIXES, RESERVED_EVENT_TYPES
from ._checks import (
    DEFAULT_MAX_TURNS,
    MAX_TURNS_LIMIT,
    agent_name_of,
    check_wait,
    json_problem,
    json_sha256,
    storable_text,
)
from .base import (
    DEFAULT_DEDUP_TTL_HOURS,
    DUPLICATE_WAIT_S,
    BaseSessionStore,
    TurnOwnerDied,
    rollback_target,
    take_context_claim,
)
from .context import INTERRUPTED_TOOL_RESULT, SessionContext, Turn
from ._port import Owner
from .protocol import (
    ClaimStore,
    ContextStore,
    EditStore,
    ListingStore,
    SessionLookup,
    SessionStoreProtocol,
    TurnStore,
)
from .values import MessageState, SessionSummary, TurnRecord, TurnStart

if TYPE_CHECKING:
    from .inmemory import InMemorySessionStore, SessionStore
    from .postgres import PostgresSessionStore
    from .search import SearchHit, parse_query
    from .sqlite import SQLiteSessionStore

#: The names resolved on first use, and their modules.
_LAZY = {
    "InMemorySessionStore": ".inmemory",
    "SessionStore": ".inmemory",
    "SearchHit": ".search",
    "parse_query": ".search",
    "SQLiteSessionStore": ".sqlite",
    "PostgresSessionStore": ".postgres",
}

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "DEFAULT_MAX_TURNS",
    "DUPLICATE_WAIT_S",
    "INTERRUPTED_TOOL_RESULT",
    "MAX_TURNS_LIMIT",
    "RESERVED_EVENT_PREFIXES",
    "RESERVED_EVENT_TYPES",
    "BaseSessionStore",
    "ClaimStore",
    "ContextStore",
    "EditStore",
    "InMemorySessionStore",
    "ListingStore",
    "MessageState",
    "Owner",
    "PostgresSessionStore",
    "SQLiteSessionStore",
    "SearchHit",
    "SessionContext",
    "SessionDeletedError",
    "SessionLookup",
    "SessionStore",
    "SessionStoreProtocol",
    "SessionSummary",
    "Turn",
    "TurnOwnerDied",
    "TurnRecord",
    "TurnStart",
    "TurnStore",
    "agent_name_of",
    "check_wait",
    "json_problem",
    "json_sha256",
    "parse_query",
    "rollback_target",
    "storable_text",
    "take_context_claim",
]


def __getattr__(name: str) -> Any:
    """The names of :data:`_LAZY` on first use (``SQLiteSessionStore`` imports ``sqlite3``,
    ``PostgresSessionStore`` needs ``psycopg``); AttributeError otherwise."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
