"""The in-memory store: :class:`SessionStore` (alias :data:`InMemorySessionStore`).

Sessions live in dicts behind one re-entrant lock, so the store is safe under threads. A
write transaction logs an undo step for every change and runs them backwards when it
raises, so a failed call leaves nothing behind. Nothing survives the process: use it for
tests, command-line tools and short-lived services; the session rules are those of
:class:`~chatflow_cli.core.memory.base.BaseSessionStore`.
"""

from __future__ import annotations

import dataclasses
import functools

import copy
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import ChatflowError
from ..events import Event
from ..messages import Message, Role
from ..tokens import message_tokens
from ._checks import DEFAULT_MAX_TURNS
from ..resources.vaults import VaultEntry, VaultInfo
from ._memstore_inmemory import MemStores, _InMemoryMemoryStoreTx
from ._port import SearchFilter, _MessageRecord, _MessageRow, _SessionRow, _Tx, Owner
from ._vaults import _VaultTx
from ._attachments import _AttachmentTx
from .base import BaseSessionStore
from .search import Query, SearchHit, memory_snippet, searchable_texts, words_of

__all__ = ["InMemorySessionStore", "SessionStore"]


@dataclass(slots=True)
class _MemSession:
    row: _SessionRow
    messages: list[list[Any]] = field(default_factory=list)  # [turn, Message, removed, removed_at_seq, event seq]
    events: list[Event] = field(default_factory=list)
    event_turns: list[int | None] = field(default_factory=list)
    keys: dict[str, tuple[str, int | None, int]] = field(default_factory=dict)
    endpoint: tuple[str | None, str | None] | None = None


