"""``chatflow chat`` (and bare ``chatflow`` with piped stdin, and ``replay --rerun``): run turns and print them.

Kept out of :mod:`chatflow_cli.cli` so that ``chatflow --help`` never even compiles it.

Input
    ``MESSAGE``; ``-`` or no message with a piped stdin reads all of stdin (UTF-8, at most
    :data:`MAX_MESSAGE_BYTES`); a MESSAGE with a piped stdin sends the message, a blank line,
    then stdin (``git diff | chatflow chat "review this"``). Nothing to send is a usage error
    (exit 2) on every path. ``--tool-result ID OUTPUT`` (repeatable) answers pending custom
    tool calls, OUTPUT sent as given (JSON or plain text); ``--input jsonl`` reads one JSON
    object a line (see :func:`parse_input_line`).

Output (``--output``)
    ``text``: on a terminal the reply streams as rendered Markdown, tool calls and handoffs
    shown above it, and until it starts a spinner says what it waits for (``thinking``, a
    rate-limited retry with its countdown and attempt, a busy session's pid with ``--wait``);
    into a pipe the reply is plain text with no ANSI codes and control characters made inert
    (:func:`chatflow_cli.render.safe_text`).
    ``json``: one object on stdout when the turn ends: the :class:`RunResult` fields plus
    ``"is_error": false`` -- or, when it fails, ``{"is_error": true, "error", "error_type",
    "exit_code", "session_id"}``.
    ``jsonl``: one event a line as it happens, in :func:`chatflow_cli.render.event_json`'s
    shape (``schema``, ``seq`` on stored events only, ``type``, ``session_id``, ``turn``,
    ``data``), ending with exactly one ``result`` event whose ``data`` carries ``is_error``.
    With ``--input jsonl`` each finished turn also gets a ``turn.result`` line.

The session's model and endpoint: a session keeps the model and base URL it talks to
(``store.session_endpoint``); resuming it uses them unless ``--model``/``--base-url`` are
given, which switch it (announced). ``--system`` and ``--max-turns`` set up a new session;
on an existing one they are not applied and a notice says so.

Replies that did not finish (the verdict of :mod:`chatflow_cli.core._stream`)
    cut by the token limit or a content filter: the turn is stored, marked with its
    ``finish_reason``; text mode adds a dim note after the reply on a terminal, or a
    ``chatflow: reply cut …`` line on stderr when piped; JSON results carry
    ``"finish_reason"``; the exit code is 10 (:attr:`ExitStatus.INCOMPLETE`). A reply of
    reasoning only (or empty) gets a note too and exits 0. A stream that broke off is a
    :class:`~chatflow_cli.core.errors.StreamBrokenError` (exit 6; the partial reply is kept
    as an interrupted turn); a tool call with cut arguments is an
    :class:`~chatflow_cli.core.errors.InvalidToolCallError` (exit 5; the turn fails).

De-duplication (seed 000's webhooks): ``--message-id`` is claimed (under its scope, see
:func:`claim_key`) in one atomic statement before anything else is done; an id already processed within 192 h prints a notice to
stderr (or ``{"duplicate": true}`` with ``--output json``), calls nothing, and exits 0.
As in seed 000's example (mark, then process), the id counts as processed from the claim
on, so a concurrent redelivery is skipped; when the turn then fails (a provider error,
Ctrl-C), the claim is released (``store.release_message``) and a later redelivery runs.

``--agent NAME`` on an existing session makes NAME its active agent (a ``handoff`` event)
before the turn. Every configured agent resolves, whichever one the run starts from.

The local model (SmolLM2-135M) is sampled greedily (``temperature`` :data:`LOCAL_TEMPERATURE`):
at the server's default, and even at 0.2, it wanders (asked for the capital of France it
tells a story in French); remote models keep their provider's default.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from .core.errors import ChatflowError, ExitStatus, NotFoundError, UsageError
from .render import ReplyPrinter, dumps, event_json, plural, reply_note, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from .cli import State
    from .config import Settings

__all__ = ["MAX_MESSAGE_BYTES", "ChatOptions", "parse_input_line", "rerun_session", "run_chat"]

#: The largest message chatflow sends (2 MiB of UTF-8). Bigger input is refused with exit 2
#: before anything is stored, rather than stored and then refused by the provider.
MAX_MESSAGE_BYTES = 2 * 1024 * 1024

#: Sampling temperature for the embedded local model (see the module docstring).
LOCAL_TEMPERATURE = 0.0


@dataclass
class ChatOptions:
    message: str | None = None
    session: str | None = None
    continue_: bool = False
    system: str | None = None
    model: str | None = None
    base_url: str | None = None
    agent: str | None = None
    max_turns: int | None = None
    metadata: dict[str, str] | None = None
    message_id: str | None = None
    message_id_scope: str | None = None
    idempotency_key: str | None = None
    tool_results: list[tuple[str, str]] | None = None
    wait: float = 0.0
    output: str = "text"
    input: str = "text"
    timeout: float = 60.0


@dataclass
class InputItem:
    """One line of ``--input jsonl``: a user message or a tool result."""

    line: int
    message: str | None = None
    tool_use_id: str | None = None
    output: str | None = None
    session: str | None = None
    metadata: dict[str, Any] | None = None
    message_id: str | None = None
    idempotency_key: str | None = None


# ---------------------------------------------------------------------------------------
# input
# ---------------------------------------------------------------------------------------
def _check_message(text: str) -> str:
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise UsageError("the message is not valid UTF-8 (it holds a lone surrogate)") from None
    if size > MAX_MESSAGE_BYTES:
        raise UsageError(
            f"the message is too long ({size / 1048576:.1f} MiB; chatflow sends at most {MAX_MESSAGE_BYTES // 1048576} MiB)"
        )
    if not text.strip():
        raise UsageError("the message is empty")
    return text


def _message_from(state: State, opts: ChatOptions) -> str:
    """The message to send: ``MESSAGE``; all of stdin for ``-`` or no message; or, when a
    MESSAGE is given and stdin is piped (``git diff | chatflow chat "review this"``), the
    message, a blank line, then stdin. Nothing to send is a :class:`UsageError` (exit 2) on
    every path."""
    from .cli import read_stdin_text

    if opts.message is not None and opts.message != "-":
        text = opts.message
        if not state.env.stdin_isatty:
            piped = read_stdin_text(state).strip("\n")
            if piped.strip():
                text = f"{text.rstrip()}\n\n{piped}"
        return _check_message(text)
    if opts.message is None and state.env.stdin_isatty:
        raise UsageError('no message: pass one (chatflow chat "hello"), or pipe it: echo hello | chatflow chat')
    text = read_stdin_text(state).strip()
    if not text:
        raise UsageError('nothing to send: stdin was empty (chatflow chat MESSAGE, or chatflow on a terminal for the REPL)')
    return _check_message(text)


def _tool_output_text(tool_use_id: str, raw: str) -> str:
    """A ``--tool-result`` output, sent as given, as the REPL does: JSON (``'{"ok": true}'``)
    or plain text (``yes``) alike. Empty or non-UTF-8 text is a :class:`UsageError`."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"--tool-result {safe_text(tool_use_id)}: the output is not valid UTF-8 (a lone surrogate)") from None
    if not raw.strip():
        raise UsageError(f"--tool-result {safe_text(tool_use_id)}: the output is empty (give JSON or text, e.g. '\"yes\"')")
    return raw


