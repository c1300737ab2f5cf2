"""The session rules, written once for every store: :class:`BaseSessionStore` over the :class:`_Tx` port.

A backend supplies only transactions: a :class:`_Tx` (storage primitives: rows, events,
messages, idempotency keys, message claims, the turn queue) yielded by ``_read()`` and
``_write()``. Everything else -- window loading, turn numbering, the event log, idempotency,
owner leases, turn recovery, de-duplication -- lives in :class:`BaseSessionStore`, so every
store behaves the same (one contract test suite runs against each). The port and its records
are in ``_port``; the rules are split by concern into mixins over ``_core._StoreCore``
(``_journal``, ``_turns``, ``_claims``, ``_tool_results``, ``_rollback``, ``_listing``,
``_forking``, ``_searching``, ``_compaction``, ``_attachments``), which :class:`BaseSessionStore` composes.

Event ``seq`` and deleted sessions: ``seq`` counts 1, 2, 3... per *incarnation* of a session
id. ``store.delete(session_id)`` removes the session with its whole event log, so a session
created again under the same id is a new incarnation whose log starts again at ``seq`` 1.
A consumer that keeps a ``replay`` cursor (``after_seq``) across a delete must reset it;
a context still held from the old incarnation gets :class:`SessionDeletedError` instead of
writing into the new one.

De-duplication of inbound messages (webhooks): a message id is *claimed* (in progress) by
the process that handles it -- the claim records its holder, an :class:`Owner` as for a
running turn -- and becomes *processed* when the turn it started completes, in the same
transaction. A processed id stays a duplicate while ``now < processed_at +
DEFAULT_DEDUP_TTL_HOURS`` (192 h, which covers a 7-day re-delivery window). A claim whose
holder died, or whose turn failed or was interrupted, is free again, so the platform's
redelivery runs it. :meth:`BaseSessionStore.claim_message` checks and claims in one atomic
step; ``is_message_processed`` / ``mark_message_processed`` claim the same way, and a Runner
turn started next in the same thread or task completes the claim. ``is_message_processed``
waits (bounded) while another process holds the id, so a duplicate delivery runs the message
itself when that holder dies before answering.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._attachments import _Attachments
from ._compaction import _Compaction
from ._core import take_context_claim
from ._forking import _Forking
from ._journal import EditResult, _Journal
from ._memstores import _MemoryStores
from ._port import DEFAULT_DEDUP_TTL_HOURS, DUPLICATE_WAIT_S, TurnOwnerDied
from ._rollback import _Rollback, rollback_target
from ._searching import _Searching
from ._turns import _Turns
from ._vaults import _Vaults

if TYPE_CHECKING:  # pragma: no cover
    from .protocol import SessionStoreProtocol

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "DUPLICATE_WAIT_S",
    "BaseSessionStore",
    "EditResult",
    "TurnOwnerDied",
    "rollback_target",
    "take_context_claim",
]


class BaseSessionStore(_Journal, _Turns, _Rollback, _Forking, _Searching, _Compaction, _MemoryStores, _Vaults,
                       _Attachments):
    """The session rules, shared by every store.

    Subclasses provide :meth:`_read` and :meth:`_write` (context managers yielding a
    :class:`_Tx`); everything else — pruning windows, turn numbering, the event log,
    idempotency, owner leases, de-duplication — is implemented here once, so both stores
    behave the same (one contract test suite runs against each).

    Most public methods have an async twin named ``a<name>``, derived from the method
    beside it in its mixin (``_twins.async_twin``); it runs the method through
    :meth:`_run_blocking` (on the event loop here; for on-disk SQLite, reads on a private
    thread pool and writes in turn on the store's writer thread, :meth:`_run_writing`).
    The twins of the message-claim methods are written out in ``_claims``: they record or
    forget the claim in the calling task's context.
    ``clock`` (callable -> UTC epoch seconds) may be replaced, e.g. in tests.
    """

    #: True when the storage never blocks on disk: async twins then stay on the event loop.
    _ephemeral = True


if TYPE_CHECKING:  # pragma: no cover

    def _implements_every_role(store: BaseSessionStore) -> SessionStoreProtocol:
        """mypy checks here that the shared rules implement each role's signatures."""
        return store
