"""The REPL's entry point and prompt loop: :func:`run_repl` and :class:`Repl`.

:func:`run_repl` builds the Runner through :mod:`chatflow_cli.assembly` and runs a
:class:`Repl`, which holds the session's state, the prompt-toolkit prompt (keys, history,
completion, toolbar), the loop and the terminal's signals. Slash commands live in
:mod:`~chatflow_cli.repl.commands`, turn running in :mod:`~chatflow_cli.repl.turn`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..context import notice
from ..core.errors import ChatflowError, UsageError
from ..render import safe_text
from ..session_ids import new_session_id, validate_session_id
from .commands import COMMANDS, SlashCommands, _slash_completer
from .turn import TurnRunner, _TurnView, plural_rows

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State
    from ..core.memory import BaseSessionStore
    from ..core.model import ModelClient
    from ..core.runner import Runner

__all__ = ["HISTORY_FILENAME", "Repl", "run_repl"]

HISTORY_FILENAME = "repl_history"
#: After SIGHUP, how long the REPL waits for an interrupted turn still closing before it exits.
HANGUP_WAIT_S = 15.0


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------
def run_repl(
    state: State,
    *,
    session_id: str | None = None,
    continue_last: bool = False,
    model: str | None = None,
    agent: str | None = None,
    base_url: str | None = None,
    max_turns: int | None = None,
    system: str | None = None,
    max_context_tokens: int | None = None,
    input: Any = None,
    output: Any = None,
    console: Any = None,
) -> int:
    """Run the REPL until ``/exit`` or Ctrl-D (see :mod:`chatflow_cli.repl`).

    Args:
        state: The run.
        session_id: Continue (or create) this session.
        continue_last: Continue the most recently updated session.
        model: ``--model``.
        agent: ``--agent``.
        base_url: ``--base-url``.
        max_turns: ``--max-turns`` of a session the REPL creates.
        max_context_tokens: ``--max-context-tokens``: the model's context size.
        system: ``--system`` of a session the REPL creates.
        input: A prompt-toolkit ``Input`` (tests pass ``create_pipe_input()``).
        output: A prompt-toolkit ``Output`` (tests pass ``DummyOutput()``).
        console: The Rich console replies are rendered on (default: stdout's).

    Returns:
        The exit status, 0.

    Raises:
        UsageError: Both ``session_id`` and ``continue_last``, or an invalid session id.
        NotFoundError: ``continue_last`` with no session yet, or an unknown agent.
        ConfigError: No model is configured, or a tool module cannot be imported.
    """
    from ..assembly import assemble, transport_for
    from ..config import ensure_private_dir, resolve_model
    from ..endpoints import endpoint_of, remember_endpoint, session_endpoint
    from ..lookup import find_session, unapplied_options

    if session_id and continue_last:
        raise UsageError("give --session or --continue, not both")
    reader = state.store(create=False)  # the session's stored model and endpoint, if it exists
    if session_id:
        sid = validate_session_id(session_id)
    elif continue_last:
        latest = reader.latest_session_id() if reader is not None else None
        if latest is None:
            from ..core.errors import NotFoundError

            raise NotFoundError("no session to continue: start one with chatflow")
        sid = latest
    else:
        sid = new_session_id()
    existing = find_session(reader, sid) if reader is not None else None
    if existing is not None and reader is not None:
        unapplied_options(state, reader, existing, max_turns=max_turns, system=system)
    settings = state.settings(**dict(zip(("model", "base_url"),
                                         session_endpoint(state, reader, existing, model, base_url))))
    choice = resolve_model(settings)  # configuration problems before anything is stored
    store = reader if reader is not None else state.open_store()
    console = console if console is not None else state.out()
    if choice.local:
        notice(state, "starting the local model (SmolLM2 on llama.cpp)…")
    history_path = ensure_private_dir(Path(settings.data_dir)) / HISTORY_FILENAME
    # /switch and /new talk to the other session's stored model and endpoint, else these
    flag_settings = state.settings(model=model, base_url=base_url)
    defaults = endpoint_of(choice if flag_settings is settings else resolve_model(flag_settings))
    transport = transport_for("openai")
    timeout = 60.0

    def client_for(url: str) -> ModelClient:
        from ..core.model import ModelClient

        return ModelClient(url, choice.api_key, timeout=timeout, transport=transport)

    with assemble(settings, store, choice=choice, model=model, agent=agent, timeout=timeout,
                  transport=transport, max_context_tokens=max_context_tokens) as built:
        repl = Repl(
            built.runner,
            store,
            sid,
            console=console,
            input=input,
            output=output,
            history_path=history_path,
            max_turns=max_turns or settings.max_turns,
            system=system,
            resume_prefix=_resume_prefix(state),
            endpoint=endpoint_of(choice),
            default_endpoint=defaults,
            client_for=None if choice.local else client_for,
        )
        try:
            return asyncio.run(repl.run())
        finally:  # the session keeps its model (a /model or /switch change too) and endpoint
            remember_endpoint(store, repl.session_id, choice, model=repl.endpoint[0], base_url=repl.endpoint[1])


def _resume_prefix(state: State) -> list[str]:
    """``chatflow`` with the global options that pick this store and config (``--db``, ``--config``)."""
    prefix = ["chatflow"]
    if getattr(state, "db", None):
        from ..core._dsn import dsn_without_password  # never printed: PGPASSWORD or ~/.pgpass give it then

        prefix += ["--db", dsn_without_password(str(state.db))]
    if getattr(state, "config", None):
        prefix += ["--config", str(state.config)]
    return prefix


# --------------------------------------------------------------------------------------
# the REPL
# --------------------------------------------------------------------------------------
class Repl(SlashCommands, TurnRunner):
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
        runner: Runner,
        store: BaseSessionStore,
        session_id: str,
        *,
        console: Any,
        input: Any = None,
        output: Any = None,
        history_path: Path | None = None,
        max_turns: int | None = None,
        system: str | None = None,
        resume_prefix: Iterable[str] = ("chatflow",),
        endpoint: tuple[str | None, str | None] = (None, None),
        default_endpoint: tuple[str | None, str | None] | None = None,
        client_for: Callable[[str], ModelClient] | None = None,
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
        self._history: tuple[Any, ...] = ()  # the stored window, for the context use in tokens
        self.session_max_turns = max_turns or store.default_max_turns
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
            ("", self._context_use()),
        ]
        if self.last_usage_tokens is not None:
            parts += [sep, ("", f"{self.last_usage_tokens} tok")]
        return parts

    def _context_use(self) -> str:
        """``ctx 6.1k/8.2k``: the stored window's tokens of the model's context size; with no
        known size, ``ctx W/M``: the window's turns of ``max_turns``."""
        budget = self.runner.budget_for(self.agent_name)
        if budget is None:
            return f"ctx {self.window_turns}/{self.session_max_turns}"
        from ..core.memory.context import split_turns
        from ..core.tokens import select_window, short_count

        systems, _, turns = split_turns(self._history)
        _kept, tokens = select_window(systems, turns, budget.tokens) if turns or systems else (0, 0)
        return f"ctx {short_count(tokens)}/{short_count(budget.context)}"

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
            self._history = ()
            self.session_max_turns = self.max_turns or self.store.default_max_turns
            return
        self.agent_name = getattr(session.active_agent, "name", str(session.active_agent))
        self.turn = session.turn_count
        self.window_turns = len(session.turns)
        self._history = session.history
        self.session_max_turns = session.max_turns

    # ---------------------------------------------------------------- output helpers
    def say(self, text: str, style: str = "dim") -> None:
        from rich.text import Text

        from ..markdown_stream import print_unpadded

        # Wrapped between words at the terminal's width (with no trailing spaces), so a
        # narrow terminal never cuts a word in two.
        print_unpadded(self.console, Text(text, style=style))

    def recap(self) -> None:
        """On opening an existing session: its last exchange, as ``/show`` prints it; taller
        than half the screen, its title, the user's message and the reply's last rows."""
        from rich.text import Text

        from ..lookup import InterruptedTurns
        from ..markdown_stream import print_unpadded
        from ..render import turn_interrupted, turn_renderables

        try:
            records = self.store.load_turns(self.session_id, first=max(1, self.turn))
        except ChatflowError:
            return
        if not records:
            return
        record = records[-1]
        width = self.console.width
        lines: list[Any] = []
        interrupted = turn_interrupted(record, InterruptedTurns(self.store, self.session_id))
        for item in turn_renderables(record, markdown=True, width=width, interrupted=interrupted):
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
            from ..render import plural

            self.say(f"session {self.session_id} ({plural(self.turn, 'turn')}) · resume: {self.resume_command()}")
        else:
            self.say("nothing was sent; no session was stored")

    def resume_command(self) -> str:
        return shlex.join([*self.resume_prefix, "chat", "-s", self.session_id])

    def error(self, text: str) -> None:
        from rich.text import Text

        from ..markdown_stream import print_unpadded

        # Wrapped between words at the terminal's width, as notices are: a narrow terminal
        # never cuts a word (or an id or path) in two.
        print_unpadded(self.console, Text("error: ", style="bold red") + Text(safe_text(text).replace("\n", " ")))

    # ---------------------------------------------------------------- the loop
    async def run(self) -> int:
        """Read, run, print until ``/exit`` or Ctrl-D. Returns 0."""
        from ..render import plural

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


def _private_file(path: Path) -> None:
    """Create ``path`` if needed and make it readable by its owner only (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)
