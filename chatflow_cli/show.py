"""``sessions show``, ``sessions rollback``, ``sessions delete`` and ``replay``: reading and editing stored sessions.

``sessions show`` streams: turns are loaded from the store in pages of
:data:`PAGE_TURNS` and each turn is printed as soon as it is rendered, so the first turns
of a long session are on screen (or in the pager) at once (issue 5: a 500-turn session shows
its first turns within 0.3 s). On a terminal the output goes through a pager
(``$PAGER``, else ``less``; ``LESS=FRX`` unless set, so a short session prints and exits
like ``git log``); ``--no-pager`` turns that off. Into a pipe the text is plain, with no
ANSI codes and no Markdown rendering.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from typing import TYPE_CHECKING, Any, Iterator

from .core.errors import ChatflowError, SessionBusyError, SessionNotFoundError, UsageError
from .render import dumps, plural, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from .cli import State

__all__ = ["PAGE_TURNS", "delete_sessions", "replay_events", "rollback_session", "show_session"]

PAGE_TURNS = 50
FOLLOW_POLL_S = 0.25


def _not_found(session_id: str) -> ChatflowError:
    """The error for an id with no session: a usage error (exit 2) when chatflow would never
    make such an id, else not found (exit 3). Ids are checked only once the look-up failed, so
    a session a library user stored under any id can still be read."""
    from .cli import validate_session_id

    try:
        validate_session_id(session_id)
    except UsageError as exc:
        return exc
    shown = safe_text(session_id[:60]) + ("…" if len(session_id) > 60 else "")
    return SessionNotFoundError(f"no session {shown!r} (list them with: chatflow sessions ls)", session_id=session_id)


def _store_or_missing(state: State, session_id: str) -> Any:
    store = state.store(create=False)
    if store is None:
        raise _not_found(session_id)
    return store


class _NamedAgent:
    """What ``show`` needs of an agent: its name (no need to import and build real agents)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _summary(store: Any, session_id: str) -> Any:
    from .core.errors import SessionNotFoundError as _NF

    # list_sessions has no id filter; the session context gives what show needs.
    store.set_agent_resolver(_NamedAgent)
    try:
        session = store.get(session_id)
    except _NF:
        session = None
    if session is None:
        raise _not_found(session_id)
    return session


def _pages(store: Any, session_id: str, last_turn: int, include_rolled_back: bool) -> Iterator[Any]:
    first = 0
    while first <= last_turn:
        upto = first + PAGE_TURNS - 1
        records = store.load_turns(session_id, first=first, last=upto, include_rolled_back=include_rolled_back)
        yield from records
        first = upto + 1


# ---------------------------------------------------------------------------------------
# show
# ---------------------------------------------------------------------------------------
class _InterruptedTurns:
    """Turn numbers of the session's ``turn.interrupted`` events, read on first use only.

    Only a turn that ends with its user message needs them (see
    :func:`chatflow_cli.render.turn_interrupted`), so most ``show`` runs never scan the log.
    """

    def __init__(self, store: Any, session_id: str) -> None:
        self._store, self._session_id = store, session_id
        self._numbers: set[int] | None = None

    def __contains__(self, number: object) -> bool:
        if self._numbers is None:
            self._numbers = {
                int(e.payload.get("turn") or 0)
                for e in self._store.events(self._session_id)
                if str(getattr(e.type, "value", e.type)) == "turn.interrupted" and e.payload
            }
        return number in self._numbers


