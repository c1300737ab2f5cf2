"""The interactive REPL (issue 6): ``chatflow`` or ``chatflow chat`` with no message, on a terminal.

Entry point, called lazily by the CLI (prompt-toolkit is imported only here)::

    run_repl(state, *, session_id=None, continue_last=False, model=None, agent=None,
             base_url=None, max_turns=None, system=None, input=None, output=None,
             console=None) -> int

``state`` is the CLI's :class:`chatflow_cli.cli.State` (settings, store, consoles).
``session_id`` continues (or creates) that session; ``continue_last`` picks the most
recently updated one; otherwise a new session id is made. ``model``/``agent``/``base_url``
are the ``--model``/``--agent``/``--base-url`` flags. ``input``/``output`` are
prompt-toolkit ``Input``/``Output`` objects (tests pass ``create_pipe_input()`` and
``DummyOutput()``); ``console`` is the Rich console replies are rendered on (default: the
CLI's stdout console). Returns the exit status (0). Configuration problems raise the
chatflow errors the CLI's error boundary reports; nothing that happens in a turn ends the
REPL.

Keys:

=====================  ============================================================
Enter                  send the message (in a Ctrl-R search: take the match and send it)
Esc Enter / Alt-Enter  a new line in the message
paste                  a bracketed paste is inserted as it is (one message, CRLF
                       made LF), and sent only on Enter
Ctrl-X Ctrl-E, /edit   write the message in ``$VISUAL`` / ``$EDITOR``; the text comes back
                       to the prompt for review and Enter sends it
Up / Down, Ctrl-R      history (kept in ``<data dir>/repl_history``, mode 0600), search
Right arrow            accept the grey suggestion taken from history
Tab                    complete a slash command, a session id, an agent name
Ctrl-C                 at the prompt: clear it; while a reply streams or a tool runs:
                       stop the turn (stored as interrupted) and come back here
Ctrl-D                 at an empty prompt: leave
=====================  ============================================================

Slash commands: ``/help``, ``/new``, ``/sessions``, ``/switch ID``, ``/show [--full]``,
``/rollback [N]`` (keep turns 1..N as ``/show`` numbers them; default: drop the last
turn; asks first), ``/retry`` (send the last failed message again, also after reopening
the session: it is in the event log; when nothing failed it says so and offers, asking
first, to roll back the last turn for another answer), ``/agent [NAME]``,
``/model [NAME]``, ``/metadata [KEY=VALUE]``, ``/edit``, ``/clear`` (the screen only),
``/exit``. ``/switch ID`` talks to ID's stored model and endpoint, as
``chatflow chat -s ID`` does (the session being left keeps its own), and ``/new`` goes
back to the ones from the flags or config; a change is announced (``model: M (session
ID)``). An unknown command gets a suggestion when one is close (difflib ratio 0.75),
and never reaches the model; a message that really starts with ``/`` is sent by typing
``//`` first. Blank or whitespace-only input is neither sent nor kept in the history.

While a turn runs: a spinner until the first token; the reply streams as Markdown
(:class:`~chatflow_cli.markdown_stream.MarkdownStream`: finished blocks printed once,
only the tail redrawn); tool calls print as they start and finish (arguments and results
folded when long); a handoff prints ``handoff: A -> B`` and the prompt then shows the new
agent. A custom tool (config ``tools = [{name, description, parameters}]``) asks here for
its result — JSON or plain text — and the turn continues. A provider error prints one
line and keeps the message for ``/retry``.

The bottom toolbar shows the session id, active agent, model, turn number, context
window use (turns in the window of ``max_turns``) and the tokens of the last turn.

How a turn runs: the Runner's ``run_streamed`` generator is consumed on a worker thread
(it blocks on the network and on tools); its events come to the asyncio loop through a
queue. Meanwhile the terminal is in raw mode and its keys are read, so Ctrl-C arrives as
a key (SIGINT is handled too) and sets the Runner's cancel event; the Runner stores the
turn as interrupted and the REPL returns to the prompt. Keys typed during a turn are
type-ahead, as in a shell: kept in order and acted on by the next prompt as if typed
there (a line typed and entered during a reply is sent when the turn ends; Ctrl-D
leaves); Ctrl-C discards the type-ahead typed before it.
Closing the terminal (SIGHUP) during a turn stops it as Ctrl-C does — the Runner stores
it as interrupted with the partial reply — and then the REPL leaves.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import difflib
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core.errors import ChatflowError, RunInterrupted, ToolResultError, UsageError
from .render import pretty_json_text, reply_note, safe_text

__all__ = ["COMMANDS", "HISTORY_FILENAME", "Repl", "run_repl"]

HISTORY_FILENAME = "repl_history"

#: name -> (arguments, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "/help": ("", "list the commands and keys"),
    "/new": ("", "start a new session"),
    "/sessions": ("", "list recent sessions"),
    "/switch": ("ID", "continue another session"),
    "/show": ("[--full]", "show this session's turns (--full: long tool calls and results unfolded)"),
    "/rollback": ("[N]", "keep turns 1..N (default: drop the last turn); asks first"),
    "/retry": ("", "send the last failed message again (nothing failed: asks to redo the last turn)"),
    "/agent": ("[NAME]", "list the agents, or make NAME the active agent"),
    "/model": ("[NAME]", "show or change the model"),
    "/metadata": ("[KEY=VALUE]", "show or set the session's metadata"),
    "/edit": ("", "write the message in $EDITOR (also Ctrl-X Ctrl-E)"),
    "/clear": ("", "clear the screen"),
    "/exit": ("", "leave the REPL (also Ctrl-D)"),
}
_ALIASES = {"/quit": "/exit", "/q": "/exit", "/h": "/help", "/?": "/help"}
#: difflib ratio an unknown command needs to get a "did you mean" ("/shwo" vs "/show" is 0.8).
_SUGGEST_CUTOFF = 0.75
_TICK_S = 0.08  # spinner and late-text refresh while waiting for events
_BATCH = 512  # events shown between two looks at the keyboard
#: After Ctrl-C, how long the REPL waits for the Runner to store the interrupted turn before
#: it gives the prompt back anyway (a server that never sends its response headers keeps
#: the request blocked until the client's timeout); the next turn waits for that close.
ABANDON_AFTER_S = 3.0
#: After SIGHUP, how long the REPL waits for an interrupted turn still closing before it exits.
HANGUP_WAIT_S = 15.0


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------
def run_repl(
    state: Any,
    *,
    session_id: str | None = None,
    continue_last: bool = False,
    model: str | None = None,
    agent: str | None = None,
    base_url: str | None = None,
    max_turns: int | None = None,
    system: str | None = None,
    input: Any = None,
    output: Any = None,
    console: Any = None,
) -> int:
    """Run the REPL until ``/exit`` or Ctrl-D; see the module docstring. Returns 0.

    ``max_turns`` and ``system`` (``--max-turns``, ``--system``) apply to a session the
    REPL creates, as in ``chatflow chat``.
    """
    from .chat import (ChatOptions, _runner, endpoint_of, existing_session, remember_endpoint, session_endpoint,
                       transport_for)
    from .cli import _notice, new_session_id, validate_session_id
    from .config import ensure_private_dir, resolve_model

    if session_id and continue_last:
        raise UsageError("give --session or --continue, not both")
    reader = state.store(create=False)  # the session's stored model and endpoint, if it exists
    if session_id:
        sid = validate_session_id(session_id)
    elif continue_last:
        latest = reader.latest_session_id() if reader is not None else None
        if latest is None:
            from .core.errors import NotFoundError

            raise NotFoundError("no session to continue: start one with chatflow")
        sid = latest
    else:
        sid = new_session_id()
    existing = existing_session(reader, sid) if reader is not None else None
    settings = state.settings(**dict(zip(("model", "base_url"),
                                         session_endpoint(state, reader, existing, model, base_url))))
    choice = resolve_model(settings)  # configuration problems before anything is stored
    store = reader if reader is not None else state.store()
    console = console if console is not None else state.out()
    if choice.local:
        _notice(state, "starting the local model (SmolLM2 on llama.cpp)…")
    history_path = ensure_private_dir(Path(settings.data_dir)) / HISTORY_FILENAME
    opts = ChatOptions(model=model, agent=agent, base_url=base_url)
    # /switch and /new talk to the other session's stored model and endpoint, else these
    defaults = endpoint_of(resolve_model(state.settings(model=model, base_url=base_url)))
    transport = transport_for("openai")

    def client_for(url: str) -> Any:
        from .core.model import ModelClient

        return ModelClient(url, choice.api_key, timeout=opts.timeout, transport=transport)

    with _runner(state, settings, opts, store, transport=transport) as runner:
        repl = Repl(
            runner,
            store,
            sid,
            console=console,
            input=input,
            output=output,
            history_path=history_path,
            max_turns=max_turns or settings.max_turns,
            system=system,
            new_session_id=new_session_id,
            validate_session_id=validate_session_id,
            resume_prefix=_resume_prefix(state),
            endpoint=endpoint_of(choice),
            default_endpoint=defaults,
            client_for=None if choice.local else client_for,
        )
        try:
            return asyncio.run(repl.run())
        finally:  # the session keeps its model (a /model or /switch change too) and endpoint
            remember_endpoint(store, repl.session_id, choice, model=repl.endpoint[0], base_url=repl.endpoint[1])


def _resume_prefix(state: Any) -> list[str]:
    """``chatflow`` with the global options that pick this store and config (``--db``, ``--config``)."""
    prefix = ["chatflow"]
    if getattr(state, "db", None):
        from .core._dsn import dsn_without_password  # never printed: PGPASSWORD or ~/.pgpass give it then

        prefix += ["--db", dsn_without_password(str(state.db))]
    if getattr(state, "config", None):
        prefix += ["--config", str(state.config)]
    return prefix


# --------------------------------------------------------------------------------------
# the reply as it streams
# --------------------------------------------------------------------------------------
class _TurnView:
    """One turn on screen: spinner, streamed Markdown, tool and handoff lines."""

    def __init__(self, console: Any) -> None:
        from .markdown_stream import MarkdownStream

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
        from rich.text import Text

        line = Text()
        line.append("⚙ ", style="yellow")
        line.append(f"{safe_text(agent or 'model')} called ", style="dim")
        line.append(safe_text(name), style="bold yellow")
        args = safe_text(_short(pretty_json_text(arguments)))
        if args:
            line.append(" " + args, style="dim")
        self.line(line, status=f"running {safe_text(name)}…")

    def tool_finished(self, name: str, output: str | None, is_error: bool, duration_ms: float | None) -> None:
        from rich.text import Text

        line = Text("  ✗ error: " if is_error else "  ↳ ", style="red" if is_error else "dim")
        line.append(safe_text(_short(pretty_json_text(output))), style="dim")
        if duration_ms and duration_ms >= 100:
            line.append(
                f"  ({duration_ms / 1000:.1f}s)" if duration_ms >= 1000 else f"  ({duration_ms:.0f}ms)", style="dim"
            )
        self.line(line, status="thinking…")

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
    result: Any = None
    error: BaseException | None = None
    interrupted: bool = False
    abandoned: bool = False  # interrupted, but the turn is still closing on its worker thread
    received: int = 0  # characters of reply text received
    shown: int = 0  # of which shown (none after Ctrl-C)


# --------------------------------------------------------------------------------------
# the REPL
# --------------------------------------------------------------------------------------
class Repl:
    """The REPL's state and loop. Built by :func:`run_repl`; tests may build it directly.

    Args:
        runner: a :class:`~chatflow_cli.core.runner.Runner` (its store is ``store``).
        store: the session store.
        session_id: the session to talk in (created with the first message if new).
        console: the Rich console replies are rendered on.
        input, output: prompt-toolkit input/output (None: the terminal).
        history_path: the input history file (created 0600), or None for memory only.
        max_turns: ``max_turns`` of a session created here (None: the store's default).
        system: a system message for a session created here.
    """

    def __init__(
        self,
        runner: Any,
        store: Any,
        session_id: str,
        *,
        console: Any,
        input: Any = None,
        output: Any = None,
        history_path: Path | None = None,
        max_turns: int | None = None,
        system: str | None = None,
        new_session_id: Callable[[], str] | None = None,
        validate_session_id: Callable[[str], str] | None = None,
        resume_prefix: Iterable[str] = ("chatflow",),
        endpoint: tuple[str | None, str | None] = (None, None),
        default_endpoint: tuple[str | None, str | None] | None = None,
        client_for: Callable[[str], Any] | None = None,
    ) -> None:
        from prompt_toolkit.input import create_input
        from prompt_toolkit.output import create_output

        self.runner = runner
        self.store = store
        self.session_id = session_id
        self.console = console
        self.input = input if input is not None else create_input()
        self.output = output if output is not None else create_output()
        self.history_path = history_path
        self.max_turns = max_turns
        self.system = system
        self._new_session_id = new_session_id or _fallback_session_id
        self._validate_session_id = validate_session_id or (lambda s: s)
        self.resume_prefix = list(resume_prefix)
        #: the (model, base URL) this run talks to, as stored with a session; the defaults
        #: (flags, else config) are what ``/new`` goes back to; ``client_for(url)`` makes a
        #: model client for another endpoint (``None``: the endpoint is not switched)
        self.endpoint = endpoint
        self.default_endpoint = default_endpoint if default_endpoint is not None else endpoint
        self._client_for = client_for
        self.done = False
        self.hung_up = False  # the terminal went away (SIGHUP): finish the turn quietly and leave
        self._turn_interrupt: Callable[[], None] | None = None  # stops the running turn, if any
        self._devnull: Any = None
        self.failed_message: str | None = None  # kept after a provider error, for /retry
        self.last_usage_tokens: int | None = None
        self._prefill = ""
        self._typeahead: list[Any] = []  # key presses typed while a turn ran
        self._closing: threading.Thread | None = None  # an interrupted turn still being stored
        self._notes: collections.deque[logging.LogRecord] = collections.deque(maxlen=50)
        self._ids_cache: tuple[float, list[str]] = (0.0, [])
        # what the toolbar shows, refreshed after each turn and command
        self.agent_name = runner.starting_agent.name
        self.turn = 0
        self.window_turns = 0
        self.session_max_turns = max_turns or getattr(store, "default_max_turns", 40)
        self.exists = False
        self._refresh_info()
        self.prompt_session = self._make_prompt_session()
        self._ask_session = self._make_ask_session()

    # ---------------------------------------------------------------- prompt-toolkit
    def _make_prompt_session(self) -> Any:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
        from prompt_toolkit.filters import completion_is_selected, has_completions, is_searching
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings
        from prompt_toolkit.styles import Style

        bindings = KeyBindings()

        @bindings.add("enter", filter=has_completions & completion_is_selected)
        def _take_completion(event: Any) -> None:
            buffer = event.current_buffer
            buffer.complete_state = None
            word = buffer.document.text_before_cursor.split(" ")[0]
            if COMMANDS.get(word, ("", ""))[0] and not buffer.document.text_after_cursor:
                buffer.insert_text(" ")

        @bindings.add("enter", filter=~(has_completions & completion_is_selected) & ~is_searching)
        def _send(event: Any) -> None:
            event.current_buffer.validate_and_handle()

        @bindings.add("enter", filter=is_searching)
        def _accept_search_and_send(event: Any) -> None:
            """Enter in a Ctrl-R search takes the match and sends it, as readline's accept-line does."""
            from prompt_toolkit import search

            search.accept_search()
            event.app.current_buffer.validate_and_handle()

        @bindings.add("c-x", "c-e")
        def _open_editor(event: Any) -> None:
            """Ctrl-X Ctrl-E: edit the message in $VISUAL/$EDITOR; the text comes back to the
            prompt for review (Enter sends), as with /edit — never sent when the editor closes."""
            event.current_buffer.open_in_editor(validate_and_handle=False)

        @bindings.add("escape", "enter")
        def _newline(event: Any) -> None:
            event.current_buffer.insert_text("\n")

        @bindings.add("tab", filter=~has_completions)
        def _complete_now(event: Any) -> None:
            """Tab completes from what is typed *now*: a single match is inserted, several
            insert their common part and open the menu. (prompt-toolkit's own Tab does nothing
            while the completion started by typing is still running, so ``/sw`` Tab typed
            fast would open the menu without inserting ``/switch``.)"""
            from prompt_toolkit.completion import CompleteEvent

            buffer = event.current_buffer
            document = buffer.document
            found = list(buffer.completer.get_completions(document, CompleteEvent(completion_requested=True)))
            if not found:
                return
            if len(found) == 1:
                buffer.cancel_completion()
                buffer.apply_completion(found[0])
                return
            from prompt_toolkit.completion import get_common_complete_suffix

            common = get_common_complete_suffix(document, found)
            if common:
                buffer.insert_text(common)
            buffer.start_completion(select_first=False)

        if self.history_path is not None:
            _private_file(self.history_path)
            history: Any = _SkipBlank(FileHistory)(str(self.history_path))
        else:
            history = _SkipBlank(InMemoryHistory)()
        style = Style.from_dict(
            {
                "agent": "bold ansicyan",
                "bottom-toolbar": "noreverse bg:#262626 #bcbcbc",
                "bottom-toolbar.key": "bold",
                "bottom-toolbar.sep": "#6c6c6c",
            }
        )
        return PromptSession(
            history=history,
            auto_suggest=AutoSuggestFromHistory(),
            completer=_slash_completer(self),
            complete_while_typing=True,
            key_bindings=bindings,
            multiline=True,
            bottom_toolbar=self._toolbar,
            prompt_continuation=lambda width, line_number, wrap_count: "… ".rjust(width),
            style=style,
            input=self.input,
            output=self.output,
        )

    def _make_ask_session(self) -> Any:
        from prompt_toolkit import PromptSession

        return PromptSession(input=self.input, output=self.output)

    def _prompt_message(self) -> Any:
        return [("class:agent", safe_text(self.agent_name)), ("", " › ")]

    def _toolbar(self) -> Any:
        """``session · agent · model · turn N · ctx W/M · T tok``: compact enough for 80 columns."""
        sep = ("class:bottom-toolbar.sep", " │ ")
        parts = [
            ("", " "),
            ("class:bottom-toolbar.key", safe_text(self.session_id)),
            sep,
            ("", safe_text(self.agent_name)),
            sep,
            ("", safe_text(self.model_name or "?")),
            sep,
            ("", f"turn {self.turn}"),
            sep,
            ("", f"ctx {self.window_turns}/{self.session_max_turns}"),
        ]
        if self.last_usage_tokens is not None:
            parts += [sep, ("", f"{self.last_usage_tokens} tok")]
        return parts

    @property
    def model_name(self) -> str | None:
        agent = self.runner.agents.get(self.agent_name)
        return (getattr(agent, "model", None) or self.runner.default_model) if agent else self.runner.default_model

    def _refresh_info(self) -> None:
        """Re-read what the toolbar and prompt show from the store (one indexed read)."""
        try:
            session = self.store.get(self.session_id)
        except ChatflowError:
            session = None
        self.exists = session is not None
        if session is None:
            self.agent_name = self.runner.starting_agent.name
            self.turn = self.window_turns = 0
            self.session_max_turns = self.max_turns or getattr(self.store, "default_max_turns", 40)
            return
        self.agent_name = getattr(session.active_agent, "name", str(session.active_agent))
        self.turn = session.turn_count
        self.window_turns = len(session.turns)
        self.session_max_turns = session.max_turns

    # ---------------------------------------------------------------- output helpers
    def say(self, text: str, style: str = "dim") -> None:
        from rich.text import Text

        from .markdown_stream import print_unpadded

        # Wrapped between words at the terminal's width (with no trailing spaces), so a
        # narrow terminal never cuts a word in two.
        print_unpadded(self.console, Text(text, style=style))

    def recap(self) -> None:
        """On opening an existing session: its last exchange, as ``/show`` prints it; taller
        than half the screen, its title, the user's message and the reply's last rows."""
        from rich.text import Text

        from .markdown_stream import print_unpadded
        from .render import turn_renderables

        try:
            records = self.store.load_turns(self.session_id, first=max(1, self.turn))
        except ChatflowError:
            return
        if not records:
            return
        record = records[-1]
        width = self.console.width
        lines: list[Any] = []
        for item in turn_renderables(record, markdown=True, width=width):
            lines.extend(self.console.render_lines(item, self.console.options, pad=False))
        while lines and not "".join(seg.text for seg in lines[-1]).strip():
            lines.pop()
        from rich.segment import Segment, Segments

        def text_of(line: list[Any]) -> str:
            return "".join(segment.text for segment in line)

        room = max(8, self.console.size.height // 2)
        if len(lines) > room:
            # The title and the user's message stay; the reply keeps its last rows.
            head = 1
            if head < len(lines) and text_of(lines[head]).startswith("You: "):
                head += 1
                while head < min(len(lines), 5) and text_of(lines[head]).startswith("     "):
                    head += 1
            tail = room - head - 1
            hidden = len(lines) - head - tail
            note = Text(f"  … {plural_rows(hidden)} more; /show prints the whole turn", style="dim")
            lines = [*lines[:head], *self.console.render_lines(note, self.console.options, pad=False), *lines[-tail:]]
        segments: list[Any] = []
        for line in [*lines, []]:  # and a blank line before the prompt
            segments.extend(line)
            segments.append(Segment.line())
        print_unpadded(self.console, Segments(segments))
        if self._failed_in_log() is not None:
            self.say("your last message failed: /retry sends it again", style="yellow")

    def farewell(self) -> None:
        """On leaving: the session id and the command that opens it again."""
        if self.exists:
            from .render import plural

            self.say(f"session {self.session_id} ({plural(self.turn, 'turn')}) · resume: {self.resume_command()}")
        else:
            self.say("nothing was sent; no session was stored")

    def resume_command(self) -> str:
        return shlex.join([*self.resume_prefix, "chat", "-s", self.session_id])

    def error(self, text: str) -> None:
        from rich.text import Text

        # One logical line (the terminal wraps it), so it reads and copies as one line.
        self.console.print(Text("error: ", style="bold red") + Text(safe_text(text).replace("\n", " ")), soft_wrap=True)

    # ---------------------------------------------------------------- the loop
    async def run(self) -> int:
        """Read, run, print until ``/exit`` or Ctrl-D. Returns 0."""
        from .render import plural

        state = plural(self.turn, "turn") if self.exists else "new"
        self.say(f"chatflow · session {self.session_id} ({state}) · agent {self.agent_name} · model {self.model_name}")
        self.say("Enter sends · Esc-Enter new line · /help · Ctrl-D leaves")
        if self.exists:
            self.recap()
        try:
            with self._log_notes(), self._hangup_handler(), self._raw_terminal():
                while not self.done:
                    try:
                        text = await self.prompt_session.prompt_async(
                            self._prompt_message, default=self._take_prefill()
                        )
                    except KeyboardInterrupt:
                        continue  # Ctrl-C clears the line
                    except (EOFError, OSError):  # Ctrl-D, or the terminal is gone
                        break
                    try:
                        await self.handle(text)
                    except ChatflowError as exc:
                        self.error(exc.message)
                if self.hung_up:
                    await self._let_the_turn_close()
                else:
                    self.farewell()
        finally:
            if self._devnull is not None:
                self._devnull.close()
        return 0

    @contextlib.contextmanager
    def _raw_terminal(self) -> Iterator[None]:
        """Keep the terminal in raw mode for the whole run, also between prompts and turns.

        In the terminal's cooked mode, Ctrl-D is not a key but an end-of-file that the line
        discipline swallows when raw mode comes back: a Ctrl-D pressed right as a reply ends
        (or while a command prints) would be lost. Raw mode only changes how keys are read
        (output is processed as before); the editor runs in cooked mode.
        """
        try:
            raw = self.input.raw_mode()
            raw.__enter__()
        except Exception:  # noqa: BLE001 - not a terminal: nothing to keep
            yield
            return
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                raw.__exit__(None, None, None)

    @contextlib.contextmanager
    def _cooked_terminal(self) -> Iterator[None]:
        try:
            cooked = self.input.cooked_mode()
            cooked.__enter__()
        except Exception:  # noqa: BLE001 - not a terminal
            yield
            return
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                cooked.__exit__(None, None, None)

    @contextlib.contextmanager
    def _hangup_handler(self) -> Iterator[None]:
        """SIGHUP (the terminal closed) is handled like Ctrl-C during a turn, then the REPL leaves.

        A running turn is cancelled and the Runner stores it as interrupted with the partial
        reply (not left ``running`` for the next command to recover); output goes nowhere from
        then on (the terminal is gone); a prompt on screen ends as Ctrl-D would. The handler
        is the REPL's only while it runs; the previous one is put back after.
        """
        loop = asyncio.get_running_loop()
        hup = getattr(signal, "SIGHUP", None)
        previous = signal.getsignal(hup) if hup is not None else None
        try:
            loop.add_signal_handler(hup, self._hang_up)  # type: ignore[arg-type]
        except (NotImplementedError, RuntimeError, ValueError, TypeError):  # no SIGHUP here, or not the main thread
            yield
            return
        try:
            yield
        finally:
            loop.remove_signal_handler(hup)  # type: ignore[arg-type]
            if previous is not None:
                signal.signal(hup, previous)  # type: ignore[arg-type]

    def _hang_up(self) -> None:
        self.hung_up = True
        self.done = True
        if self._devnull is None:
            self._devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - closed when run() ends
            self.console.file = self._devnull
        if self._turn_interrupt is not None:
            self._turn_interrupt()
            return
        for session in (self.prompt_session, self._ask_session):
            app = session.app
            if app.is_running and not app.future.done():
                app.exit(exception=EOFError())

    async def _let_the_turn_close(self) -> None:
        """After a hang-up: wait (at most :data:`HANGUP_WAIT_S`) for an interrupted turn still closing."""
        thread = self._closing
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, HANGUP_WAIT_S)

    @contextlib.contextmanager
    def _log_notes(self) -> Iterator[None]:
        """Show library warnings as REPL lines instead of raw stderr writes.

        With no logging configured (no ``--debug``), Python would write warnings straight
        to stderr, in the middle of the live reply. Records are queued (they may come from
        worker threads) and printed by the loop: above the live tail during a turn, or
        before the next prompt.
        """
        root = logging.getLogger()
        if any(_writes_to_terminal(h) for h in root.handlers):  # --debug logging: leave it as it is
            yield
            return
        handler = _QueueHandler(self._notes)
        handler.setLevel(logging.WARNING)
        root.addHandler(handler)
        try:
            yield
        finally:
            root.removeHandler(handler)
            self._print_notes()

    def _print_notes(self, view: _TurnView | None = None) -> None:
        from rich.text import Text

        while self._notes:
            record = self._notes.popleft()
            line = Text(f"{record.levelname.lower()}: {safe_text(record.getMessage())}", style="yellow")
            if view is not None:
                view.line(line)
            else:
                self.console.print(line)

    def _take_prefill(self) -> str:
        text = self._prefill
        self._prefill = ""
        return text

    async def handle(self, text: str) -> None:
        """One line from the prompt: a slash command or a message."""
        stripped = text.strip()
        if not stripped:
            return
        if stripped.startswith("//"):
            await self.send(text.lstrip()[1:])
        elif stripped.startswith("/"):
            await self.command(stripped)
        else:
            await self.send(text)

    # ---------------------------------------------------------------- messages and turns
    async def send(self, text: str) -> None:
        """Send ``text`` as the next user message (answering pending custom tools first)."""
        if not await self._wait_closing() or not await self._settle_pending():
            self._prefill = text
            return
        self.failed_message = None
        outcome = await self._run_turn(
            lambda cancel: self.runner.run_streamed(
                self.session_id, text, cancel=cancel, max_turns=self.max_turns, system=self.system, wait=0
            )
        )
        if outcome.error is not None and not outcome.interrupted:
            self.failed_message = text
        await self._after_turn(outcome)

    async def _after_turn(self, outcome: _Outcome) -> None:
        result = outcome.result
        self._refresh_info()
        if result is not None and result.pending_tool_calls and not self.hung_up:
            await self._answer_tools(list(result.pending_tool_calls))

    async def _settle_pending(self) -> bool:
        """Custom tool calls still open (from before): ask for them first. False if the user declined."""
        session = self.store.get(self.session_id)
        if session is None or not session.pending_tool_calls:
            return True
        self.say(f"turn {session.turn_count} is waiting for tool results first.", style="yellow")
        return await self._answer_tools(list(session.pending_tool_calls))

    async def _answer_tools(self, calls: list[Any]) -> bool:
        """Ask the user for each custom tool result, then continue the turn. False on Ctrl-C."""
        from rich.text import Text

        while calls:
            remaining: list[str] = []
            for call in calls:
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
                    remaining = self.store.submit_tool_result(self.session_id, call.id, answer.strip())
                except ToolResultError as exc:
                    self.error(exc.message)
                    remaining = []
            if remaining:
                session = self.store.get(self.session_id)
                calls = [c for c in (session.pending_tool_calls if session else ()) if c.id in remaining]
                continue
            outcome = await self._run_turn(
                lambda cancel: self.runner.continue_streamed(self.session_id, cancel=cancel, wait=0)
            )
            self._refresh_info()
            result = outcome.result
            calls = list(result.pending_tool_calls) if result is not None else []
        return True

    async def _run_turn(self, start: Callable[[threading.Event], Iterator[Any]]) -> _Outcome:
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

        def interrupt() -> None:
            nonlocal stopping, stop_at
            if not stopping:
                stopping = True
                stop_at = loop.time()
                cancel.set()
                view.status("stopping…")

        thread = threading.Thread(target=work, name="chatflow-repl-turn", daemon=True)
        self._turn_interrupt = interrupt
        with self._watch_keys(interrupt), self._sigint(loop, interrupt):
            thread.start()
            if self.hung_up:
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
                        if kind == "event":
                            self._show_event(view, value, outcome, display=not stopping)
                        else:
                            if kind == "error":
                                outcome.error = value
                            finished = True
                            break
                    view.tick()
                    await asyncio.sleep(0)
            finally:
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
            self.say(
                f"⏹ interrupted: turn {self.turn} was kept as interrupted with the {_chars(outcome.received)} of reply "
                f"received ({_chars(outcome.shown)} shown); the session is ready.",
                style="yellow",
            )
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
            self.error(f"{message} (/retry sends the message again)")
        elif outcome.result is not None:
            self.last_usage_tokens = outcome.result.usage.total_tokens if outcome.result.usage else None
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

    def _show_event(self, view: _TurnView, event: Any, outcome: _Outcome, *, display: bool = True) -> None:
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
        elif kind == "handoff" and data.get("to_agent"):
            self.agent_name = str(data["to_agent"])
            if display:
                view.handoff(data.get("from_agent"), data.get("to_agent"))
        elif not display:
            return
        elif kind == "tool.call_started":
            if not str(data.get("name", "")).startswith("transfer_to_"):
                view.tool_started(data.get("agent"), str(data.get("name", "?")), data.get("arguments"))
        elif kind == "tool.call_finished":
            if not str(data.get("name", "")).startswith("transfer_to_"):
                view.tool_finished(
                    str(data.get("name", "?")), data.get("output"), bool(data.get("is_error")), data.get("duration_ms")
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

    # ---------------------------------------------------------------- slash commands
    async def command(self, line: str) -> None:
        """Run a slash command line (``/name args``)."""
        name, _, arg = line.partition(" ")
        name = _ALIASES.get(name.lower(), name.lower())
        arg = arg.strip()
        handler = getattr(self, "cmd_" + name[1:], None) if name in COMMANDS else None
        if handler is None:
            # Only a close match is suggested ("/shwo" -> "/show"); "/" or "/ hello" match nothing.
            close = difflib.get_close_matches(name, [*COMMANDS, *_ALIASES], n=1, cutoff=_SUGGEST_CUTOFF)
            hint = f" — did you mean {_ALIASES.get(close[0], close[0])}?" if close else ""
            self.error(
                f"unknown command {safe_text(name)}{hint} (/help lists them; start a message with // to send a slash)"
            )
            return
        await handler(arg)

    async def cmd_help(self, arg: str) -> None:
        from rich.table import Table

        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for name, (args, text) in COMMANDS.items():
            table.add_row(f"{name} {args}".rstrip(), text)
        table.add_row("", "")
        for keys, text in [
            ("Enter", "send"),
            ("Esc Enter / Alt-Enter", "new line"),
            ("Ctrl-C", "stop the reply or tool; at the prompt, clear it"),
            ("Ctrl-R, Up", "search / walk the history"),
            ("Ctrl-X Ctrl-E", "edit in $EDITOR"),
            ("Ctrl-D", "leave"),
        ]:
            table.add_row(keys, text)
        from .markdown_stream import print_unpadded

        print_unpadded(self.console, table)

    async def cmd_exit(self, arg: str) -> None:
        self.done = True

    async def cmd_clear(self, arg: str) -> None:
        self.console.clear()

    def _enter_endpoint(self, session_id: str | None) -> None:
        """Leave the current session keeping its model and endpoint, then talk to
        ``session_id``'s stored ones (``None``: a new session, the defaults), as resuming it
        with ``chatflow chat -s`` would; a change is announced."""
        current = self.endpoint
        try:
            if self.store.get(self.session_id) is not None and current[0] \
                    and self.store.session_endpoint(self.session_id) != current:
                self.store.set_session_endpoint(self.session_id, current[0], current[1])
            stored = self.store.session_endpoint(session_id) if session_id else (None, None)
        except ChatflowError:
            stored = (None, None)
        model = stored[0] or self.default_endpoint[0]
        url = stored[1] or self.default_endpoint[1]
        whose = f"session {session_id}" if session_id else "a new session"
        if url != current[1] and url and current[1] and self._client_for is not None:
            self.runner.model_client = self._client_for(url)
            self.endpoint = (self.endpoint[0], url)
            self.say(f"endpoint: {safe_text(url)} ({whose})")
        if model and model != current[0] and model != "local" and current[0] != "local":
            for agent in self.runner.agents.values():
                if agent.model == current[0]:  # an agent with a model of its own keeps it
                    agent.model = model
            self.runner.default_model = model
            self.endpoint = (model, self.endpoint[1])
            self.say(f"model: {safe_text(model)} ({whose})")

    async def cmd_new(self, arg: str) -> None:
        self._enter_endpoint(None)
        self.session_id = self._new_session_id()
        self.failed_message = None
        self.last_usage_tokens = None
        self._refresh_info()
        self.say(f"new session {self.session_id}")

    async def cmd_sessions(self, arg: str) -> None:
        summaries = self.store.list_sessions(limit=20)
        if not summaries:
            self.say("no sessions yet")
            return
        for line in session_lines(summaries, self.console.width, current=self.session_id):
            self.console.print(line, soft_wrap=True)

    async def cmd_switch(self, arg: str) -> None:
        if not arg:
            self.error("/switch needs a session id (Tab completes; /sessions lists them)")
            return
        session = self.store.get(arg)
        if session is None:
            close = difflib.get_close_matches(arg, self._session_ids(), n=1)
            self.error(f"no session {safe_text(arg)}" + (f" — did you mean {close[0]}?" if close else ""))
            return
        self._enter_endpoint(arg)
        self.session_id = arg
        self.failed_message = None
        self.last_usage_tokens = None
        self._refresh_info()
        from .render import plural

        self.say(f"session {arg}: {plural(self.turn, 'turn')}, agent {self.agent_name}")
        if self.turn:
            self.recap()

    async def cmd_show(self, arg: str) -> None:
        """``/show`` folds long tool arguments and results as ``chatflow sessions show`` does;
        ``/show --full`` (or ``-f``) prints them whole — the REPL's tool lines point here."""
        from .render import turn_interrupted, turn_renderables
        from .show import _InterruptedTurns

        if arg not in ("", "--full", "-f"):
            self.error(f"/show {safe_text(arg)}: the only option is --full")
            return
        if self.store.get(self.session_id) is None:
            self.say("nothing yet: this session has no turns")
            return
        from .markdown_stream import print_unpadded

        full = bool(arg)
        interrupted = _InterruptedTurns(self.store, self.session_id)
        for record in self.store.load_turns(self.session_id):
            print_unpadded(self.console, *turn_renderables(record, markdown=True, full=full, width=self.console.width,
                                                           interrupted=turn_interrupted(record, interrupted)))

    async def cmd_rollback(self, arg: str) -> None:
        if not await self._wait_closing():
            return
        session = self.store.get(self.session_id)
        count = session.turn_count if session is not None else 0
        if count == 0:
            self.say("nothing to roll back")
            return
        try:
            target = int(arg) if arg else count - 1
        except ValueError:
            self.error(f"/rollback {safe_text(arg)}: N is a turn number (0..{count})")
            return
        if not 0 <= target <= count:
            self.error(f"/rollback {target}: this session has turns 1..{count}; nothing was changed")
            return
        if target == count:
            self.say(f"nothing to remove: turn {count} is the last turn")
            return
        removed = f"turn {count}" if target + 1 == count else f"turns {target + 1}-{count}"
        if target == 0:
            question = f"Remove every turn ({removed}; keep only system messages)?"
        else:
            question = f"Remove {removed} and keep turns 1..{target}?"
        if not await self.confirm(question):
            self.say("nothing was changed")
            return
        self.store.rollback(self.session_id, target)
        self._refresh_info()
        self.say(f"rolled back: {removed} removed; the next message is turn {target + 1}")

    async def cmd_retry(self, arg: str) -> None:
        """Send the last failed message again, or say that nothing failed.

        The failed message comes from this run or, after reopening the session, from the
        event log (a ``turn.failed`` with no completed turn, rollback or interruption after
        it). When nothing failed, ``/retry`` says so and offers to roll back the last turn
        and send its message again for another answer; it asks first, and nothing changes
        on "no".
        """
        if not await self._wait_closing():
            return
        failed = self.failed_message if self.failed_message is not None else self._failed_in_log()
        if failed is not None:
            self.say("sending the failed message again")
            await self.send(failed)
            return
        session = self.store.get(self.session_id)
        turns = session.turns if session is not None else ()
        if not turns:
            self.say("nothing failed: there is nothing to retry")
            return
        last = turns[-1]
        text = last.messages[0].content if last.messages else None
        if not text:
            self.say(f"nothing failed: turn {last.number} completed")
            return
        question = f"Nothing failed: turn {last.number} completed. Roll it back and send its message again for another answer?"
        if not await self.confirm(question):
            self.say("nothing was changed")
            return
        self.store.rollback(self.session_id, last.number - 1)
        self.say(f"turn {last.number} rolled back; sending its message again")
        await self.send(text)

    def _failed_in_log(self) -> str | None:
        """The user message of the session's last turn when that turn failed and nothing
        came after it (a completed, interrupted or rolled-back turn), else None."""
        try:
            if self.store.get(self.session_id) is None:
                return None
            events = self.store.events(self.session_id)
        except ChatflowError:
            return None
        last = next(
            (e for e in reversed(events) if e.type in ("turn.failed", "turn.completed", "turn.interrupted", "rollback")),
            None,
        )
        if last is None or last.type != "turn.failed":
            return None
        number = (last.payload or {}).get("turn")
        records = self.store.load_turns(self.session_id, include_rolled_back=True)
        failed = [r for r in records if r.failed and r.number == number]
        for message in failed[-1].messages if failed else ():
            if getattr(message.role, "value", message.role) == "user" and message.content:
                return str(message.content)
        return None

    async def cmd_agent(self, arg: str) -> None:
        if not await self._wait_closing():
            return
        agents = self.runner.agents
        if not arg:
            for name in agents:
                mark = "●" if name == self.agent_name else " "
                self.say(f"{mark} {name}", style="bold" if name == self.agent_name else "")
            return
        if arg not in agents:
            close = difflib.get_close_matches(arg, list(agents), n=1)
            self.error(
                f"no agent {safe_text(arg)}"
                + (f" — did you mean {close[0]}?" if close else "")
                + f" (agents: {', '.join(agents)})"
            )
            return
        session = self.store.get_or_create(self.session_id, agents[arg], max_turns=self.max_turns)
        if getattr(session.active_agent, "name", None) != arg:
            session.set_active_agent(agents[arg])
            self.store.save(session)
        self._refresh_info()
        self.say(f"active agent: {arg}")

    async def cmd_model(self, arg: str) -> None:
        if not arg:
            self.say(f"model: {self.model_name}")
            return
        for agent in self.runner.agents.values():
            agent.model = arg
        self.runner.default_model = arg
        self.endpoint = (arg, self.endpoint[1])
        try:  # the session keeps it (a new session gets it with its first message)
            if self.store.get(self.session_id) is not None:
                self.store.set_session_endpoint(self.session_id, arg, self.store.session_endpoint(self.session_id)[1])
        except Exception:  # noqa: BLE001 - the switch still applies to this run
            pass
        self.say(f"model: {arg} (from the next message)")

    async def cmd_metadata(self, arg: str) -> None:
        if not await self._wait_closing():
            return
        if not arg:
            session = self.store.get(self.session_id)
            meta = session.metadata if session is not None else {}
            self.say(safe_text(pretty_json_text(_json(meta))) if meta else "no metadata", style="")
            return
        key, sep, value = arg.partition("=")
        if not sep or not key.strip():
            self.error("/metadata KEY=VALUE")
            return
        starting = self.runner.agents.get(self.agent_name, self.runner.starting_agent)
        session = self.store.get_or_create(self.session_id, starting, max_turns=self.max_turns)
        session.update_metadata({key.strip(): value})
        self.store.save(session)
        self._refresh_info()
        self.say(f"metadata: {safe_text(key.strip())} = {safe_text(value)}")

    async def cmd_edit(self, arg: str) -> None:
        text = await self.edit(arg)
        if text is None:
            return
        if text.strip():
            self._prefill = text.rstrip("\n")
            self.say("edited: press Enter to send")

    async def edit(self, initial: str = "") -> str | None:
        """Open ``$VISUAL``/``$EDITOR`` (default ``vi``) on ``initial``; the text written, or None."""
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        try:
            with self._cooked_terminal():
                code, text = await asyncio.to_thread(_run_editor, editor, initial)
        except OSError as exc:
            self.error(f"cannot run the editor {safe_text(editor)!r}: {exc.strerror or exc}")
            return None
        if code != 0:
            self.say(f"the editor exited with status {code}; nothing was changed")
            return None
        return text

    async def confirm(self, question: str) -> bool:
        try:
            answer = await self._ask_session.prompt_async(f"{question} [y/N] ")
        except (KeyboardInterrupt, EOFError):
            return False
        return answer.strip().lower() in {"y", "yes"}

    # ---------------------------------------------------------------- completion data
    def _session_ids(self) -> list[str]:
        stamp, ids = self._ids_cache
        if time.monotonic() - stamp > 5:
            try:
                ids = [s.session_id for s in self.store.list_sessions(limit=200)]
            except ChatflowError:
                ids = []
            self._ids_cache = (time.monotonic(), ids)
        return ids


def slash_completions(repl: Repl, text: str) -> list[tuple[str, int, str]]:
    """Completions for the text before the cursor: ``(text, start offset, help)`` each.

    Slash commands first; then session ids after ``/switch``, agent names after ``/agent``
    and configured model names after ``/model``.
    """
    if not text.startswith("/") or "\n" in text:
        return []
    if " " not in text:
        return [
            (name, -len(text), help_text) for name, (_, help_text) in COMMANDS.items() if name.startswith(text.lower())
        ]
    name, _, partial = text.partition(" ")
    choices: list[str] = []
    if name == "/switch":
        choices = repl._session_ids()
    elif name == "/agent":
        choices = list(repl.runner.agents)
    elif name == "/model":
        choices = sorted({a.model for a in repl.runner.agents.values() if getattr(a, "model", None)})
    return [(choice, -len(partial), "") for choice in choices if choice.startswith(partial)]


def session_lines(summaries: Iterable[Any], width: int, *, current: str | None = None, now: float | None = None) -> list[Any]:
    """The REPL's ``/sessions`` list: a header and one ``rich.text.Text`` line per session.

    Columns: a ``●`` on ``current``, the session id (never shortened: it is what ``/switch``
    takes), agent, status (only when some session is not idle), turns, last update, and the
    first message's preview in whatever room is left. When ``width`` (columns) is tight the
    preview is shortened (with ``…``) and then dropped, then agent names are shortened to 10
    characters, then the update time, status, agent and turns go, in that order. Lines are
    not padded.
    """
    from rich.text import Text

    from .render import format_age

    rows = []
    for s in summaries:
        status = str(getattr(s.status, "value", s.status))
        rows.append(
            {
                "id": safe_text(s.session_id),
                "agent": safe_text(s.active_agent_name),
                "status": status,
                "turns": f"{s.turn_count} turn" + ("" if s.turn_count == 1 else "s"),
                "age": format_age(s.updated_at, now),
                "preview": safe_text(s.preview, one_line=True).strip(),
                "current": s.session_id == current,
            }
        )
    show_status = any(r["status"] != "idle" for r in rows)
    columns = ["id", "agent", *(["status"] if show_status else []), "turns", "age"]
    gap = 2

    def widths(cols: list[str]) -> dict[str, int]:
        return {c: max(len(r[c]) for r in rows) for c in cols}

    def used(w: dict[str, int]) -> int:
        return 2 + sum(w.values()) + gap * (len(w) - 1)

    w = widths(columns)
    if used(w) + gap + 12 > width and w["agent"] > 10:
        w["agent"] = 10
    for optional in ("age", "status", "agent", "turns"):
        if used(w) > width and optional in w:
            del w[optional]
    room = width - used(w) - gap
    preview = room >= 12 and any(r["preview"] for r in rows)
    styles = {"id": "cyan", "status": "yellow", "turns": "", "age": "dim", "agent": ""}
    lines = []
    for r in rows:
        line = Text("● " if r["current"] else "  ", style="bold green")
        for index, col in enumerate(w):
            value = r[col]
            if len(value) > w[col]:
                value = value[: w[col] - 1] + "…"
            if index:
                line.append(" " * gap)
            pad = "" if index == len(w) - 1 and not preview else " " * (w[col] - len(value))
            line.append(value, style=styles[col])
            line.append(pad)
        if preview and r["preview"]:
            text = r["preview"] if len(r["preview"]) <= room else r["preview"][: room - 1] + "…"
            line.append(" " * gap + text, style="dim")
        line.rstrip()
        lines.append(line)
    return lines


def _slash_completer(repl: Repl) -> Any:
    from prompt_toolkit.completion import Completer, Completion

    class SlashCompleter(Completer):
        def get_completions(self, document: Any, complete_event: Any) -> Iterable[Any]:
            for text, start, meta in slash_completions(repl, document.text_before_cursor):
                yield Completion(text, start, display_meta=meta or None)

    return SlashCompleter()


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


def _SkipBlank(base: type) -> type:  # noqa: N802 - a class factory
    """``base`` (a prompt-toolkit History class) that never stores a blank or whitespace-only
    entry: such input is never sent, so it has no place in the history."""

    class SkipBlank(base):  # type: ignore[misc, valid-type]
        def append_string(self, string: str) -> None:
            if string.strip():
                super().append_string(string)

    SkipBlank.__name__ = f"SkipBlank{base.__name__}"
    return SkipBlank


def _writes_to_terminal(handler: logging.Handler) -> bool:
    import sys

    stream = getattr(handler, "stream", None)
    return stream is not None and stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)


class _QueueHandler(logging.Handler):
    """A logging handler that only queues records; the REPL loop prints them."""

    def __init__(self, queue: collections.deque[logging.LogRecord]) -> None:
        super().__init__()
        self.queue = queue

    def emit(self, record: logging.LogRecord) -> None:
        self.queue.append(record)


def _run_editor(editor: str, initial: str) -> tuple[int, str]:
    """Run ``editor`` (a command line) on a temporary file holding ``initial``: (exit status, text)."""
    fd, path = tempfile.mkstemp(prefix="chatflow-", suffix=".md")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(initial)
        code = subprocess.call([*shlex.split(editor), path])
        with open(path, encoding="utf-8") as fh:
            return code, fh.read()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _private_file(path: Path) -> None:
    """Create ``path`` if needed and make it readable by its owner only (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)


def _json(data: Any) -> str:
    import json

    return json.dumps(data, ensure_ascii=False)


def _fallback_session_id() -> str:
    import secrets

    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