def parse_input_line(number: int, line: str) -> InputItem | None:
    """One ``--input jsonl`` line -> :class:`InputItem` (``None`` for a blank line).

    Accepted objects::

        {"message": "text"}                       also {"content": ...} or {"role": "user", "content": ...}
        {"tool_use_id": "call_1", "output": ...}  also {"tool_result": {"tool_use_id": ..., "output": ...}}

    plus, on a message, optional ``"session"``, ``"metadata"`` (object), ``"message_id"`` and
    ``"idempotency_key"``. A non-string ``output`` is sent as its JSON text. Anything else
    raises :class:`UsageError` naming the line.
    """
    if not line.strip():
        return None

    def bad(problem: str) -> UsageError:
        return UsageError(f"--input jsonl line {number}: {problem}")

    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise bad(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise bad(f"expected a JSON object, got {type(obj).__name__}")
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad("not valid UTF-8 (a lone surrogate such as \\ud800)") from None
    if isinstance(obj.get("tool_result"), dict):
        obj = {**obj, **obj.pop("tool_result")}
    item = InputItem(line=number)
    for key in ("session", "session_id"):
        if key in obj:
            if not isinstance(obj[key], str):
                raise bad(f"{key} must be a string")
            item.session = obj[key]
    if "tool_use_id" in obj:
        if not isinstance(obj["tool_use_id"], str) or not obj["tool_use_id"]:
            raise bad("tool_use_id must be a non-empty string")
        if "output" not in obj:
            raise bad("a tool result needs an output")
        out = obj["output"]
        item.tool_use_id = obj["tool_use_id"]
        item.output = out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)
        return item
    if "role" in obj and obj["role"] != "user":
        raise bad(f"role must be 'user', got {obj['role']!r}")
    text = obj.get("message", obj.get("content"))
    if not isinstance(text, str):
        raise bad('expected {"message": "..."} or {"tool_use_id": "...", "output": ...}')
    try:
        item.message = _check_message(text)
    except UsageError as exc:
        raise bad(exc.message) from None
    if "metadata" in obj:
        if not isinstance(obj["metadata"], dict):
            raise bad("metadata must be an object")
        item.metadata = obj["metadata"]
    for key in ("message_id", "idempotency_key"):
        if key in obj:
            if not isinstance(obj[key], str) or not obj[key]:
                raise bad(f"{key} must be a non-empty string")
            setattr(item, key, obj[key])
    return item


