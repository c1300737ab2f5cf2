"""``chatflow chat`` (and bare ``chatflow`` with piped stdin): run turns and print them.

Kept out of :mod:`chatflow_cli.cli` so that ``chatflow --help`` never even compiles it. The
input is read here, the run printed by :mod:`~chatflow_cli.commands.chat_output`, the
Runner built by :mod:`chatflow_cli.assembly`.

What it sends: ``MESSAGE``; ``-`` or no message with a piped stdin reads all of stdin (UTF-8,
at most :data:`MAX_MESSAGE_BYTES`); a MESSAGE with a piped stdin sends the message, a blank
line, then stdin (``git diff | chatflow chat "review this"``). Nothing to send is a usage
error (exit 2) on every path. ``--tool-result ID OUTPUT`` (repeatable) answers pending custom
tool calls, OUTPUT sent as given (JSON or plain text); ``--input jsonl`` reads one JSON object
a line (see :func:`parse_input_line`); ``--attach`` files are read by
:mod:`~chatflow_cli.commands.attach` (see :func:`attached_message`).

The session's model and endpoint (see :mod:`chatflow_cli.assembly`): resuming a session uses the
model and base URL stored with it unless ``--model``/``--base-url`` are given, which switch
it (announced). ``--system`` and ``--max-turns`` set up a new session; on an existing one
they are not applied and a notice says so.

Replies that did not finish (the verdict of :mod:`chatflow_cli.core.stream`): cut by the
token limit or a content filter, the turn is stored, marked with its ``finish_reason``, and
the exit code is 10 (:attr:`ExitStatus.INCOMPLETE`); a reply of reasoning only (or empty)
gets a note and exits 0. A stream that broke off is a
:class:`~chatflow_cli.core.errors.StreamBrokenError` (exit 6; the partial reply is kept as an
interrupted turn); a tool call with cut arguments is an
:class:`~chatflow_cli.core.errors.InvalidToolCallError` (exit 5; the turn fails).

De-duplication of webhook deliveries: ``--message-id`` is claimed (under its scope, see
:func:`claim_key`) in one atomic statement before anything else is done; an id already
processed within 192 h prints a notice to stderr (or ``{"duplicate": true}`` with ``--output
json``), calls nothing, and exits 0. The id counts as processed from the claim on (mark, then
process), so a concurrent redelivery is skipped; when the turn then fails (a provider error,
Ctrl-C), the claim is released (``store.release_message``) and a later redelivery runs.

``--agent NAME`` on an existing session makes NAME its active agent (a ``handoff`` event)
before the turn. Every configured agent resolves, whichever one the run starts from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..assembly import (adopt_starting_agent, assemble, gone_notice, remember_endpoint, session_endpoint, session_mounts,
                        transport_for, unmount_gone)
from ..config import resolve_model
from ..context import new_session_id, notice, read_stdin_text, set_json_errors, validate_session_id
from ..core.errors import ChatflowError, ExitStatus, NotFoundError, UsageError
from ..lookup import find_session, unapplied_options
from ..render import event_json, safe_text
from .chat_output import ChatOutput

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator

    from ..config import ModelChoice
    from ..context import State
    from ..core.agents import Agent
    from ..core.memory.protocol import (
        ClaimStore,
        ContextStore,
        EditStore,
        ListingStore,
        SessionStoreProtocol,
        TurnStore,
    )
    from ..core.messages import Message
    from ..core.runner import Runner, StreamEvent

__all__ = ["MAX_MESSAGE_BYTES", "ChatOptions", "InputItem", "attached_message", "claim_key", "input_items",
           "message_from", "parse_input_line", "run_chat", "tool_output_text"]


# ---------------------------------------------------------------------------------------
# the input: the message, --tool-result outputs, --input jsonl lines
# ---------------------------------------------------------------------------------------
#: The largest message chatflow sends (2 MiB of UTF-8). Bigger input is refused with exit 2
#: before anything is stored, rather than stored and then refused by the provider.
MAX_MESSAGE_BYTES = 2 * 1024 * 1024


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
    max_context_tokens: int | None = None
    metadata: dict[str, str] | None = None
    message_id: str | None = None
    message_id_scope: str | None = None
    idempotency_key: str | None = None
    tool_results: list[tuple[str, str]] | None = None
    wait: float = 0.0
    output: str = "text"
    input: str = "text"
    timeout: float = 60.0
    title: str | None = None
    memory: list[str] | None = None  #: --memory NAME[:ro], repeatable
    vaults: tuple[str, ...] = ()  # --vault NAME (repeatable): vaults mounted for tools' secrets
    attachments: tuple[str, ...] = ()  # --attach FILE (repeatable; '-': stdin): see commands/attach.py
    #: --approve ID / --deny ID (repeatable): (tool-call id, approved) of calls waiting for an approval
    approvals: list[tuple[str, bool]] | None = None


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


def message_from(state: State, opts: ChatOptions) -> str:
    """The message to send: ``MESSAGE``; all of stdin for ``-`` or no message; or, when a
    MESSAGE is given and stdin is piped (``git diff | chatflow chat "review this"``), the
    message, a blank line, then stdin. Nothing to send is a :class:`UsageError` (exit 2) on
    every path."""
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


def tool_output_text(tool_use_id: str, raw: str) -> str:
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
    except json.JSONDecodeError as exc:
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


def input_items(state: State) -> Iterator[InputItem]:
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


def attached_message(state: State, opts: ChatOptions) -> Message:
    """The USER message of ``chatflow chat --attach ...``: its text (the MESSAGE argument;
    with no ``-f -``, also piped stdin as ``message_from`` reads it) and its attachments.

    Raises:
        UsageError: with ``--input jsonl`` or ``--tool-result``, or ``-`` both as MESSAGE and file.
        AttachmentError: a file cannot be attached.
    """
    from ..core.messages import Message
    from .attach import read_attachments

    if opts.input == "jsonl" or opts.tool_results:
        raise UsageError("--attach goes with a MESSAGE, not with --input jsonl or --tool-result")
    paths = list(opts.attachments)
    if "-" in paths:
        if opts.message == "-":
            raise UsageError("stdin cannot be both the message (-) and a file (-f -)")
        attachments = read_attachments(state, paths)
        text = _check_message(opts.message) if opts.message is not None else None
    else:
        attachments = read_attachments(state, paths)
        text = None
        if opts.message is not None or not state.env.stdin_isatty:
            text = message_from(state, opts)
    return Message.user(text or "", attachments)  # no text: "" (previews and titles read a string)


# ---------------------------------------------------------------------------------------
# the session
# ---------------------------------------------------------------------------------------


def _switch_agent(store: ContextStore, session_id: str, agent: Agent) -> None:
    """``--agent`` on an existing session makes ``agent`` its active agent (a ``handoff`` event)."""
    session = store.get(session_id)
    if session is None or session.active_agent.name == agent.name:
        return
    session.set_active_agent(agent)
    store.save(session)


def _session_for(state: State, store: ListingStore | None, opts: ChatOptions, *, announce: bool = True) -> str:
    if opts.session is not None and opts.continue_:
        raise UsageError("give --session or --continue, not both")
    if opts.session is not None:
        return validate_session_id(opts.session)
    if opts.continue_:
        # the most recently updated session that is not archived (an archived one takes no turns)
        recent = store.list_sessions(limit=1) if store is not None else []
        latest = recent[0].session_id if recent else None
        if latest is None:
            raise NotFoundError("no session to continue: start one with chatflow chat \"hello\"")
        return latest
    if opts.tool_results or opts.approvals:
        raise UsageError(f"{'--tool-result' if opts.tool_results else '--approve/--deny'} needs the session: add "
                         "--session ID (or --continue)")
    session_id = new_session_id()
    if announce:
        notice(state, f"new session {session_id} (continue it with: chatflow chat -s {session_id} MESSAGE)")
    return session_id


# ---------------------------------------------------------------------------------------
# chat
# ---------------------------------------------------------------------------------------
def run_chat(state: State, opts: ChatOptions) -> ExitStatus:
    """Run ``chatflow chat``: send the message (or tool results, or ``--input jsonl`` lines)
    and print the run as ``opts.output`` asks.

    Args:
        state: The run.
        opts: The command's options.

    Returns:
        :attr:`ExitStatus.INCOMPLETE` (10) when a turn's reply was cut by the token limit or
        a content filter (stored and marked), else :attr:`ExitStatus.SUCCESS`.

    Raises:
        UsageError: Bad input (no message, bad ``--tool-result``, bad session id...).
        ChatflowError: What the store, the model server or the configuration raised; the
            claim of a ``--message-id`` is released first.
    """
    if opts.output not in {"text", "json", "jsonl"}:
        raise UsageError(f"--output {opts.output!r}: use text, json or jsonl")
    # an error before the run (a file that cannot be attached, no message, a bad session id)
    # ends a JSON output as one during the run does: its error object, a failed result event
    set_json_errors(opts.output, event="result")
    multi = opts.input == "jsonl"
    message: str | None = None
    user: Message | None = None  # a message with attachments
    if opts.attachments and (multi or opts.tool_results or opts.approvals):
        raise UsageError("--attach goes with a MESSAGE, not with --input jsonl, --tool-result or --approve/--deny")
    tool_outputs: list[tuple[str, str]] = []
    approvals = list(opts.approvals or ())
    if approvals:
        if opts.message is not None or multi:
            raise UsageError("--approve/--deny continue a turn: give no MESSAGE and no --input jsonl")
        ids = [i for i, _ in approvals] + [i for i, _ in opts.tool_results or ()]
        twice = next((i for i in ids if ids.count(i) > 1), None)
        if twice is not None:
            raise UsageError(f"tool call {safe_text(twice)} is answered twice: give each call one answer")
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
            tool_outputs.append((tool_use_id, tool_output_text(tool_use_id, raw)))
    elif opts.attachments:
        user = attached_message(state, opts)
    elif not approvals:
        message = message_from(state, opts)

    reader = state.store(create=False)  # an existing session's settings, without creating a file
    session_id = _session_for(state, reader, opts, announce=False)
    new_id = opts.session is None and not opts.continue_ and not opts.tool_results and not approvals
    existing = None if new_id or reader is None else find_session(reader, session_id)
    model, base_url = session_endpoint(state, reader, existing, opts.model, opts.base_url)
    settings = state.settings(model=model, base_url=base_url)
    choice = resolve_model(settings)  # a configuration problem is reported before anything is stored
    if user is not None:
        from .attach import text_only_check

        text_only_check(choice, user)
    transport = transport_for("http")
    store = reader if reader is not None else state.open_store()
    if existing is not None:
        unapplied_options(state, store, existing, max_turns=opts.max_turns, system=opts.system)
    announce = new_id or (existing is None and opts.session is not None)
    out = ChatOutput(state, opts.output, multi=multi)
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
        with assemble(settings, store, choice=choice, model=opts.model, agent=opts.agent, timeout=opts.timeout,
                      transport=transport, on_retry=out.retrying, on_wait=out.waiting_for_session,
                      max_context_tokens=opts.max_context_tokens) as built:
            runner = built.runner
            out.server_of = runner.tool_server
            if opts.agent:
                _switch_agent(store, session_id, runner.agents[opts.agent])
            elif not tool_outputs and not approvals:  # a session whose agent left config.toml: the default agent
                note = adopt_starting_agent(store, session_id, runner)
                if note is not None:
                    notice(state, note)
            if existing is not None:  # a memory store or vault deleted since it was mounted: said once, unmounted
                for _mount, reason in unmount_gone(store, session_id):
                    notice(state, gone_notice(session_id, reason))
            mounts = session_mounts(settings, store, session_id, runner, opts.agent, opts.memory, opts.vaults)
            if multi:
                _run_items(state, runner, store, opts, session_id, out, scope, mounts)
            elif tool_outputs or approvals:
                if approvals:
                    _check_pending(state, store, session_id, [i for i, _ in approvals])
                if tool_outputs:
                    _refuse_results_for_approvals(state, store, runner, session_id, [i for i, _ in tool_outputs])
                remaining = _submit_tool_results(store, session_id, tool_outputs) if tool_outputs else []
                for call_id, approved in approvals:
                    remaining = runner.decide_tool_call(session_id, call_id, approved)
                if remaining:
                    out.pending_only(session_id, remaining, _awaiting_approval(store, runner, session_id))
                else:
                    out.run(runner.continue_streamed(session_id, wait=opts.wait))
            else:
                assert message is not None or user is not None
                out.run(
                    _endpoint_at_begin(store, session_id, choice, runner.run_streamed(
                        session_id,
                        user if user is not None else message,  # type: ignore[arg-type]
                        opts.metadata,
                        idempotency_key=opts.idempotency_key,
                        wait=opts.wait,
                        max_turns=opts.max_turns or settings.max_turns,
                        system=opts.system,
                        resources=mounts,
                    ))
                )
        if opts.title is not None:
            store.set_title(session_id, opts.title)
        out.success()
        remember_endpoint(store, session_id, choice)
        return out.exit_code
    except BaseException as exc:
        if claimed:
            _release_claim(store, claim_id)
        remember_endpoint(store, session_id, choice, worked=False)
        _busy_hint(exc, opts.wait)
        if user is not None:
            from .attach import images_refused

            images_refused(exc, user, choice.model)
        if isinstance(exc, (ChatflowError, KeyboardInterrupt)):
            out.failure(exc, session_id)
        raise
    finally:
        if announce:
            _announce_if_stored(state, store, session_id, seen=session_id in out.stored)


def _endpoint_at_begin(store: EditStore, session_id: str, choice: ModelChoice,
                       events: Iterator[StreamEvent]) -> Iterator[StreamEvent]:
    """``events``, storing the model and endpoint (never a key) with a session that has none
    as soon as its turn has begun (the first event), so another process resuming or waiting
    on a brand-new session uses them while its first turn still runs."""
    first = True
    for event in events:
        if first:
            first = False
            remember_endpoint(store, session_id, choice, begun=True)
        yield event


def _check_pending(state: State, store: TurnStore, session_id: str, ids: list[str]) -> None:
    """Every id of ``--approve``/``--deny`` waits in the session, else nothing is done (exit 2).
    A call left without a result by a run that ended during its tool calls waits for nothing:
    the next message records it as interrupted."""
    from ..core.errors import SessionNotFoundError, ToolResultError
    from ..lookup import awaiting_approval

    session = store.get(session_id)
    if session is None:
        raise SessionNotFoundError(f"no session {safe_text(session_id)!r} (list them with: chatflow sessions ls)",
                                   session_id=session_id)
    answered = store.submitted_tool_results(session_id)
    left_open = awaiting_approval(state, store, session_id).left_open  # type: ignore[arg-type]
    waiting = [c.id for c in session.pending_tool_calls if c.id not in answered and c.id not in left_open]
    unknown = [i for i in ids if i not in waiting]
    if unknown and unknown[0] in left_open:
        raise ToolResultError(f"tool call {safe_text(unknown[0])} waits for no approval: the run that made it ended "
                              f"during its tool calls, so it has no result; your next message records it as "
                              f"interrupted (chatflow chat -s {session_id} MESSAGE); nothing was run or recorded",
                              session_id=session_id)
    if unknown:
        raise ToolResultError(f"no tool call {safe_text(unknown[0])} waits in session {session_id} (waiting: "
                              f"{', '.join(waiting) or 'none'}); nothing was run or recorded", session_id=session_id)


def _refuse_results_for_approvals(state: State, store: TurnStore, runner: Any, session_id: str,
                                  ids: list[str]) -> None:
    """No ``--tool-result`` for a call that waits for an approval (an MCP tool's, a Python tool
    set to ``ask``): its tool must run, or be refused, not be answered with the user's text."""
    from ..core.errors import ToolResultError

    session = store.get(session_id)
    if session is None:
        return  # _submit_tool_results names the missing session
    calls = {c.id: c for c in session.pending_tool_calls}
    from ..lookup import awaiting_approval

    left_open = awaiting_approval(state, store, session_id).left_open  # type: ignore[arg-type]
    for tool_use_id in ids:
        call = calls.get(tool_use_id)
        if call is not None and tool_use_id in left_open:
            raise ToolResultError(f"tool call {safe_text(tool_use_id)} ({safe_text(call.name)}) takes no result: the "
                                  f"run that made it ended during its tool calls; your next message records it as "
                                  f"interrupted; nothing was recorded", session_id=session_id)
        if call is not None and runner.awaits_approval(session_id, call):
            raise ToolResultError(f"tool call {safe_text(tool_use_id)} ({safe_text(call.name)}) waits for an approval, "
                                  f"not for a result: run it with --approve {safe_text(tool_use_id)} or refuse it "
                                  f"with --deny {safe_text(tool_use_id)}; nothing was recorded", session_id=session_id)


