"""What callers need of a session store, apart from any backend: one small protocol a role.

Each role is a structural type (``typing.Protocol``) written beside the rules it names, and
collected here:

=======================  ===========================================================  ============
role                     what it is for (its callers)                                 module
=======================  ===========================================================  ============
:class:`TurnStore`       running turns: start one, save its messages and events,      ``_turns``
                         custom tool results, the turn queue, leases (the Runner)
:class:`ListingStore`    listing, showing, searching, forking, titling and            ``_listing``
                         archiving sessions (``sessions`` commands, ``replay``)
:class:`EditStore`       changing a stored session outside a turn: imports, edits,    ``_journal``
                         rollback, deletion, its stored endpoint
:class:`ClaimStore`      running each inbound message once: claims on message ids     ``_claims``
                         (webhook handlers)
:class:`ContextStore`    ``get`` and ``save`` of a context (in turns and edits)       ``_journal``
:class:`SessionLookup`   one session's summary, agent and endpoint (in all but        ``_listing``
                         claims)
=======================  ===========================================================  ============

:class:`SessionStoreProtocol` is all of them at once, for code that needs everything (the
REPL). Every store of this package satisfies each
(:class:`~chatflow_cli.core.memory.base.BaseSessionStore` implements them once for all
backends), and a new backend does by subclassing ``BaseSessionStore`` and supplying
transactions. Code that only *uses* a store annotates with the narrowest role it needs, not
with a backend class.

Every method validates its arguments the same way in every store (TypeError for a wrong
type, ValueError for a value out of range, UsageError for text that is not valid Unicode)
and raises :class:`~chatflow_cli.core.errors.SessionNotFoundError` for an unknown session
where a session must exist. Each store also has async twins ``a<name>`` of most methods
(not part of these protocols).

The values the methods return are in :mod:`~chatflow_cli.core.memory.values` and importable
from here too. Times are UTC epoch seconds throughout; turn numbers are the user-visible
ones (1, 2, 3... for the life of a session; 0 holds the SYSTEM messages).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ._claims import ClaimStore
from ._journal import ContextStore, EditStore
from ._listing import ListingStore, SessionLookup
from ._turns import TurnStore
from .values import MessageState, SessionSummary, TurnRecord, TurnStart

__all__ = [
    "ClaimStore",
    "ContextStore",
    "EditStore",
    "ListingStore",
    "MessageState",
    "SessionLookup",
    "SessionStoreProtocol",
    "SessionSummary",
    "TurnRecord",
    "TurnStart",
    "TurnStore",
]


@runtime_checkable
class SessionStoreProtocol(TurnStore, ListingStore, EditStore, ClaimStore, Protocol):
    """Every role at once (synchronous forms): what code that needs all of a store uses."""

    #: Turns kept in a new session's context window unless it is created with ``max_turns``.
    default_max_turns: int

    def close(self) -> None:
        """Release the store's resources."""
        ...
