"""How the REPL runs a turn: the reply streamed, tool calls shown, Ctrl-C and type-ahead.

The Runner's ``run_streamed`` generator is consumed on a worker thread (it blocks on the
network and on tools); its events come to the asyncio loop through a queue. Meanwhile the
terminal is in raw mode and its keys are read, so Ctrl-C arrives as a key (SIGINT is handled
too) and sets the Runner's cancel event; the Runner stores the turn as interrupted and the
REPL returns to the prompt. Keys typed during a turn are type-ahead, as in a shell: kept in
order and acted on by the next prompt as if typed there; Ctrl-C discards the type-ahead typed
before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..assembly import keep_endpoint
from ..core.errors import ChatflowError, RunInterrupted, SessionArchivedError, ToolResultError
from ..render import agent_changed_text, pretty_json_text, reply_note, safe_text
from .host import ReplHost

if TYPE_CHECKING:  # pragma: no cover
    from ..core.messages import ToolCall
    from ..core.runner import RunResult, StreamEvent

__all__ = ["ABANDON_AFTER_S", "TurnRunner"]

_TICK_S = 0.08  # spinner and late-text refresh while waiting for events
_BATCH = 512  # events shown between two looks at the keyboard
#: A text event longer than this (characters) is shown in slices of it, the keyboard read
#: between slices: a huge reply that arrived in one piece still stops at once on Ctrl-C.
_SLICE = 2048
#: After Ctrl-C, how long the REPL waits for the Runner to store the interrupted turn before
#: it gives the prompt back anyway (a server that never sends its response headers keeps
#: the request blocked until the client's timeout); the next turn waits for that close.
ABANDON_AFTER_S = 3.0


def tool_started_line(agent: str | None, name: str, arguments: str | None) -> Any:
    """``⚙ AGENT called NAME ARGS``: a tool call starting (a Rich ``Text``)."""
    from rich.text import Text

    line = Text()
    line.append("⚙ ", style="yellow")
    line.append(f"{safe_text(agent or 'model')} called ", style="dim")
    line.append(safe_text(name), style="bold yellow")
    args = safe_text(_short(pretty_json_text(arguments)))
    if args:
        line.append(" " + args, style="dim")
    return line


def tool_finished_line(output: str | None, is_error: bool, duration_ms: float | None, attachments: Any = ()) -> Any:
    """``  ↳ RESULT`` (or ``  ✗ error: RESULT``) and its duration: a tool call's result."""
    from rich.text import Text

    from ..render.turns import attached_lines

    line = Text("  ✗ error: " if is_error else "  ↳ ", style="red" if is_error else "dim")
    line.append(safe_text(_short(pretty_json_text(output))), style="dim")
    if duration_ms and duration_ms >= 100:
        line.append(f"  ({duration_ms / 1000:.1f}s)" if duration_ms >= 1000 else f"  ({duration_ms:.0f}ms)", style="dim")
    for shown in attached_lines(attachments):  # the images the tool returned
        line.append("\n" + shown, style="dim")
    return line


class _TurnView:
    """One turn on screen: spinner, streamed Markdown, tool and handoff lines."""

    def __init__(self, console: Any) -> None:
        from ..render.markdown_stream import MarkdownStream

        self.console = console
        self.stream = MarkdownStream(console)
        self.stream.set_status("thinking…")
        self.got_text = False

    def text(self, delta: str) -> None:
        if not self.got_text:
            self.got_text = True
            self.stream.set_status(None, refresh=False)  # the spinner gives way to the text
        self.stream.feed(delta)

    def line(self, text: Any, *, status: str | None = None) -> None:
        self.stream.set_status(None, refresh=False)
        self.stream.print(text)
        self.got_text = False
        if status:
            self.stream.set_status(status)

    def tool_started(self, agent: str | None, name: str, arguments: str | None) -> None:
        self.line(tool_started_line(agent, name, arguments), status=f"running {safe_text(name)}…")

    def tool_finished(self, name: str, output: str | None, is_error: bool, duration_ms: float | None,
                      attachments: Any = ()) -> None:
        self.line(tool_finished_line(output, is_error, duration_ms, attachments), status="thinking…")

    def handoff(self, from_agent: str | None, to_agent: str | None) -> None:
        from rich.text import Text

        self.line(
            Text(f"⇄ handoff: {safe_text(from_agent)} -> {safe_text(to_agent)}", style="bold magenta"),
            status="thinking…",
        )

    def status(self, text: str) -> None:
        self.stream.set_status(text)

    def tick(self) -> None:
        self.stream.refresh(force=False)

    def finish(self) -> None:
        self.stream.finish()