def show_session(
    state: State, session_id: str, *, include_rolled_back: bool, full: bool, output: str = "text", pager: bool = True
) -> None:
    """Print a session: ``output`` ``text`` (numbered turns; paged on a terminal), ``json``
    (``{"session": {...}, "turns": [...]}``) or ``jsonl`` (a ``{"session": {...}}`` line, then
    one turn a line)."""
    store = _store_or_missing(state, session_id)
    session = _summary(store, session_id)
    if include_rolled_back:  # rolled-back turns may carry numbers past the live last turn
        records: Iterator[Any] = iter(store.load_turns(session_id, first=0, last=None, include_rolled_back=True))
    elif session.turn_count == 0:
        # no live turn: show the failed ones (a first message that failed, e.g. on a wrong key)
        records = iter([r for r in store.load_turns(session_id, first=0, last=None, include_rolled_back=True)
                        if r.number == 0 or r.failed])
    else:
        records = _pages(store, session_id, session.turn_count, False)
    env = state.env
    interrupted = _InterruptedTurns(store, session_id)
    endpoint = getattr(store, "session_endpoint", None)
    session.endpoint = endpoint(session_id) if endpoint is not None else (None, None)
    if output == "json":
        _show_json(env.stdout, session, records, interrupted)
        return
    if output == "jsonl":
        _show_jsonl(env.stdout, session, records, interrupted)
        return
    use_pager = pager and env.interactive and session.turn_count > 3
    if use_pager:
        _show_paged(state, session, records, full, interrupted)
    else:
        console = state.out() if env.stdout_isatty else None
        _render(console, session, records, full, markdown=env.stdout_isatty, out=env.stdout, interrupted=interrupted)


def _header(session: Any) -> Any:
    from .render import Lines

    status = getattr(session.status, "value", session.status)
    agent = getattr(session.active_agent, "name", "?")
    text = Lines(f"Session {safe_text(session.session_id)}", "bold")
    text.append(f"  agent {safe_text(agent)} · {status} · {plural(session.turn_count, 'turn')} · window {session.max_turns}",
                "dim")
    model = (getattr(session, "endpoint", None) or (None, None))[0]
    if model:
        text.append(f" · model {safe_text(model)}", "dim")
    if session.metadata:
        text.append("\n" + safe_text(", ".join(f"{k}={v}" for k, v in session.metadata.items())), "dim")
    return text


class _Batch:
    """A file-like buffer in front of the real output: :meth:`write` collects text,
    :meth:`drain` writes it out in one call and flushes.

    A terminal stream is line-buffered, so each printed item used to be one ``write``
    system call (thousands for a long session, each waking the terminal or pager);
    Rich also flushes after every ``print``. Batching makes it a few dozen calls.
    """

    def __init__(self, out: Any) -> None:
        self.out = out
        self.encoding = getattr(out, "encoding", None) or "utf-8"
        self.parts: list[str] = []
        self.size = 0

    def write(self, text: str) -> int:
        self.parts.append(text)
        self.size += len(text)
        return len(text)

    def flush(self) -> None:
        """Rich calls this after every ``print``: the text waits for :meth:`drain`."""

    def isatty(self) -> bool:  # pragma: no cover - consoles here are forced to terminal or not
        return False

    def drain(self) -> None:
        if self.parts:
            self.out.write("".join(self.parts))
            self.parts.clear()
            self.size = 0
        self.out.flush()


#: Text collected before it is written out (after the first turns, which go out at once).
BATCH_CHARS = 64 * 1024


def _render(console: Any, session: Any, records: Iterator[Any], full: bool, *, markdown: bool, out: Any,
            interrupted: Any = ()) -> None:
    """Print the session turn by turn as each is rendered.

    ``console=None`` (a pipe): the plain text of each turn is written directly; Rich is
    not even imported, since its layout pass is only needed for colours, wrapping and
    Markdown on a terminal. The first two turns are written out as soon as each is
    rendered; after that, output goes out in batches of :data:`BATCH_CHARS` (issue 5).
    """
    from .render import turn_interrupted, turn_renderables

    plain = console is None
    batch = _Batch(out)
    width = 80 if console is None else console.width
    saved_file = None
    if console is not None:
        # fixed size: otherwise Rich asks the terminal for its size on every print
        console.size = (width, console.height)
        saved_file = console.file
        console.file = batch
    color_system = None if console is None or console.no_color else console.color_system

    def emit(item: Any) -> None:
        if plain:
            batch.write(item.plain + "\n")
        elif hasattr(item, "ansi"):
            batch.write(item.wrapped(width).ansi(color_system) + "\n")  # a terminal never cuts a word
        else:
            console.print(item)

    try:
        emit(_header(session))
        shown = 0
        for record in records:
            if record.number == 0 and not record.messages:
                continue
            for item in turn_renderables(record, markdown=markdown, full=full, width=width,
                                         interrupted=turn_interrupted(record, interrupted)):
                emit(item)
            shown += 1
            if shown <= 2 or batch.size >= BATCH_CHARS:
                batch.drain()
        if shown == 0:
            emit(_no_turns())
        batch.drain()
    finally:
        if console is not None:
            console.file = saved_file


