"""The REPL's entry point and prompt loop: :func:`run_repl` and :class:`Repl`.

:func:`run_repl` builds the Runner through :mod:`chatflow_cli.assembly` and runs a
:class:`Repl`, which holds the session's state and the loop. Its parts are mixed in: the
prompt (keys, history, completion, toolbar) from :mod:`~chatflow_cli.repl.prompt`, the
terminal's modes and signals from :mod:`~chatflow_cli.repl.terminal`, slash commands from
:mod:`~chatflow_cli.repl.commands`, turn running from :mod:`~chatflow_cli.repl.turn`; the
state they share is declared on :class:`~chatflow_cli.repl.host.ReplHost`.
"""

from __future__ import annotations

import asyncio
import collections
import shlex
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..context import new_session_id, notice, validate_session_id
from ..core.errors import ChatflowError, ExitStatus, UsageError
from ..render import safe_text
from .commands import SlashCommands
from .host import Endpoint
from .prompt import PromptView
from .terminal import TerminalModes
from .turn import TurnRunner, plural_rows

if TYPE_CHECKING:  # pragma: no cover
    from prompt_toolkit.input import Input
    from prompt_toolkit.output import Output
    from rich.console import Console

    from ..context import State
    from ..core.memory.protocol import SessionStoreProtocol
    from ..core.model import ModelClient
    from ..core.runner import Runner

__all__ = ["HISTORY_FILENAME", "Repl", "run_repl"]

HISTORY_FILENAME = "repl_history"


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
    input: Input | None = None,
    output: Output | None = None,
    console: Console | None = None,
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
    from ..assembly import assemble, endpoint_of, remember_endpoint, session_endpoint, transport_for
    from ..config import ensure_private_dir, resolve_model
    from ..lookup import find_session, unapplied_options

    if session_id and continue_last:
        raise UsageError("give --session or --continue, not both")
    reader = state.store(create=False)  # the session's stored model and endpoint, if it exists
    if session_id:
        sid = validate_session_id(session_id)
    elif continue_last:
        recent = reader.list_sessions(limit=1) if reader is not None else []  # archived ones are skipped
        latest = recent[0].session_id if recent else None
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
    # /switch and /new talk to the other session's stored model and endpoint, else to these:
    # the flags' and config's, resolved only when a resumed session's own ones differ and
    # only once one of them is needed
    flag_settings = state.settings(model=model, base_url=base_url)
    defaults: Endpoint | Callable[[], Endpoint] = endpoint_of(choice) if flag_settings is settings else (
        lambda: endpoint_of(resolve_model(flag_settings)))

    with assemble(settings, store, choice=choice, model=model, agent=agent, timeout=60.0,
                  transport=transport_for("openai"), max_context_tokens=max_context_tokens) as built:
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
            client_for=built.client_for,
        )
        try:
            return asyncio.run(repl.run())
        finally:  # the session keeps its model (a /model or /switch change too) and endpoint
            remember_endpoint(store, repl.session_id, choice, model=repl.endpoint[0], base_url=repl.endpoint[1],
                              worked=None)


def _resume_prefix(state: State) -> list[str]:
    """``chatflow`` with the global options that pick this store and config (``--db``, ``--config``)."""
    prefix = ["chatflow"]
    if getattr(state, "db", None):
        from ..core.dsn import dsn_without_password  # never printed: PGPASSWORD or ~/.pgpass give it then

        prefix += ["--db", dsn_without_password(str(state.db))]
    if getattr(state, "config", None):
        prefix += ["--config", str(state.config)]
    return prefix


