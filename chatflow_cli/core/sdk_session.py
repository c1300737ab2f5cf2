"""An OpenAI Agents SDK ``Session`` kept in a chatflow store (the ``agents-sdk`` extra).

Switching an Agents SDK program to chatflow's store is two lines::

    from chatflow_cli import ChatflowSession
    session = ChatflowSession("user-123", "conversations.db")   # was SQLiteSession("user-123", "conversations.db")

    result = await Runner.run(agent, "Hello", session=session)

:class:`ChatflowSession` implements the SDK's ``Session`` protocol (``session_id``,
``session_settings``, ``get_items(limit)``, ``add_items(items)``, ``pop_item()``,
``clear_session()``) on any chatflow store: the in-memory :class:`SessionStore`,
:class:`SQLiteSessionStore` (several processes on one file) and any other
:class:`BaseSessionStore`. The session is a normal chatflow session: ``chatflow sessions
show``, ``replay``, ``export`` and search see its turns.

How items are kept
------------------
Each item becomes a chatflow message that carries the item itself (``Message.items``), so
``get_items`` returns every item exactly as it was added (a JSON copy), in the order added:

* a user message item (``{"role": "user", ...}``) starts a turn (a USER message with its text);
* a ``system`` or ``developer`` message item while the session has no turn yet is a SYSTEM
  message with its text (after the first turn it is kept as any other item, below, so the
  order stays as added);
* consecutive ``function_call`` items of one ``add_items`` call are one MODEL message with
  those tool calls; each ``function_call_output`` is the TOOL message answering its call;
* an assistant message, a reasoning item and any other item is a MODEL message (its text or
  reasoning when it has some, else none: chatflow's own Runner never sends it);
* an item that chatflow's history rules cannot place as such -- a ``function_call_output``
  whose call is not open, anything before the first user message -- is kept on a MODEL
  message of its own (after an empty USER message that opens a turn, when none is open);
  a new item while tool calls are still unanswered first closes them with a result named
  ``chatflow.sdk_gap`` (``get_items`` leaves those out).

Items carry no agent name, so model messages are labelled with the session's active
agent, as chatflow's own Runner labels its replies: ``agent_name`` for a session created by
the plain ``Runner.run``, the starting agent's name for one :meth:`ChatflowSession.run`
creates (a run that starts with another agent than the active one makes it active first). A handoff's output (the SDK answers a
``transfer_to_<agent>`` call with ``{"assistant": "<agent name>"}``) makes the agent it
names the active agent -- a ``handoff`` event at that place in the turn -- and labels the
items after it, so ``sessions show`` reads ``handoff: Support -> Billing``.

Messages chatflow itself wrote in the session (``chatflow chat -s ID``) are returned as the
equivalent items (``{"role": "user", ...}``, ``{"role": "assistant", ...}``,
``function_call``, ``function_call_output``), so an SDK program can continue a session
started on the command line.

Contract
--------
* ``add_items`` is atomic: one store transaction, its events have consecutive ``seq``;
  two processes adding to one SQLite file at once each land whole, one after the other.
* ``get_items(limit)``: the newest ``limit`` items in chronological order (``None``: the
  ``session_settings.limit``, else all; ``0``: none; a negative limit: all); never more
  than ``limit`` items. With ``turn_safe=True`` it returns the newest whole turns that fit
  in ``limit`` -- never a ``function_call_output`` without its call. When even the newest
  turn does not fit, the limit cuts it: its newest ``limit`` items are returned, minus any
  ``function_call_output`` whose ``function_call`` was cut off (so fewer than ``limit``
  items may come back). With ``max_turns=N`` the window itself is the newest N whole turns.
* ``pop_item`` removes and returns the newest item, or None when there is none: its turn is
  rolled back (a ``rollback`` event, as ``sessions rollback`` writes) and written again
  without that item, plus an ``sdk.item_popped`` event holding the item. With no turn left,
  the newest SYSTEM message's item is popped the same way (a ``rollback`` with
  ``"system": true``, the other SYSTEM messages written again).
* ``clear_session`` empties the window, SYSTEM messages too (a ``rollback`` to turn 0 with
  ``"system": true`` and an ``sdk.session_cleared`` event); the log keeps everything.
* A busy session (a ``chatflow chat`` turn running on it) makes ``add_items``,
  ``pop_item`` and ``clear_session`` try again with a short backoff for up to ``wait``
  seconds, then raise ``SessionBusyError``; they also raise ``SessionTerminatedError``,
  ``add_items`` ``SessionArchivedError`` (a user item in an archived session) and
  ``TypeError`` (an item that is not a JSON-serialisable dict).
* An injected store is never closed by the session; a store the session opened from a
  path (or the in-memory one it made) is closed by :meth:`close`.

Beyond the SDK's own sessions: :meth:`ChatflowSession.run` runs ``Runner.run`` with the
session's remembered active agent (a handoff in one run is the starting agent of the
next), a message id de-duplicated with the store's claims (a redelivered webhook message
runs once) and an idempotency key (a retried call with the same input returns the first
run's output without running again; another input raises ``IdempotencyConflictError``).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .errors import IdempotencyConflictError, SessionBusyError, UsageError
from .memory import BaseSessionStore, SessionContext, SessionStore
from .memory import check_wait, json_problem, json_sha256
from .messages import Message, Role, ToolCall, compact_json
from .runner import DEFAULT_WAIT_S

if TYPE_CHECKING:  # the SDK's own types, so a type checker sees the ``Session`` protocol met
    # (ignored when the SDK is absent: the names are then Any; never imported at run time)
    from agents.items import TResponseInputItem  # type: ignore[import-not-found,unused-ignore]
    from agents.memory.session_settings import SessionSettings  # type: ignore[import-not-found,unused-ignore]

__all__ = ["GAP_TOOL_NAME", "ChatflowSession", "SessionRun"]

#: ``name`` of the TOOL result that closes tool calls no output was added for.
GAP_TOOL_NAME = "chatflow.sdk_gap"
_GAP_TEXT = "No output was added for this call before the next item."
#: The agent name of sessions the SDK session creates unless ``agent_name`` says otherwise.
DEFAULT_AGENT_NAME = "Assistant"
#: ``max_turns`` of sessions the SDK session creates: the SDK expects every item back.
UNBOUNDED_TURNS = 1_000_000
#: The first and the longest pause between two tries of an edit on a busy session, in seconds.
_BUSY_BACKOFF_S = (0.02, 0.25)

#: The agent a :meth:`ChatflowSession.run` starts with, until the run's first ``add_items``
#: makes it the active agent: ``(session object, [name])``, the list emptied when it is used.
_RUN_START: contextvars.ContextVar[tuple[object, list[str]] | None] = contextvars.ContextVar(
    "chatflow_sdk_run_start", default=None)


def _require_sdk() -> Any:
    try:
        from agents.memory import session_settings
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "ChatflowSession needs the OpenAI Agents SDK: pip install 'chatflow-cli[agents-sdk]'"
        ) from exc
    return session_settings


# -- items <-> messages ------------------------------------------------------------------
def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict):
                kind = part.get("type")
                if kind in ("input_text", "output_text", "text"):
                    out.append(str(part.get("text") or ""))
                elif kind == "refusal":
                    out.append(str(part.get("refusal") or ""))
                elif kind:
                    out.append(f"[{kind}]")
            elif isinstance(part, str):
                out.append(part)
        return "".join(out)
    return json.dumps(content, ensure_ascii=False)


def _reasoning_text(item: Mapping[str, Any]) -> str | None:
    parts = [p.get("text", "") for p in item.get("summary") or [] if isinstance(p, dict)]
    parts += [p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict)]
    text = "\n".join(p for p in parts if p)
    return text or None


def _is_user(item: Mapping[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def _is_instructions(item: Mapping[str, Any]) -> bool:
    """A ``system`` or ``developer`` message item."""
    return item.get("role") in ("system", "developer") and item.get("type", "message") == "message"


def _is_skipped(msg: Message) -> bool:
    """Messages the session wrote only to keep chatflow's history valid."""
    if msg.items:
        return False
    if msg.role is Role.TOOL and msg.name == GAP_TOOL_NAME:
        return True
    return msg.role is Role.USER and not msg.content


