"""Compaction: summarise turns 1..K of a session into one stored summary.

A compaction takes the session like a turn does (``running`` under this process, so other
callers find it busy), sends one tool-free request asking the model to summarise the
conversation up to turn K, and stores the answer as a SYSTEM message flagged as the
summary of turns 1..K (``Message.summary_through``), together with a ``context.compacted``
event ``{"through", "model", "tokens_before", "tokens_after", "instructions", "summary"}``.
Nothing is deleted: every turn stays in the log (``sessions show --all``).

The context window then holds the real SYSTEM messages, the newest summary and the live
turns after K. A rollback to n < K marks the summaries covering turns after n removed, so
the window falls back to an older summary or to plain turns; a copy of the session up to
turn N takes only summaries with K <= N (:meth:`BaseSessionStore.summaries`).

The request: a SYSTEM message with the compaction prompt (:data:`DEFAULT_PROMPT`, or the
caller's), then one USER message holding the earlier summary (when one covers turns
before K) and a transcript of the turns after it up to K, then the caller's instructions.
When the agent has tools their definitions go along with ``tool_choice: "none"``, so the
model reads the calls in the transcript but cannot make one; with no tools the request has
neither field (providers refuse ``tool_choice`` without tools).

A compaction with the same K and the same instructions as the session's newest live
summary is not made again: the stored one is returned (``CompactionResult.repeated``).

A summary is refused (nothing stored, exit 5) when it did not finish (cut by the token limit
or a content filter, or a stream that ended with no finish reason) and when it is not shorter
than the earlier summary and the turns it summarises (:class:`SummaryTooLongError`): it would
save no room. A Runner whose automatic compaction cannot make room stores a
``context.compaction_stopped`` event and does not compact the session automatically again
until a later compaction or a rollback (:func:`compaction_stopped`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from .errors import UsageError
from .events import Event
from .memory import Owner
from .messages import Message, Role
from .tokens import message_tokens, reply_tokens

__all__ = ["DEFAULT_PROMPT", "KEEP_SHARE", "CompactionResult", "compact_session", "compaction_point",
           "compaction_stopped", "compaction_through"]

#: The instructions a compaction request starts with (config ``compact_prompt`` replaces it).
DEFAULT_PROMPT = (
    "You summarise a conversation so that it can continue from your summary alone. Write a concise "
    "summary that keeps every decision made, every name, identifier, number, file and order id "
    "mentioned, the open tasks and questions, and the preferences the user stated. Write plain "
    "sentences or short bullet points; do not invent anything and do not address the user."
)


@dataclasses.dataclass(frozen=True, slots=True)
class CompactionResult:
    """What :func:`compact_session` did.

    ``through``: K, the last turn summarised; ``summary``: the stored summary text;
    ``tokens_before`` / ``tokens_after``: the stored window's tokens before and after;
    ``events``: the events written; ``repeated``: the same K and instructions were
    compacted before, nothing was sent or written.
    """

    session_id: str
    through: int
    summary: str
    model: str
    tokens_before: int
    tokens_after: int
    instructions: str | None = None
    events: tuple[Event, ...] = ()
    repeated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "through": self.through, "model": self.model,
                "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
                "instructions": self.instructions, "summary": self.summary, "repeated": self.repeated}


#: The share of the budget an automatic compaction keeps as live turns (:func:`compaction_point`).
KEEP_SHARE = 0.3


def compaction_point(turns: Sequence[tuple[int, int]], budget: int, keep_share: float = KEEP_SHARE) -> int | None:
    """The K an automatic compaction summarises up to, or None when there is nothing to gain.

    ``turns``: ``(number, tokens)`` of the live turns of the window, oldest first. The newest
    whole turns totalling at most ``keep_share`` of ``budget`` stay as they are (at least
    the newest one); everything before them is summarised.
    """
    kept = 0
    total = 0
    for _number, tokens in reversed(turns):
        if kept and total + tokens > budget * keep_share:
            break
        total += tokens
        kept += 1
    if kept >= len(turns):
        return None
    return turns[len(turns) - kept - 1][0]


def compaction_through(fixed: int, turns: Sequence[tuple[int, int]], new_turn: int, budget: int,
                       compact_at: float) -> int | None:
    """K an automatic compaction must summarise through before the next request, or None.

    ``fixed``: the tokens every request carries (SYSTEM messages, the summary in use, the
    agent's instructions); ``turns``: ``(number, tokens)`` of the live turns of the window,
    oldest first; ``new_turn``: the new message's tokens. Turns are kept newest first while
    they fit ``budget`` beside ``fixed`` and the new message; the newest that does not fit,
    and every older one, must leave the request, so K is at least that turn (no turn leaves
    without a summary). Past ``compact_at`` of the budget, K also reaches back so that about
    30 % of the budget stays as live turns (:func:`compaction_point`, the new message counted
    as the newest turn). None when everything fits under ``compact_at``.
    """
    if not turns:
        return None
    room = budget - fixed - new_turn
    must_leave = 0
    for number, cost in reversed(turns):
        if cost > room:
            must_leave = number
            break
        room -= cost
    total = fixed + new_turn + sum(cost for _, cost in turns)
    if not must_leave and total <= compact_at * budget:
        return None
    point = compaction_point([*turns, (turns[-1][0] + 1, new_turn)], budget)
    return max(must_leave, point or 0) or None


def _transcript(turns: dict[int, list[Message]]) -> str:
    """The turns as plain text, one block a turn (tool calls and results included)."""
    lines: list[str] = []
    for number in sorted(turns):
        lines.append(f"## Turn {number}")
        for msg in turns[number]:
            if msg.role is Role.USER:
                lines.append(f"User: {msg.content or ''}")
                if msg.attachments:  # named, not sent again: the summary stands for them
                    from .attachments import attachment_line

                    lines.extend(f"User attached {attachment_line(a)}" for a in msg.attachments)
            elif msg.role is Role.MODEL:
                if msg.content:
                    lines.append(f"Assistant: {msg.content}")
                for call in msg.tool_calls:
                    lines.append(f"Assistant called {call.name}({call.arguments})")
            elif msg.role is Role.TOOL:
                lines.append(f"Result of {msg.name or 'the tool'}: {msg.content or ''}")
    return "\n".join(lines)


def compact_session(
    store: Any,
    session_id: str,
    client: Any,
    model: str,
    *,
    through: int | None = None,
    instructions: str | None = None,
    prompt: str | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    owner: Owner | None = None,
    cancel: Any = None,
) -> CompactionResult:
    """Summarise turns 1..``through`` of ``session_id`` (default: every turn but the newest).

    Args:
        store: a session store (``begin_compaction``/``finish_compaction``).
        client: a model client with ``complete(model, messages, tools=..., tool_choice=...)``.
        model: the model that writes the summary.
        through: K, the last turn summarised, in ``1..turn_count``.
        instructions: what to focus on, appended to the request (``/compact TEXT``).
        prompt: replaces :data:`DEFAULT_PROMPT`.
        tools: the agent's tool definitions (wire form): sent with ``tool_choice: "none"``.
        cancel: a ``threading.Event``; set from any thread, it stops the request at once
            (:class:`RunInterrupted`; the session is released, nothing stored).

    Raises:
        UsageError: ``through`` is not a turn of the session, or the session has no turn
            to summarise; nothing is written.
        SessionBusyError: another run holds the session.
        RunInterrupted: ``cancel`` was set; nothing was stored.
        PendingToolCallsError: the last turn waits for custom tool results.
        ProviderResponseError: the summary came back empty, or did not finish (cut by
            ``finish_reason`` ``length`` or ``content_filter``, or a stream that ended with
            no finish reason): a cut summary would silently lose what it did not reach, so
            it is refused (exit 5) and nothing is stored.
        SummaryTooLongError: the summary is not shorter (in tokens) than the earlier summary
            and the turns it summarises: it would save no room, so it is refused (exit 5)
            and nothing is stored.
        ChatflowError: the request failed (the session is released unchanged).
    """
    summary_list = store.summaries(session_id)
    info = store.session_summary(session_id)
    if through is None:
        through = info.turn_count - 1
    if isinstance(through, bool) or not isinstance(through, int) or not 1 <= through <= info.turn_count:
        where = f"1..{info.turn_count}" if info.turn_count else "none yet"
        raise UsageError(f"cannot compact session {session_id} through turn {through}: its turns are {where}",
                         session_id=session_id)
    live = [m for m, _removed in summary_list]
    newest = max(live, key=lambda m: m.summary_through or 0) if live else None
    if newest is not None and (newest.summary_through or 0) > through:
        raise UsageError(f"session {session_id} is already summarised through turn {newest.summary_through}: "
                         f"compact through a later turn, or roll back first", session_id=session_id)
    if newest is not None and newest.summary_through == through:
        last = _last_compaction(store, session_id, through)
        if last is not None and last.payload.get("instructions") == instructions:
            tokens, _ = store.window_tokens(session_id)
            return CompactionResult(session_id, through, newest.content or "", str(last.payload.get("model", "")),
                                    int(last.payload.get("tokens_before", tokens)), tokens, instructions,
                                    repeated=True)
    before, _ = store.window_tokens(session_id)
    session = store.begin_compaction(session_id, owner=owner or Owner.current())
    try:
        earlier = max((m for m in live if (m.summary_through or 0) < through),
                      key=lambda m: m.summary_through or 0, default=None)
        start = (earlier.summary_through or 0) + 1 if earlier is not None else 1
        turns = session._binding.loader(start, through) if start <= through else {}
        # what the new summary stands for: the earlier summary and the turns after it through K
        replaced = (message_tokens(earlier) if earlier is not None else 0) + sum(
            message_tokens(m) for msgs in turns.values() for m in msgs)
        parts = []
        if earlier is not None:
            parts.append(f"Summary of turns 1..{earlier.summary_through}:\n{earlier.content or ''}")
        if turns:
            parts.append(f"Conversation, turns {start}..{through}:\n{_transcript(turns)}")
        ask = f"Summarise the conversation up to turn {through}."
        if instructions:
            ask += f"\nFocus: {instructions}"
        parts.append(ask)
        wire = [Message.system(prompt or DEFAULT_PROMPT).to_wire(), Message.user("\n\n".join(parts)).to_wire()]
        try:
            reply = _ask(client, model, wire, cancel, tools=list(tools) if tools else None,
                         tool_choice="none" if tools else None, max_tokens=max_tokens, temperature=temperature)
        except Exception as exc:
            if cancel is not None and cancel.is_set():
                raise _interrupted(session_id) from None
            if getattr(exc, "error_code", None) == "context_length_exceeded":
                raise _does_not_fit(exc, session_id) from None
            raise
        if cancel is not None and cancel.is_set():
            raise _interrupted(session_id)
        text = (reply.content or "").strip()
        from .stream import ReplyState, cut_phrase, judge
        from .errors import ProviderResponseError, SummaryTooLongError

        if not text:
            raise ProviderResponseError("the model returned an empty summary; nothing was compacted",
                                        session_id=session_id)
        if cut_phrase(reply.finish_reason):
            raise ProviderResponseError(
                f"the summary was {cut_phrase(reply.finish_reason)}; nothing was compacted (use a model with a "
                "larger context or token limit, or compact fewer turns with --through)", session_id=session_id)
        verdict = judge(reply)
        if verdict.state in (ReplyState.BROKEN, ReplyState.INTERRUPTED):  # no finish reason: cut short
            raise ProviderResponseError(
                f"the summary {verdict.reason.removeprefix('the reply ')}; nothing was compacted",
                session_id=session_id)
        counted = reply_tokens(reply.usage, reasoning=bool(getattr(reply, "reasoning", None)))
        summary = dataclasses.replace(Message.summary(text, through), tokens=counted)
        if message_tokens(summary) >= replaced:
            raise SummaryTooLongError(
                f"the summary (about {message_tokens(summary)} tokens) is not shorter than what it would replace "
                f"(about {replaced} tokens); nothing was compacted (compact more turns with --through, or ask "
                "for a shorter summary with --instructions)", session_id=session_id)
        payload = {"through": through, "model": model, "tokens_before": before,
                   "instructions": instructions, "summary": text}
        events = store.finish_compaction(session, summary, payload)
    except BaseException:
        try:
            store.release(session, reason="compaction failed")
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        raise
    tokens_after = int(events[0].payload["tokens_after"])
    return CompactionResult(session_id, through, text, model, before, tokens_after, instructions, tuple(events))


def _ask(client: Any, model: str, wire: list[dict[str, Any]], cancel: Any, **kwargs: Any) -> Any:
    """The model's reply (``client.complete``); with ``cancel``, streamed so that setting the
    event closes the request at once, even while the server has not answered yet."""
    if cancel is None or not hasattr(client, "stream"):
        return client.complete(model, wire, **kwargs)
    import threading

    from .stream import ModelTurn

    stream = client.stream(model, wire, cancel=cancel, **kwargs)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if cancel.wait(0.05):
                if not done.is_set() and hasattr(stream, "cancel"):
                    stream.cancel()  # wakes a read blocked on a silent server
                return

    threading.Thread(target=watch, name="chatflow-compaction-cancel", daemon=True).start()
    reply = None
    try:
        for item in stream:
            if isinstance(item, ModelTurn):
                reply = item
    finally:
        done.set()
    if reply is None:
        from .errors import ProviderResponseError

        raise ProviderResponseError("the model's stream ended without a reply")
    return reply


#: The sizes a refusal over the context names (``(the request has 3,012 tokens; the model runs with 2,048)``).
_SIZES = re.compile(r"\((?:the request has|the prompt has)[^()]*\)")


def _does_not_fit(exc: Exception, session_id: str) -> Exception:
    """The error for a compaction refused because its own request is over the model's
    context: compacting again cannot help, so the line says what can."""
    from .errors import CompactionDoesNotFitError

    found = _SIZES.search(str(getattr(exc, "message", exc)))
    sizes = f" {found.group(0)}" if found else ""
    return CompactionDoesNotFitError(
        f"the turns to summarise do not fit the model's context either{sizes}; nothing was compacted, and "
        "compacting again cannot help: shorten the long message (roll it back: chatflow sessions rollback, /rollback in the REPL), start a "
        "new session, or use a model with a larger context", session_id=session_id)


def _interrupted(session_id: str) -> Exception:
    from .errors import RunInterrupted

    return RunInterrupted("the compaction was interrupted; nothing was compacted", session_id=session_id)


#: Events that decide whether automatic compaction is stopped (the newest of them wins).
_STOP_EVENTS = frozenset({"context.compaction_stopped", "context.compacted", "rollback"})


def compaction_stopped(store: Any, session_id: str) -> bool:
    """Whether automatic compaction is stopped for the session: its newest
    ``context.compaction_stopped`` event (a Runner's automatic compaction could not help)
    came after its newest compaction and its newest rollback."""
    newest = None
    for event in store.events(session_id):
        if event.type in _STOP_EVENTS:
            newest = event.type
    return newest == "context.compaction_stopped"


def _last_compaction(store: Any, session_id: str, through: int) -> Event | None:
    """The newest ``context.compacted`` event through turn ``through``."""
    found = None
    for event in store.events(session_id):
        if event.type == "context.compacted" and event.payload.get("through") == through:
            found = event
    return found