class _MemoryTx(_InMemoryMemoryStoreTx, _VaultTx, _AttachmentTx, _Tx):
    """Dict-backed primitives; writes log an undo step so a failed transaction leaves no trace."""

    def __init__(self, store: SessionStore, writable: bool) -> None:
        self._s = store
        self._memstores = store._memstores
        self._writable = writable
        self.undo: list[Callable[[], object]] = []  # called for their effect; results ignored

    def _session(self, session_id: str) -> _MemSession:
        return self._s._sessions[session_id]

    def get_row(self, session_id: str) -> _SessionRow | None:
        entry = self._s._sessions.get(session_id)
        return None if entry is None else copy.deepcopy(entry.row)

    def insert_row(self, row: _SessionRow) -> None:
        self._s._sessions[row.session_id] = _MemSession(copy.deepcopy(row))
        self.undo.append(lambda: self._s._sessions.pop(row.session_id, None))

    def update_row(self, row: _SessionRow) -> None:
        entry = self._session(row.session_id)
        old = entry.row
        entry.row = copy.deepcopy(row)
        self.undo.append(lambda: setattr(entry, "row", old))

    def delete_row(self, session_id: str) -> bool:
        entry = self._s._sessions.pop(session_id, None)
        if entry is None:
            return False
        self.undo.append(lambda: self._s._sessions.__setitem__(session_id, entry))
        self.attachments_drop_session(session_id)
        return True

    # -- attachments: bytes by hash, each session's references --------------------------
    def attachments_add(self, session_id: str, attachments: Any) -> None:
        blobs, refs = self._s._blobs, self._s._refs.setdefault(session_id, set())
        for attachment in attachments:
            digest = attachment.sha256
            if attachment.data is not None and digest not in blobs:
                blobs[digest] = bytes(attachment.data)
                self.undo.append(functools.partial(blobs.pop, digest, None))
            if digest not in refs:
                refs.add(digest)
                self.undo.append(functools.partial(refs.discard, digest))

    def attachments_drop_session(self, session_id: str) -> None:
        refs = self._s._refs.pop(session_id, None)
        if not refs:
            return
        self.undo.append(lambda: self._s._refs.__setitem__(session_id, refs))
        used = set().union(*self._s._refs.values()) if self._s._refs else set()
        for digest in refs - used:
            data = self._s._blobs.pop(digest, None)
            if data is not None:
                self.undo.append(functools.partial(self._s._blobs.__setitem__, digest, data))

    def attachment_blobs(self, hashes: Any) -> dict[str, bytes]:
        return {h: self._s._blobs[h] for h in hashes if h in self._s._blobs}

    def attachment_hashes(self, session_id: str | None) -> list[str]:
        return sorted(self._s._blobs if session_id is None else self._s._refs.get(session_id, ()))

    def list_rows(self, agent: str | None) -> list[_SessionRow]:
        rows = [
            copy.deepcopy(e.row)
            for e in self._s._sessions.values()
            if agent is None or e.row.active_agent_name == agent
        ]
        rows.sort(key=lambda r: (-r.updated_at, r.session_id))
        return rows

    def latest_session_id(self) -> str | None:
        rows = self.list_rows(None)
        return rows[0].session_id if rows else None

    def next_seq(self, session_id: str) -> int:
        entry = self._s._sessions.get(session_id)
        return (entry.events[-1].seq if entry and entry.events else 0) + 1

    def insert_event(self, event: Event, turn: int | None, payload_json: str | None = None) -> None:
        entry = self._session(event.session_id)
        if entry.events and entry.events[-1].seq >= event.seq:
            raise ChatflowError(f"event seq {event.seq} already used in session {event.session_id}")
        entry.events.append(event)
        entry.event_turns.append(turn)

        def undo() -> None:
            entry.events.pop()
            entry.event_turns.pop()

        self.undo.append(undo)

    def events(self, session_id: str, after_seq: int, limit: int | None) -> list[Event]:
        entry = self._s._sessions.get(session_id)
        if entry is None:
            return []
        out = [e for e in entry.events if e.seq > after_seq]
        return out if limit is None else out[:limit]

    def last_event(self, session_id: str, type: str, turn: int | None = None, after_seq: int = 0) -> Event | None:
        entry = self._session(session_id)
        for event, event_turn in zip(reversed(entry.events), reversed(entry.event_turns)):
            if event.seq <= after_seq:
                return None
            if event.type == type and (turn is None or event_turn == turn):
                return event
        return None

    def events_of_type(self, session_id: str, type: str, after_seq: int) -> list[Event]:
        return [e for e in self._session(session_id).events if e.seq > after_seq and e.type == type]

    def insert_message(self, session_id: str, turn: int, message: Message, seq: int,
                       message_json: str | None = None) -> None:
        entry = self._session(session_id)
        if message.tokens is None:  # counted when stored, as the SQLite store does
            message = dataclasses.replace(message, tokens=message_tokens(message))
        if message.attachments:  # the bytes apart, by hash; the message keeps the metadata
            self.attachments_add(session_id, message.attachments)
            message = dataclasses.replace(message, attachments=tuple(a.without_data() for a in message.attachments))
        entry.messages.append([turn, message, None, None, seq])
        self.undo.append(entry.messages.pop)

    def remove_turns(self, session_id: str, first: int, last: int | None, reason: str, seq: int) -> None:
        entry = self._session(session_id)
        changed = [
            item
            for item in entry.messages
            if item[2] is None and item[0] >= max(0, first) and (last is None or item[0] <= last)
        ]
        for item in changed:
            item[2], item[3] = reason, seq

        def undo() -> None:
            for item in changed:
                item[2], item[3] = None, None

        self.undo.append(undo)

    def window(self, session_id: str, first_turn: int) -> list[tuple[int, Message]]:
        entry = self._session(session_id)
        system = [(0, m) for t, m, r, *_ in entry.messages
                  if t == 0 and r is None and m.role is Role.SYSTEM and m.summary_through is None]
        summaries = [(m.summary_through, i, m) for i, (t, m, r, *_) in enumerate(entry.messages)
                     if r is None and m.summary_through is not None]
        if summaries:
            system.append((0, max(summaries, key=lambda s: (s[0], s[1]))[2]))
        turns = [(t, m) for t, m, r, *_ in entry.messages if t >= first_turn and t > 0 and r is None]
        turns.sort(key=lambda item: item[0])  # stable: keeps insertion order inside a turn
        return system + turns

    def latest_summary_through(self, session_id: str) -> int | None:
        entry = self._session(session_id)
        found = [m.summary_through for _, m, r, *_ in entry.messages if r is None and m.summary_through is not None]
        return max(found) if found else None

    def remove_summaries(self, session_id: str, after_turn: int, seq: int) -> None:
        entry = self._session(session_id)
        changed = [item for item in entry.messages
                   if item[2] is None and item[1].summary_through is not None and item[1].summary_through > after_turn]
        for item in changed:
            item[2], item[3] = "rolled_back", seq

        def undo() -> None:
            for item in changed:
                item[2], item[3] = None, None

        self.undo.append(undo)

    def summaries(self, session_id: str, include_removed: bool) -> list[_MessageRow]:
        entry = self._session(session_id)
        return [_MessageRow(0, m, r, s) for t, m, r, s, *_ in entry.messages
                if m.summary_through is not None and (include_removed or r is None)]

    def turn_messages(
        self, session_id: str, first: int, last: int | None, include_removed: bool
    ) -> list[_MessageRow]:
        entry = self._session(session_id)
        out = [
            _MessageRow(t, m, r, s, at)
            for t, m, r, s, at in entry.messages
            if t >= first
            and (last is None or t <= last)
            and (include_removed or r is None)
            and (t > 0 or (m.role is Role.SYSTEM and m.summary_through is None))
        ]
        out.sort(key=lambda item: item.turn)
        return out

    def preview(self, session_id: str) -> str:
        failed = ""
        for t, m, r, *_ in self._session(session_id).messages:
            if t == 1 and r is None and m.role is Role.USER:
                return m.content or ""
            if r == "failed" and m.role is Role.USER:
                failed = m.content or ""
        return failed

    def idempotency_get(self, session_id: str, key: str) -> tuple[str, int | None, int] | None:
        return self._session(session_id).keys.get(key)

    def idempotency_put(self, session_id: str, key: str, digest: str, turn: int | None, seq: int, now: float) -> None:
        keys = self._session(session_id).keys
        old = keys.get(key)
        keys[key] = (digest, turn, seq)
        self.undo.append(lambda: keys.pop(key, None) if old is None else keys.__setitem__(key, old))

    def idempotency_turn_keyed(self, session_id: str, turn: int) -> bool:
        return any(t == turn for _, t, _ in self._session(session_id).keys.values())

    def processed_get(self, message_id: str) -> _MessageRecord | None:
        return self._s._processed.records.get(message_id)

    def processed_put(self, message_id: str, record: _MessageRecord) -> None:
        processed = self._s._processed
        old = processed.records.get(message_id)
        processed.put(message_id, record)
        self.undo.append(lambda: processed.restore(message_id, old))

    def processed_turn_claimed(self, session_id: str, turn: int) -> bool:
        processed = self._s._processed
        return any(
            processed.records[m].state == "in_progress" for m in processed.by_turn.get((session_id, turn), ())
        )

    def _turn_claims(self, session_id: str, turn: int, holder: str | None) -> list[str]:
        processed = self._s._processed
        out = []
        for message_id in list(processed.by_turn.get((session_id, turn), ())):
            record = processed.records[message_id]
            if record.state == "in_progress" and (
                holder is None or (record.holder is not None and record.holder.token == holder)
            ):
                out.append(message_id)
        return out

    def processed_finish_turn(self, session_id: str, turn: int, holder: str | None, now: float) -> None:
        for message_id in self._turn_claims(session_id, turn, holder):
            self.processed_put(message_id, _MessageRecord("completed", now, None, session_id, turn))

    def processed_drop_turn(self, session_id: str, turn: int, holder: str | None) -> None:
        for message_id in self._turn_claims(session_id, turn, holder):
            self.processed_release(message_id)

    def processed_purge(self, now: float, ttl_s: float) -> None:
        # Not undone: an expired id is not a duplicate, so dropping it changes no answer.
        self._s._processed.purge(now, ttl_s)

    def processed_release(self, message_id: str) -> bool:
        processed = self._s._processed
        old = processed.records.get(message_id)
        if old is None:
            return False
        processed.restore(message_id, None)
        self.undo.append(lambda: processed.restore(message_id, old))
        return True

    def endpoint_get(self, session_id: str) -> tuple[str | None, str | None] | None:
        return self._session(session_id).endpoint

    def endpoint_put(self, session_id: str, model: str | None, base_url: str | None, now: float) -> None:
        entry = self._session(session_id)
        old = entry.endpoint
        entry.endpoint = (model, base_url)
        self.undo.append(lambda: setattr(entry, "endpoint", old))

    def queue_add(self, session_id: str, owner: Owner, now: float) -> int:
        store = self._s
        store._tickets += 1
        ticket = store._tickets
        waiters = store._queues.setdefault(session_id, {})
        waiters[ticket] = owner
        self.undo.append(lambda: waiters.pop(ticket, None))
        return ticket

    def queue_list(self, session_id: str) -> list[tuple[int, Owner]]:
        return sorted(self._s._queues.get(session_id, {}).items())

    def queue_remove(self, session_id: str, ticket: int) -> None:
        waiters = self._s._queues.get(session_id)
        if waiters is None or ticket not in waiters:
            return
        owner = waiters.pop(ticket)
        if not waiters:
            self._s._queues.pop(session_id, None)
        self.undo.append(lambda: self._s._queues.setdefault(session_id, {}).__setitem__(ticket, owner))

    def search(self, query: Query, where: SearchFilter) -> list[SearchHit]:
        # A scan of every stored message: each searched text is split into folded words
        # and scored by Query.score (matched occurrences); the best message of a turn wins.
        best: dict[tuple[str, int, int | None], tuple[int, float, str, str, str]] = {}
        for sid, entry in self._s._sessions.items():
            if where.session_id is not None and sid != where.session_id:
                continue
            if where.agent is not None and entry.row.active_agent_name != where.agent:
                continue
            for turn, message, removed, removed_seq, seq in entry.messages:
                if turn <= 0 or (removed is not None and not where.include_removed):
                    continue
                created = entry.events[seq - 1].created_at
                if where.since is not None and created < where.since:
                    continue
                for text in searchable_texts(message, where.include_tools):
                    score = query.score(words_of(text))
                    key = (sid, turn, removed_seq)
                    if score and (key not in best or score > best[key][0]):
                        best[key] = (score, created, text, message.role.value, removed or "")
        ordered = sorted(best.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0][0], kv[0][1]))
        return [
            SearchHit(sid, turn, memory_snippet(query, text), role, created, float(-score),
                      self._s._sessions[sid].row.active_agent_name, removed or None)
            for (sid, turn, _seq), (score, created, text, role, removed) in ordered[: where.limit]
        ]

    # -- vaults (names and locations only) ---------------------------------------------
    def vault_list(self, name: str | None) -> list[VaultInfo]:
        names = sorted(self._s._vaults) if name is None else [name] if name in self._s._vaults else []
        out = []
        for each in names:
            created, entries = self._s._vaults[each]
            out.append(VaultInfo(each, created, tuple(VaultEntry(e, loc, at) for e, (loc, at) in sorted(entries.items()))))
        return out

    def vault_insert(self, name: str, at: float) -> bool:
        if name in self._s._vaults:
            return False
        self._s._vaults[name] = (at, {})
        self.undo.append(lambda: self._s._vaults.pop(name, None))
        return True

    def vault_put_entry(self, vault: str, entry: str, location: str, at: float) -> None:
        entries = self._s._vaults[vault][1]
        old = entries.get(entry)
        entries[entry] = (location, at)
        self.undo.append(lambda: entries.pop(entry, None) if old is None else entries.__setitem__(entry, old))

    def vault_delete_entry(self, vault: str, entry: str) -> bool:
        entries = self._s._vaults.get(vault, (0.0, {}))[1]
        old = entries.pop(entry, None)
        if old is None:
            return False
        self.undo.append(lambda: entries.__setitem__(entry, old))
        return True

    def vault_delete(self, name: str) -> bool:
        old = self._s._vaults.pop(name, None)
        if old is None:
            return False
        self.undo.append(lambda: self._s._vaults.__setitem__(name, old))
        return True