# --------------------------------------------------------------------------------------
# the REPL
# --------------------------------------------------------------------------------------
class Repl(SlashCommands, TurnRunner, PromptView, TerminalModes):
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
        store: SessionStoreProtocol,
        session_id: str,
        *,
        console: Console,
        input: Input | None = None,
        output: Output | None = None,
        history_path: Path | None = None,
        max_turns: int | None = None,
        system: str | None = None,
        resume_prefix: Iterable[str] = ("chatflow",),
        endpoint: Endpoint = (None, None),
        default_endpoint: Endpoint | Callable[[], Endpoint] | None = None,
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
        self._default_endpoint = default_endpoint if default_endpoint is not None else endpoint
        self._client_for = client_for
        self.done = False
        self.hung_up = False  # the terminal went away (SIGHUP): finish the turn quietly and leave
        self.terminated = False  # SIGTERM: finish the turn as Ctrl-C does, say so and leave (exit 143)
        self._turn_interrupt = None  # stops the running turn, if any
        self._devnull = None
        self.failed_message = None  # kept after a provider error, for /retry
        self.attachments = []  # /attach: files for the next message
        self.failed_attachments = []  # the failed message's files, for /retry only
        self.last_usage_tokens = None
        self._prefill = ""
        self._typeahead = []  # key presses typed while a turn ran
        self._closing = None  # an interrupted turn still being stored
        self._notes = collections.deque(maxlen=50)
        self._ids_cache = (0.0, [])
        # what the toolbar shows, refreshed after each turn and command
        self.agent_name = runner.starting_agent.name
        self.turn = 0
        self.window_turns = 0
        self._history = ()  # the stored window, for the context use in tokens
        self.session_max_turns = max_turns or store.default_max_turns
        self.exists = False
        self._refresh_info()
        self.prompt_session = self._make_prompt_session()
        self._ask_session = self._make_ask_session()

    @property
    def default_endpoint(self) -> Endpoint:
        """The (model, base URL) of the flags and config, what ``/new`` goes back to; resolved
        on first use when the REPL was given a way to resolve it (a resumed session's stored
        endpoint differed), then kept."""
        if callable(self._default_endpoint):
            self._default_endpoint = self._default_endpoint()
        return self._default_endpoint

    # ---------------------------------------------------------------- output helpers
    def say(self, text: str, style: str = "dim") -> None:
        from rich.text import Text

        from ..render.unpadded import print_unpadded

        # Wrapped between words at the terminal's width (with no trailing spaces), so a
        # narrow terminal never cuts a word in two.
        print_unpadded(self.console, Text(text, style=style))

    def recap(self) -> None:
        """On opening an existing session: its last exchange, as ``/show`` prints it; taller
        than half the screen, its title, the user's message and the reply's last rows."""
        from rich.text import Text

        from ..lookup import InterruptedTurns
        from ..render.unpadded import print_unpadded
        from ..render import turn_interrupted, turn_renderables

        try:
            records = self.store.load_turns(self.session_id, first=max(1, self.turn))
        except ChatflowError:
            return
        if not records:  # no turn in the window: its only turn may have failed
            self._tell_failed()
            return
        record = records[-1]
        width = self.console.width
        lines: list[Any] = []
        interrupted = turn_interrupted(record, InterruptedTurns(self.store, self.session_id))
        submitted = self.store.submitted_tool_results(self.session_id)
        for item in turn_renderables(record, markdown=True, width=width, interrupted=interrupted,
                                     submitted=submitted, awaiting=self._awaiting(), repl=True):
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
        self._tell_failed()

    def _tell_failed(self) -> None:
        if self._failed_in_log() is not None:
            self.say("your last message failed: /retry sends it again", style="yellow")

    def farewell(self) -> None:
        """On leaving: the session id and the command that opens it again (and the files
        ``/attach`` queued that no message took: they are not sent)."""
        self.drop_queued_files("you leave", failed=False)  # a failed message's stay in the log for /retry
        if self.exists:
            from ..render import plural

            line = f"session {self.session_id} ({plural(self.turn, 'turn')}) · resume: {self.resume_command()}"
            if len(line) > self.console.width:  # the command on a line of its own, whole, to copy
                line = f"session {self.session_id} ({plural(self.turn, 'turn')}) · resume with:\n{self.resume_command()}"
            self.say(line)
        else:
            self.say("nothing was sent; no session was stored")

    def drop_queued_files(self, why: str, *, failed: bool = True) -> None:
        """Drop the files ``/attach`` queued (with ``failed``, a failed message's too), saying
        in one line that they were not sent, as ``why`` happens (``you leave``, ``/new``...)."""
        from ..core.attachments import attachment_line

        queued = [*(self.failed_attachments if failed else ()), *self.attachments]
        self.attachments, self.failed_attachments = [], []
        if queued:
            names = ", ".join(safe_text(attachment_line(a), one_line=True) for a in queued)
            self.say(f"not sent: {names} (attached files are dropped when {why})", style="yellow")

    def resume_command(self) -> str:
        return shlex.join([*self.resume_prefix, "chat", "-s", self.session_id])

    def error(self, text: str) -> None:
        from rich.text import Text

        from ..render.unpadded import print_unpadded

        # Wrapped between words at the terminal's width, as notices are: a narrow terminal
        # never cuts a word (or an id or path) in two.
        print_unpadded(self.console, Text("error: ", style="bold red") + Text(safe_text(text).replace("\n", " ")))

    # ---------------------------------------------------------------- the loop
    async def run(self) -> int:
        """Read, run, print until ``/exit`` or Ctrl-D. Returns 0 (143 after SIGTERM)."""
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
                if self.hung_up or self.terminated:
                    await self._let_the_turn_close()
                if self.terminated and not self.hung_up:
                    self.say("terminated (SIGTERM)")
                elif not self.hung_up:
                    self.farewell()
        finally:
            if self._devnull is not None:
                self._devnull.close()
        if self.hung_up or self.terminated:  # 129 or 143, as a one-shot chat stopped by the same signal
            return int(ExitStatus.HUNG_UP) if self.hung_up and not self.terminated else int(ExitStatus.TERMINATED)
        return 0

    def _take_prefill(self) -> str:
        text = self._prefill
        self._prefill = ""
        return text

    async def handle(self, text: str) -> None:
        """One line from the prompt: a slash command or a message."""
        stripped = text.strip()
        if not stripped:
            if self.attachments:  # files need no text: Enter on an empty prompt sends them
                await self.send("")
            return
        if stripped.startswith("//"):
            await self.send(text.lstrip()[1:])
        elif stripped.startswith("/"):
            await self.command(stripped)
        else:
            await self.send(text)

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

