"""Human-readable turns and events: ``sessions show``, ``/show`` and ``replay``; and the reply
of ``chatflow chat`` as it streams (:class:`ReplyPrinter`, at the end).

Layout of one turn in ``sessions show`` (plain form; on a terminal the model's text is
rendered Markdown and labels are coloured)::

    ── Turn 3 · outside the context window · gpt-4o ─────────────────
    You: where is my order 42?
    Support called check_order_status {"order_id": "42"}
      result: {"status": "IN_TRANSIT"}
    handoff: Support -> Billing
    Billing: It is in transit and arrives tomorrow.

The title ends with the model that answered the turn, when its ``turn.completed`` records
one. A turn that ran with resources mounted says them under the title, as ``replay`` says
them at the turn's end: ``mounted: memory store notes (read-write), vault work (read-only)``. Long tool arguments and results are folded to :data:`~chatflow_cli.render.text.FOLD_LINES`
lines / :data:`~chatflow_cli.render.text.FOLD_CHARS` characters with a note saying how much
was left out (``--full`` shows everything).
"""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING, Any, Container, Mapping

from ..core.stream import cut_phrase
from .lines import Lines
from .markdown import Trimmed, has_markdown, markdown_lines, markdown_renderable
from .shapes import _role, turn_handoffs
from .text import TextSanitizer, fold, plural, pretty_json_text, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from ..core.events import Event
    from ..core.memory import TurnRecord
    from ..core.messages import Message
    from ..core.runner import RunResult

__all__ = ["AgentVersionMarks", "ReplyPrinter", "agent_changed_text", "attached_lines", "event_text", "mount_text",
           "mounts_text", "reply_cut_text", "reply_note", "turn_renderables", "turn_versions"]


def agent_changed_text(data: dict[str, Any]) -> str:
    """The notice for an ``agent.changed`` event: ``agent Support changed since turn 12
    (3f2a1b9c0d4e -> 9a8b7c6d5e4f)``, where turn 12 is the last turn the previous version ran
    in. When that turn is not before the event's turn (a turn continued after custom tool
    results, or numbers used again after a rollback), ``since turn N`` is left out."""
    agent = safe_text(str(data.get("agent") or "?"))
    since, turn = data.get("since_turn"), data.get("turn")
    when = f" since turn {since}" if isinstance(since, int) and isinstance(turn, int) and 0 < since < turn else ""
    versions = f"{safe_text(str(data.get('previous_version') or '?'))} -> {safe_text(str(data.get('version') or '?'))}"
    return f"agent {agent} changed{when} ({versions})"


def mount_text(mount: Mapping[str, Any]) -> str:
    """One mount as people read it, in ``sessions show`` and ``replay`` alike: ``memory store
    notes (read-write)``, ``vault work (read-only)`` (``mount``: ``{"kind", "name", "mode"}``)."""
    kind = mount.get("kind")
    word = "memory store" if kind == "memory_store" else safe_text(str(kind))
    return f"{word} {safe_text(str(mount.get('name')))} ({safe_text(str(mount.get('mode')))})"


def mounts_text(mounts: Any) -> str:
    """The resources a turn ran with, as :func:`mount_text` says each, comma-separated
    (``mounts``: ``{"kind", "name", "mode"}`` dicts or values with ``to_dict()``); ``none``."""
    items = [m if isinstance(m, Mapping) else m.to_dict() for m in mounts or ()]
    return ", ".join(mount_text(m) for m in items) or "none"


def turn_versions(record: TurnRecord) -> dict[str, str]:
    """``{agent: version}`` of the agents that replied in the turn (the version of each
    agent's last reply in it); agents whose replies carry no version are left out."""
    out: dict[str, str] = {}
    for msg in record.messages:
        version = getattr(msg, "agent_version", None)
        if _role(msg) == "model" and msg.agent and version:
            out[msg.agent] = str(version)
    return out


