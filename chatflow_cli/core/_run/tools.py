"""Running the tool calls of one model reply.

Unknown tool names and handoffs are answered at once (:func:`answer_at_once`); the other
calls run concurrently, each on its own daemon thread (:func:`run_concurrently`), except the
calls of ``sequential`` tools (the memory tools), which run one after another on one thread
of their own, in the order the model gave them, beside the others. Every
failure becomes text the model sees, flagged ``is_error``: a tool that raises, arguments
that are not valid JSON or do not fit the parameters, an unknown name, a second handoff
in one reply. Results are made storable (lone surrogates escaped).

A tool with secret parameters (:class:`~chatflow_cli.core.tools.Secret`) gets them from the
turn's :class:`~chatflow_cli.core.resources.vaults.SessionSecrets`; when one is missing the tool
does not run and the call's error result names the vaults and the entry. Every result and
error text is scrubbed of the vault values this process has read
(:func:`~chatflow_cli.core.resources.secrets.scrub_values`) before anyone sees it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..agents import HandoffTool
from ..memory import storable_text
from ..errors import ChatflowError
from ..messages import ToolCall
from ..resources.secrets import scrub_values
from ..tools import Tool, ToolArgumentsError, ToolCallFailed, to_json_text
from ..cancel import Cancelled, CancelToken
from .lifecycle import TurnState

if TYPE_CHECKING:  # pragma: no cover
    import asyncio
    import concurrent.futures

    from ..resources.vaults import SessionSecrets

__all__ = ["answer_at_once", "invoke_call", "output_text", "run_concurrently"]

log = logging.getLogger("chatflow_cli.core.runner")

#: ``(text, is_error)`` of one tool call.
Outcome = tuple[str, bool]


def answer_at_once(calls: list[ToolCall], tools: dict[str, Tool], state: TurnState,
                   outcomes: dict[str, Outcome], waiting: frozenset[str] = frozenset()) -> list[tuple[ToolCall, Tool]]:
    """Answer the calls that need no tool run, into ``outcomes``; return the others with their tool.

    An unknown name gets an error listing the tools; the first handoff of the reply is
    recorded in ``state.handoffs`` and answered "Transferred to …", a later one gets an
    error. Custom tool calls, calls already in ``outcomes`` (answered by an approval policy)
    and calls in ``waiting`` (waiting for an approval) are neither answered nor returned.
    """
    runnable: list[tuple[ToolCall, Tool]] = []
    for position, call in enumerate(calls):
        found = tools.get(call.name)
        if (found is not None and found.is_custom) or call.id in outcomes or call.id in waiting:
            continue
        if found is None:
            known = ", ".join(sorted(tools)) or "none"
            outcomes[call.id] = (f"Error: unknown tool {call.name!r}. Available tools: {known}.", True)
        elif isinstance(found, HandoffTool):
            if any(isinstance(tools.get(c.name), HandoffTool) for c in calls[:position]):
                outcomes[call.id] = ("Error: only the first handoff of a reply is followed.", True)
            else:
                state.handoffs[call.id] = found.target
                outcomes[call.id] = (f"Transferred to {found.target.name}. {found.target.name} answers now.", False)
        else:
            runnable.append((call, found))
    return runnable


def run_concurrently(runnable: list[tuple[ToolCall, Tool]], outcomes: dict[str, Outcome],
                     timings: dict[str, float], cancel: CancelToken, loop: asyncio.AbstractEventLoop | None,
                     state: TurnState, secrets: SessionSecrets | None = None) -> None:
    """Run the calls concurrently, each on its own daemon thread, and wait for all.

    The calls of ``sequential`` tools share one thread instead and run on it one after
    another, in the reply's order (the order of ``runnable``); a cancel request stops the
    ones not begun yet.
    ``outcomes`` and ``timings`` (seconds) get each call's result by id. Daemon threads,
    not a pool: a tool abandoned by an interrupt keeps running in the background but never
    holds up the process's exit. The wait wakes every 50 ms to notice a cancel request.
    ``loop``: the event loop async tools run on (``None``: their own). ``secrets``: the
    mounted vaults that fill secret parameters (``None``: none is mounted).

    Raises:
        Cancelled: ``cancel`` was set before every call finished; the results that did
            come in are in ``state.finished`` (the others get synthetic results).
    """
    import concurrent.futures

    futures: list[tuple[ToolCall, concurrent.futures.Future[tuple[str, bool, float, str | None, tuple[Any, ...]]]]] = []
    in_order: list[tuple[concurrent.futures.Future[tuple[str, bool, float, str | None, tuple[Any, ...]]], Tool, ToolCall]] = []
    for call, found in runnable:
        future: concurrent.futures.Future[tuple[str, bool, float, str | None, tuple[Any, ...]]] = concurrent.futures.Future()
        futures.append((call, future))
        if found.sequential:
            in_order.append((future, found, call))
            continue
        thread = threading.Thread(target=_run_into, args=(future, found, call, loop, secrets),
                                  name=f"chatflow-tool-{call.name}"[:40], daemon=True)
        thread.start()
    if in_order:
        threading.Thread(target=_run_in_order, args=(in_order, cancel, loop, secrets),
                         name="chatflow-tools-in-order", daemon=True).start()
    pending = {f for _, f in futures}
    by_future = {f: c for c, f in futures}
    try:
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=0.05,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                text, is_error, took, whole, images = future.result()
                call = by_future[future]
                outcomes[call.id] = (text, is_error)
                timings[call.id] = took
                if whole is not None:
                    state.wholes[call.id] = whole
                if images:
                    state.images[call.id] = images
            if pending and cancel.is_set():
                raise Cancelled()
    except BaseException:
        # results that did come in are kept; the others get synthetic results
        state.finished = dict(outcomes)
        for _, found in runnable:  # a tool server's call is cancelled (notifications/cancelled)
            cancel_calls = getattr(found, "cancel_calls", None)
            if cancel_calls is not None:
                cancel_calls()
        raise


def output_text(output: Any) -> str:
    """A submitted custom-tool result as text: as a tool's return value (:func:`to_json_text`)."""
    return storable_text(scrub_values(to_json_text(output)))


