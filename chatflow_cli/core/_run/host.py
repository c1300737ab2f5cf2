"""What the parts of :class:`~chatflow_cli.core.runner.Runner` share, declared once.

The Runner is one object built from mixins: the turn (:class:`~.turn.TurnLoop`) and the
context window (:class:`~.turn.ContextWindow`). Each mixin subclasses :class:`RunnerHost`,
which declares the attributes :class:`~chatflow_cli.core.runner.Runner` sets in ``__init__``
and the methods one part calls on another, so every part is type-checked on its own. The
declarations are annotations only: nothing here runs or holds a value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..agents import Agent
    from ..resources.vaults import Vaults
    from ..memory.context import SessionContext
    from ..memory.protocol import TurnStore
    from ..messages import Message
    from ..model import ChatClient
    from ..events import Event
    from ..tokens import ContextBudget
    from .lifecycle import StreamEvent

__all__ = ["RunnerHost"]


class RunnerHost:
    """The attributes and cross-part methods of :class:`~chatflow_cli.core.runner.Runner`."""

    # set by Runner.__init__ (see its docstring) -------------------------------------------
    starting_agent: Agent
    agents: dict[str, Agent]
    store: TurnStore
    default_model: str | None
    max_tool_rounds: int
    max_tokens: int | None
    temperature: float | None
    max_context_tokens: int | None
    compact_at: float | None
    compact_prompt: str | None
    on_wait: Callable[[dict[str, Any]], None] | None
    vaults: Vaults | Callable[[], Vaults] | None
    #: asked about a call of a tool whose approval policy is ``ask``: ``(call, tool)`` ->
    #: ``"yes"``, ``"no"`` or ``"always"``; None: such a call waits (``approve_tool_call``)
    approver: Callable[[Any, Any], str] | None
    approved_tools: set[str]  # tool names answered "always" (for this Runner's life)
    #: models that refused the images of tool results (a 400 that speaks of images): later
    #: requests to them carry the results' text only (for this Runner's life)
    text_only_models: set[str]

    if TYPE_CHECKING:  # the methods one part calls on another (each defined by one part)
        @property
        def model_client(self) -> ChatClient: ...

        def _version_of(self, agent: Any) -> str | None: ...

        def _auto_compact(self, session_id: str, message: Message) -> list[Event | StreamEvent]: ...

        def _budget(self, agent: Agent, model: str) -> ContextBudget | None: ...

        def _budget_window(self, session: SessionContext, agent: Agent,
                           model: str) -> tuple[list[Message], dict[str, Any]]: ...