def _items_of(msg: Message) -> list[dict[str, Any]]:
    """The items a window message stands for (its own, or the equivalent of chatflow's)."""
    if msg.items:
        return list(msg.items)
    if _is_skipped(msg):
        return []
    if msg.role is Role.USER:
        return [{"role": "user", "content": msg.content or ""}]
    if msg.role is Role.SYSTEM:
        return [{"role": "system", "content": msg.content or ""}]
    if msg.role is Role.TOOL:
        return [{"type": "function_call_output", "call_id": msg.tool_call_id or "", "output": msg.content or ""}]
    out: list[dict[str, Any]] = []
    if msg.content:
        out.append({"role": "assistant", "content": msg.content})
    for call in msg.tool_calls:
        out.append({"type": "function_call", "call_id": call.id, "name": call.name, "arguments": call.arguments})
    return out


def _json_text(item: Any, index: int) -> str:
    """``item`` as strict JSON text (TypeError for an item that is not a JSON-serialisable
    dict, a float NaN or Infinity included)."""
    if not isinstance(item, Mapping):
        raise TypeError(f"item {index} is a {type(item).__name__}, not a dict")
    try:
        return compact_json(item)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"item {index} is not JSON-serialisable: {json_problem(exc)}") from None


def _close_gaps(ctx: SessionContext) -> None:
    for call in ctx.pending_tool_calls:
        ctx.add_message(Message.tool(call.id, _GAP_TEXT, name=GAP_TOOL_NAME, is_error=True))


