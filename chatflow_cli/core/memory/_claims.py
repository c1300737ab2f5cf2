"""De-duplication of inbound message ids (claims, processed ids, their TTL) and idempotency keys.

A claim made here is also recorded for this thread or task (``_core._CLAIM``): the
Runner's next turn takes it over through :func:`~._core.take_context_claim`."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ._checks import _check_session_id, _check_text, check_wait
from ._core import _CLAIM, _StoreCore
from ._port import DUPLICATE_WAIT_S, _MessageRecord, Owner
from ._twins import async_twin
from .values import MessageState


@runtime_checkable
class ClaimStore(Protocol):
    """What a webhook handler needs to run each inbound message once: claims on message ids,
    their state, and completing or releasing a claim handled without a Runner turn."""

    def claim_message(self, message_id: str, *, owner: Owner | None = None) -> bool:
        """Claim an inbound message id atomically; True for exactly one caller."""
        ...

    def mark_message_processed(self, message_id: str) -> None:
        """Claim ``message_id`` for the next Runner turn of this thread or task."""
        ...

    def is_message_processed(self, message_id: str, *, wait: float = ...) -> bool:
        """True when a delivery of ``message_id`` must be skipped."""
        ...

    def message_state(self, message_id: str) -> MessageState:
        """Where ``message_id`` stands."""
        ...

    def complete_message(self, message_id: str) -> None:
        """Record ``message_id`` as processed now."""
        ...

    def release_message(self, message_id: str) -> bool:
        """Undo a claim whose processing failed."""
        ...


class _Claims(_StoreCore):
    """Message claims and de-duplication, and reads of stored idempotency keys."""

    # -- de-duplication ----------------------------------------------------------------
    @staticmethod
    def _check_message_id(message_id: Any) -> str:
        """Message ids are non-empty strings in every store: ``5`` and ``"5"`` must not
        differ between backends, and ``None`` would never count as a duplicate in SQLite."""
        if not isinstance(message_id, str):
            raise TypeError(f"message_id must be a str, got {type(message_id).__name__}")
        if not message_id:
            raise TypeError("message_id must be a non-empty str")
        if not message_id.isascii():
            _check_text(message_id, "message_id")
        return message_id

    def _state_of(self, record: _MessageRecord | None, now: float) -> MessageState:
        if record is None or now >= record.at + self._dedup_ttl_s:
            return MessageState.NEW
        if record.state == "completed":
            return MessageState.PROCESSED
        if record.holder is None or not record.holder.alive():
            return MessageState.NEW
        return MessageState.IN_PROGRESS

    def message_state(self, message_id: str) -> MessageState:
        """Where ``message_id`` stands: ``new``, ``in_progress`` (a live holder's claim) or
        ``processed`` (its turn completed less than 192 h ago). See :class:`MessageState`.

        ``message_id``: a non-empty ``str`` (TypeError otherwise, in every store and method).
        """
        self._check_message_id(message_id)
        with self._read() as tx:
            return self._state_of(tx.processed_get(message_id), self.clock())

    amessage_state = async_twin(message_state)

    def is_message_processed(self, message_id: str, *, wait: float = DUPLICATE_WAIT_S) -> bool:
        """True when a delivery of ``message_id`` must be skipped: its turn completed (less than
        192 h ago), or a live holder is processing it now. False for a new id, and for a claim
        that is free again (its holder died, its turn failed or was interrupted, it was
        released): the caller then claims the id and runs the message.

        A claim held by a live holder in *another process* (another worker, or another host)
        is waited for, polling every 20-250 ms, at most ``wait`` seconds (default
        ``DUPLICATE_WAIT_S``, 60): True once it is processed, False once it is free again
        (that worker was killed before it answered: this delivery must run the message), and
        True when ``wait`` runs out with the holder still alive and working. ``wait=0``
        answers at once. A claim held in *this process* answers True at once: its holder (a
        thread or a task of this event loop, which a blocking wait would deadlock) cannot die
        without this process, and when its turn fails its own delivery fails and is
        delivered again. This method blocks its thread while it waits; in ``async`` code,
        ``await store.ais_message_processed(id)`` waits without blocking the event loop.

        ``message_id``: a non-empty ``str`` (TypeError otherwise, in every store and method);
        ``wait``: seconds >= 0 (ValueError otherwise).
        """
        deadline = time.monotonic() + check_wait(wait)
        delay = 0.02
        while True:
            verdict = self._duplicate_verdict(message_id)
            remaining = deadline - time.monotonic()
            if verdict is not None:
                return verdict
            if remaining <= 0:
                return True
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.25)

    async def ais_message_processed(self, message_id: str, *, wait: float = DUPLICATE_WAIT_S) -> bool:
        """:meth:`is_message_processed`, waiting for another process's claim without blocking
        the event loop (each look is a read run by ``_run_blocking``; the waits are
        ``asyncio.sleep``)."""
        import asyncio  # here: importing the stores does not import asyncio

        deadline = time.monotonic() + check_wait(wait)
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

    def _duplicate_verdict(self, message_id: str) -> bool | None:
        """is_message_processed's answer now, or None while another process's live holder works."""
        state = self.message_state(message_id)
        if state is not MessageState.IN_PROGRESS:
            return state is MessageState.PROCESSED
        with self._read() as tx:
            record = tx.processed_get(message_id)
        holder = record.holder if record is not None else None
        if holder is None:  # it changed between the two reads: look again
            return None
        return True if holder.pid == os.getpid() and holder.host == socket.gethostname() else None

    def mark_message_processed(self, message_id: str) -> None:
        """Claim ``message_id`` for this caller, as :meth:`claim_message` does (under the
        name webhook handlers call first): the next Runner turn this thread or asyncio task starts completes the claim
        when it completes. When another live holder already has the id in progress, that
        turn (in this context) waits for it and returns its result instead of running twice.
        A processed id stays processed. ``message_id``: a non-empty str (TypeError).
        """
        _CLAIM.set((id(self), message_id, self._mark(message_id)))

    async def amark_message_processed(self, message_id: str) -> None:
        """:meth:`mark_message_processed` for async callers: the claim is recorded for the
        calling task (not for the thread that wrote it)."""
        _CLAIM.set((id(self), message_id, await self._run_writing(self._mark, message_id)))

    def _mark(self, message_id: str) -> str:
        """mark_message_processed's transaction; the claim's owner token (a fresh one when
        another holder has it: this caller's turn then waits for that holder)."""
        self._check_message_id(message_id)
        owner = Owner.current()
        now = self.clock()
        with self._write() as tx:
            # the message's lock first, then the purge's rows, as begin_turn and claim_message take them
            old = tx.processed_get(message_id)
            tx.processed_purge(now, self._dedup_ttl_s)
            if self._state_of(old, now) is MessageState.NEW:
                tx.processed_put(message_id, self._new_claim(old, owner, now))
        return owner.token

    def claim_message(self, message_id: str, *, owner: Owner | None = None) -> bool:
        """Claim ``message_id`` in one atomic step: True for exactly one caller while the id is
        new (never seen, expired, or its claim is free again).

        The claim records its holder (``owner``, default: this process); it is *in progress*
        until the turn it starts completes -- the next Runner turn started in this thread or
        asyncio task, in the same transaction as ``turn.completed`` -- and then *processed*
        for 192 hours. A claim whose holder died, or whose turn failed or was interrupted,
        is free again. Without a Runner turn, call :meth:`complete_message` when done (or
        :meth:`release_message` when it failed). ``message_id``: a non-empty str (TypeError).
        """
        token = self._claim(message_id, owner)
        if token is not None:
            _CLAIM.set((id(self), message_id, token))
        return token is not None

    async def aclaim_message(self, message_id: str, *, owner: Owner | None = None) -> bool:
        """:meth:`claim_message` for async callers: the claim is recorded for the calling
        task (not for the thread that wrote it)."""
        token = await self._run_writing(self._claim, message_id, owner)
        if token is not None:  # set here: the claim belongs to the calling task's context
            _CLAIM.set((id(self), message_id, token))
        return token is not None

    def _claim(self, message_id: str, owner: Owner | None) -> str | None:
        """claim_message's transaction: the holder's token when claimed, else None."""
        self._check_message_id(message_id)
        holder = owner if owner is not None else Owner.current()
        now = self.clock()
        with self._write() as tx:
            old = tx.processed_get(message_id)
            if self._state_of(old, now) is not MessageState.NEW:
                claimed = False
            else:
                tx.processed_put(message_id, self._new_claim(old, holder, now))
                claimed = True
            tx.processed_purge(now, self._dedup_ttl_s)
        return holder.token if claimed else None

    @staticmethod
    def _new_claim(old: _MessageRecord | None, holder: Owner, now: float) -> _MessageRecord:
        """A claim taking over ``old``: an attempt whose holder died keeps naming its turn, so
        the turn's recovery knows the message is retried (and takes the attempt out of the
        window)."""
        if old is not None and old.state == "in_progress" and old.session_id is not None:
            return _MessageRecord("in_progress", now, holder, old.session_id, old.turn)
        return _MessageRecord("in_progress", now, holder)

    def _release_held(self, message_id: str, token: str) -> bool:
        """Free ``message_id`` if the claim in progress is still the one ``token`` holds (a
        turn that never started: busy past its wait, refused); True when freed."""
        self._check_message_id(message_id)
        with self._write() as tx:
            record = tx.processed_get(message_id)
            if record is None or record.state != "in_progress" or record.holder is None:
                return False
            if record.holder.token != token:
                return False
            return tx.processed_release(message_id)

    def _forget_context_claim(self, message_id: str) -> None:
        claim = _CLAIM.get()
        if claim is not None and claim[0] == id(self) and claim[1] == message_id:
            _CLAIM.set(None)

    def complete_message(self, message_id: str) -> None:
        """Record ``message_id`` as processed now (for ids handled without a Runner turn).

        ``message_id``: a non-empty str (TypeError otherwise)."""
        self._check_message_id(message_id)
        now = self.clock()
        with self._write() as tx:
            old = tx.processed_get(message_id)
            tx.processed_put(
                message_id,
                _MessageRecord("completed", now, None, old.session_id if old else None, old.turn if old else None),
            )
        self._forget_context_claim(message_id)

    async def acomplete_message(self, message_id: str) -> None:
        """:meth:`complete_message` for async callers; the calling task's claim is forgotten."""
        await self._run_writing(self.complete_message, message_id)
        self._forget_context_claim(message_id)

    def release_message(self, message_id: str) -> bool:
        """Undo a claim whose processing failed, so a redelivery of ``message_id`` runs again.

        A Runner turn releases its claim itself when it fails; this is for failures before
        or outside a turn. Returns True when a record was removed. ``message_id``: a
        non-empty ``str`` (TypeError).
        """
        self._check_message_id(message_id)
        with self._write() as tx:
            released = tx.processed_release(message_id)
        self._forget_context_claim(message_id)
        return released

    async def arelease_message(self, message_id: str) -> bool:
        """:meth:`release_message` for async callers; the calling task's claim is forgotten."""
        released = await self._run_writing(self.release_message, message_id)
        self._forget_context_claim(message_id)
        return released

    def idempotency_digests(self, session_id: str, keys: Sequence[str]) -> dict[str, str]:
        """The idempotency keys of ``keys`` already used in the session, with the digest kept
        with each (``{}`` when the session does not exist)."""
        _check_session_id(session_id)
        found: dict[str, str] = {}
        with self._read() as tx:
            if tx.get_row(session_id) is None:
                return found
            for key in keys:
                known = tx.idempotency_get(session_id, key)
                if known is not None:
                    found[key] = known[0]
        return found