def _no_turns() -> Any:
    from .render import Lines

    return Lines("(no turns yet)", "dim")


def _show_paged(state: State, session: Any, records: Iterator[Any], full: bool, interrupted: Any = ()) -> None:
    """Stream the rendering into a pager process as it is produced."""
    pager_cmd = os.environ.get("PAGER") or "less"
    env = dict(os.environ)
    env.setdefault("LESS", "FRX")
    try:
        proc = subprocess.Popen(shlex.split(pager_cmd), stdin=subprocess.PIPE, env=env, text=True,
                                encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        _render(state.out(), session, records, full, markdown=True, out=state.env.stdout, interrupted=interrupted)
        return
    assert proc.stdin is not None
    console = state.env.console(file=proc.stdin, terminal=True)
    try:
        _render(console, session, records, full, markdown=True, out=proc.stdin, interrupted=interrupted)
    except (BrokenPipeError, OSError):
        pass  # the user quit the pager early
    finally:
        try:
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        proc.wait()


def _session_head(session: Any) -> dict[str, Any]:
    return {
        "session_id": session.session_id,
        "agent": getattr(session.active_agent, "name", None),
        "status": getattr(session.status, "value", session.status),
        "turns": session.turn_count,
        "max_turns": session.max_turns,
        "metadata": session.metadata,
        "model": session.endpoint[0],
        "base_url": session.endpoint[1],
    }


def _show_jsonl(stream: Any, session: Any, records: Iterator[Any], interrupted: Any = ()) -> None:
    from .render import turn_dict, turn_interrupted

    stream.write(dumps({"session": _session_head(session)}) + "\n")
    for record in records:
        if record.number == 0 and not record.messages:
            continue
        stream.write(dumps({"turn": turn_dict(record, interrupted=turn_interrupted(record, interrupted))}) + "\n")


def _show_json(stream: Any, session: Any, records: Iterator[Any], interrupted: Any = ()) -> None:
    from .render import turn_dict, turn_interrupted

    head = _session_head(session)
    stream.write('{"session":' + dumps(head) + ',"turns":[')
    first = True
    for record in records:
        if record.number == 0 and not record.messages:
            continue
        stream.write(("" if first else ",") + "\n" + dumps(turn_dict(record, interrupted=turn_interrupted(record, interrupted))))
        first = False
    stream.write("\n]}\n")


# ---------------------------------------------------------------------------------------
# rollback
# ---------------------------------------------------------------------------------------
def rollback_session(state: State, session_id: str, *, to: int | None, last: int | None, yes: bool) -> None:
    from .cli import _notice, confirm

    store = _store_or_missing(state, session_id)
    session = _summary(store, session_id)
    count = session.turn_count
    target = to if to is not None else count - (last or 0)
    if to is not None and to > count:
        raise UsageError(f"--to {to} is beyond the last turn of {session_id} ({count}); nothing changed")
    if target < 0:
        raise UsageError(f"--last {last}: {session_id} has only {plural(count, 'turn')}; nothing changed")
    if target == count:
        _notice(state, f"nothing to roll back: {session_id} ends at turn {count}")
        return
    going = store.load_turns(session_id, first=target + 1, last=count)
    env = state.env
    err = env.console(stderr=True)
    from rich.text import Text

    err.print(Text(f"Rolling back {session_id} to turn {target}; these turns go:", style="bold"))
    for record in going:
        first_user = next((m for m in record.messages if getattr(m.role, "value", m.role) == "user"), None)
        preview = safe_text((first_user.content or "") if first_user else "", one_line=True)
        err.print(Text(f"  turn {record.number}: {preview[:70]}"))
    if env.stdin_isatty and not yes and not confirm(state, "Roll back?", assume_yes=False):
        _notice(state, "nothing changed")
        return
    rollback = getattr(store, "rollback", None)
    try:
        if rollback is not None:
            rollback(session_id, target)
        else:  # pragma: no cover - every chatflow store has rollback()
            session.rollback_to(target)
            store.save(session)
    except ValueError as exc:
        raise UsageError(f"cannot roll back {session_id}: {exc}; nothing changed") from None
    _notice(state, f"rolled back {session_id} to turn {target} ({plural(count - target, 'turn')} removed)")


# ---------------------------------------------------------------------------------------
# delete
# ---------------------------------------------------------------------------------------
def delete_sessions(state: State, ids: list[str], *, older_than: float | None, all_: bool, yes: bool) -> None:
    from .cli import _notice, confirm

    store = state.store(create=False)
    if store is None:
        if ids:
            raise _not_found(ids[0])
        _notice(state, "no sessions")
        return
    if ids:
        # All or nothing: a command that fails (an unknown id) deletes nothing.
        missing = [sid for sid in ids if store.get(sid) is None]
        if missing:
            raise _not_found(missing[0]) if len(missing) == 1 else SessionNotFoundError(
                f"no sessions {', '.join(repr(safe_text(m[:60])) for m in missing)}: nothing was deleted")
        # Deletion cannot be undone: on a terminal, ask first (as --all and rollback do);
        # --yes skips the question, and scripts (stdin not a terminal) are not asked.
        if not yes and state.env.stdin_isatty:
            what = f"session {safe_text(ids[0])}" if len(ids) == 1 else plural(len(ids), "session") + f" ({', '.join(safe_text(i) for i in ids)})"
            if not confirm(state, f"Delete {what} with its messages and events? This cannot be undone.", assume_yes=False):
                _notice(state, "nothing deleted")
                return
        deleted = sum(1 for sid in ids if store.delete(sid))
        _notice(state, f"deleted {plural(deleted, 'session')}")
        return
    summaries = store.list_sessions()
    if older_than is not None:
        cutoff = time.time() - older_than
        summaries = [s for s in summaries if (s.updated_at or 0) < cutoff]
    if not summaries:
        _notice(state, "no sessions match: nothing deleted")
        return
    what = f"ALL {plural(len(summaries), 'session')}" if all_ else plural(len(summaries), "session") + " not updated since " + time.strftime(
        "%Y-%m-%d %H:%M", time.localtime(time.time() - (older_than or 0)))
    if not yes:
        if not state.env.stdin_isatty:
            raise UsageError(f"deleting {what} needs --yes when not on a terminal")
        if not confirm(state, f"Delete {what}?", assume_yes=False):
            _notice(state, "nothing deleted")
            return
    deleted = sum(1 for s in summaries if store.delete(s.session_id))
    _notice(state, f"deleted {plural(deleted, 'session')}")


# ---------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------
def replay_events(state: State, session_id: str, *, since: int, follow: bool, output: str = "text") -> None:
    """Print the event log from ``since``: ``text`` (one line an event), ``jsonl`` (one JSON
    event a line, :func:`chatflow_cli.render.event_json`'s shape) or ``json`` (one array of
    them; not with ``follow``). ``follow`` keeps printing new events until Ctrl-C."""
    store = _store_or_missing(state, session_id)
    out = state.env.stdout
    as_json = output != "text"
    console = None if as_json else state.out()
    from .render import event_text, stored_event_json

    collected: list[Any] | None = [] if output == "json" else None

    cursor = since
    while True:
        try:
            events = store.events(session_id, after_seq=cursor)
        except SessionNotFoundError:
            if cursor > since or follow and cursor > 0:
                from .cli import _notice

                _notice(state, f"session {session_id} was deleted")
                return
            raise _not_found(session_id) from None
        for event in events:
            if collected is not None:
                collected.append(stored_event_json(event))
            elif as_json:
                out.write(dumps(stored_event_json(event)) + "\n")
            else:
                if state.env.stdout_isatty:  # word-wrapped, wrapped rows indented
                    console.print(event_text(event, width=console.width))
                else:  # piped: never wrapped
                    console.print(event_text(event), soft_wrap=True)
            cursor = event.seq
        if not follow:
            if collected is not None:
                out.write(dumps(collected, indent=2) + "\n")
            return
        out.flush()
        wait = getattr(store, "wait_for_events", None)
        if wait is not None:  # PostgreSQL: pushed by LISTEN/NOTIFY (and a read each second)
            wait(session_id, cursor, 1.0)
        else:
            time.sleep(FOLLOW_POLL_S)


# ---------------------------------------------------------------------------------------
# interrupt
# ---------------------------------------------------------------------------------------
#: What ``sessions interrupt`` reports for the event that ended the turn it asked to stop.
_ENDINGS = {
    "turn.interrupted": "stopped: the partial reply is kept as an interrupted turn",
    "turn.completed": "had already finished",
    "turn.failed": "failed before it could stop",
    "tool.pending": "stopped to wait for tool results",
    "session.recovered": "was recovered: its process had died",
}


def interrupt_session(state: State, session_id: str, *, wait: float, as_json: bool) -> None:
    """Ask the process running ``session_id``'s turn (in any process, on any host) to stop it,
    then wait up to ``wait`` seconds for the turn to end and say how it ended.

    Nothing running is not an error (exit 0). A turn still running when ``wait`` runs out is
    :class:`SessionBusyError` (exit 4): it was asked and will stop at its next chunk or tool
    boundary. Raises SessionNotFoundError (exit 3) for an unknown session.
    """
    store = _store_or_missing(state, session_id)
    try:
        before = store.last_seq(session_id)
        turn = store.request_interrupt(session_id)
    except SessionNotFoundError:
        raise _not_found(session_id) from None
    outcome: str | None = None
    if turn is not None and wait > 0:
        deadline = time.monotonic() + wait
        while outcome is None:
            for event in store.events(session_id, after_seq=before):
                if event.type in _ENDINGS and event.payload.get("turn") in (turn, None):
                    outcome = event.type
                    break
            remaining = deadline - time.monotonic()
            if outcome is not None or remaining <= 0:
                break
            waiter = getattr(store, "wait_for_events", None)
            if waiter is not None:
                waiter(session_id, store.last_seq(session_id), min(remaining, 1.0))
            else:
                time.sleep(min(FOLLOW_POLL_S, remaining))
    if turn is not None and wait > 0 and outcome is None:
        pid = store.running_turn_pid(session_id)
        raise SessionBusyError(
            f"asked turn {turn} of session {session_id} to stop; it is still running after {wait:g} s"
            + (f" (pid {pid})" if pid else "") + ": it stops at its next chunk or tool boundary",
            session_id=session_id, pid=pid)
    if as_json:
        state.env.stdout.write(dumps({"session_id": session_id, "turn": turn, "requested": turn is not None,
                                      "outcome": outcome}) + "\n")
        return
    from .cli import _notice

    if turn is None:
        _notice(state, f"session {session_id} has no running turn: nothing to interrupt")
    elif outcome is None:
        _notice(state, f"asked turn {turn} of session {session_id} to stop")
    else:
        _notice(state, f"turn {turn} of session {session_id} {_ENDINGS[outcome]}")