def _ensure_turn(ctx: SessionContext) -> None:
    if ctx.turn_count == 0:
        ctx.add_message(Message.user(""))


def _handoff_target(call: ToolCall, output: Any) -> str | None:
    """The agent a handoff's output names: the SDK answers a ``transfer_to_*`` call with
    ``{"assistant": "<agent name>"}``; None for any other call or output."""
    if not call.name.startswith("transfer_to_") or not isinstance(output, str) or '"assistant"' not in output:
        return None
    try:
        data = json.loads(output)
    except ValueError:
        return None
    name = data.get("assistant") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else None


def _place(ctx: SessionContext, items: Sequence[dict[str, Any]], agent: str | None = None) -> None:
    """Append ``items`` to the context as messages (see the module docstring).

    Model items are labelled with ``agent``, else the session's active agent; a handoff's
    output makes the agent it names the active agent (a ``handoff`` event at that place in
    the turn) and labels the items after it."""
    if agent is None:
        agent = getattr(ctx.active_agent, "name", None) or None
    i = 0
    while i < len(items):
        item = items[i]
        kind = item.get("type")
        if ctx.turn_count == 0 and _is_instructions(item):  # instructions before any turn: a SYSTEM message
            ctx.add_message(Message(Role.SYSTEM, _content_text(item.get("content")), items=(item,)))
            i += 1
            continue
        if _is_user(item):
            _close_gaps(ctx)
            ctx.add_message(Message(Role.USER, _content_text(item.get("content")), items=(item,)))
            i += 1
            continue
        if kind == "function_call":
            group = [item]
            while i + len(group) < len(items) and items[i + len(group)].get("type") == "function_call":
                group.append(items[i + len(group)])
            ids = [str(g.get("call_id") or "") for g in group]
            known = {c.id for m in ctx.history for c in m.tool_calls}
            if all(ids) and len(set(ids)) == len(ids) and not known & set(ids):
                _close_gaps(ctx)
                _ensure_turn(ctx)
                calls = [ToolCall(str(g["call_id"]), str(g.get("name") or ""), str(g.get("arguments") or "{}"))
                         for g in group]
                ctx.add_message(Message(Role.MODEL, None, tuple(calls), agent=agent, items=tuple(group)))
                i += len(group)
                continue
        elif kind == "function_call_output":
            call_id = str(item.get("call_id") or "")
            open_calls = {c.id: c for c in ctx.pending_tool_calls}
            if call_id in open_calls:
                output = item.get("output")
                text = output if isinstance(output, str) else _content_text(output)
                call = open_calls[call_id]
                target = _add_output(ctx, call, Message(Role.TOOL, text, tool_call_id=call_id, name=call.name,
                                                        items=(item,)), output)
                if target is not None:
                    agent = target
                i += 1
                continue
        _close_gaps(ctx)
        _ensure_turn(ctx)
        if kind in (None, "message") and item.get("role") == "assistant":
            ctx.add_message(Message(Role.MODEL, _content_text(item.get("content")) or None, agent=agent,
                                    items=(item,)))
        elif kind == "reasoning":
            ctx.add_message(Message(Role.MODEL, None, reasoning=_reasoning_text(item), agent=agent, items=(item,)))
        else:
            ctx.add_message(Message(Role.MODEL, None, agent=agent, items=(item,)))
        i += 1