class AgentVersionMarks:
    """Where an agent's version changed, turn by turn (``sessions show``).

    Feed live turns oldest first to :meth:`changes`: a turn is marked for an agent when the
    agent's version in it differs from the one of the agent's latest earlier reply with a
    known version. Removed turns (rolled back, failed) are marked against the live history
    but do not move it. ``known`` seeds the versions before the first turn fed.
    """

    def __init__(self, known: dict[str, str] | None = None) -> None:
        self.known: dict[str, str] = dict(known or {})

    def changes(self, record: TurnRecord) -> list[dict[str, Any]]:
        """``[{"agent", "from", "to"}]`` for the agents whose version changed in ``record``."""
        out = []
        removed = record.rolled_back or record.failed
        first: dict[str, str] = {}
        for msg in record.messages:  # an agent's first reply in the turn is compared
            version = getattr(msg, "agent_version", None)
            if _role(msg) == "model" and msg.agent and version:
                first.setdefault(msg.agent, str(version))
        for agent, version in first.items():
            before = self.known.get(agent)
            if before is not None and before != version:
                out.append({"agent": agent, "from": before, "to": version})
        if not removed:
            self.known.update(turn_versions(record))
        return out


def turn_renderables(record: TurnRecord, *, markdown: bool = False, full: bool = False, width: int | None = None,
                     interrupted: bool = False, changed: list[dict[str, Any]] | None = None,
                     submitted: Mapping[str, str] | None = None, awaiting: Container[str] = (),
                     repl: bool = False) -> list[Any]:
    """The renderables of one turn (see the module docstring for the layout).

    Items are :class:`Lines` (with ``plain`` text and Rich styles) and, when ``markdown``
    is true (a terminal), the model's text as Markdown: laid out by
    :func:`markdown_lines` into :class:`Lines` when it only uses paragraphs, lists and
    inline styles, else a ``rich.markdown.Markdown`` (:func:`markdown_renderable`). Text
    with no Markdown syntax at all (:func:`has_markdown`) is shown as written, unparsed.
    Target: a 500-turn ``sessions show`` on a terminal within 1 s. With ``markdown`` and
    ``width`` (a terminal) the lines are word-wrapped to ``width`` (:meth:`Lines.wrapped`);
    continuation lines of a multi-line message are indented under its text.
    ``changed``: the agents whose version changed in this turn (:class:`AgentVersionMarks`),
    marked in the title and named in a line under it. ``submitted``: results already given
    for tool calls still waiting on others (``{tool_use_id: output}``), shown with their call.
    ``awaiting``: the ids of calls waiting for an approval (``--approve``/``--deny``), not
    for a custom tool's ``--tool-result``; its ``left_open`` (:class:`chatflow_cli.lookup.Awaiting`),
    if any: calls a run that ended during its tool calls left without a result. ``repl``: drawn in the REPL, where a call still
    waiting is asked about before the next message is sent: its line says so.
    """
    marks = []
    for change in changed or ():
        marks.append(f"{safe_text(change['agent'])} changed")
    if record.rolled_back:
        marks.append("rolled back")
    if record.failed:
        marks.append("failed")
    if interrupted:
        marks.append("interrupted")
    cut = next((m.finish_reason for m in record.messages if getattr(m, "finish_reason", None)), None)
    if cut:
        marks.append(f"cut ({cut})")
    if not record.in_window and not record.rolled_back:
        marks.append("outside the context window")
    answered = f" · {safe_text(record.model)}" if getattr(record, "model", None) else ""  # who answered, last
    title = f"── Turn {record.number}" + ("".join(f" · {m}" for m in marks)) + answered + " "
    rule_style = "dim" if marks else "bold blue"
    out: list[Any] = [Lines(title + "─" * max(3, (width or 72) - len(title)), rule_style)]
    for change in changed or ():
        out.append(Lines(f"agent {safe_text(change['agent'])} changed: version {safe_text(change['from'])} -> "
                         f"{safe_text(change['to'])}", "yellow"))
    resources = getattr(record, "resources", ())
    if resources and record.number > 0:  # what the turn ran with, as sessions show --json's "resources"
        out.append(Lines(f"mounted: {mounts_text(resources)}", "dim"))

    msgs = record.messages
    results = {m.tool_call_id: m for m in msgs if _role(m) == "tool"}
    handoff_to = {h["tool_call_id"]: h["to_agent"] for h in turn_handoffs(record)}
    agent_so_far: str | None = None
    body = Lines()

    def flush() -> None:
        nonlocal body
        body.rstrip()
        if body.parts:
            out.append(body)
        body = Lines()

    for msg in msgs:
        role = _role(msg)
        if role == "user":
            body.append("You: ", "bold green").append(_hanging(safe_text(msg.content or ""), 5)).append("\n")
            if msg.attachments:
                from ..core.attachments import attachment_line

                for attachment in msg.attachments:
                    body.append(f"  attached: {safe_text(attachment_line(attachment))}\n", "dim")
            if interrupted and msg is msgs[-1]:
                body.append("  (interrupted)\n", "yellow")
        elif role == "system":
            body.append("System: ", "bold magenta").append(_hanging(fold(safe_text(msg.content), full=full), 8), "dim")
            body.append("\n")
        elif role == "model":
            agent = msg.agent or agent_so_far or "model"
            agent_so_far = agent
            if msg.content:
                body.append(f"{safe_text(agent)}: ", "bold cyan")
                if markdown and has_markdown(msg.content):
                    flush()
                    safe = safe_text(msg.content)
                    laid_out = markdown_lines(safe, width or 80)
                    if laid_out is None:
                        out.append(Trimmed(markdown_renderable(safe)))
                    else:
                        block = Lines()
                        for number, line in enumerate(laid_out):
                            if number:
                                block.append("\n")
                            block.parts.extend(line.parts)
                        out.append(block)
                else:
                    body.append(_hanging(safe_text(msg.content), len(safe_text(agent)) + 2)).append("\n")
            if msg.reasoning and (full or not msg.content):
                if full:
                    body.append(f"{safe_text(agent)} reasoned: ", "dim").append(safe_text(msg.reasoning), "dim")
                    body.append("\n")
                else:
                    body.append(f"{safe_text(agent)}: ", "bold cyan")
                    body.append("(reasoning only, no text; --full shows it)\n", "yellow")
            elif not msg.content and not msg.tool_calls and not msg.interrupted:
                kinds = _item_kinds(msg)
                body.append(f"{safe_text(agent)}: ", "bold cyan")
                if kinds:  # Agents SDK items with no text: say what they are
                    body.append(f"({safe_text(', '.join(kinds))})\n", "dim")
                else:
                    body.append("(empty reply)\n", "yellow")
            if msg.finish_reason:
                body.append(f"  ({reply_cut_text(msg.finish_reason)})\n", "yellow")
            if msg.interrupted:
                body.append("  (interrupted)\n", "yellow")
            for call in msg.tool_calls:
                result = results.get(call.id)
                if call.id in handoff_to:
                    body.append(f"handoff: {safe_text(agent)} -> {safe_text(handoff_to[call.id])}\n", "bold magenta")
                    continue
                body.append(f"{safe_text(agent)} called ", "dim").append(safe_text(call.name), "bold yellow")
                body.append(" " + safe_text(pretty_json_text(call.arguments, full=full)) + "\n")
                if result is None and call.id in (submitted or {}):
                    text = safe_text(pretty_json_text((submitted or {})[call.id], full=full))
                    body.append("  result: ", "dim").append(text.replace("\n", "\n    "))
                    body.append("  (submitted; the turn goes on once every call has its result)\n", "yellow")
                elif result is None and call.id in getattr(awaiting, "left_open", ()):
                    body.append("  no result: the run ended during this call (side effects unknown); your next "
                                "message records it as interrupted\n", "yellow")
                elif result is None and call.id in awaiting:
                    cid = safe_text(call.id)
                    here = " · your next message asks you first (y/n/a)" if repl else ""
                    body.append(f"  waiting for approval (--approve {cid} / --deny {cid}){here}\n", "yellow")
                elif result is None:
                    here = " · your next message asks you for it first" if repl else ""
                    body.append(f"  result: (waiting for --tool-result){here}\n", "yellow")
                else:
                    if result.is_error:
                        body.append("  error: ", "red")
                    else:
                        body.append("  result: ", "dim")
                    text = safe_text(pretty_json_text(result.content, full=full))
                    body.append(text.replace("\n", "\n    ") + "\n")
                    if result.attachments:  # the images the tool returned, as a user's attachments
                        from ..core.attachments import attachment_line

                        for attachment in result.attachments:
                            body.append(f"  attached: {safe_text(attachment_line(attachment))}\n", "dim")
                    if result.interrupted:
                        body.append("  (interrupted)\n", "yellow")
        # TOOL messages are shown with their call
    flush()
    out.append(Lines())
    if markdown and width:
        out = [item.wrapped(width) if isinstance(item, Lines) else item for item in out]
    return out


