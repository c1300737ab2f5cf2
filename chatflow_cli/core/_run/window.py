"""The context window of a turn's requests: the token budget, the turns that fit it, and
compaction before a turn when the window would not fit -- :class:`ContextWindow`, mixed
into :class:`~chatflow_cli.core.runner.Runner`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..agents import Agent
from ..errors import ChatflowError
from ..events import Event
from ..memory.context import split_turns
from ..messages import Message
from ..tokens import ContextBudget, context_budget, estimate_tokens, select_window
from .host import RunnerHost
from .results import StreamEvent

if TYPE_CHECKING:  # pragma: no cover
    from ..memory.context import SessionContext

__all__ = ["ContextWindow"]

log = logging.getLogger("chatflow_cli.core.runner")


class ContextWindow(RunnerHost):
    """The token budget and the window of :class:`~chatflow_cli.core.runner.Runner`'s
    requests, and automatic compaction."""

    def _auto_compact(self, session_id: str, message: Message) -> list[Event | StreamEvent]:
        """Compact the session before its next turn, when needed; the events (stored ones, and
        a runtime ``context.compaction_failed`` ``{"through", "error"}``) to pass on.

        A compaction is needed when the next request, as the stored window stands, would
        leave out turns no summary covers (they do not fit the token budget beside the new
        message), or when the window passes ``compact_at`` of the budget. It summarises
        through the newest turn that must leave the window, or further back to keep about
        30 % of the budget as live turns (:func:`compaction_point`, the new message counted
        as the newest turn), so no turn leaves the request without a summary. With
        compaction off (``compact_at`` None) or failing, the turns are dropped and the
        request's ``context.dropped`` event says so.

        Automatic compaction stops for the session when it cannot help: the model's summary
        was refused as not shorter than what it replaces (:class:`SummaryTooLongError`), its
        request did not fit the model's context either (:class:`CompactionDoesNotFitError`), or
        what stays in every request after it (the summary, the SYSTEM messages and the
        agent's instructions) takes more than ``compact_at`` minus the 30 % kept as live
        turns (at least half of ``compact_at``) of the budget: the window could not get
        under ``compact_at`` for long, and every next turn would compact again, summarising
        the summary. A stored
        ``context.compaction_stopped`` event ``{"through", "reason"}`` says so once; until a
        later compaction (``sessions compact``, ``/compact``) or a rollback, automatic
        compaction is not tried again and turns that do not fit are dropped.
        """
        from ..errors import CompactionDoesNotFitError, SessionNotFoundError, SummaryTooLongError

        try:
            info = self.store.session_summary(session_id)
        except SessionNotFoundError:
            return []
        agent = self.agents.get(info.active_agent_name, self.starting_agent)
        model = agent.model or self.default_model
        budget = self._budget(agent, model) if model else None
        if budget is None or not model or self.compact_at is None:
            return []
        tokens, turns = self.store.window_tokens(session_id)
        if not turns:
            return []
        from ..compaction import KEEP_SHARE, compact_session, compaction_stopped, compaction_through

        new_turn = estimate_tokens(message)
        instructions = estimate_tokens(Message.system(agent.instructions)) if agent.instructions else 0
        through = compaction_through(tokens - sum(t for _, t in turns) + instructions, turns, new_turn,
                                     budget.tokens, self.compact_at)
        if through is None or compaction_stopped(self.store, session_id):
            return []
        try:
            done = compact_session(self.store, session_id, self.model_client, model, through=through,
                                   prompt=self.compact_prompt,
                                   tools=[t.to_wire() for t in agent.all_tools().values()] or None,
                                   max_tokens=self.max_tokens, temperature=self.temperature)
        except (SummaryTooLongError, CompactionDoesNotFitError) as exc:
            return [self._stop_compaction(session_id, through, exc.message)]
        except ChatflowError as exc:
            log.warning("session %s: automatic compaction through turn %d failed (%s); the turn goes on "
                        "without it", session_id, through, exc)
            return [StreamEvent("context.compaction_failed", session_id, {"through": through, "error": exc.message})]
        events: list[Event | StreamEvent] = list(done.events)
        after, kept = self.store.window_tokens(session_id)
        fixed = after - sum(cost for _, cost in kept) + instructions  # the summary, SYSTEM messages, instructions
        limit = int(max(self.compact_at - KEEP_SHARE, self.compact_at / 2) * budget.tokens)
        if fixed > limit:
            events.append(self._stop_compaction(
                session_id, through, f"the summary and system messages alone take about {fixed} tokens of the "
                f"budget of {budget.tokens} (more than {limit}), so every next turn would compact again"))
        return events

    def _stop_compaction(self, session_id: str, through: int, reason: str) -> Event:
        """Store ``context.compaction_stopped`` ``{"through", "reason"}``: automatic compaction
        is not tried again for the session until a later compaction or a rollback."""
        log.warning("session %s: automatic compaction through turn %d stopped: %s", session_id, through, reason)
        event: Event = self.store.append_event(session_id, "context.compaction_stopped",
                                               {"through": through, "reason": reason})
        return event

    def _budget(self, agent: Agent, model: str) -> ContextBudget | None:
        """The token budget of ``agent``'s requests: the Runner's ``max_context_tokens``, the
        agent's, else the model table (None: unknown model)."""
        return context_budget(model, max_context_tokens=self.max_context_tokens,
                              configured=agent.max_context_tokens, reply_tokens=self.max_tokens)

    def budget_for(self, agent_name: str | None = None) -> ContextBudget | None:
        """The :class:`~chatflow_cli.core.tokens.ContextBudget` of the named agent's requests
        (default: the starting agent), or None when its model's context size is unknown."""
        agent = self.agents.get(agent_name or "", self.starting_agent)
        model = agent.model or self.default_model
        return self._budget(agent, model) if model else None

    def _budget_window(self, session: SessionContext, agent: Agent, model: str) -> tuple[list[Message], dict[str, Any]]:
        """The messages of the next request: the agent's instructions, the window's SYSTEM
        messages, then the newest whole turns of the window that fit the token budget (the
        open turn always, whole); and the context use ``{"tokens", "budget", "context",
        "turns", "over_budget"}``."""
        history = session.history
        systems, _preamble, turns = split_turns(history)
        if agent.instructions:
            systems = [Message.system(agent.instructions), *systems]
        budget = self._budget(agent, model)
        limit = budget.tokens if budget is not None else 2**62
        kept, tokens = select_window(systems, turns, limit)
        over = budget is not None and tokens > limit
        numbers = [t.number for t in session.turns]
        if len(numbers) != len(turns):  # pragma: no cover - the window's turns are its numbered turns
            numbers = list(range(len(turns)))
        dropped = [numbers[0], numbers[len(turns) - kept - 1]] if kept < len(turns) else None
        summary = next((m.summary_through for m in systems if m.summary_through is not None), None)
        if over:
            log.warning("session %s: the context (%d tokens: system messages%s and the newest turn) is over the "
                        "context budget of %d tokens; it is sent whole", session.session_id, tokens,
                        ", summary" if summary else "", limit)
        outgoing = [*systems, *(m for msgs in turns[len(turns) - kept:] for m in msgs)]
        use = {"tokens": tokens, "budget": budget.tokens if budget is not None else None,
               "context": budget.context if budget is not None else None, "turns": kept, "over_budget": over,
               "first_turn": numbers[len(turns) - kept] if kept else None, "summary_through": summary,
               "system_messages": sum(1 for m in systems if m.summary_through is None), "dropped": dropped}
        return outgoing, use
