"""The session rules, written once for every store: :class:`BaseSessionStore` over the :class:`_Tx` port.

A backend supplies only transactions: a :class:`_Tx` (storage primitives: rows, events,
messages, idempotency keys, message claims, the turn queue) yielded by ``_read()`` and
``_write()``. Everything else -- window loading, turn numbering, the event log, idempotency,
owner leases, turn recovery, de-duplication -- lives in :class:`BaseSessionStore`, so every
store behaves the same (one contract test suite runs against each). The port and its records
are in ``_port``; the rules are split by concern into mixins over ``_core._StoreCore``
(``_journal``, ``_turns``, ``_claims``, ``_tool_results``, ``_rollback``, ``_listing``,
``_compaction``), which :class:`BaseSessionStore` composes with the async twins.

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

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ..events import Event, EventType, SessionStatus
from ._checks import _check_wait
from ._compaction import _Compaction
from ._journal import _Journal
from ._listing import _Listing
from ._port import (
    _CLAIM,
    _T,
    DEFAULT_DEDUP_TTL_HOURS,
    DUPLICATE_WAIT_S,
    EditResult,
    TurnOwnerDied,
    rollback_target,
    take_context_claim,
)
from ._rollback import _Rollback
from ._turns import _Turns
from ._vaults import _Vaults
from .context import SessionContext, Turn
from .owner import Owner
from .protocol import MessageState, SessionSummary, TurnRecord, TurnStart
from .search import SearchHit

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "DUPLICATE_WAIT_S",
    "BaseSessionStore",
    "EditResult",
    "TurnOwnerDied",
    "rollback_target",
    "take_context_claim",
]


class BaseSessionStore(_Journal, _Turns, _Rollback, _Listing, _Compaction, _Vaults):
    """The session rules, shared by every store.

    Subclasses provide :meth:`_read` and :meth:`_write` (context managers yielding a
    :class:`_Tx`); everything else — pruning windows, turn numbering, the event log,
    idempotency, owner leases, de-duplication — is implemented here once, so both stores
    behave the same (one contract test suite runs against each).

    Every public method has an async twin named ``a<name>``; it runs the method through
    :meth:`_run_blocking` (on the event loop here; for on-disk SQLite, reads on a private
    thread pool and writes in turn on the store's writer thread, :meth:`_run_writing`).
    ``clock`` (callable -> UTC epoch seconds) may be replaced, e.g. in tests.
    """

    #: True when the storage never blocks on disk: async twins then stay on the event loop.
    _ephemeral = True


    async def alog_position(self, session_id: str) -> tuple[str, int] | None:
        return await self._run_blocking(self.log_position, session_id)

    async def awindow_dicts(self, session_id: str) -> tuple[tuple[str, int] | None, list[tuple[int, dict[str, Any]]]]:
        return await self._run_blocking(self.window_dicts, session_id)

    # -- async twins -------------------------------------------------------------------
    async def aedit(self, session_id: str, change: Callable[[SessionContext], _T], **kwargs: Any) -> EditResult[_T]:
        return await self._run_writing(partial(self.edit, session_id, change, **kwargs))

    async def awindow_turns(self, session_id: str) -> tuple[Turn, ...]:
        return await self._run_blocking(self.window_turns, session_id)

    async def aactive_agent_name(self, session_id: str) -> str | None:
        return await self._run_blocking(self.active_agent_name, session_id)

    async def aget(self, session_id: str) -> SessionContext | None:
        return await self._run_blocking(self.get, session_id)

    async def aget_or_create(
        self,
        session_id: str,
        default_agent: Any,
        max_turns: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionContext:
        return await self._run_blocking(self.get_or_create, session_id, default_agent, max_turns, metadata)

    async def asave(self, session: SessionContext) -> list[Event]:
        return await self._run_writing(self.save, session)

    async def arelease(
        self, session: SessionContext, status: SessionStatus | str = SessionStatus.IDLE, reason: str = "", **extra: Any
    ) -> list[Event]:
        return await self._run_writing(self.release, session, status, reason, **extra)

    async def adelete(self, session_id: str) -> bool:
        return await self._run_writing(self.delete, session_id)

    async def arollback(self, session_id: str, to_turn: int | None = None, *, last: int | None = None) -> list[Event]:
        return await self._run_writing(self.rollback, session_id, to_turn, last=last)

    async def asession_summary(self, session_id: str) -> SessionSummary:
        return await self._run_blocking(self.session_summary, session_id)

    async def alist_sessions(
        self,
        limit: int | None = None,
        agent: str | None = None,
        status: SessionStatus | str | None = None,
        **filters: Any,
    ) -> list[SessionSummary]:
        return await self._run_blocking(self.list_sessions, limit, agent, status, **filters)

    async def asearch(self, query: str, **kwargs: Any) -> list[SearchHit]:
        return await self._run_blocking(self.search, query, **kwargs)

    async def afork(self, session_id: str, at: int | None = None, *, into: str | None = None) -> SessionSummary:
        return await self._run_writing(self.fork, session_id, at, into=into)

    async def aset_title(self, session_id: str, title: str | None) -> None:
        return await self._run_writing(self.set_title, session_id, title)

    async def aarchive(self, session_id: str) -> bool:
        return await self._run_writing(self.archive, session_id)

    async def aunarchive(self, session_id: str) -> bool:
        return await self._run_writing(self.unarchive, session_id)

    async def alatest_session_id(self) -> str | None:
        return await self._run_blocking(self.latest_session_id)

    async def aload_turns(
        self, session_id: str, first: int = 1, last: int | None = None, include_rolled_back: bool = False
    ) -> list[TurnRecord]:
        return await self._run_blocking(self.load_turns, session_id, first, last, include_rolled_back)

    async def aevents(self, session_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        return await self._run_blocking(self.events, session_id, after_seq, limit)

    async def alast_seq(self, session_id: str) -> int:
        return await self._run_blocking(self.last_seq, session_id)

    async def aappend_event(
        self,
        session_id: str,
        type: EventType | str,
        payload: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Event:
        return await self._run_writing(self.append_event, session_id, type, payload, idempotency_key)

    async def abegin_turn(self, session_id: str, **kwargs: Any) -> TurnStart:
        return await self._run_blocking(partial(self.begin_turn, session_id, **kwargs))

    async def asubmit_tool_result(self, session_id: str, tool_use_id: str, output: str) -> list[str]:
        return await self._run_writing(self.submit_tool_result, session_id, tool_use_id, output)

    async def asession_endpoint(self, session_id: str) -> tuple[str | None, str | None]:
        return await self._run_blocking(self.session_endpoint, session_id)

    async def aset_session_endpoint(self, session_id: str, model: str | None, base_url: str | None) -> None:
        return await self._run_writing(self.set_session_endpoint, session_id, model, base_url)

    async def ais_message_processed(self, message_id: str, *, wait: float = DUPLICATE_WAIT_S) -> bool:
        """:meth:`is_message_processed`, waiting for another process's claim without blocking
        the event loop."""
        import asyncio  # here: importing the stores does not import asyncio

        deadline = time.monotonic() + _check_wait(wait)
        delay = 0.02
        while True:
            verdict = await self._run_blocking(self._duplicate_verdict, message_id)
            remaining = deadline - time.monotonic()
            if verdict is not None:
                return verdict
            if remaining <= 0:
                return True
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.25)

    async def amark_message_processed(self, message_id: str) -> None:
        _CLAIM.set((id(self), message_id, await self._run_writing(self._mark, message_id)))

    async def aclaim_message(self, message_id: str, *, owner: Owner | None = None) -> bool:
        token = await self._run_writing(self._claim, message_id, owner)
        if token is not None:  # set here: the claim belongs to the calling task's context
            _CLAIM.set((id(self), message_id, token))
        return token is not None

    async def amessage_state(self, message_id: str) -> MessageState:
        return await self._run_blocking(self.message_state, message_id)

    async def acomplete_message(self, message_id: str) -> None:
        await self._run_writing(self.complete_message, message_id)
        self._forget_context_claim(message_id)

    async def arelease_message(self, message_id: str) -> bool:
        released = await self._run_writing(self.release_message, message_id)
        self._forget_context_claim(message_id)
        return released