def _item_kinds(msg: Message) -> list[str]:
    """The Agents SDK item types a model message with no text stands for (``web_search_call``,
    ``reasoning``, a custom type, ``developer message``...), each once, in order; [] when it
    carries no item or only an assistant message item (an empty reply, shown as such)."""
    kinds: list[str] = []
    for item in msg.items:
        kind = item.get("type") or ("message" if "role" in item else "item")
        if kind == "message" and item.get("role") == "assistant":
            continue
        if kind == "message" and isinstance(item.get("role"), str):  # a system or developer item inside a turn
            kind = f"{item['role']} message"
        if str(kind) not in kinds:
            kinds.append(str(kind))
    return kinds


def _hanging(text: str, indent: int) -> str:
    """``text`` with its continuation lines indented by ``indent`` (at most 12) spaces: a
    multi-line message reads as one block after its label, not from column 0."""
    return text.replace("\n", "\n" + " " * min(indent, 12)) if "\n" in text else text


# ---------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------
def event_text(event: Event, *, full: bool = False, width: int | None = None, mounts: Any = None) -> Any:
    """One stored event as a line of ``rich.text.Text`` (``chatflow replay``).

    With ``width`` (a terminal's columns) the line is word-wrapped to it, wrapped rows and
    the continuation lines of a multi-line message indented by 6 (under the event type).
    ``mounts``: the session's mounts in force at the event (``{"kind", "name", "mode"}``
    dicts); the end of a turn (``turn.completed``, ``turn.failed``, ``turn.interrupted``)
    then says what the turn ran with, ``· mounted: ...``, as ``sessions show`` does.
    """
    if width:
        return _hanging_text(event_text(event, full=full, mounts=mounts), width, 6)
    from rich.text import Text

    p = event.payload or {}
    line = Text()
    line.append(f"{event.seq:>5} ", style="dim")
    line.append(f"{event.type:<21} ", style="bold")  # a 22-column field, and a space after a longer type
    t = event.type
    if t in ("message.user", "message.model", "message.system", "tool.result"):
        msg = p.get("message") or {}
        turn = p.get("turn")
        if turn:
            line.append(f"turn {turn}  ", style="dim")
        if msg.get("agent"):
            line.append(f"{safe_text(msg['agent'])}: ", style="cyan")
        if msg.get("content"):
            line.append(_hanging(safe_text(fold(str(msg["content"]), full=full, max_lines=3, max_chars=300)), 6))
        for call in msg.get("tool_calls") or ():
            line.append(f" call {safe_text(call.get('name'))}({safe_text(fold(call.get('arguments') or '', full=full, max_lines=1, max_chars=200))})", style="yellow")
        if msg.get("finish_reason"):
            line.append(f" ({reply_cut_text(str(msg['finish_reason']))})", style="yellow")
        if msg.get("reasoning") and (full or not msg.get("content")):
            line.append(" reasoning: " if full else " (reasoning only)", style="dim")
            if full:
                line.append(safe_text(str(msg["reasoning"])), style="dim")
    elif t == "handoff":
        line.append(f"{safe_text(p.get('from_agent'))} -> {safe_text(p.get('to_agent'))}", style="magenta")
    elif t == "status":
        line.append(safe_text(str(p.get("status"))))
        if p.get("reason"):
            line.append(f" ({safe_text(str(p['reason']))})", style="dim")
    elif t == "turn.completed":
        line.append(f"turn {p.get('turn')} by {safe_text(str(p.get('agent')))}")
        if p.get("model") or p.get("base_url"):  # what answered (logs written before lack it)
            where = f" at {safe_text(str(p['base_url']))}" if p.get("base_url") else ""
            line.append(f" ({safe_text(str(p.get('model') or '?'))}{where})", style="dim")
        if cut_phrase(p.get("finish_reason")):
            line.append(f" ({reply_cut_text(str(p['finish_reason']))})", style="yellow")
    elif t == "turn.failed":
        line.append(f"turn {p.get('turn')}: {safe_text(str(p.get('error')))}", style="red")
        if p.get("reverted_from_agent"):
            line.append(f" (handoff undone: {safe_text(str(p['reverted_from_agent']))} -> "
                        f"{safe_text(str(p.get('active_agent')))})", style="dim")
    elif t == "session.created":
        line.append(f"agent {safe_text(str(p.get('agent')))}, window {p.get('max_turns')}")
        if p.get("metadata"):
            line.append(" " + _key_values(p["metadata"], full=full), style="dim")
    elif t == "turn.interrupted":
        line.append(f"turn {p.get('turn')}: {safe_text(str(p.get('reason') or 'interrupted'))}", style="yellow")
        ids = p.get("tool_use_ids") or []
        if ids:
            line.append(f" (tool calls left without a result: {safe_text(', '.join(map(str, ids)))})", style="dim")
    elif t == "turn.interrupt_requested":
        line.append(f"turn {p.get('turn')}: asked to stop", style="yellow")
    elif t == "tool.pending":
        asking = [str(i) for i in p.get("approval") or []]
        ids = ", ".join(str(i) for i in p.get("tool_use_ids") or [] if str(i) not in asking)
        waits = ([f"--tool-result {safe_text(ids)}"] if ids else []) + (
            [f"--approve/--deny {safe_text(', '.join(asking))}"] if asking else [])
        line.append(f"turn {p.get('turn')}: waiting for {' and '.join(waits) or '--tool-result'}", style="yellow")
    elif t == "tool.result_submitted":
        line.append(f"turn {p.get('turn')}: result for {safe_text(str(p.get('tool_use_id')))}"
                    f"{' (error)' if p.get('is_error') else ''}: ")
        line.append(safe_text(fold(str(p.get("output") or ""), full=full, max_lines=1, max_chars=200)))
    elif t in ("resource.mounted", "resource.unmounted"):
        line.append(mount_text(p))
        if p.get("reason"):
            line.append(f": {safe_text(str(p['reason']))}", style="yellow")
    elif t == "rollback":
        removed = p.get("removed_turns") or []
        line.append(f"to turn {p.get('to_turn')}, removed {plural(len(removed), 'turn')}"
                    + (f" ({', '.join(map(str, removed))})" if removed else ""))
    elif t == "metadata.updated":
        changes = p.get("changes") or {}
        line.append(_key_values(changes, full=full) or "-")
        if p.get("removed"):
            line.append(f" removed {safe_text(', '.join(map(str, p['removed'])))}", style="dim")
    elif t == "session.recovered":
        owner = p.get("owner") or {}
        whose = "a process whose lease ran out" if p.get("lease_expired") is True else "a dead process"
        line.append(f"turn {p.get('turn')}: closed the run of {whose} "
                    f"(pid {owner.get('pid')} on {safe_text(str(owner.get('host')))})", style="yellow")
    else:
        line.append(_key_values(p, full=full), style="dim")
    if mounts and t in _TURN_ENDS:
        line.append(f" · mounted: {mounts_text(mounts)}", style="dim")
    return line