@dataclass
class _Outcome:
    result: RunResult | None = None
    error: BaseException | None = None
    interrupted: bool = False
    abandoned: bool = False  # interrupted, but the turn is still closing on its worker thread
    received: int = 0  # characters of reply text received
    shown: int = 0  # of which shown (none after Ctrl-C)


class TurnRunner(ReplHost):
    """The REPL's turns: a message sent, the reply streamed, tool results asked for, Ctrl-C.

    Mixed into :class:`~chatflow_cli.repl.app.Repl`, whose state it uses.
    """

    async def send(self, text: str, *, retry: bool = False) -> None:
        """Send ``text`` as the next user message (answering pending custom tools first),
        with the files ``/attach`` queued. ``retry``: it is the failed message again, and
        its files go with it; a new message never takes them (they are dropped, said in one line)."""
        if not await self._wait_closing() or not await self._settle_pending():
            self._prefill = text
            return
        if retry:
            self.attachments = [*self.failed_attachments, *self.attachments]
        elif self.failed_attachments:
            self.say(f"not sent with this message: {_names(self.failed_attachments)} (the files of the message "
                     "that failed; /attach them again to send them)", style="yellow")
        self.failed_attachments = []
        self.failed_message = None
        message: Any = text
        if self.attachments:  # /attach: the files go with this message
            from ..core.messages import Message

            message = Message.user(text, self.attachments)
        outcome = await self._run_turn(
            lambda cancel: self.runner.run_streamed(
                self.session_id, message, cancel=cancel, max_turns=self.max_turns, system=self.system, wait=0
            )
        )
        if outcome.error is not None and not outcome.interrupted and not isinstance(outcome.error, SessionArchivedError):
            self.failed_message = text  # an archived session's refusal is no failure /retry could fix
            self.failed_attachments = self.attachments  # for /retry only: a new message does not take them
        self.attachments = []  # sent and stored, or kept with the failed message
        await self._after_turn(outcome)

    async def _after_turn(self, outcome: _Outcome) -> None:
        result = outcome.result
        self._refresh_info()
        # stored after each turn, not only at exit: a REPL that is killed still resumes there
        keep_endpoint(self.store, self.session_id, self.endpoint, worked=result is not None and outcome.error is None)
        if result is not None and result.pending_tool_calls and not self.hung_up:
            await self._answer_tools(list(result.pending_tool_calls))

    async def _settle_pending(self) -> bool:
        """Tool calls still open (from before): ask for their results or approvals first.
        False if the user declined."""
        session = self.store.get(self.session_id)
        if session is None or not session.pending_tool_calls:
            return True
        answered = self.store.submitted_tool_results(self.session_id)
        open_calls = [c for c in session.pending_tool_calls if c.id not in answered]
        if self._left_open(open_calls):  # a run that died during its calls: the message records them interrupted
            return True
        asking = sum(1 for c in open_calls if self.runner.awaits_approval(self.session_id, c))
        waits = ("your approval" if asking == len(open_calls) else
                 "tool results and your approval" if asking else "tool results")
        self.say(f"turn {session.turn_count} is waiting for {waits} first.", style="yellow")
        return await self._answer_tools(list(session.pending_tool_calls))

    def _awaiting(self) -> frozenset[str]:
        """The ids of the session's open calls that wait for an approval, not for a result."""
        try:
            session = self.store.get(self.session_id)
        except ChatflowError:
            return frozenset()
        calls = session.pending_tool_calls if session is not None else ()
        asking = frozenset(c.id for c in calls if self.runner.awaits_approval(self.session_id, c))
        left = self._left_open([c for c in calls if c.id in asking])
        if not left:
            return asking
        from ..lookup import Awaiting

        found = Awaiting(asking - left)
        found.left_open = left
        return found

    def _left_open(self, calls: list[ToolCall]) -> frozenset[str]:
        """The ids of ``calls`` (not a custom tool's) that a run which ended during its tool
        calls left without a result: they wait for no approval."""
        from ..lookup import left_open

        return left_open(self.store, self.session_id,
                         [c for c in calls if self.runner.awaits_approval(self.session_id, c)])

    async def _answer_tools(self, calls: list[ToolCall]) -> bool:
        """Ask the user for the result of each custom tool call that has none yet (results
        already submitted, here or with ``chat --tool-result``, are not asked again), then
        continue the turn. False on Ctrl-C."""
        from rich.text import Text

        while calls:
            answered = self.store.submitted_tool_results(self.session_id)
            for call in calls:
                if call.id in answered:
                    continue
                if self.runner.awaits_approval(self.session_id, call):
                    if not await self._approve(call):
                        self.say(f"turn {self.turn} waits for your approval of {call.name}; your next message asks "
                                 "again.", style="yellow")
                        return False
                    continue
                line = Text("? ", style="bold yellow")
                line.append(f"tool {safe_text(call.name)} ", style="bold")
                line.append(
                    safe_text(_short(pretty_json_text(call.arguments), max_lines=8, max_chars=600)), style="dim"
                )
                line.append("\n  type its result (JSON or text), Enter sends; Ctrl-C leaves it waiting", style="dim")
                self.console.print(line)
                try:
                    answer = await self._ask_session.prompt_async(f"{call.name} result › ")
                except (KeyboardInterrupt, EOFError):
                    self.say(f"turn {self.turn} waits for {call.name}; your next message asks again.", style="yellow")
                    return False
                try:
                    self.store.submit_tool_result(self.session_id, call.id, answer.strip())
                except ToolResultError as exc:
                    self.error(exc.message)
            session = self.store.get(self.session_id)
            pending = list(session.pending_tool_calls) if session is not None else []
            answered = self.store.submitted_tool_results(self.session_id) if pending else {}
            calls = [c for c in pending if c.id not in answered]
            if calls or not pending:
                continue  # ask for what is still open (nothing pending: the turn went on elsewhere)
            outcome = await self._run_turn(
                lambda cancel: self.runner.continue_streamed(self.session_id, cancel=cancel, wait=0)
            )
            self._refresh_info()
            result = outcome.result
            calls = list(result.pending_tool_calls) if result is not None else []
        return True

    async def _approve(self, call: ToolCall) -> bool:
        """Ask whether a tool call waiting for an approval may run (yes, no, always for this
        session) and answer it: it runs, or its result says the user declined. False on Ctrl-C."""
        from rich.text import Text

        server = self.runner.tool_server(self.session_id, call)
        named = safe_text(call.name) + (f" (server {safe_text(server)})" if server else "")
        line = Text("? ", style="bold yellow")
        line.append(f"run tool {named} ", style="bold")
        line.append(safe_text(_short(pretty_json_text(call.arguments), max_lines=8, max_chars=600)), style="dim")
        line.append("\n  y: run it  n: refuse it (the model is told)  a: always run this tool in this session",
                    style="dim")
        self.console.print(line)
        while True:
            try:
                answer = (await self._ask_session.prompt_async(f"allow {named}? [y/n/a] › ")).strip().lower()
            except (KeyboardInterrupt, EOFError):
                return False
            if answer in ("y", "yes", "n", "no", "a", "always"):
                break
        if answer in ("a", "always"):
            self.runner.approved_tools.add(call.name)
        results: list[tuple[str, bool, tuple[Any, ...], float]] = []
        session = self.store.get(self.session_id)
        agent = getattr(session.active_agent, "name", None) if session is not None else None
        self.console.print(tool_started_line(agent, call.name, call.arguments))  # as the calls a turn runs
        try:
            await asyncio.to_thread(self.runner.decide_tool_call, self.session_id, call.id, answer[0] != "n",
                                    lambda *result: results.append(result))
        except ChatflowError as exc:
            self.error(exc.message)
        for output, is_error, attachments, duration_ms in results:
            self.console.print(tool_finished_line(output, is_error, duration_ms, attachments))
        return True

    async def _run_turn(self, start: Callable[[threading.Event], Iterator[StreamEvent]]) -> _Outcome:
        """Consume a Runner event stream on a worker thread, rendering as events arrive."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancel = threading.Event()

        def put(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
            except RuntimeError:  # pragma: no cover - the loop is gone
                pass

        def work() -> None:
            try:
                for event in start(cancel):
                    put("event", event)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop
                put("error", exc)
            else:
                put("end", None)

        view = _TurnView(self.console)
        outcome = _Outcome()
        stopping = False
        stop_at = 0.0

        ended = False

        def interrupt() -> None:
            nonlocal stopping, stop_at
            if not stopping and not ended:  # a Ctrl-C read after the turn ended only clears type-ahead
                stopping = True
                stop_at = loop.time()
                cancel.set()
                view.status("stopping…")

        thread = threading.Thread(target=work, name="chatflow-repl-turn", daemon=True)
        self._turn_interrupt = interrupt
        with self._watch_keys(interrupt), self._sigint(loop, interrupt):
            thread.start()
            if self.hung_up or self.terminated:
                interrupt()
            try:
                finished = False
                while not finished:
                    try:
                        first = await asyncio.wait_for(queue.get(), _TICK_S)
                    except TimeoutError:
                        self._print_notes(view)
                        view.tick()
                        if stopping and loop.time() - stop_at > ABANDON_AFTER_S:
                            outcome.interrupted = outcome.abandoned = True
                            self._closing = thread
                            break
                        continue
                    # Events that arrived together are shown together (one refresh at most);
                    # the keyboard is read between batches, so Ctrl-C is seen at once.
                    batch = [first]
                    while len(batch) < _BATCH and not queue.empty():
                        batch.append(queue.get_nowait())
                    if self._notes:
                        self._print_notes(view)
                    for kind, value in batch:
                        if kind == "event" and not stopping and _long_text(value):
                            text = str(value.data["text"])
                            for at in range(0, len(text), _SLICE):
                                piece = text[at:at + _SLICE]
                                outcome.received += len(piece)
                                if not stopping:
                                    outcome.shown += len(piece)
                                    view.text(piece)
                                    view.stream.refresh()  # drawn now, not all at once at the end
                                    await asyncio.sleep(0)  # the keyboard and SIGINT are read here
                        elif kind == "event":
                            self._show_event(view, value, outcome, display=not stopping)
                        else:
                            if kind == "error":
                                outcome.error = value
                            finished = True
                            break
                    view.tick()
                    await asyncio.sleep(0)
            finally:
                ended = True
                self._turn_interrupt = None
                view.finish()
        self._print_notes()
        if outcome.abandoned:
            self.say(
                "⏹ interrupted: the server is not answering; the turn is stored as interrupted when the request "
                "gives up (the next message waits for that)",
                style="yellow",
            )
        elif isinstance(outcome.error, (RunInterrupted, KeyboardInterrupt)) or (stopping and outcome.error is not None):
            outcome.interrupted = True
            if outcome.received:
                kept = f"with the {_chars(outcome.received)} of reply received ({_chars(outcome.shown)} shown)"
            else:
                kept = "before any reply arrived"
            self.say(f"⏹ interrupted: turn {self.turn} was kept as interrupted {kept}; the session is ready.",
                     style="yellow")
        elif stopping and outcome.result is not None and outcome.shown < outcome.received:
            # The whole reply had arrived (the model was done) before Ctrl-C: only the display stopped.
            self.say(
                f"⏹ display stopped: turn {self.turn} had arrived whole and is stored complete "
                f"({_chars(outcome.shown)} of {_chars(outcome.received)} shown); /show prints it.",
                style="yellow",
            )
        elif outcome.error is not None:
            exc = outcome.error
            message = exc.message if isinstance(exc, ChatflowError) else f"{type(exc).__name__}: {exc}"
            if isinstance(exc, SessionArchivedError):  # its message says how to unarchive; /retry would fail again
                self.error(message)
            elif self.attachments and _refuses_images(exc, self.attachments):  # the files stay for /retry
                self.error(f"model {self.model_name} does not accept images (the provider said: {message}); "
                           "/model NAME switches to a vision model, then /retry sends the message again")
            elif self.attachments and _unreadable_image(exc, self.attachments):
                self.error(f"{_unreadable_image(exc, self.attachments)}; check that the file is a whole image")
            else:
                self.error(f"{message} (/retry sends the message again)")
        elif outcome.result is not None:
            self.last_usage_tokens = (outcome.result.usage.total_tokens if outcome.result.usage_reported
                                      else None)  # no false 0 from a server that reports none
            use = outcome.result.context
            if use and use.get("over_budget"):
                from ..render.context_notes import over_budget_note

                self.say(over_budget_note(use, outcome.result.turn), style="yellow")
            note = reply_note(outcome.result)
            if note is not None:
                self.say(f"[{note}]")
        if not self.hung_up:
            self.console.print()  # a blank line between the reply and the next prompt
        return outcome

    async def _wait_closing(self) -> bool:
        """Wait for an abandoned interrupted turn to be stored. False when the user stopped waiting."""
        thread = self._closing
        if thread is None or not thread.is_alive():
            self._closing = None
            return True
        self.say("waiting for the interrupted turn to close (the server has not answered); Ctrl-C stops waiting")
        loop = asyncio.get_running_loop()
        gave_up = False

        def stop() -> None:
            nonlocal gave_up
            gave_up = True

        with self._watch_keys(stop), self._sigint(loop, stop):
            while thread.is_alive() and not gave_up:
                await asyncio.sleep(0.05)
        if thread.is_alive():
            return False
        self._closing = None
        self._refresh_info()
        return True

    def _show_event(self, view: _TurnView, event: StreamEvent, outcome: _Outcome, *, display: bool = True) -> None:
        """Show one Runner event (``display=False`` after Ctrl-C: only count and record it)."""
        data = event.data or {}
        kind = event.type
        if kind == "text.delta":
            text = data.get("text", "")
            outcome.received += len(text)
            if display:
                outcome.shown += len(text)
                view.text(text)
        elif kind == "result":
            outcome.result = event.result
        elif kind == "message.user":
            if event.turn:
                self.turn = int(event.turn)
        elif kind == "agent.changed" and display:  # said once per change
            from rich.text import Text

            view.line(Text(agent_changed_text(data), style="yellow"), status="thinking…")
        elif kind in ("mcp.unavailable", "mcp.unknown_tools") and display:  # said once
            from rich.text import Text

            view.line(Text(safe_text(str(data.get("error") or data.get("warning") or "")), style="yellow"),
                      status="thinking…")
        elif kind == "handoff" and data.get("to_agent"):
            self.agent_name = str(data["to_agent"])
            if display:
                view.handoff(data.get("from_agent"), data.get("to_agent"))
        elif not display:
            return
        elif kind in ("context.compacted", "context.compaction_failed", "context.compaction_stopped",
                      "context.dropped"):
            from rich.text import Text

            from ..render.context_notes import context_event_note

            note = context_event_note(kind, data)
            if note is not None:
                style = "dim" if kind == "context.compacted" else "yellow"
                view.line(Text(safe_text(note), style=style), status="thinking…")
        elif kind == "tool.call_started":
            if not str(data.get("name", "")).startswith("transfer_to_"):
                view.tool_started(data.get("agent"), str(data.get("name", "?")), data.get("arguments"))
        elif kind == "tool.call_finished":
            if not str(data.get("name", "")).startswith("transfer_to_"):
                view.tool_finished(
                    str(data.get("name", "?")), data.get("output"), bool(data.get("is_error")), data.get("duration_ms"),
                    data.get("attachments") or (),
                )
        elif kind == "handoff":
            view.handoff(data.get("from_agent"), data.get("to_agent"))

    @contextlib.contextmanager
    def _watch_keys(self, on_interrupt: Callable[[], None]) -> Iterator[None]:
        """Read the keyboard while a turn runs: Ctrl-C interrupts, every other key is type-ahead.

        Type-ahead works as in a shell: the keys typed while a reply streams or a tool runs
        (text, Enter, Esc-Enter, pastes, editing keys, Ctrl-D) are kept in order and given to
        the next prompt as if typed there, so a line typed and entered during a reply is sent
        when the turn ends, and Ctrl-D pressed as a reply ends leaves. Ctrl-C stops the turn
        and, like a terminal's interrupt, discards what was typed before it. Keys already
        typed but not yet read when the turn ends are read here too, so none is lost or
        reordered.
        """
        from prompt_toolkit.input.typeahead import store_typeahead
        from prompt_toolkit.keys import Keys

        inp = self.input

        def take(presses: Iterable[Any]) -> None:
            for press in presses:
                key = press.key
                if key == Keys.ControlC:
                    self._typeahead.clear()
                    on_interrupt()
                elif key != Keys.CPRResponse:  # a late answer to a cursor query is no key
                    self._typeahead.append(press)

        def ready() -> None:
            take(inp.read_keys())

        def drain() -> None:
            with contextlib.suppress(Exception):  # a closed or broken input: nothing left to read
                for _ in range(64):  # 64 KiB of type-ahead at most
                    presses = inp.read_keys()
                    if not presses:
                        break
                    take(presses)
                take(inp.flush_keys())

        try:
            raw = inp.raw_mode()
            attach = inp.attach(ready)
        except Exception:  # noqa: BLE001 - an input that cannot be watched: SIGINT still works
            yield
            return
        try:
            with raw, attach:
                try:
                    yield
                finally:
                    drain()
        finally:
            if self._typeahead:
                store_typeahead(inp, self._typeahead)  # the next prompt reads these first
                self._typeahead = []

    @contextlib.contextmanager
    def _sigint(self, loop: asyncio.AbstractEventLoop, on_interrupt: Callable[[], None]) -> Iterator[None]:
        installed = False
        try:
            loop.add_signal_handler(signal.SIGINT, on_interrupt)
            installed = True
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass
        try:
            yield
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGINT)


def _long_text(event: StreamEvent) -> bool:
    """Whether ``event`` is reply text too long to show in one go (:data:`_SLICE`)."""
    return event.type == "text.delta" and len(str((event.data or {}).get("text", ""))) > _SLICE


def _chars(count: int) -> str:
    return f"{count:,} character" + ("" if count == 1 else "s")


def plural_rows(count: int) -> str:
    return f"{count} row" + ("" if count == 1 else "s")


def _short(text: str, *, max_lines: int = 4, max_chars: int = 240) -> str:
    """``text`` folded for a tool line: at most ``max_lines`` lines / ``max_chars`` characters."""
    lines = text.splitlines() or [""]
    cut = "\n".join(lines[:max_lines])[:max_chars]
    if len(cut) >= len(text.rstrip("\n")):
        return text
    return f"{cut}… ({len(text) - len(cut)} more characters; /show has them all with --full)"


def _unreadable_image(exc: BaseException, attachments: Any) -> str | None:
    from ..core.attachments import unreadable_image

    return unreadable_image(exc, attachments)


def _names(attachments: Any) -> str:
    """The files' names, each on one inert line, joined by commas."""
    from ..core.attachments import attachment_line

    return ", ".join(safe_text(attachment_line(a), one_line=True) for a in attachments)


def _refuses_images(exc: BaseException, attachments: Any) -> bool:
    from ..core.attachments import refuses_images

    return refuses_images(exc, attachments)