def _add_output(ctx: SessionContext, call: ToolCall, msg: Message, output: Any) -> str | None:
    """Add ``msg``, the TOOL message answering ``call``; a handoff's ``output`` makes the agent
    it names active (a ``handoff`` event there), and that name is returned (else None)."""
    ctx.add_message(msg)
    target = _handoff_target(call, output)
    if target is not None:
        ctx.set_active_agent(target, tool_call_id=call.id)
    return target


def _readd(ctx: SessionContext, msg: Message) -> None:
    """Add a message of a rolled-back turn again; a handoff's output makes its agent active again."""
    call = next((c for c in ctx.pending_tool_calls if c.id == msg.tool_call_id), None) if msg.role is Role.TOOL else None
    if call is None:
        ctx.add_message(msg)
    else:
        _add_output(ctx, call, msg, msg.content)


def _without_orphans(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` without the ``function_call_output`` items whose ``function_call`` is not among them."""
    calls = {it.get("call_id") for it in items if it.get("type") == "function_call"}
    return [it for it in items if it.get("type") != "function_call_output" or it.get("call_id") in calls]


def _dict_items(data: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`_items_of` for a message in its ``to_dict()`` form (no Message built)."""
    items = data.get("items")
    if items:
        return list(items)
    return _items_of(Message.from_dict(data))


def _turn_items(rows: Sequence[tuple[int, dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """The window's items grouped by turn (SYSTEM messages, turn 0, form a group of their own)."""
    groups: list[list[dict[str, Any]]] = []
    last = None
    for turn, data in rows:
        if turn != last:
            groups.append([])
            last = turn
        groups[-1].extend(_dict_items(data))
    return groups


@dataclass(slots=True)
class SessionRun:
    """What :meth:`ChatflowSession.run` returns.

    ``result``: the SDK's ``RunResult`` (None when nothing ran); ``final_output``: the run's
    final output (for a replay, the stored one, as text); ``last_agent``: the name of the
    agent that answered, now the session's active agent; ``replayed``: the idempotency key
    or message id was seen before, so nothing ran (``duplicate``: it was a message id).
    """

    result: Any
    final_output: Any
    last_agent: str | None
    replayed: bool = False
    duplicate: bool = False


class ChatflowSession:
    """An Agents SDK ``Session`` on a chatflow store (see the module docstring).

    Args:
        session_id: the chatflow session id (created on the first ``add_items``).
        store: a :class:`BaseSessionStore` (injected: never closed here), a path to a
            SQLite file (opened here, closed by :meth:`close`), or None for a private
            in-memory store.
        session_settings: the SDK's ``SessionSettings`` (or a dict); ``limit`` is the
            default of ``get_items``.
        turn_safe: ``get_items(limit)`` returns whole turns only.
        max_turns: the context window of a session created here, in turns (default: all).
        agent_name: the active agent of a session created here by ``add_items`` (the label
            of its replies); a session created by :meth:`run` takes the starting agent's name.
        metadata: the metadata of a session created here.
        wait: seconds ``add_items``, ``pop_item`` and ``clear_session`` wait for a busy
            session (a ``chatflow chat`` turn running on it), trying again with a short
            backoff, before :class:`SessionBusyError` (default ``DEFAULT_WAIT_S``, 60, as the
            library Runner; 0 refuses a busy session at once).

    Raises:
        ImportError: the ``openai-agents`` package is not installed.
        ValueError, TypeError: an empty ``session_id``, or a negative or non-number ``wait``.
    """

    def __init__(
        self,
        session_id: str,
        store: BaseSessionStore | str | Path | None = None,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
        turn_safe: bool = False,
        max_turns: int | None = None,
        agent_name: str = DEFAULT_AGENT_NAME,
        metadata: Mapping[str, Any] | None = None,
        wait: float = DEFAULT_WAIT_S,
    ) -> None:
        settings_mod = _require_sdk()
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        self.wait = check_wait(wait)
        self.session_id: str = session_id
        self.session_settings: SessionSettings | None = (
            settings_mod.coerce_session_settings(
                dict(session_settings) if isinstance(session_settings, Mapping) else session_settings)
            if session_settings is not None else settings_mod.SessionSettings()
        )
        self._owns_store = not isinstance(store, BaseSessionStore)
        if isinstance(store, BaseSessionStore):
            self.store = store
        elif store is None:
            self.store = SessionStore()
        else:
            from .sqlite_store import SQLiteSessionStore

            self.store = SQLiteSessionStore(store)
        self.turn_safe = turn_safe
        self._max_turns = max_turns if max_turns is not None else UNBOUNDED_TURNS
        self._agent_name = agent_name
        self._metadata = dict(metadata or {})
        self._copy_out = isinstance(self.store, SessionStore)  # the memory store keeps the objects
        # The window's items grouped by turn as one JSON text, at a log position, with the
        # number of turns it holds: get_items() answers from it while the log has not moved
        # (one indexed read), add_items() extends it while the session's window holds them all.
        self._cache: tuple[tuple[str, int], str, int] | None = None

    # -- the Session protocol ----------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items (JSON dicts as added), oldest first; see the module docstring for ``limit``."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        per_turn = await self._window_items()
        if limit is None or limit < 0:
            items = [it for group in per_turn for it in group]
        elif limit == 0:
            items = []
        elif self.turn_safe:
            kept: list[list[dict[str, Any]]] = []
            count = 0
            for group in reversed(per_turn):
                if count + len(group) > limit:
                    break
                kept.append(group)
                count += len(group)
            if not kept and per_turn:  # the limit cuts the newest turn: its tail, minus orphans
                kept.append(_without_orphans(per_turn[-1][-limit:]))
            items = [it for group in reversed(kept) for it in group]
        else:
            flat = [it for group in per_turn for it in group]
            items = flat[-limit:]
        return cast("list[TResponseInputItem]", copy.deepcopy(items) if self._copy_out else items)

    async def _window_items(self) -> list[list[dict[str, Any]]]:
        """The window's items grouped by turn: from the cache when the log has not moved."""
        cache = self._cache
        if cache is not None and await self.store.alog_position(self.session_id) == cache[0]:
            groups: list[list[dict[str, Any]]] = json.loads(cache[1])  # fresh objects, as a read gives
            return groups
        position, rows = await self.store.awindow_dicts(self.session_id)
        groups = _turn_items(rows)
        self._cache = None
        if position is not None:
            self._cache = (position, compact_json(groups), len({turn for turn, _ in rows if turn > 0}))
        return groups

    def _extend_cache(self, result: Any, turn_open: bool, items: list[dict[str, Any]], texts: list[str]) -> None:
        """After add_items: the cache follows when it was current just before the edit.

        The cache text is ``[[item, ...], ...]``; the new items are spliced in with one
        concatenation, opening a group where :func:`_place` opens a turn (with no turn, the
        only group is the SYSTEM messages' one, turn 0). When the session's window no longer
        holds every turn of the cache (its ``max_turns`` pruned the oldest), the cache is
        dropped: the next read takes the window from the store."""
        cache, self._cache = self._cache, None
        if cache is None or result.position is None or cache[0] != result.before:
            return
        text, turns = cache[1], cache[2]
        has_group = text != "[]"
        head = text[:-2] if has_group else "["  # inside the last group, or inside the outer list
        in_group = has_group and not head.endswith("[")  # the open group already holds an item
        pieces: list[str] = []
        for item, item_text in zip(items, texts):
            if not turn_open and _is_instructions(item):  # a SYSTEM message: the turn-0 group
                if not has_group:
                    pieces.append("[")
                    has_group = True
                elif in_group:
                    pieces.append(",")
            elif _is_user(item) or not turn_open or not has_group:
                pieces.append("],[" if has_group else "[")
                has_group = turn_open = True
                turns += 1
            elif in_group:
                pieces.append(",")
            pieces.append(item_text)
            in_group = True
        if result.max_turns is None or turns <= result.max_turns:
            self._cache = (result.position, head + "".join(pieces) + "]]", turns)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in one transaction (nothing is written when one is not a JSON object).

        The first ``add_items`` of a :meth:`run` makes the agent the run starts with the
        active agent first (a ``handoff`` event when it differs), in the same transaction.

        Raises:
            TypeError: an item that is not a JSON-serialisable dict (a float NaN or Infinity
                in it too: the stores write strict JSON), naming the item.
            UsageError: text in an item that is not valid Unicode (a lone surrogate).
            SessionBusyError: a turn still runs on the session after ``wait`` seconds.
            SessionArchivedError: the session is archived (a user item opens no turn).
            SessionTerminatedError: the session is terminated.
        """
        if not items:
            return
        texts = [_json_text(item, k) for k, item in enumerate(items)]
        copies: list[dict[str, Any]] = json.loads("[" + ",".join(texts) + "]")
        start = self._take_run_start()

        turn_open: list[bool] = []

        def change(ctx: SessionContext) -> None:
            if start is not None and getattr(ctx.active_agent, "name", ctx.active_agent) != start:
                ctx.set_active_agent(start)
            turn_open.append(ctx.turn_count > 0)
            _place(ctx, copies)

        result = await self._edit(change, create_agent=start or self._agent_name, max_turns=self._max_turns,
                                  metadata=self._metadata, last_turns=1)
        self._extend_cache(result, bool(turn_open and turn_open[-1]), copies, texts)

    def _take_run_start(self) -> str | None:
        """The agent the current :meth:`run` starts with, once (None outside a run, or after)."""
        pending = _RUN_START.get()
        if pending is None or pending[0] is not self or not pending[1]:
            return None
        return pending[1].pop()

    async def _edit(self, change: Callable[[SessionContext], Any], **kwargs: Any) -> Any:
        """``store.aedit`` on this session, tried again while the session is busy, up to ``wait`` seconds.

        Raises:
            SessionBusyError: still busy when the wait ran out.
        """
        deadline = time.monotonic() + self.wait
        pause = _BUSY_BACKOFF_S[0]
        while True:
            try:
                return await self.store.aedit(self.session_id, change, **kwargs)
            except SessionBusyError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, _BUSY_BACKOFF_S[1])

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item; None when the session has none.

        Raises:
            SessionBusyError: a turn still runs on the session after ``wait`` seconds.
            SessionTerminatedError: the session is terminated.
        """

        def change(ctx: SessionContext) -> dict[str, Any] | None:
            turns = ctx.turns
            if not turns:  # only SYSTEM messages: the newest goes, the others are written again
                systems = [m for m in ctx.history if m.role is Role.SYSTEM]
                items = _items_of(systems[-1]) if systems else []
                if not items:
                    return None
                ctx.rollback_to(0, system=True)
                for msg in systems[:-1]:
                    ctx.add_message(msg)
                ctx.record_event("sdk.item_popped", {"turn": 0, "item": items[-1]})
                return items[-1]
            turn = turns[-1]
            messages = list(turn.messages)
            index = next((k for k in range(len(messages) - 1, -1, -1) if _items_of(messages[k])), None)
            if index is None:
                return None
            target = messages[index]
            items = _items_of(target)
            popped = items[-1]
            ctx.rollback_to(turn.number - 1)  # the agent active before the turn comes back
            before = messages[:index]
            if items[:-1] or not all(_is_skipped(m) for m in before):
                for msg in before:
                    _readd(ctx, msg)
                if items[:-1]:
                    _place(ctx, items[:-1], target.agent)
            ctx.record_event("sdk.item_popped", {"turn": turn.number, "item": popped})
            return popped

        self._cache = None
        popped = (await self._edit(change, last_turns=1)).value
        return cast("TResponseInputItem | None",
                    copy.deepcopy(popped) if (popped is not None and self._copy_out) else popped)

    async def clear_session(self) -> None:
        """Empty the window; the event log keeps every item.

        Raises:
            SessionBusyError: a turn still runs on the session after ``wait`` seconds.
            SessionTerminatedError: the session is terminated.
        """

        def change(ctx: SessionContext) -> None:
            if ctx.turn_count or any(m.role is Role.SYSTEM for m in ctx.history):
                ctx.rollback_to(0, system=True)
            ctx.record_event("sdk.session_cleared", {})

        self._cache = None
        await self._edit(change, last_turns=1)

    # -- beyond the protocol -----------------------------------------------------------
    def close(self) -> None:
        """Close the store when this session opened it; an injected store stays open."""
        if self._owns_store:
            self.store.close()

    @property
    def active_agent_name(self) -> str | None:
        """The session's active agent (None before the session exists)."""
        return self.store.active_agent_name(self.session_id)

    async def aactive_agent_name(self) -> str | None:
        """:attr:`active_agent_name`, read off the event loop for an on-disk store."""
        return await self.store.aactive_agent_name(self.session_id)

    async def set_active_agent(self, name: str) -> None:
        """Make ``name`` the active agent (a ``handoff`` event when it changes)."""

        def change(ctx: SessionContext) -> None:
            ctx.set_active_agent(name)

        await self._edit(change, create_agent=name, max_turns=self._max_turns, metadata=self._metadata,
                         last_turns=1)

    async def run(
        self,
        starting_agent: Any,
        input: Any,
        *,
        agents: Mapping[str, Any] | Callable[[str], Any] | None = None,
        message_id: str | None = None,
        idempotency_key: str | None = None,
        runner: Any = None,
        **run_kwargs: Any,
    ) -> SessionRun:
        """``Runner.run`` on this session, with chatflow's active agent and de-duplication.

        The run starts with the session's active agent (found by name in ``agents``, a
        mapping or a callable; ``starting_agent`` when the session is new or the name is
        unknown), and the agent a run starts with is the session's active agent: a session
        the run creates is created with its name, and when the remembered agent is not the
        one the run starts with (not found in ``agents``), the run's first ``add_items``
        makes it the active agent first (a ``handoff`` event), so replies are labelled with
        the agent that gave them. The agent that answered becomes the active agent.

        ``message_id``: a webhook message id claimed in the store (``claim_message``): a
        duplicate delivery returns ``SessionRun(duplicate=True, replayed=True)`` without
        running, and a run that raises frees the claim for the redelivery.
        ``idempotency_key``: the ``sdk.run_completed`` event of a run keeps the key and the
        SHA-256 of its ``input`` (``input_sha256``); the key coming back with the same input
        returns the first run's final output (as stored: text) with ``replayed=True``
        without running, with another input raises :class:`IdempotencyConflictError`; a run
        that raised leaves the key free.

        Raises:
            IdempotencyConflictError: ``idempotency_key`` completed a run with another input.
            UsageError: a run with ``idempotency_key`` is in progress.
            whatever ``Runner.run`` raises (after freeing the claims), including the errors
            of :meth:`add_items`.
        """
        if runner is None:
            from agents import Runner as runner
        claim = message_id
        key_claim = f"idempotency:{self.session_id}:{idempotency_key}" if idempotency_key is not None else None
        digest = _input_digest(input)
        if key_claim is not None:
            done = await self._completed_run(idempotency_key or "", digest)
            if done is not None:
                return done
            if not await self.store.aclaim_message(key_claim):
                done = await self._completed_run(idempotency_key or "", digest)
                if done is not None:
                    return done
                raise UsageError(f"a run with idempotency key {idempotency_key!r} is in progress",
                                 session_id=self.session_id)
        if claim is not None and not await self.store.aclaim_message(claim):
            if key_claim is not None:
                await self.store.arelease_message(key_claim)
            return SessionRun(None, None, await self.aactive_agent_name(), replayed=True, duplicate=True)
        agent = starting_agent
        name = await self.aactive_agent_name()
        if name is not None and name != getattr(starting_agent, "name", None) and agents is not None:
            found = agents(name) if callable(agents) else agents.get(name)
            if found is not None:
                agent = found
        start = getattr(agent, "name", None)
        token = _RUN_START.set((self, [start]) if isinstance(start, str) and start else None)
        try:
            result = await runner.run(agent, input, session=self, **run_kwargs)
        except BaseException:
            for held in (claim, key_claim):
                if held is not None:
                    await self.store.arelease_message(held)
            raise
        finally:
            _RUN_START.reset(token)
        last = getattr(getattr(result, "last_agent", None), "name", None)
        if last is not None:
            await self.set_active_agent(last)
        if idempotency_key is not None:
            payload = {"idempotency_key": idempotency_key, "input_sha256": digest,
                       "final_output": _plain(result.final_output), "last_agent": last}
            await self.store.aappend_event(self.session_id, "sdk.run_completed", payload,
                                           idempotency_key=f"sdk-run:{idempotency_key}")
        for held in (claim, key_claim):
            if held is not None:
                await self.store.acomplete_message(held)
        return SessionRun(result, result.final_output, last)

    async def _completed_run(self, key: str, digest: str) -> SessionRun | None:
        """The stored outcome of the run completed under ``key``, or None.

        Raises:
            IdempotencyConflictError: that run had another input (``digest`` differs).
        """
        try:
            events = await self.store.aevents(self.session_id)
        except Exception:
            return None
        for event in reversed(events):
            if event.type == "sdk.run_completed" and event.payload.get("idempotency_key") == key:
                stored = event.payload.get("input_sha256")
                if stored is not None and stored != digest:  # (a run stored before digests: replayed)
                    raise IdempotencyConflictError(
                        f"idempotency key {key!r} was used with another input", session_id=self.session_id)
                return SessionRun(None, event.payload.get("final_output"), event.payload.get("last_agent"),
                                  replayed=True)
        return None

    def __repr__(self) -> str:
        return f"ChatflowSession(session_id={self.session_id!r}, store={self.store!r})"


def _input_digest(value: Any) -> str:
    """SHA-256 of a run's input (text or items) as canonical JSON; what is not JSON counts by its repr."""
    return json_sha256(value, default=repr)


def _plain(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)  # stored in an event: strict JSON
        return value
    except (TypeError, ValueError):
        return str(value)