#: The events that end a run of a turn: ``replay`` says the resources it ran with on them.
_TURN_ENDS = frozenset({"turn.completed", "turn.failed", "turn.interrupted"})


def _hanging_text(text: Any, width: int, hang: int) -> Any:
    """A ``rich.text.Text`` word-wrapped to ``width`` with wrapped rows indented by ``hang``."""
    spans = [span for span in text.spans if isinstance(span.style, str)]
    plain = text.plain
    cuts = sorted({0, len(plain), *(s.start for s in spans), *(s.end for s in spans)})
    lines = Lines()
    for start, end in zip(cuts, cuts[1:]):
        style = " ".join(s.style for s in spans if s.start <= start and s.end >= end)
        lines.append(plain[start:end], style)
    return lines.wrapped(width, hang=hang).to_text()


def reply_cut_text(finish_reason: str) -> str:
    """``"cut by the token limit, finish_reason length"`` for a stored cut reply's mark."""
    phrase = cut_phrase(finish_reason) or "cut"
    return f"{phrase}, finish_reason {safe_text(finish_reason)}"


def reply_note(result: RunResult) -> str | None:
    """The note a front-end shows after a finished turn whose reply is not a plain whole
    answer: cut (``finish_reason`` ``length``/``content_filter``, read from the turn's
    stored verdict), reasoning only, or empty. ``None`` for a whole answer."""
    if result is None or result.pending_tool_calls or result.replayed and not result.finish_reason:
        return None
    phrase = cut_phrase(result.finish_reason)
    show = f"chatflow sessions show {result.session_id} --full"
    if phrase:
        tail = (" before any text (its reasoning: " + show + ")") if not (result.content or "").strip() and result.reasoning else ""
        return f"reply {phrase} (finish_reason {result.finish_reason}){tail}; turn {result.turn} is stored, marked as cut"
    if not (result.content or "").strip():
        if result.reasoning:
            return f"the model answered with reasoning only, no text (see it with: {show})"
        return "the model's reply was empty" if not result.content else "the model's reply was only whitespace"
    return None