def _awaiting_approval(store: TurnStore, runner: Any, session_id: str) -> set[str]:
    """The ids of the session's open calls that wait for an approval, not for a result."""
    session = store.get(session_id)
    calls = session.pending_tool_calls if session is not None else ()
    return {c.id for c in calls if runner.awaits_approval(session_id, c)}


def _submit_tool_results(store: TurnStore, session_id: str, outputs: list[tuple[str, str]]) -> list[str]:
    """Record every ``--tool-result`` in the order given; the ids still unanswered after them.

    Every id is checked against the pending calls before anything is written, so an unknown
    or already answered id records none of them (exit 2).
    """
    from ..core.errors import ToolResultError

    session = store.get(session_id)
    if session is None:
        from ..core.errors import SessionNotFoundError

        raise SessionNotFoundError(f"no session {safe_text(session_id)!r} (list them with: chatflow sessions ls)",
                                   session_id=session_id)
    pending = [c.id for c in session.pending_tool_calls]
    unknown = [i for i, _ in outputs if i not in pending]
    if unknown:
        answered = store.submitted_tool_results(session_id)
        waiting = ", ".join(i for i in pending if i not in answered) or "none"
        raise ToolResultError(f"no pending tool call {safe_text(unknown[0])} in session {session_id} "
                              f"(waiting for: {waiting}); nothing was recorded", session_id=session_id)
    remaining: list[str] = []
    for tool_use_id, output in outputs:
        remaining = store.submit_tool_result(session_id, tool_use_id, output)
    return remaining


