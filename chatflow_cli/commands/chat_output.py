"""How ``chatflow chat`` prints a run: text, one JSON object, or JSON lines.

``text``: on a terminal the reply streams as rendered Markdown, tool calls and handoffs shown
above it, and until it starts a spinner says what it waits for (``thinking``, a rate-limited
retry with its countdown and attempt, a busy session's pid with ``--wait``); into a pipe the
reply is plain text with no ANSI codes and control characters made inert
(:func:`chatflow_cli.render.safe_text`).
``json``: one object on stdout when the turn ends: the :class:`RunResult` fields plus
``"is_error": false`` -- or, when it fails, ``{"is_error": true, "error", "error_type",
"exit_code", "session_id"}``.
``jsonl``: one event a line as it happens, in :func:`chatflow_cli.render.event_json`'s shape
(``schema``, ``seq`` on stored events only, ``type``, ``session_id``, ``turn``, ``data``),
ending with exactly one ``result`` event whose ``data`` carries ``is_error``. With
``--input jsonl`` each finished turn also gets a ``turn.result`` line.

A reply cut by the token limit or a content filter adds a dim note after the reply on a
terminal, or a ``chatflow: reply cut …`` line on stderr when piped, and makes the exit code
10 (:attr:`ExitStatus.INCOMPLETE`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Container, Iterator

from ..context import interrupted_code, notice, set_json_errors, silence_broken_pipe
from ..core.errors import ChatflowError, ExitStatus
from ..redaction import scrub
from ..render import ReplyPrinter, agent_changed_text, dumps, event_json, reply_note

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State
    from ..core.runner import RunResult, StreamEvent

__all__ = ["ChatOutput", "pending_notice"]

#: Run events about the context window that get a note on stderr.
_CONTEXT_EVENTS = frozenset({"context.compacted", "context.compaction_failed", "context.compaction_stopped",
                             "context.dropped"})


class ChatOutput:
    """Writes a run's events in the chosen ``--output`` form."""

    def __init__(self, state: State, mode: str, *, multi: bool = False) -> None:
        self.state = state
        self.mode = mode
        self.multi = multi
        self.out = state.env.stdout
        self._final_written = False
        self.last_result: RunResult | None = None
        self.turns = 0
        self.printer: ReplyPrinter | None = None
        self.stored: set[str] = set()  #: the sessions a stored event (one with a seq) was seen for
        #: the run's exit status: a turn's cut reply (RunResult.exit_status) makes it 10, even when a later one finished
        self.exit_code = ExitStatus.SUCCESS
        self.compaction: dict[str, Any] | None = None  # the run's automatic compaction, for ``json``
        self.server_of: Callable[[str, Any], str | None] | None = None  # the MCP server of a call's tool

    # -- what a reply waits for (called from the request's or the runner's thread) -------------
    def retrying(self, info: dict[str, Any]) -> None:
        """openai is about to retry: "rate limited, retrying in 3 s (2/3)" beside the spinner."""
        printer = self.printer
        if printer is None:
            return
        status = info.get("status")
        what = ("rate limited" if status == 429 else f"server error (HTTP {status})" if status
                else "no connection")
        count = f"({info.get('attempt')}/{info.get('attempts')})"
        printer.waiting(f"{what}, retrying in {{seconds}} s {count}", info.get("delay_s"),
                        then=f"{what}, retrying now {count}")

    def waiting_for_session(self, info: dict[str, Any]) -> None:
        """``--wait``: "session busy (pid 123), waiting up to 30 s" beside the spinner."""
        printer = self.printer
        if printer is None:
            return
        pid = info.get("pid")
        who = f" (pid {pid})" if pid else ""
        printer.waiting(f"session busy{who}, waiting up to {{seconds}} s", info.get("wait_s"),
                        then=f"session busy{who}, giving up")

    def _line(self, obj: dict[str, Any]) -> None:
        self.out.write(dumps(obj) + "\n")
        self.out.flush()

    @property
    def final_written(self) -> bool:
        """Whether the run's last line (its result, failed or not) is written."""
        return self._final_written

    @final_written.setter
    def final_written(self, value: bool) -> None:
        self._final_written = value
        if value:  # the error that ends the run is in that line: the error boundary adds no other
            set_json_errors(None)

    def _final_line(self, obj: dict[str, Any]) -> None:
        """The closing line of a run: a reader that has gone (EPIPE, closed stdout) does not
        change the outcome -- the error's exit code, or 10 for a cut reply, still wins (the
        error line goes to stderr, which is still open)."""
        try:
            self._line(obj)
        except (BrokenPipeError, ValueError, AttributeError):
            silence_broken_pipe()

    # -- one run ------------------------------------------------------------------------
    def run(self, events: Iterator[StreamEvent]) -> RunResult:
        """Consume a run's stream events; return its RunResult."""
        printer = None
        if self.mode == "text":
            env = self.state.env
            err = env.console(stderr=True) if env.stderr_isatty else None
            # into a pipe the reply is written straight to stdout: no Rich console needed
            out = env.console() if env.stdout_isatty else None
            printer = ReplyPrinter(out, err, live=env.stdout_isatty, file=env.stdout)
            self.printer = printer
        result = None
        try:
            for ev in events:
                if ev.seq is not None:
                    self.stored.add(ev.session_id)
                if ev.type == "agent.changed":  # once per change: the store recorded the new version with it
                    notice(self.state, agent_changed_text(ev.data or {}))
                if ev.type in _CONTEXT_EVENTS:
                    self._context_event(ev)
                if ev.type == "mcp.unavailable" and self.mode != "jsonl":  # its tools are left out of the turn
                    notice(self.state, str((ev.data or {}).get("error", "")))
                if ev.type == "mcp.unknown_tools" and self.mode != "jsonl":  # a misspelt tool in its config
                    notice(self.state, str((ev.data or {}).get("warning", "")))
                if self.mode == "jsonl":
                    if ev.type == "result":
                        result = ev.result
                        continue
                    # a stored event's turn is its payload's, as replay shows it
                    turn = (ev.data or {}).get("turn") if ev.seq is not None else ev.turn
                    self._line(event_json(ev.type, ev.session_id, ev.data, seq=ev.seq,
                                          turn=turn if isinstance(turn, int) else None))
                elif printer is not None:
                    self._show(printer, ev)
                if ev.type == "result":
                    result = ev.result
        except BaseException:
            # The turn must end before the error goes on: a reader that closed stdout (EPIPE),
            # a full disk under stdout, or any other failure of the output stops the turn as
            # Ctrl-C does -- closing the run's iterator stores what arrived as an interrupted
            # turn (a turn that already ended, or failed, is not touched).
            close = getattr(events, "close", None)
            if close is not None:
                close()
            self.printer = None
            if printer is not None:
                with contextlib.suppress(OSError, ValueError):
                    printer.abort()
            raise
        self.printer = None
        if printer is not None:
            printer.finish(result.content if result is not None and result.replayed else None)
        if result is None:  # pragma: no cover - the Runner always ends with a result
            raise ChatflowError("the run ended without a result")
        self.last_result = result
        self.turns += 1
        if result.exit_status is not ExitStatus.SUCCESS:
            self.exit_code = result.exit_status
        use = result.context
        if use and use.get("over_budget"):  # sent whole: the provider is the judge of what fits
            from ..render.context_notes import over_budget_note

            notice(self.state, f"turn {result.turn}: {over_budget_note(use, result.turn)}")
        note = reply_note(result)
        if note is not None and self.mode == "text":
            if self.state.env.stdout_isatty:
                from rich.text import Text

                self.state.out().print(Text(f"[{note}]", style="dim"))
            else:
                notice(self.state, note)
        if self.mode == "jsonl" and self.multi:
            self._line(event_json("turn.result", result.session_id, {**result.to_dict(), "is_error": False},
                                  turn=result.turn))
        if self.mode == "json" and self.multi:
            self._line(self._json(result))
            self.compaction = None
        if self.mode == "text" and result.pending_tool_calls:
            pending_notice(self.state, result, self.server_of)
        return result

    def _json(self, result: RunResult) -> dict[str, Any]:
        """The ``json`` object of a turn: the result, plus ``compaction`` when the run
        compacted the session first (``{"through", "model", "tokens_before", "tokens_after",
        "seq", "failed": false}``, or ``{"through", "error", "failed": true}``; ``"stopped": true``
        when automatic compaction stopped for the session there)."""
        out = {**result.to_dict(), "is_error": False}
        if self.compaction is not None:
            out["compaction"] = self.compaction
        return out

    def _context_event(self, ev: StreamEvent) -> None:
        """An automatic compaction, a failed one, or turns left out of the request: a note on
        stderr; ``json`` also carries the compaction in the result object (``compaction``)."""
        from ..render.context_notes import context_event_note

        data = dict(ev.data or {})
        if ev.type == "context.compacted":
            self.compaction = {**{k: data.get(k) for k in ("through", "model", "tokens_before", "tokens_after")},
                               "seq": ev.seq, "failed": False}
        elif ev.type == "context.compaction_failed":
            self.compaction = {"through": data.get("through"), "error": data.get("error"), "failed": True}
        elif ev.type == "context.compaction_stopped":  # after a compaction that did not help, or none
            self.compaction = {**(self.compaction or {"through": data.get("through"), "error": data.get("reason"),
                                                      "failed": True}), "stopped": True}
        note = context_event_note(ev.type, data)
        if note is not None:
            notice(self.state, note)

    @staticmethod
    def _show(printer: ReplyPrinter, ev: StreamEvent) -> None:
        data = ev.data or {}
        if ev.type == "text.delta":
            printer.delta(data.get("text", ""))
        elif ev.type == "tool.call_started":
            if not str(data.get("name", "")).startswith("transfer_to_"):
                printer.tool_started(data.get("agent"), data.get("name", "?"), data.get("arguments"))
        elif ev.type == "tool.call_finished":
            if not str(data.get("name", "")).startswith("transfer_to_"):
                printer.tool_finished(data.get("name", "?"), data.get("output"), bool(data.get("is_error")),
                                      data.get("attachments") or ())
        elif ev.type == "handoff":
            printer.handoff(data.get("from_agent"), data.get("to_agent"))

    def pending_only(self, session_id: str, remaining: list[str], awaiting: Container[str] = ()) -> None:
        """``--tool-result``, ``--approve`` or ``--deny`` answered some ids while others still
        wait; ``awaiting``: those of them that wait for an approval, not for a result."""
        asking = [i for i in remaining if i in awaiting]
        data = {"session_id": session_id, "status": "idle", "pending_tool_use_ids": remaining,
                "awaiting_approval": asking, "content": None}
        if self.mode == "json":
            self._line({**data, "is_error": False})
            self.final_written = True
        elif self.mode == "jsonl":
            self._line(event_json("result", session_id, {**data, "is_error": False}))
            self.final_written = True
        else:
            named = [f"{i} (approve it with --approve {i} or refuse it with --deny {i})" if i in asking else i
                     for i in remaining]
            notice(self.state, f"recorded; still waiting for: {', '.join(named)}")

    # -- the end ------------------------------------------------------------------------
    def success(self) -> None:
        if self.final_written:
            return
        self.final_written = True
        result = self.last_result
        if result is None:
            return
        if self.mode == "json" and not self.multi:
            self._final_line(self._json(result))
        elif self.mode == "jsonl":
            data = result.to_dict()
            if self.multi:
                data["turns"] = self.turns
            self._final_line(event_json("result", result.session_id, {**data, "is_error": False}, turn=result.turn))

    def failure(self, exc: BaseException, session_id: str | None) -> None:
        if self.final_written or self.mode == "text":
            return
        self.final_written = True
        code: int = exc.exit_code if isinstance(exc, ChatflowError) else (
            ExitStatus.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else ExitStatus.ERROR)
        if code == ExitStatus.INTERRUPTED:
            code = interrupted_code()  # 143 after SIGTERM
        message = exc.message if isinstance(exc, ChatflowError) else (
            "interrupted" if isinstance(exc, KeyboardInterrupt) else f"unexpected {type(exc).__name__}: {exc}")
        failed_in: str | None = getattr(exc, "session_id", None) or session_id
        err = {"error": scrub(message), "error_type": type(exc).__name__, "exit_code": int(code),
               "session_id": failed_in}
        if self.mode == "json":
            self._final_line({**err, "is_error": True})
        else:
            self._final_line(event_json("result", failed_in, {**err, "is_error": True}))

    def duplicate(self, message_id: str, session_id: str) -> None:
        self.final_written = True
        if self.mode == "text":
            notice(self.state, f"message {message_id} was already processed (within 192 h): nothing sent")
            return
        data = {"duplicate": True, "message_id": message_id, "session_id": session_id, "content": None}
        if self.mode == "json":
            self._line({**data, "is_error": False})
        else:
            self._line(event_json("result", session_id, {**data, "is_error": False}))


def pending_notice(state: State, result: RunResult, server_of: Callable[[str, Any], str | None] | None = None) -> None:
    """How to go on with each pending call; ``server_of``: the MCP server of a call's tool."""
    asking = {c.id for c in result.approval_tool_calls}
    for call in result.pending_tool_calls:
        if call.id in asking:
            server = server_of(result.session_id, call) if server_of is not None else None
            named = call.name + (f" (server {server})" if server else "")
            notice(state, f"tool {named} {call.arguments} waits for your approval: run it with chatflow chat -s "
                          f"{result.session_id} --approve {call.id} (or refuse it with --deny {call.id})")
            continue
        notice(
            state,
            f"waiting for tool {call.name} {call.arguments}: answer with "
            f"chatflow chat -s {result.session_id} --tool-result {call.id} OUTPUT "
            "(plain text or JSON, sent as given)",
        )