def invoke_call(found: Tool, call: ToolCall, loop: asyncio.AbstractEventLoop | None,
                secrets: SessionSecrets | None = None) -> tuple[str, bool, str | None, tuple[Any, ...]]:
    """Run one tool call: ``(text, is_error, whole, images)``; errors become text the model
    sees (``is_error`` True). The text is scrubbed of vault values and made storable
    (:func:`~chatflow_cli.core.memory.storable_text`: lone surrogates escaped); ``whole`` is
    the complete result when the text was cut, else None, and ``images`` the images the tool
    returned (both from a :class:`~chatflow_cli.core.tools.ToolText`)."""
    text, is_error = _outcome(found, call, loop, secrets)
    whole = getattr(text, "whole", None)
    images = tuple(getattr(text, "attachments", None) or ())
    return (storable_text(scrub_values(str(text))), is_error,
            storable_text(scrub_values(whole)) if isinstance(whole, str) else None, images)


def _outcome(found: Tool, call: ToolCall, loop: asyncio.AbstractEventLoop | None,
             secrets: SessionSecrets | None) -> Outcome:
    values: dict[str, str] | None = None
    needed = found.secrets
    if needed:
        from ..resources.vaults import MissingSecret, SessionSecrets

        try:
            values = (secrets or SessionSecrets(None, ())).for_tool(call.name, list(needed.values()))
        except MissingSecret as exc:
            return f"Error: {exc}", True
        except ChatflowError as exc:  # a vault that cannot be read: its message holds no value
            return f"Error: {call.name} needs a secret that could not be read: {exc}; nothing ran", True
    try:
        return found.invoke(call.arguments, loop=loop, secrets=values), False
    except ToolArgumentsError as exc:
        return f"Error: invalid arguments for {call.name}: {exc}", True
    except ToolCallFailed as exc:  # a tool server's failure or error result, written for the model
        log.info("tool %s failed: %s", call.name, scrub_values(str(exc)))
        return f"Error: {exc}", True
    except Exception as exc:  # noqa: BLE001 - the model sees the error and the turn goes on
        log.info("tool %s raised %s: %s", call.name, type(exc).__name__, scrub_values(str(exc)))
        return f"Error: {call.name} raised {type(exc).__name__}: {exc}", True


def _run_in_order(calls: list[tuple[concurrent.futures.Future[tuple[str, bool, float, str | None, tuple[Any, ...]]], Tool, ToolCall]],
                  cancel: CancelToken, loop: asyncio.AbstractEventLoop | None,
                  secrets: SessionSecrets | None) -> None:
    """Run the sequential calls one after another; after a cancel request none begins (their
    futures stay pending: the waiting side raises :class:`Cancelled`)."""
    for future, found, call in calls:
        if cancel.is_set():
            return
        _run_into(future, found, call, loop, secrets)


def _run_into(future: concurrent.futures.Future[tuple[str, bool, float, str | None, tuple[Any, ...]]], found: Tool, call: ToolCall,
              loop: asyncio.AbstractEventLoop | None, secrets: SessionSecrets | None = None) -> None:
    if not future.set_running_or_notify_cancel():
        return
    began = time.perf_counter()
    try:
        text, is_error, whole, images = invoke_call(found, call, loop, secrets)
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt/SystemExit raised by a tool
        future.set_exception(exc)
    else:
        future.set_result((text, is_error, time.perf_counter() - began, whole, images))