class _ProcessedIds:
    """Processed message ids for :class:`SessionStore`: O(1) amortized mark and purge.

    ``at`` maps id -> processed-at time; ``_queue`` holds ``(time, id)`` in marking order.
    While the clock never goes back the queue is sorted by time, so a purge pops expired
    entries from its front and stops at the first live one. An entry whose id was marked
    again later is stale and is dropped when it reaches the front. If the clock goes back
    (an injected test clock, a wall-clock step) the queue is marked unsorted; a full sweep
    that rebuilds it sorted then runs after as many purges as there were ids at that moment
    (still O(1) amortized, plus the sort). ``scanned`` counts queue entries examined by
    purges and sweeps. ``records`` holds each id's :class:`_MessageRecord` (``at`` is its
    time), ``by_turn`` the ids whose claim started a (session, turn).
    """

    __slots__ = ("_calls", "_queue", "_sorted", "_sweep_after", "at", "by_turn", "records", "scanned")

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.records: dict[str, _MessageRecord] = {}
        self.by_turn: dict[tuple[str, int], set[str]] = {}
        self._queue: deque[tuple[float, str]] = deque()
        self._sorted = True
        self._calls = 0
        self._sweep_after = 0
        self.scanned = 0

    def __len__(self) -> int:
        return len(self.at)

    def set(self, message_id: str, at: float) -> None:
        if self._sorted and self._queue and at < self._queue[-1][0]:
            self._sorted = False
            self._calls, self._sweep_after = 0, len(self.at) + 1
        self.at[message_id] = at
        self._queue.append((at, message_id))
        if len(self._queue) > 2 * len(self.at) + 1024:  # many re-marks of live ids: drop the stale entries
            self._rebuild(None, 0.0)

    def put(self, message_id: str, record: _MessageRecord) -> None:
        self._unindex(message_id)
        self.records[message_id] = record
        if record.session_id is not None and record.turn is not None:
            self.by_turn.setdefault((record.session_id, record.turn), set()).add(message_id)
        if self.at.get(message_id) != record.at:
            self.set(message_id, record.at)

    def _unindex(self, message_id: str) -> None:
        old = self.records.get(message_id)
        if old is not None and old.session_id is not None and old.turn is not None:
            ids = self.by_turn.get((old.session_id, old.turn))
            if ids is not None:
                ids.discard(message_id)
                if not ids:
                    del self.by_turn[(old.session_id, old.turn)]

    def _forget(self, message_id: str) -> None:
        self._unindex(message_id)
        self.records.pop(message_id, None)
        self.at.pop(message_id, None)

    def restore(self, message_id: str, old: _MessageRecord | None) -> None:
        """Undo a :meth:`put`: put back the previous record (None: the id was not recorded)."""
        if old is None:
            self._forget(message_id)
        else:
            self.put(message_id, old)

    def purge(self, now: float, ttl_s: float) -> None:
        """Forget ids with ``now >= at + ttl_s``."""
        self._calls += 1
        if not self._sorted and self._calls >= self._sweep_after:
            self._rebuild(now, ttl_s)
            return
        queue, at = self._queue, self.at
        while queue and queue[0][0] + ttl_s <= now:
            when, message_id = queue.popleft()
            self.scanned += 1
            if at.get(message_id) == when:
                self._forget(message_id)
        if not queue:
            self._sorted = True

    def _rebuild(self, now: float | None, ttl_s: float) -> None:
        """Full sweep: drop expired ids (when ``now`` is given) and rebuild the queue sorted."""
        self.scanned += len(self.at)
        if now is not None:
            for k in [k for k, v in self.at.items() if now >= v + ttl_s]:
                self._forget(k)
        self._queue = deque(sorted((v, k) for k, v in self.at.items()))
        self._sorted = True