def _busy_hint(exc: BaseException, wait: float) -> None:
    """A :class:`SessionBusyError` names the way to wait for the running turn (``--wait``)."""
    from ..core.errors import SessionBusyError

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


def _release_claim(store: ClaimStore, message_id: str | None) -> None:
    """The turn of a claimed ``--message-id`` failed: un-claim it so a redelivery runs."""
    if message_id is None:
        return
    try:
        store.release_message(message_id)
    except Exception:  # the store itself failed: the run's own error is reported instead
        pass


def _announce_if_stored(state: State, store: ListingStore, session_id: str, *, seen: bool = False) -> None:
    """Tell the user the id of the new session chatflow made up, once it is in the store
    : a run that failed before storing anything names no session.

    ``seen``: the run already yielded a stored event of the session, so it is in the store
    without asking it (a successful turn needs no third SQLite transaction for this notice).
    """
    from ..core.errors import SessionNotFoundError

    if not seen:
        try:
            store.last_seq(session_id)
        except SessionNotFoundError:
            return
        except Exception:  # the store itself failed: the run's own error is reported instead
            return
    notice(state, f"new session {session_id} (continue it with: chatflow chat -s {session_id} MESSAGE)")


def _run_items(state: State, runner: Runner, store: SessionStoreProtocol, opts: ChatOptions, session_id: str, out: ChatOutput,
               scope: str = "global", mounts: tuple[Any, ...] = ()) -> None:
    settings_turns = opts.max_turns
    items = 0
    for item in input_items(state):
        items += 1
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
                    resources=mounts,
                )
            )
        except BaseException:
            if item_claim:
                _release_claim(store, item_claim)
            raise
    if not items:
        raise UsageError('--input jsonl: nothing to send: stdin had no lines (one JSON object a line, e.g. '
                         '{"message": "hello"})')