def _key_values(data: Any, *, full: bool = False) -> str:
    """A compact ``key=value key2=value2`` summary of an event payload (values as compact JSON
    unless plain strings/numbers), made safe; the fallback for event types replay does not
    know (business events such as ``note`` or ``billing.refund``)."""
    if not isinstance(data, dict):
        return safe_text(fold(json.dumps(data, ensure_ascii=False), full=full, max_lines=1, max_chars=200))
    parts = []
    for key, value in data.items():
        if isinstance(value, str):
            shown = value if value and not any(c.isspace() for c in value) else json.dumps(value, ensure_ascii=False)
        elif isinstance(value, (int, float, bool)) or value is None:
            shown = json.dumps(value)
        else:
            shown = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        parts.append(f"{key}={shown}")
    return safe_text(fold(" ".join(parts), full=full, max_lines=1, max_chars=300))


# ---------------------------------------------------------------------------------------
# chat: the streamed reply
# ---------------------------------------------------------------------------------------
class ReplyPrinter:
    """Shows a reply as it streams.

    On a terminal (``live=True``) the text is rendered as Markdown as it arrives, through
    :class:`chatflow_cli.render.markdown_stream.MarkdownStream` (complete blocks printed once,
    only the tail redrawn); tool calls and handoffs are printed above the live tail. Into a
    pipe the text is written as it arrives, plain and made safe, and notes about tool calls
    go to stderr only when stderr is a terminal, so stdout holds the answer and nothing else.
    """

    #: Seconds between two redraws of the spinner while nothing else arrives.
    TICK_S = 0.1

    def __init__(self, out_console: Console | None, err_console: Console | None, *, live: bool,
                 file: IO[str] | None = None) -> None:
        import threading

        self.out = out_console
        self.err = err_console
        self.live_enabled = live and out_console is not None
        self._stream: Any = None
        self._text = ""
        self._printed_any = False
        if file is None:
            if out_console is None:
                raise TypeError("ReplyPrinter writes to out_console's file or to file: give one")
            file = out_console.file
        self._file = file
        # The spinner moves on its own: a ticker thread redraws the live tail every TICK_S
        # seconds while the main thread waits on the model. Every use of the stream holds
        # the lock, since MarkdownStream itself is not thread-safe.
        self._lock = threading.RLock()
        # (what, until: monotonic s or None, what once the countdown is over)
        self._waiting: tuple[str, float | None, str] = ("thinking", None, "thinking")
        self._stop = threading.Event()
        self._ticker: Any = None
        self._segment_text = False  # text of the current segment is live (no spinner then)
        self._sanitizer = TextSanitizer()
        if self.live_enabled and out_console is not None:
            from .markdown_stream import MarkdownStream

            self._stream = MarkdownStream(out_console, live=True)
            self._stream.set_status("thinking")
            self._ticker = threading.Thread(target=self._tick, name="chatflow-spinner", daemon=True)
            self._ticker.start()

    # -- the spinner ----------------------------------------------------------------------
    def waiting(self, what: str, seconds: float | None = None, then: str | None = None) -> None:
        """Say what the reply waits for (any thread): ``what`` beside the spinner. With
        ``seconds``, ``{seconds}`` in ``what`` counts down ("rate limited, retrying in 3 s
        (2/3)") and ``then`` is shown once it reaches 0."""
        import time

        with self._lock:
            until = time.monotonic() + seconds if seconds is not None else None
            self._waiting = (what, until, then or what)
            self._show_waiting()

    def _status_text(self) -> str:
        import math
        import time

        what, until, then = self._waiting
        if until is None:
            return what
        left = until - time.monotonic()
        return what.format(seconds=math.ceil(left)) if left > 0 else then

    def _show_waiting(self) -> None:
        if self._stream is not None:
            self._stream.set_status(self._status_text(), refresh=False)

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_S):
            with self._lock:
                if self._stream is None:
                    return
                if self._segment_text:  # text is streaming: its own redraws suffice
                    continue
                self._show_waiting()
                self._stream.refresh()

    def _stop_ticker(self) -> None:
        self._stop.set()
        ticker, self._ticker = self._ticker, None
        if ticker is not None and ticker.is_alive():
            import threading

            if ticker is not threading.current_thread():
                ticker.join(timeout=1.0)

    # -- text ---------------------------------------------------------------------------
    def delta(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            self._text += text
            self._printed_any = True
            self._segment_text = True
            self._waiting = ("thinking", None, "thinking")
            if self._stream is not None:
                self._stream.feed(text)
            else:
                self._file.write(self._sanitizer.feed(text))
                self._file.flush()

    def _end_segment(self) -> None:
        """Close the current text segment (before a tool call line, or at the end)."""
        if self._stream is not None:
            self._stream.end_text()
        elif self._text and not self._text.endswith("\n"):
            self._file.write(self._sanitizer.flush())
            self._file.write("\n")
            self._file.flush()
        self._text = ""

    # -- notes --------------------------------------------------------------------------
    def note(self, text: Any) -> None:
        """A line about a tool call or handoff: above the live tail, or on a terminal stderr."""
        with self._lock:
            self._segment_text = False  # after a tool or handoff line the spinner shows again
            if self._stream is not None:
                self._stream.print(text)
                return
            self._end_segment()
            if self.err is not None:
                self.err.print(text)

    def tool_started(self, agent: str | None, name: str, arguments: str | None) -> None:
        from rich.text import Text

        line = Text()
        line.append(f"{safe_text(agent or 'model')} called ", style="dim")
        line.append(safe_text(name), style="bold yellow")
        line.append(" " + safe_text(pretty_json_text(arguments)), style="dim")
        self.note(line)

    def tool_finished(self, name: str, output: str | None, is_error: bool = False,
                      attachments: Any = ()) -> None:
        """A tool's result; ``attachments``: the images it returned (``Attachment.to_dict()``
        dicts), each shown as an ``attached:`` line."""
        from rich.text import Text

        line = Text("  error: " if is_error else "  result: ", style="red" if is_error else "dim")
        line.append(safe_text(fold(pretty_json_text(output), max_lines=3, max_chars=300)), style="dim")
        for shown in attached_lines(attachments):
            line.append("\n" + shown, style="dim")
        self.note(line)

    def handoff(self, from_agent: str | None, to_agent: str | None) -> None:
        from rich.text import Text

        self.note(Text(f"handoff: {safe_text(from_agent)} -> {safe_text(to_agent)}", style="bold magenta"))

    def finish(self, final_text: str | None = None) -> None:
        """End the reply. ``final_text`` is printed when nothing was streamed (a replayed turn)."""
        if final_text and not self._printed_any:
            self.delta(final_text)
        self._stop_ticker()
        with self._lock:
            if self._stream is not None:
                self._stream.finish()
                self._stream = None
            else:
                self._end_segment()

    def abort(self) -> None:
        self._stop_ticker()
        with self._lock:
            if self._stream is not None:
                try:
                    self._stream.finish()
                finally:
                    self._stream = None
            else:
                self._end_segment()


def attached_lines(attachments: Any) -> list[str]:
    """``  attached: NAME (TYPE, SIZE, WxH)`` for each attachment of a ``tool.call_finished``
    event (``Attachment.to_dict()`` dicts: the images a tool returned); a malformed one is skipped."""
    from ..core.attachments import Attachment, attachment_line

    out: list[str] = []
    for item in attachments or ():
        try:
            out.append(f"  attached: {safe_text(attachment_line(Attachment.from_dict(item)))}")
        except ValueError:
            continue
    return out
