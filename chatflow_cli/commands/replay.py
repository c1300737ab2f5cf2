"""``replay``: a session's event log in seq order, and ``replay --rerun``.

``replay`` prints the stored events after ``--since`` (one line an event, or JSON), and with
``--follow`` keeps polling for new ones (every :data:`FOLLOW_POLL_S` seconds) until Ctrl-C
or until the session is deleted. A follower outlives a database server that restarts or a
connection that is cut: it tries again with backoff, reads on from the last seq it printed
(no event lost, none printed twice), says on stderr that it reconnected, and gives up
(exit 8) only after :data:`FOLLOW_RECONNECT_S` seconds without the store. ``--rerun``
sends the session's user messages again, one turn each, into a new session.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..assembly import assemble, transport_for
from ..context import new_session_id, notice, validate_session_id
from ..core.messages import Message, Role
from ..core.errors import ChatflowError, ExitStatus, SessionNotFoundError, StoreUnreachableError, UsageError
from ..lookup import not_found, store_or_missing
from ..render import dumps, plural, safe_text
from .chat_output import ChatOutput

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State
    from ..core.memory.protocol import SessionLookup

__all__ = ["FOLLOW_POLL_S", "FOLLOW_RECONNECT_S", "replay_events", "rerun_session"]

#: Seconds between two looks at the store with ``--follow``.
FOLLOW_POLL_S = 0.25
#: Seconds a follower keeps trying to reach a store it lost (a server restarting) before
#: it gives up with the store's error (exit 8); the waits between tries double from
#: :data:`_RECONNECT_FIRST_S` up to :data:`_RECONNECT_MAX_S`.
FOLLOW_RECONNECT_S = 60.0
_RECONNECT_FIRST_S = 0.25
_RECONNECT_MAX_S = 5.0


def replay_events(state: State, session_id: str, *, since: int, follow: bool, output: str = "text") -> None:
    """Print a session's event log in seq order.

    Args:
        state: The run.
        session_id: The session.
        since: Only events after this seq.
        follow: Keep printing new events until Ctrl-C, or until the session is deleted; a
            store that becomes unreachable is tried again for :data:`FOLLOW_RECONNECT_S`.
        output: ``text`` (one line an event), ``jsonl`` (one JSON event a line, in
            :func:`chatflow_cli.render.event_json`'s shape) or ``json`` (one array of them;
            not with ``follow``).

    Raises:
        SessionNotFoundError: No such session (:class:`UsageError` for an invalid id).
        StoreUnreachableError: The store was lost (before the first read, or for longer
            than :data:`FOLLOW_RECONNECT_S` while following).
    """
    store = store_or_missing(state, session_id)
    out = state.env.stdout
    as_json = output != "text"
    console = None if as_json else state.out()
    from ..render import event_text, stored_event_json

    collected: list[Any] | None = [] if output == "json" else None
    # the text says at each turn's end the resources it ran with: the mounts in force then
    mounts = _MountsInForce(store, session_id, since) if console is not None else None

    cursor = since
    lost = _Reconnecting(state)
    following = False  # the first read succeeded: from now on a lost store is waited for
    while True:
        try:
            events = store.events(session_id, after_seq=cursor)
        except SessionNotFoundError:
            if cursor > since or follow and cursor > 0:
                notice(state, f"session {session_id} was deleted")
                return
            raise not_found(session_id) from None
        except StoreUnreachableError as exc:
            if not following:
                raise
            lost.wait(exc)
            continue
        lost.back(cursor)
        following = follow
        for event in events:
            if collected is not None:
                collected.append(stored_event_json(event))
            elif as_json:
                out.write(dumps(stored_event_json(event)) + "\n")
            elif console is not None:  # text
                now = mounts.after(event) if mounts is not None else None
                if state.env.stdout_isatty:  # word-wrapped, wrapped rows indented
                    console.print(event_text(event, width=console.width, mounts=now))
                else:  # piped: never wrapped
                    console.print(event_text(event, mounts=now), soft_wrap=True)
            cursor = event.seq
        if not follow:
            if collected is not None:
                out.write(dumps(collected, indent=2) + "\n")
            return
        out.flush()
        wait = getattr(store, "wait_for_events", None)
        if wait is not None:  # PostgreSQL: pushed by LISTEN/NOTIFY (and a read each second)
            try:
                wait(session_id, cursor, 1.0)
            except StoreUnreachableError as exc:
                lost.wait(exc)  # the next read says whether the store is back
        else:
            time.sleep(FOLLOW_POLL_S)


class _MountsInForce:
    """The session's mounts as ``replay`` reads its log: the fold of its ``resource.*``
    events up to the event just read (those before ``--since`` are read first, once), so
    the end of each turn can say what the turn ran with, as ``sessions show`` does."""

    def __init__(self, store: Any, session_id: str, since: int) -> None:
        self.current: dict[tuple[str, str], dict[str, Any]] = {}
        if since > 0:
            try:
                for event in store.events(session_id, after_seq=0, limit=since):
                    self.after(event)
            except ChatflowError:  # the log is read again below, and its error said there
                pass

    def after(self, event: Any) -> list[dict[str, Any]]:
        """The mounts in force once ``event`` is applied (``{"kind", "name", "mode"}`` dicts)."""
        payload = event.payload if isinstance(event.payload, dict) else {}
        key = (str(payload.get("kind")), str(payload.get("name")))
        if event.type == "resource.mounted":
            self.current[key] = {k: payload.get(k) for k in ("kind", "name", "mode")}
        elif event.type == "resource.unmounted":
            self.current.pop(key, None)
        return list(self.current.values())


class _Reconnecting:
    """A follower's state while its store is unreachable: the backoff between tries, the
    bound, and the lines on stderr."""

    def __init__(self, state: State) -> None:
        self._state = state
        self._since: float | None = None  # monotonic time the store was lost at
        self._backoff = _RECONNECT_FIRST_S

    def wait(self, exc: StoreUnreachableError) -> None:
        """Sleep before the next try; re-raise ``exc`` once :data:`FOLLOW_RECONNECT_S` passed."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
            notice(self._state, f"{exc}; reconnecting (giving up after {FOLLOW_RECONNECT_S:.0f} s)")
        elif now - self._since >= FOLLOW_RECONNECT_S:
            raise StoreUnreachableError(
                f"{exc} (gave up following after {FOLLOW_RECONNECT_S:.0f} s without the store)"
            ) from None
        time.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, _RECONNECT_MAX_S)

    def back(self, cursor: int) -> None:
        """A read succeeded: say so on stderr when the store had been lost."""
        if self._since is not None:
            notice(self._state, f"reconnected to the store after {time.monotonic() - self._since:.1f} s; "
                                f"following on after seq {cursor}")
            self._since, self._backoff = None, _RECONNECT_FIRST_S


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
    """Send ``session_id``'s user messages again, one turn each, into a new session.

    The new session gets the old one's system messages, the current agent, and the source
    session's model and endpoint unless ``--model``/``--base-url`` override them (both said
    on stderr). Turns rolled back or failed are not
    re-sent.

    Args:
        state: The run.
        session_id: The session whose user messages are sent again.
        into: The new session's id (it must not exist yet); ``None`` makes one up.
        model: ``--model``.
        base_url: ``--base-url``.
        agent: ``--agent``: the starting agent.
        output: ``text``, ``json`` or ``jsonl``, as ``chat --input jsonl`` prints.

    Returns:
        :attr:`ExitStatus.INCOMPLETE` when a reply was cut, else success.

    Raises:
        SessionNotFoundError: No such session.
        UsageError: Nothing to re-run, or ``into`` names an existing session.
    """
    store = state.store(create=False)
    if store is None:
        raise SessionNotFoundError(f"no session {safe_text(session_id)!r}")
    records = store.load_turns(session_id, first=0)
    systems = [m.content or "" for r in records if r.number == 0 for m in r.messages]
    users: list[Message] = []  # with their attachments: the new session references the same files
    for record in records:
        if record.number == 0 or record.rolled_back or record.failed:
            continue
        first_user = next((m for m in record.messages if m.role == Role.USER), None)
        if first_user is not None and (first_user.content or first_user.attachments):
            users.append(Message.user(first_user.content or "", first_user.attachments))
    if not users:
        raise UsageError(f"session {safe_text(session_id)!r} has no user messages to re-run")
    target = validate_session_id(into) if into is not None else new_session_id()
    if store.get(target) is not None:
        raise UsageError(f"session {target!r} already exists: --into needs a new id")
    chosen_model, chosen_url = _source_endpoint(state, store, session_id, model, base_url)
    settings = state.settings(model=chosen_model, base_url=chosen_url)
    notice(state, f"re-running {plural(len(users), 'user message')} of {session_id} into {target}")
    out = ChatOutput(state, output, multi=True)
    system = "\n\n".join(s for s in systems if s) or None
    try:
        with assemble(settings, store, model=model, agent=agent, transport=transport_for("http")) as built:
            runner = built.runner
            for user in users:
                if output == "text":
                    from rich.text import Text

                    state.out().print(Text("You: ", style="bold green") + Text(safe_text(user.content or "")))
                out.run(runner.run_streamed(target, user, system=system, wait=0))
                system = None
        out.success()
        from ..config import resolve_model
        from ..assembly import remember_endpoint

        remember_endpoint(store, target, resolve_model(settings))
        return out.exit_code
    except BaseException as exc:
        if isinstance(exc, (ChatflowError, KeyboardInterrupt)):
            out.failure(exc, target)
        raise


def _source_endpoint(state: State, store: SessionLookup, session_id: str, model: str | None,
                     base_url: str | None) -> tuple[str | None, str | None]:
    """The model and base URL a re-run uses: ``--model``/``--base-url`` when given, else those
    stored with the source session (said on stderr), else ``None`` (the configured ones). A
    flag that differs from the source session's value is said too."""
    from ..assembly import stored_endpoint

    stored_model, stored_url = stored_endpoint(store, session_id) or (None, None)
    if base_url and not model and stored_model == "local":
        stored_model = None  # the embedded model's name means nothing to another endpoint
    for flag, what, given, stored in (("--model", "model", model, stored_model),
                                      ("--base-url", "endpoint", base_url, stored_url)):
        if given and stored and given != stored:
            notice(state, f"{session_id} used {what} {stored}; {flag} re-runs it with {given}")
        elif not given and stored:
            notice(state, f"re-running with {session_id}'s {what} {stored}")
    return model or stored_model, base_url or stored_url
