"""What ties a :class:`~chatflow_cli.core.memory.context.SessionContext` to its store.

The seam to the stores
----------------------
A store talks to a context through one named seam and nothing else:

* :class:`SessionBinding` -- what ties a context to one stored session: the store object's
  id, the session's incarnation (a random id per creation, so a context of a deleted
  session never writes into a new one of the same id), the base row the context was
  loaded from (status, owner token, agent name), the lease token of the run that holds the
  turn, and the loader that reads pruned turns back. The context holds it (``_binding``;
  None until first stored); only the store that made it reads or updates it.
* two friend methods, :meth:`SessionContext._pending
  <chatflow_cli.core.memory.context.SessionContext._pending>` (the journal entries to
  save) and :meth:`SessionContext._saved
  <chatflow_cli.core.memory.context.SessionContext._saved>` (acknowledge them: drop the
  saved entries, take the stored metadata and the new binding, optionally make the window
  look freshly loaded).
* :func:`~chatflow_cli.core.memory.context.restore_context` builds a bound context from a
  stored row's window; each journal entry is a :class:`JournalEntry`, and
  :data:`MESSAGE_EVENT_TYPE` names the event a stored message of each role is recorded as.

So a new backend never needs to know how a context keeps its window or journal, and a
context never needs to know which store it is in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..events import EventType, SessionStatus
from ..messages import Message, Role

__all__ = [
    "AGENT_TRAIL_EVENTS",
    "MESSAGE_EVENT_TYPE",
    "AgentTrail",
    "JournalEntry",
    "SessionBinding",
    "TurnLoader",
]


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journal entry: the change (``kind``) and the event that records it."""

    kind: str  # message | rollback | turn_failed | status | agent | agent_version | metadata | event | summary
    #            | title | archive | resource
    type: str
    payload: dict[str, Any]
    turn: int = 0
    message: Message | None = None
    #: the message's compact JSON, checked once when it was added (stores write it as is)
    text: str | None = None
    #: the event's time (UTC epoch seconds) when it is not the store's clock (history copied
    #: from elsewhere: :meth:`SessionContext.set_event_time
    #: <chatflow_cli.core.memory.context.SessionContext.set_event_time>`)
    at: float | None = None
    #: files an event's payload names whose bytes the store keeps with it (a tool result's
    #: images, recorded before its TOOL message): :class:`~chatflow_cli.core.attachments.Attachment`
    attachments: tuple[Any, ...] = ()


#: The event type a stored message of each role is recorded as.
MESSAGE_EVENT_TYPE = {
    Role.USER: EventType.MESSAGE_USER.value,
    Role.MODEL: EventType.MESSAGE_MODEL.value,
    Role.SYSTEM: EventType.MESSAGE_SYSTEM.value,
    Role.TOOL: EventType.TOOL_RESULT.value,
}

#: (first_turn, last_turn) -> {turn: [messages]} of live stored turns; raises SessionDeletedError.
TurnLoader = Callable[[int, int], dict[int, list[Message]]]

#: The event types :class:`AgentTrail` replays, in ``seq`` order.
AGENT_TRAIL_EVENTS = (EventType.SESSION_CREATED.value, EventType.HANDOFF.value, EventType.ROLLBACK.value,
                      EventType.TURN_FAILED.value)


@dataclass(slots=True)
class AgentTrail:
    """Which agent was active at the end of each turn, replayed from a session's
    ``session.created``, ``handoff``, ``rollback`` and ``turn.failed`` events in ``seq`` order.

    ``after[t]``: the agent a handoff made in turn ``t`` (its payload's ``turn``) left
    active; ``created``: the agent the session was created with. A rollback to ``j`` drops
    the entries after ``j`` (all of them with ``"system": true``), a failed turn ``t`` those
    from ``t`` on, so turn numbers used again after either replay right.
    """

    created: str | None = None
    after: dict[int, str] = field(default_factory=dict)

    def agent_at(self, turn: int, system: bool = False) -> str | None:
        """The agent active at the end of ``turn`` (``system``: the SYSTEM messages went too,
        so no handoff before the first turn counts): the newest handoff's at or before it,
        else the created agent."""
        best = None if system else max((t for t in self.after if t <= turn), default=None)
        return self.created if best is None else self.after[best]

    def replay(self, type: str, payload: Mapping[str, Any]) -> None:
        """Take one event (or journal entry) of the log into account."""
        if type == EventType.SESSION_CREATED.value:
            agent = payload.get("agent")
            self.created, self.after = (agent if isinstance(agent, str) else self.created), {}
        elif type == EventType.HANDOFF.value:
            turn, agent = payload.get("turn"), payload.get("to_agent")
            if self.created is None and isinstance(payload.get("from_agent"), str):
                self.created = payload["from_agent"]  # a log with no session.created
            if isinstance(turn, int) and isinstance(agent, str):
                self.after[turn] = agent
        elif type == EventType.ROLLBACK.value:
            to_turn, system = payload.get("to_turn"), payload.get("system") is True
            if not isinstance(to_turn, int):
                return
            self.after = {} if system else {t: a for t, a in self.after.items() if t <= to_turn}
            recorded = payload.get("active_agent")  # absent in logs written before it was recorded
            if isinstance(recorded, str) and recorded != self.agent_at(to_turn):
                self.after[to_turn] = recorded
        elif type == EventType.TURN_FAILED.value:
            turn = payload.get("turn")
            if isinstance(turn, int) and turn > 0:
                self.after = {t: a for t, a in self.after.items() if t < turn}


@dataclass(slots=True)
class SessionBinding:
    """What ties a :class:`SessionContext` to one stored session.

    The store that loads or saves a context makes its binding, and only that store reads
    or updates it; the context itself only calls ``loader`` (to bring back turns pruned out
    of the window, for a rollback or a failed turn).

    Attributes:
        store_id: ``id()`` of the store object that made the binding.
        incarnation: the stored session's creation id (random per creation): a context
            whose incarnation no longer matches the stored row was deleted meanwhile.
        base: ``(status, owner token, agent name)`` of the stored row the context was loaded
            from or last saved to; a status or handoff change made from another base is
            refused as stale.
        loader: reads live stored turns ``first..last`` (:data:`TurnLoader`).
        lease: the owner token of the run :meth:`BaseSessionStore.begin_turn` gave this
            context, or None; the lease holder's status changes are never stale.
        agents: reads the stored session's :class:`AgentTrail` (for a rollback: the agent
            active at the turn it rolls back to), or None.
        resolve: the agent object of a stored agent name, as a load gives it, or None.
    """

    store_id: int
    incarnation: str
    base: tuple[SessionStatus, str | None, str]
    loader: TurnLoader
    lease: str | None = None
    agents: Callable[[], AgentTrail] | None = None
    resolve: Callable[[str], Any] | None = None
