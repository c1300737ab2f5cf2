"""Leases: how long a running turn's owner, a message claim's holder and a queued waiter stay
alive without renewing, and :class:`_Leases`, the thread that renews those this process
holds."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...dsn import redact_dsn
from .errors import _lost, _store_error

if TYPE_CHECKING:
    import psycopg

    from .tx import _Store

logger = logging.getLogger("chatflow_cli.core.memory.postgres")

#: Seconds a running turn's owner (and a claim's holder, and a queued waiter) stays alive
#: without renewing its lease; renewed every third of it while the owner works.
DEFAULT_LEASE_S = 30.0
#: Seconds between renewals while leases of ended runs (turns, claims, queue tickets) wait
#: to be expired: they are expired this soon after a run ends, or after the database is
#: back, instead of holding a session or a message until they run out.
_EXPIRE_RETRY_S = 1.0


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

    def __init__(self, store: _Store) -> None:
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

    def renew(self, store: _Store) -> None:
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
