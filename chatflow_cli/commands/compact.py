"""``sessions compact``: summarise turns 1..K of a session into one stored message.

The summary is written by the session's model (its stored model and endpoint, as
``chat -s ID`` resumes them; ``--model``/``--base-url`` of the global settings otherwise),
in one tool-free request; nothing is deleted (``sessions show --all`` shows every turn).
Ctrl-C or SIGTERM stops the request at once and nothing is stored (exit 130, or 143 with
``chatflow: terminated (SIGTERM): the compaction was interrupted; nothing was compacted``).
See :mod:`chatflow_cli.core.compaction`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..assembly import assemble, session_endpoint, transport_for
from ..config import resolve_model
from ..core.errors import UsageError
from ..lookup import read_summary, store_or_missing
from ..render import safe_text
from ..render.text import dumps

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State

__all__ = ["compact_command"]


def compact_command(state: State, session_id: str, *, through: int | None, instructions: str | None,
                    output: str = "text") -> None:
    """Compact ``session_id`` through turn ``through`` (default: every turn but the newest).

    Prints what was done (``json``: the compaction as one object).

    Raises:
        SessionNotFoundError: No such session.
        UsageError: ``through`` is not a turn of the session, or is before its newest summary.
        SessionBusyError: Another process runs the session (exit 4).
        ChatflowError: The model request failed (the session is unchanged).
    """
    from ..core.compaction import compact_session
    from ..core.tokens import short_count

    store = store_or_missing(state, session_id)
    session = read_summary(store, session_id)
    if session.turn_count < 1 or (through is None and session.turn_count < 2):
        raise UsageError(f"session {safe_text(session_id)} has nothing to compact: the newest turn stays as it is "
                         "(give --through N to include it)")
    model, base_url = session_endpoint(state, store, session, None, None)
    settings = state.settings(model=model, base_url=base_url)
    choice = resolve_model(settings)
    with assemble(settings, store, choice=choice, transport=transport_for("http")) as built:
        runner = built.runner
        agent = runner.agents.get(session.active_agent_name, runner.starting_agent)
        chosen = agent.model or runner.default_model
        if not chosen:
            raise UsageError("no model to write the summary: give --model or configure one")
        tools = [t.to_wire() for t in agent.all_tools().values()] or None
        from ..core.cancel import CancelToken, ctrl_c_cancels

        # Ctrl-C or SIGTERM stops the request at once, as it stops a chat turn: nothing is
        # stored, and the error boundary says so (`terminated (SIGTERM): ...`, exit 143)
        cancel = CancelToken()
        with ctrl_c_cancels(cancel):
            done = compact_session(store, session_id, runner.model_client, chosen,
                                   through=through if through is not None else session.turn_count - 1,
                                   instructions=instructions, prompt=runner.compact_prompt, tools=tools,
                                   temperature=runner.temperature, cancel=cancel.event)
    if output == "json":
        state.env.stdout.write(dumps(done.to_dict()) + "\n")
        return
    if done.repeated:
        state.env.stdout.write(f"turns 1..{done.through} of {safe_text(session_id)} are already summarised with these "
                               "instructions; nothing was sent\n")
        return
    state.env.stdout.write(
        f"compacted turns 1..{done.through} of {safe_text(session_id)}: {short_count(done.tokens_before)} -> "
        f"{short_count(done.tokens_after)} tokens in the context window; every turn stays in the log\n")