def _input_items(state: State) -> Iterator[InputItem]:
    stream = state.env.stdin
    buffer = getattr(stream, "buffer", None)
    source = buffer if buffer is not None else stream
    for number, raw in enumerate(iter(source.readline, b"" if buffer is not None else ""), 1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(f"--input jsonl line {number}: not valid UTF-8 (byte {exc.start})") from None
        item = parse_input_line(number, raw)
        if item is not None:
            yield item


# ---------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------
class _Output:
    """Writes a run's events in the chosen ``--output`` form."""

    def __init__(self, state: State, mode: str, *, multi: bool = False) -> None:
        self.state = state
        self.mode = mode
        self.multi = multi
        self.out = state.env.stdout
        self.final_written = False
        self.last_result: Any = None
        self.turns = 0
        self.printer: ReplyPrinter | None = None
        self.stored: set[str] = set()  #: the sessions a stored event (one with a seq) was seen for
        self.incomplete = False  # a turn's reply was cut (finish_reason length/content_filter)

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

    def _final_line(self, obj: dict[str, Any]) -> None:
        """The closing line of a run: a reader that has gone (EPIPE, closed stdout) does not
        change the outcome -- the error's exit code, or 10 for a cut reply, still wins (the
        error line goes to stderr, which is still open)."""
        try:
            self._line(obj)
        except (BrokenPipeError, ValueError, AttributeError):
            from .cli import _silence_broken_pipe

            _silence_broken_pipe()

    # -- one run ------------------------------------------------------------------------
    def run(self, events: Iterator[Any]) -> Any:
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
        if result.truncated:
            self.incomplete = True
        note = reply_note(result)
        if note is not None and self.mode == "text":
            if self.state.env.stdout_isatty:
                from rich.text import Text

                self.state.out().print(Text(f"[{note}]", style="dim"))
            else:
                from .cli import _notice

                _notice(self.state, note)
        if self.mode == "jsonl" and self.multi:
            self._line(event_json("turn.result", result.session_id, {**result.to_dict(), "is_error": False},
                                  turn=result.turn))
        if self.mode == "json" and self.multi:
            self._line({**result.to_dict(), "is_error": False})
        if self.mode == "text" and result.pending_tool_calls:
            _pending_notice(self.state, result)
        return result

    @staticmethod
    def _show(printer: ReplyPrinter, ev: Any) -> None:
        data = ev.data or {}
        if ev.type == "text.delta":
            printer.delta(data.get("text", ""))
        elif ev.type == "tool.call_started":
            if not str(data.get("name", "")).startswith("transfer_to_"):
                printer.tool_started(data.get("agent"), data.get("name", "?"), data.get("arguments"))
        elif ev.type == "tool.call_finished":
            if not str(data.get("name", "")).startswith("transfer_to_"):
                printer.tool_finished(data.get("name", "?"), data.get("output"), bool(data.get("is_error")))
        elif ev.type == "handoff":
            printer.handoff(data.get("from_agent"), data.get("to_agent"))

    def pending_only(self, session_id: str, remaining: list[str]) -> None:
        """``--tool-result`` answered one id while others still wait."""
        data = {"session_id": session_id, "status": "idle", "pending_tool_use_ids": remaining, "content": None}
        if self.mode == "json":
            self._line({**data, "is_error": False})
            self.final_written = True
        elif self.mode == "jsonl":
            self._line(event_json("result", session_id, {**data, "is_error": False}))
            self.final_written = True
        else:
            from .cli import _notice

            _notice(self.state, f"recorded; still waiting for: {', '.join(remaining)}")

    # -- the end ------------------------------------------------------------------------
    @property
    def exit_code(self) -> ExitStatus:
        """:attr:`ExitStatus.INCOMPLETE` when a turn's reply was cut, else success."""
        return ExitStatus.INCOMPLETE if self.incomplete else ExitStatus.SUCCESS

    def success(self) -> None:
        if self.final_written:
            return
        self.final_written = True
        result = self.last_result
        if result is None:
            return
        if self.mode == "json" and not self.multi:
            self._final_line({**result.to_dict(), "is_error": False})
        elif self.mode == "jsonl":
            data = result.to_dict()
            if self.multi:
                data["turns"] = self.turns
            self._final_line(event_json("result", result.session_id, {**data, "is_error": False}, turn=result.turn))

    def failure(self, exc: BaseException, session_id: str | None) -> None:
        if self.final_written or self.mode == "text":
            return
        self.final_written = True
        code = exc.exit_code if isinstance(exc, ChatflowError) else (
            ExitStatus.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else ExitStatus.ERROR)
        message = exc.message if isinstance(exc, ChatflowError) else (
            "interrupted" if isinstance(exc, KeyboardInterrupt) else f"unexpected {type(exc).__name__}: {exc}")
        from .cli import _scrub

        err = {"error": _scrub(message), "error_type": type(exc).__name__, "exit_code": int(code),
               "session_id": getattr(exc, "session_id", None) or session_id}
        if self.mode == "json":
            self._final_line({**err, "is_error": True})
        else:
            self._final_line(event_json("result", err["session_id"], {**err, "is_error": True}))

    def duplicate(self, message_id: str, session_id: str) -> None:
        self.final_written = True
        if self.mode == "text":
            from .cli import _notice

            _notice(self.state, f"message {message_id} was already processed (within 192 h): nothing sent")
            return
        data = {"duplicate": True, "message_id": message_id, "session_id": session_id, "content": None}
        if self.mode == "json":
            self._line({**data, "is_error": False})
        else:
            self._line(event_json("result", session_id, {**data, "is_error": False}))


def _pending_notice(state: State, result: Any) -> None:
    from .cli import _notice

    for call in result.pending_tool_calls:
        _notice(
            state,
            f"waiting for tool {call.name} {call.arguments}: answer with "
            f"chatflow chat -s {result.session_id} --tool-result {call.id} JSON",
        )


# ---------------------------------------------------------------------------------------
# the model endpoint and the runner
# ---------------------------------------------------------------------------------------
def transport_for(default: str) -> str:
    """The model client's transport: ``$CHATFLOW_TRANSPORT`` (``http`` or ``openai``) when
    set, else ``default`` -- ``http`` for ``chatflow chat`` and ``replay --rerun`` (no openai
    import: a one-shot call starts about 0.5 s sooner), ``openai`` for the REPL.

    Raises:
        ConfigError: ``$CHATFLOW_TRANSPORT`` names no transport.
    """
    import os

    from .core.model import TRANSPORTS

    chosen = os.environ.get("CHATFLOW_TRANSPORT") or default
    if chosen not in TRANSPORTS:
        from .core.errors import ConfigError

        raise ConfigError(f"CHATFLOW_TRANSPORT={safe_text(chosen)!r}: use {' or '.join(TRANSPORTS)}")
    return chosen


@contextlib.contextmanager
def _runner(state: State, settings: Settings, opts: ChatOptions, store: Any, out: Any = None, *,
            transport: str = "openai") -> Iterator[Any]:
    """A Runner on ``store`` whose model client points at the configured endpoint and sends
    through ``transport`` (see :func:`transport_for`); with ``out`` (an :class:`_Output`),
    the spinner says what the reply waits for.

    The local model's llama.cpp server, when it is the choice, is started or reused on
    entering (:class:`~chatflow_cli.core.local.LocalModel`): with ``local_keep_alive`` 0 it
    is private and stopped on every way out (no orphan process); otherwise it is the warm
    server of the data directory, left running for the next call until it idles out.
    """
    from .config import LOCAL_MODEL, build_agents, resolve_model

    choice = resolve_model(settings)
    with contextlib.ExitStack() as stack:
        base_url, api_key, model = choice.base_url, choice.api_key, choice.model
        local = None
        if choice.local:
            from .core.local import LocalModel

            local = stack.enter_context(LocalModel(keep_alive=settings.local_keep_alive, data_dir=settings.data_dir))
            base_url = local.base_url
            model = local.model or LOCAL_MODEL
        override = opts.model
        if override == LOCAL_MODEL:
            override = model
        start, agents = build_agents(settings, model_override=override)
        if opts.agent:
            if opts.agent not in agents:
                raise NotFoundError(
                    f"unknown agent {safe_text(opts.agent)!r} (configured: {', '.join(sorted(agents))})"
                )
            start = agents[opts.agent]
        from .core.model import ModelClient
        from .core.runner import Runner

        client = local.client(timeout=opts.timeout, transport=transport) if local is not None else ModelClient(
            base_url, api_key, timeout=opts.timeout, transport=transport)
        temperature = LOCAL_TEMPERATURE if choice.local else None
        runner = Runner(start, store, model_client=client, default_model=model, temperature=temperature)
        # Every configured agent resolves, not only those reachable from the starting one:
        # a session whose active agent is another one keeps its instructions and tools.
        runner.agents.update(agents)
        if out is not None:  # the spinner says what the reply waits for
            client.on_retry = out.retrying
            runner.on_wait = out.waiting_for_session
        stack.callback(runner.close)
        yield runner


def _switch_agent(store: Any, session_id: str, agent: Any) -> None:
    """``--agent`` on an existing session makes ``agent`` its active agent (a ``handoff`` event)."""
    session = store.get(session_id)
    if session is None or session.active_agent.name == agent.name:
        return
    session.set_active_agent(agent)
    store.save(session)


def _session_for(state: State, store: Any, opts: ChatOptions, *, announce: bool = True) -> str:
    from .cli import _notice, new_session_id, validate_session_id

    if opts.session is not None and opts.continue_:
        raise UsageError("give --session or --continue, not both")
    if opts.session is not None:
        return validate_session_id(opts.session)
    if opts.continue_:
        latest = store.latest_session_id() if store is not None else None
        if latest is None:
            raise NotFoundError("no session to continue: start one with chatflow chat \"hello\"")
        return latest
    if opts.tool_results:
        raise UsageError("--tool-result needs the session: add --session ID (or --continue)")
    session_id = new_session_id()
    if announce:
        _notice(state, f"new session {session_id} (continue it with: chatflow chat -s {session_id} MESSAGE)")
    return session_id


# ---------------------------------------------------------------------------------------
# chat
# ---------------------------------------------------------------------------------------
def run_chat(state: State, opts: ChatOptions) -> ExitStatus:
    """Run ``chatflow chat`` with ``opts``; raises chatflow errors for the boundary.

    Returns the exit status: :attr:`ExitStatus.INCOMPLETE` (10) when a turn's reply was
    cut by the token limit or a content filter (stored and marked), else success."""
    if opts.output not in {"text", "json", "jsonl"}:
        raise UsageError(f"--output {opts.output!r}: use text, json or jsonl")
    multi = opts.input == "jsonl"
    message: str | None = None
    tool_outputs: list[tuple[str, str]] = []
    if multi:
        if opts.message is not None or opts.tool_results:
            raise UsageError("--input jsonl reads everything from stdin: give no MESSAGE and no --tool-result")
        if state.env.stdin_isatty:
            raise UsageError("--input jsonl reads stdin, which is a terminal: pipe the JSON lines in")
    elif opts.tool_results:
        if opts.message is not None:
            raise UsageError("give a MESSAGE or --tool-result, not both")
        seen: set[str] = set()
        for tool_use_id, raw in opts.tool_results:
            if tool_use_id in seen:
                raise UsageError(f"--tool-result {safe_text(tool_use_id)} is given twice: give each tool call one result")
            seen.add(tool_use_id)
            tool_outputs.append((tool_use_id, _tool_output_text(tool_use_id, raw)))
    else:
        message = _message_from(state, opts)

    from .config import resolve_model

    reader = state.store(create=False)  # an existing session's settings, without creating a file
    session_id = _session_for(state, reader, opts, announce=False)
    new_id = opts.session is None and not opts.continue_ and not opts.tool_results
    existing = None if new_id or reader is None else existing_session(reader, session_id)
    model, base_url = session_endpoint(state, reader, existing, opts.model, opts.base_url)
    settings = state.settings(model=model, base_url=base_url)
    choice = resolve_model(settings)  # a configuration problem is reported before anything is stored
    transport = transport_for("http")
    store = reader if reader is not None else state.store()
    if existing is not None:
        _unapplied_options(state, store, existing, opts)
    announce = new_id or (existing is None and opts.session is not None)
    out = _Output(state, opts.output, multi=multi)
    scope = opts.message_id_scope or settings.message_id_scope
    claimed = False
    claim_id: str | None = None
    try:
        if opts.message_id:
            claim_id = claim_key(opts.message_id, session_id, scope)
            if not store.claim_message(claim_id):
                out.duplicate(opts.message_id, session_id)
                return ExitStatus.SUCCESS
            claimed = True
        with _runner(state, settings, opts, store, out, transport=transport) as runner:
            if opts.agent:
                _switch_agent(store, session_id, runner.agents[opts.agent])
            if multi:
                _run_items(state, runner, store, opts, session_id, out, scope)
            elif tool_outputs:
                remaining = _submit_tool_results(store, session_id, tool_outputs)
                if remaining:
                    out.pending_only(session_id, remaining)
                else:
                    out.run(runner.continue_streamed(session_id, wait=opts.wait))
            else:
                assert message is not None
                out.run(
                    runner.run_streamed(
                        session_id,
                        message,
                        opts.metadata,
                        idempotency_key=opts.idempotency_key,
                        wait=opts.wait,
                        max_turns=opts.max_turns or settings.max_turns,
                        system=opts.system,
                    )
                )
        out.success()
        # only a run that worked moves the session to its endpoint: a mistyped --base-url
        # that failed leaves the session where it was
        remember_endpoint(store, session_id, choice)
        return out.exit_code
    except BaseException as exc:
        if claimed:
            _release_claim(store, claim_id)
        if _stored_endpoint(store, session_id) == (None, None):
            # a session's first endpoint is kept even when its first turn failed (a wrong key,
            # say): resuming it must not send the message, and the key, somewhere else
            remember_endpoint(store, session_id, choice)
        _busy_hint(exc, opts.wait)
        if isinstance(exc, (ChatflowError, KeyboardInterrupt)):
            out.failure(exc, session_id)
        raise
    finally:
        if announce:
            _announce_if_stored(state, store, session_id, seen=session_id in out.stored)


_OPENAI_URL = "https://api.openai.com/v1"


def existing_session(store: Any, session_id: str) -> Any:
    """The stored session ``session_id`` (agents by name only), or ``None``."""
    from .core.errors import SessionNotFoundError
    from .show import _NamedAgent

    store.set_agent_resolver(_NamedAgent)
    try:
        return store.get(session_id)
    except SessionNotFoundError:
        return None


def session_endpoint(state: State, store: Any, existing: Any, model: str | None,
                     base_url: str | None) -> tuple[str | None, str | None]:
    """The model and base URL to use on ``existing`` (a session or ``None``): the flags when
    given, else those stored with the session (``store.session_endpoint``), else ``None``
    (the configured ones). A flag that changes a stored value is announced."""
    from .cli import _notice

    if existing is None:
        return model, base_url
    stored_model, stored_url = store.session_endpoint(existing.session_id)
    for flag, what, given, stored in (("--model", "model", model, stored_model),
                                      ("--base-url", "endpoint", base_url, stored_url)):
        if given and stored and given != stored:
            _notice(state, f"session {existing.session_id} used {what} {stored}; {flag} switches it to {given}")
    if base_url and not model and stored_model == "local":
        stored_model = None  # the embedded model's name means nothing to another endpoint
    return model or stored_model, base_url or stored_url


def endpoint_of(choice: Any) -> tuple[str, str | None]:
    """The ``(model, base_url)`` a :class:`~chatflow_cli.config.ModelChoice` sends requests to,
    as stored with a session (the local model has no fixed URL: ``None``)."""
    if choice.local:
        return choice.model, None
    return choice.model, choice.base_url or os.environ.get("OPENAI_BASE_URL") or _OPENAI_URL


def _stored_endpoint(store: Any, session_id: str) -> tuple[str | None, str | None] | None:
    """The session's stored ``(model, base_url)``; ``None`` when the session does not exist
    or the store cannot say (a failing store never hides the error being reported)."""
    try:
        return store.session_endpoint(session_id)  # type: ignore[no-any-return]
    except ChatflowError:
        return None


def remember_endpoint(store: Any, session_id: str, choice: Any, *, model: str | None = None,
                      base_url: str | None = None) -> None:
    """Store ``choice``'s model and endpoint (or ``model`` and ``base_url``, a switch made
    since) with the session when they changed (and the session exists); a store failure here
    never hides the run's own outcome."""
    from .core.errors import SessionNotFoundError

    wanted = endpoint_of(choice)
    if model:
        wanted = (model, wanted[1])
    if base_url:
        wanted = (wanted[0], base_url)
    try:
        if store.session_endpoint(session_id) != wanted:
            store.set_session_endpoint(session_id, *wanted)
    except SessionNotFoundError:
        pass
    except ChatflowError:
        pass


def _unapplied_options(state: State, store: Any, existing: Any, opts: ChatOptions) -> None:
    """``--system`` and ``--max-turns`` set up a new session: on an existing one they are not
    applied, and chatflow says so rather than ignoring them silently."""
    from .cli import _notice

    sid = existing.session_id
    if opts.max_turns is not None and opts.max_turns != existing.max_turns:
        _notice(state, f"--max-turns {opts.max_turns} not applied: it sets up a new session, and {sid} keeps "
                       f"its window of {plural(existing.max_turns, 'turn')}")
    if opts.system is not None:
        stored = [m.content for r in store.load_turns(sid, first=0, last=0) for m in r.messages]
        if opts.system not in stored:
            _notice(state, f"--system not applied: it sets up a new session, and {sid} keeps its system prompt "
                           f"(start a new session with -s NEW_ID --system ...)")


def _submit_tool_results(store: Any, session_id: str, outputs: list[tuple[str, str]]) -> list[str]:
    """Record every ``--tool-result`` in the order given; the ids still unanswered after them.

    Every id is checked against the pending calls before anything is written, so an unknown
    or already answered id records none of them (exit 2).
    """
    from .core.errors import ToolResultError

    session = store.get(session_id)
    if session is None:
        from .core.errors import SessionNotFoundError

        raise SessionNotFoundError(f"no session {safe_text(session_id)!r} (list them with: chatflow sessions ls)",
                                   session_id=session_id)
    pending = [c.id for c in session.pending_tool_calls]
    unknown = [i for i, _ in outputs if i not in pending]
    if unknown:
        waiting = ", ".join(pending) if pending else "none"
        raise ToolResultError(f"no pending tool call {safe_text(unknown[0])} in session {session_id} "
                              f"(waiting for: {waiting}); nothing was recorded", session_id=session_id)
    remaining: list[str] = []
    for tool_use_id, output in outputs:
        remaining = store.submit_tool_result(session_id, tool_use_id, output)
    return remaining


def _busy_hint(exc: BaseException, wait: float) -> None:
    """A :class:`SessionBusyError` names the way to wait for the running turn (``--wait``)."""
    from .core.errors import SessionBusyError

    if isinstance(exc, SessionBusyError) and "--wait" not in exc.message:
        hint = (f" (still busy after --wait {wait:g} s)" if wait
                else "; wait for it with --wait SECONDS, e.g. --wait 60")
        exc.message = exc.message + hint
        exc.args = (exc.message,)


def claim_key(message_id: str, session_id: str, scope: str) -> str:
    """The id a ``--message-id`` is claimed under: the id itself in the ``global`` scope (one
    id space for every session, as WhatsApp message ids are), ``session:<session id>:<id>``
    in the ``session`` scope (ids unique within one chat, as Telegram's are), so the same id in
    two sessions is two messages. A global id cannot take the session form (``session:`` ids
    are refused), so the two scopes never collide."""
    if scope == "session":
        return f"session:{session_id}:{message_id}"
    if message_id.startswith("session:"):
        raise UsageError(f"--message-id {safe_text(message_id)!r}: ids starting with 'session:' are reserved "
                         "for --message-id-scope session")
    return message_id


def _release_claim(store: Any, message_id: str | None) -> None:
    """The turn of a claimed ``--message-id`` failed: un-claim it so a redelivery runs."""
    if message_id is None:
        return
    try:
        store.release_message(message_id)
    except Exception:  # the store itself failed: the run's own error is reported instead
        pass


def _announce_if_stored(state: State, store: Any, session_id: str, *, seen: bool = False) -> None:
    """Tell the user the id of the new session chatflow made up, once it is in the store
    (issue 5): a run that failed before storing anything names no session.

    ``seen``: the run already yielded a stored event of the session, so it is in the store
    without asking it (a successful turn needs no third SQLite transaction for this notice).
    """
    from .cli import _notice
    from .core.errors import SessionNotFoundError

    if not seen:
        try:
            store.last_seq(session_id)
        except SessionNotFoundError:
            return
        except Exception:  # the store itself failed: the run's own error is reported instead
            return
    _notice(state, f"new session {session_id} (continue it with: chatflow chat -s {session_id} MESSAGE)")


def _run_items(state: State, runner: Any, store: Any, opts: ChatOptions, session_id: str, out: _Output,
               scope: str = "global") -> None:
    from .cli import validate_session_id

    settings_turns = opts.max_turns
    for item in _input_items(state):
        sid = validate_session_id(item.session) if item.session is not None else session_id
        if item.tool_use_id is not None:
            remaining = store.submit_tool_result(sid, item.tool_use_id, item.output or "")
            if not remaining:
                out.run(runner.continue_streamed(sid, wait=opts.wait))
            continue
        item_claim = claim_key(item.message_id, sid, scope) if item.message_id else None
        if item_claim and not store.claim_message(item_claim):
            if out.mode == "jsonl":
                out._line(event_json("duplicate", sid, {"message_id": item.message_id}))
            continue
        metadata = {**(opts.metadata or {}), **(item.metadata or {})} or None
        try:
            out.run(
                runner.run_streamed(
                    sid,
                    item.message or "",
                    metadata,
                    idempotency_key=item.idempotency_key,
                    wait=opts.wait,
                    max_turns=settings_turns,
                    system=opts.system,
                )
            )
        except BaseException:
            if item_claim:
                _release_claim(store, item_claim)
            raise


# ---------------------------------------------------------------------------------------
# replay --rerun
# ---------------------------------------------------------------------------------------
def rerun_session(
    state: State,
    session_id: str,
    *,
    into: str | None,
    model: str | None,
    base_url: str | None,
    agent: str | None,
    output: str,
) -> ExitStatus:
    """Send ``session_id``'s user messages again, one turn each, into a new session (issue 5).

    The new session gets the old one's system messages, the current agent and model
    (``--model``/``--agent`` or the configured ones). Turns rolled back or failed are not
    re-sent. ``--into`` must name a session that does not exist yet.
    """
    from .cli import _notice, new_session_id, validate_session_id
    from .core.errors import SessionNotFoundError

    store = state.store(create=False)
    if store is None:
        raise SessionNotFoundError(f"no session {safe_text(session_id)!r}")
    records = store.load_turns(session_id, first=0)
    systems = [m.content or "" for r in records if r.number == 0 for m in r.messages]
    users: list[str] = []
    for record in records:
        if record.number == 0 or record.rolled_back or record.failed:
            continue
        first_user = next((m for m in record.messages if getattr(m.role, "value", m.role) == "user"), None)
        if first_user is not None and first_user.content:
            users.append(first_user.content)
    if not users:
        raise UsageError(f"session {safe_text(session_id)!r} has no user messages to re-run")
    target = validate_session_id(into) if into is not None else new_session_id()
    if store.get(target) is not None:
        raise UsageError(f"session {target!r} already exists: --into needs a new id")
    opts = ChatOptions(session=target, model=model, base_url=base_url, agent=agent, output=output)
    settings = state.settings(model=model, base_url=base_url)
    _notice(state, f"re-running {plural(len(users), 'user message')} of {session_id} into {target}")
    out = _Output(state, output, multi=True)
    system = "\n\n".join(s for s in systems if s) or None
    try:
        with _runner(state, settings, opts, store, transport=transport_for("http")) as runner:
            for text in users:
                if output == "text":
                    from rich.text import Text

                    state.out().print(Text("You: ", style="bold green") + Text(safe_text(text)))
                out.run(runner.run_streamed(target, text, system=system, wait=0))
                system = None
        out.success()
        return out.exit_code
    except BaseException as exc:
        if isinstance(exc, (ChatflowError, KeyboardInterrupt)):
            out.failure(exc, target)
        raise