class SessionStore(BaseSessionStore):
    """Sessions in process memory, safe under threads: one lock serialises every operation.

    ``SessionStore(default_max_turns=40)``. A transaction that raises leaves nothing
    behind (each write logs its undo step). Nothing survives the process.

    Raises:
        TypeError: ``default_max_turns`` is not an int.
        ValueError: ``default_max_turns`` is outside 1..1,000,000.
    """

    _ephemeral = True

    def __init__(self, default_max_turns: int = DEFAULT_MAX_TURNS) -> None:
        super().__init__(default_max_turns)
        self._lock = threading.RLock()
        self._sessions: dict[str, _MemSession] = {}
        self._processed = _ProcessedIds()
        self._queues: dict[str, dict[int, Owner]] = {}  # session id -> ticket -> waiting owner
        self._tickets = 0
        self._memstores: MemStores = {}  # memory stores: name -> documents and history
        self._vaults: dict[str, tuple[float, dict[str, tuple[str, float]]]] = {}  # name -> (created, entries)
        self._blobs: dict[str, bytes] = {}  # attachments' bytes by sha256
        self._refs: dict[str, set[str]] = {}  # session id -> the hashes its messages use

    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        with self._lock:
            yield _MemoryTx(self, writable=False)

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        with self._lock:
            tx = _MemoryTx(self, writable=True)
            try:
                yield tx
            except BaseException:
                for step in reversed(tx.undo):
                    step()
                raise


#: The in-memory store under a name that says so.
InMemorySessionStore = SessionStore
