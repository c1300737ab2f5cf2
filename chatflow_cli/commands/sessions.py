"""``sessions ls`` and ``sessions show``: listing and reading stored sessions.

``sessions show`` streams: turns are loaded from the store in pages of
:data:`PAGE_TURNS` and each turn is printed as soon as it is rendered, so the first turns
of a long session are on screen (or in the pager) at once (a 500-turn session shows its
first turns within 0.3 s). On a terminal the output goes through a pager (``$PAGER``, else
``less``; ``LESS=FRX`` unless set, so a short session prints and exits like ``git log``);
``--no-pager`` turns that off. Into a pipe the text is plain, with no ANSI codes and no
Markdown rendering.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import IO, TYPE_CHECKING, Any, Container, Iterator, Mapping

from ..context import notice, terminal_width, write_lines
from ..core.errors import ChatflowError
from ..core.events import SessionStatus
from ..lookup import InterruptedTurns, awaiting_approval, read_summary, store_or_missing
from ..render import AgentVersionMarks, Lines, dumps, plural, safe_text, turn_versions
from ..render.shapes import status_name

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State
    from ..core.memory import BaseSessionStore, SessionSummary, TurnRecord

#: A session's stored ``(model, base_url)``.
Endpoint = tuple["str | None", "str | None"]

__all__ = ["BATCH_CHARS", "PAGE_TURNS", "list_sessions", "show_session"]

PAGE_TURNS = 50

#: The statuses ``sessions ls --status`` takes.
STATUSES = tuple(status.value for status in SessionStatus)


def list_sessions(state: State, *, limit: int, agent: str | None, status: str | None, output: str,
                  metadata: dict[str, str] | None = None, since: str | None = None, until: str | None = None,
                  title: str | None = None, after: str | None = None, archived: bool = False,
                  tree: bool = False) -> None:
    """Print the stored sessions, newest first.

    Args:
        state: The run.
        limit: At most this many (0: all).
        agent: Only sessions whose active agent has this name.
        status: Only sessions with this status (one of :data:`STATUSES`).
        output: ``text`` (a table; a notice on stderr when there is nothing), ``json`` (one
            array of :func:`chatflow_cli.render.summary_dict` objects, each with its
            ``cursor``) or ``jsonl`` (one a line).
        metadata: Only sessions whose metadata has every ``KEY: VALUE``.
        since: Only sessions updated since (a duration back or a date).
        until: Only sessions last updated before (a duration back or a date).
        title: Only sessions whose title contains this text (any case).
        after: The page after this session id or cursor.
        archived: Only archived sessions (else: only the others).
        tree: Forks listed under the session they came from, indented.

    Raises:
        UsageError: ``status`` is not one of :data:`STATUSES`, a bad ``since``/``until``
            or ``after``.
    """
    from ..core.errors import UsageError
    from .search import parse_since

    if status is not None and status not in STATUSES:
        raise UsageError(f"--status {status!r}: use idle, running, rescheduled or terminated")
    since_s = parse_since(since) if since is not None else None
    until_s = parse_since(until) if until is not None else None
    store = state.store(create=False)
    summaries = [] if store is None else store.list_sessions(
        limit=limit or None, agent=agent, status=status, metadata=metadata, since=since_s, until=until_s,
        title=title, archived=archived, after=after,
    )
    prefixes: dict[str, str] = {}
    if tree:
        summaries, prefixes = _as_tree(summaries)
    if output != "text":
        from ..render import summary_dict

        rows = [summary_dict(s) for s in summaries]
        text = dumps(rows, indent=2) + "\n" if output == "json" else "".join(dumps(r) + "\n" for r in rows)
        state.env.stdout.write(text)
        return
    if not summaries:
        filters = [f"--{name} {value}" for name, value in (("status", status), ("agent", agent), ("title", title),
                                                            ("since", since), ("until", until), ("after", after))
                   if value]
        filters += [f"--metadata {k}={v}" for k, v in (metadata or {}).items()]
        if archived:
            notice(state, "no archived sessions" + (f" match {' '.join(filters)}" if filters else ""))
        elif filters and store is not None and store.latest_session_id() is not None:
            notice(state, f"no sessions match {' '.join(filters)}")
        else:
            notice(state, "no sessions yet: start one with chatflow chat \"hello\"")
        return
    from ..render import sessions_lines

    write_lines(state, sessions_lines(summaries, width=terminal_width(state), prefixes=prefixes))


def _as_tree(summaries: list[SessionSummary]) -> tuple[list[SessionSummary], dict[str, str]]:
    """The same sessions with each fork right under the session it came from (depth first,
    newest first among siblings), and each session's tree prefix: ``├─ `` before a fork
    with a later sibling, ``└─ `` before the last, under ``│  `` (or spaces) for each level
    above; a fork whose parent is not in the list stays at the top level (no prefix)."""
    ids = {s.session_id for s in summaries}
    children: dict[str, list[SessionSummary]] = {}
    roots = []
    for s in summaries:
        parent = (s.forked_from or {}).get("session_id")
        if isinstance(parent, str) and parent in ids and parent != s.session_id:
            children.setdefault(parent, []).append(s)
        else:
            roots.append(s)
    out: list[SessionSummary] = []
    prefixes: dict[str, str] = {}

    def walk(node: SessionSummary, prefix: str, lead: str) -> None:
        if node.session_id in prefixes:
            return
        prefixes[node.session_id] = prefix
        out.append(node)
        below = [c for c in children.get(node.session_id, []) if c.session_id not in prefixes]
        for n, child in enumerate(below):
            last = n == len(below) - 1
            walk(child, lead + ("\u2514\u2500 " if last else "\u251c\u2500 "), lead + ("   " if last else "\u2502  "))

    for root in roots:
        walk(root, "", "")
    return out, prefixes


def _pages(store: BaseSessionStore, session_id: str, last_turn: int, include_rolled_back: bool) -> Iterator[TurnRecord]:
    first = 0
    while first <= last_turn:
        upto = first + PAGE_TURNS - 1
        records = store.load_turns(session_id, first=first, last=upto, include_rolled_back=include_rolled_back)
        yield from records
        first = upto + 1


# ---------------------------------------------------------------------------------------
# show
# ---------------------------------------------------------------------------------------
def show_session(
    state: State, session_id: str, *, include_rolled_back: bool, full: bool, output: str = "text", pager: bool = True,
    turn: int | None = None,
    stream: IO[str] | None = None,
) -> None:
    """Print a stored session turn by turn.

    Args:
        state: The run.
        session_id: The session.
        include_rolled_back: ``--all``: also rolled-back turns.
        full: ``--full``: long tool arguments and results unfolded.
        output: ``text`` (numbered turns; paged on a terminal), ``json`` (``{"session": {...},
            "turns": [...]}``) or ``jsonl`` (a ``{"session": {...}}`` line, then one
            ``{"turn": {...}}`` a line).
        pager: Page on a terminal (``--no-pager`` turns it off).
        turn: ``--turn N``: only turn N (with ``--all`` also its rolled-back versions).
        stream: Where ``json``/``jsonl`` go instead of stdout (``sessions export --format json``).

    Raises:
        SessionNotFoundError: No such session (:class:`UsageError` for an invalid id).
        UsageError: ``turn`` names no stored turn.
    """
    store = store_or_missing(state, session_id)
    session = read_summary(store, session_id)
    if turn is not None:
        from ..core.errors import UsageError

        only = store.load_turns(session_id, first=turn, last=turn, include_rolled_back=include_rolled_back)
        if not only:
            hint = "" if include_rolled_back else " (--all also shows rolled-back turns)"
            raise UsageError(f"{session_id} has no turn {turn}: its turns are 1..{session.turn_count}{hint}")
        records: Iterator[TurnRecord] = iter(only)
    elif include_rolled_back:  # rolled-back turns may carry numbers past the live last turn
        records = iter(store.load_turns(session_id, first=0, last=None, include_rolled_back=True))
    elif session.turn_count == 0:
        # no live turn: show the failed ones (a first message that failed, e.g. on a wrong key)
        records = iter([r for r in store.load_turns(session_id, first=0, last=None, include_rolled_back=True)
                        if r.number == 0 or r.failed])
    else:
        records = _pages(store, session_id, session.turn_count, False)
    env = state.env
    interrupted = InterruptedTurns(store, session_id)
    endpoint = store.session_endpoint(session_id)
    context = context_use(state, store, session, endpoint)
    marks = AgentVersionMarks(_versions_before(store, session_id, turn) if turn is not None and turn > 1 else None)
    submitted = store.submitted_tool_results(session_id)
    resources = [m.to_dict() for m in store.session_resources(session_id)]  # the mounts in force now
    if output in ("json", "jsonl"):
        show = _show_json if output == "json" else _show_jsonl
        show(stream or env.stdout, session, records, interrupted, endpoint, context, marks, resources=resources)
        return
    awaiting = awaiting_approval(state, store, session_id)
    use_pager = pager and env.interactive and session.turn_count > 3
    if use_pager:
        _show_paged(state, session, records, full, interrupted, endpoint, context, marks, submitted, resources,
                    awaiting)
    else:
        console = state.out() if env.stdout_isatty else None
        _render(console, session, records, full, markdown=env.stdout_isatty, out=env.stdout, interrupted=interrupted,
                endpoint=endpoint, context=context, marks=marks, submitted=submitted, resources=resources,
                awaiting=awaiting)


def _versions_before(store: BaseSessionStore, session_id: str, turn: int) -> dict[str, str]:
    """``{agent: version}`` of each agent's latest reply with a known version in the live
    turns before ``turn`` (what ``--turn N`` compares turn N with), read newest page first."""
    found: dict[str, str] = {}
    last = turn - 1
    while last >= 1:
        first = max(1, last - PAGE_TURNS + 1)
        for record in reversed(store.load_turns(session_id, first=first, last=last)):
            for agent, version in turn_versions(record).items():
                found.setdefault(agent, version)
        last = first - 1
    return found


def context_use(state: State, store: BaseSessionStore, session: SessionSummary, endpoint: Endpoint) -> dict[str, Any]:
    """What the next request of ``session`` carries: ``{"tokens", "context", "budget", "turns",
    "summary_through"}``: the window's tokens (system messages, the newest summary and the
    newest whole turns that fit), the model's context size and the budget for messages
    (None when the model's size is unknown), the whole turns in it, and K of the summary
    in use (None: none). Read from the stored token counts, without loading messages' agents."""
    from ..core.tokens import context_budget

    configured = None
    try:
        settings = state.settings()
        spec = settings.agent(session.active_agent_name)
        flag, configured = settings.max_context_tokens, spec.max_context_tokens if spec is not None else None
        model = endpoint[0] or settings.model
    except ChatflowError:  # a broken config.toml does not stop `show`
        flag, model = None, endpoint[0]
    budget = context_budget(model, max_context_tokens=flag, configured=configured)
    total, turns = store.window_tokens(session.session_id)
    limit = budget.tokens if budget is not None else 2**62
    tokens = total - sum(t for _, t in turns)  # the system messages and the summary
    kept = 0
    for _number, cost in reversed(turns):  # the newest whole turns that fit, the newest always
        if kept and tokens + cost > limit:
            break
        tokens += cost
        kept += 1
    live = [m.summary_through for m, _removed in store.summaries(session.session_id) if m.summary_through is not None]
    return {"tokens": tokens, "context": budget.context if budget is not None else None,
            "budget": budget.tokens if budget is not None else None, "turns": kept,
            "summary_through": max(live) if live else None}


def _header(session: SessionSummary, endpoint: Endpoint = (None, None), context: dict[str, Any] | None = None,
            resources: list[dict[str, str]] | None = None) -> Lines:
    status = status_name(session.status)
    agent = session.active_agent_name
    text = Lines(f"Session {safe_text(session.session_id)}", "bold")
    text.append(f"  agent {safe_text(agent)} · {status} · {plural(session.turn_count, 'turn')} · window {session.max_turns}",
                "dim")
    model = endpoint[0]
    if model:
        text.append(f" · model {safe_text(model)}", "dim")
    if session.title:
        text.append("\n" + safe_text(session.title, one_line=True), "bold")
    if session.forked_from:
        origin = session.forked_from
        text.append(f"\nforked from {safe_text(origin['session_id'])} at turn {origin['turn']}", "dim")
    if session.archived_at is not None:
        text.append("\narchived (chatflow sessions unarchive to continue it)", "magenta")
    if session.metadata:
        text.append("\n" + safe_text(", ".join(f"{k}={v}" for k, v in session.metadata.items())), "dim")
    if context is not None:
        from ..core.tokens import short_count

        use = f"\n  context {short_count(context['tokens'])}"
        use += f" of {short_count(context['context'])} tokens" if context["context"] is not None else \
            " tokens (budget unknown)"
        use += f" · {plural(context['turns'], 'turn')} sent"
        if context["summary_through"] is not None:
            use += f" · turns 1..{context['summary_through']} summarised"
        text.append(use, "dim")
    if resources:  # the mounts in force now; each turn says those it ran with
        from ..render import mounts_text

        text.append(f"\n  mounted: {mounts_text(resources)}", "dim")
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


def _render(console: Any, session: SessionSummary, records: Iterator[TurnRecord], full: bool, *, markdown: bool,
            out: Any, interrupted: Container[int] = (), endpoint: Endpoint = (None, None),
            context: dict[str, Any] | None = None, marks: AgentVersionMarks | None = None,
            submitted: Mapping[str, str] | None = None, resources: list[dict[str, str]] | None = None,
            awaiting: Container[str] = ()) -> None:
    """Print the session turn by turn as each is rendered (``submitted``: the results
    already given for the open turn's tool calls, shown beside their calls).

    ``console=None`` (a pipe): the plain text of each turn is written directly; Rich is
    not even imported, since its layout pass is only needed for colours, wrapping and
    Markdown on a terminal. The first two turns are written out as soon as each is
    rendered; after that, output goes out in batches of :data:`BATCH_CHARS`.
    """
    from ..render import turn_interrupted, turn_renderables

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
        emit(_header(session, endpoint, context, resources))
        shown = 0
        for record in records:
            if record.number == 0 and not record.messages:
                continue
            changed = marks.changes(record) if marks is not None else None
            for item in turn_renderables(record, markdown=markdown, full=full, width=width,
                                         interrupted=turn_interrupted(record, interrupted), changed=changed,
                                         submitted=submitted, awaiting=awaiting):
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


def _no_turns() -> Lines:
    return Lines("(no turns yet)", "dim")


def _show_paged(state: State, session: SessionSummary, records: Iterator[TurnRecord], full: bool,
                interrupted: Container[int], endpoint: Endpoint, context: dict[str, Any] | None = None,
                marks: AgentVersionMarks | None = None, submitted: Mapping[str, str] | None = None,
                resources: list[dict[str, str]] | None = None, awaiting: Container[str] = ()) -> None:
    """Stream the rendering into a pager process as it is produced."""
    pager_cmd = os.environ.get("PAGER") or "less"
    env = dict(os.environ)
    env.setdefault("LESS", "FRX")
    try:
        proc = subprocess.Popen(shlex.split(pager_cmd), stdin=subprocess.PIPE, env=env, text=True,
                                encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        _render(state.out(), session, records, full, markdown=True, out=state.env.stdout, interrupted=interrupted,
                endpoint=endpoint, context=context, marks=marks, submitted=submitted, resources=resources,
                awaiting=awaiting)
        return
    assert proc.stdin is not None
    console = state.env.console(file=proc.stdin, terminal=True)
    try:
        _render(console, session, records, full, markdown=True, out=proc.stdin, interrupted=interrupted,
                endpoint=endpoint, context=context, marks=marks, submitted=submitted, resources=resources,
                awaiting=awaiting)
    except (BrokenPipeError, OSError):
        pass  # the user quit the pager early
    finally:
        try:
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        proc.wait()


def _session_head(session: SessionSummary, endpoint: Endpoint, context: dict[str, Any] | None = None,
                  resources: list[dict[str, str]] | None = None) -> dict[str, Any]:
    head = {
        "session_id": session.session_id,
        "agent": session.active_agent_name,
        "status": status_name(session.status),
        "turns": session.turn_count,
        "max_turns": session.max_turns,
        "metadata": session.metadata,
        "model": endpoint[0],
        "base_url": endpoint[1],
    }
    head.update(title=session.title, forked_from=session.forked_from, archived_at=session.archived_at,
                agent_version=session.agent_version, agent_versions=session.agent_versions)
    if context is not None:
        head["context"] = context
    if resources is not None:
        head["resources"] = resources  # the mounts in force: [{"kind", "name", "mode"}, ...]
    return head


def _show_jsonl(stream: Any, session: SessionSummary, records: Iterator[TurnRecord], interrupted: Container[int],
                endpoint: Endpoint, context: dict[str, Any] | None = None,
                marks: AgentVersionMarks | None = None, resources: list[dict[str, str]] | None = None) -> None:
    from ..render import turn_dict, turn_interrupted

    stream.write(dumps({"session": _session_head(session, endpoint, context, resources)}) + "\n")
    for record in records:
        if record.number == 0 and not record.messages:
            continue
        changed = marks.changes(record) if marks is not None else None
        stream.write(dumps({"turn": turn_dict(record, interrupted=turn_interrupted(record, interrupted),
                                              changed=changed)}) + "\n")


def _show_json(stream: Any, session: SessionSummary, records: Iterator[TurnRecord], interrupted: Container[int],
               endpoint: Endpoint, context: dict[str, Any] | None = None,
               marks: AgentVersionMarks | None = None, resources: list[dict[str, str]] | None = None) -> None:
    from ..render import turn_dict, turn_interrupted

    head = _session_head(session, endpoint, context, resources)
    stream.write('{"session":' + dumps(head) + ',"turns":[')
    first = True
    for record in records:
        if record.number == 0 and not record.messages:
            continue
        changed = marks.changes(record) if marks is not None else None
        stream.write(("" if first else ",") + "\n" + dumps(turn_dict(record, interrupted=turn_interrupted(record, interrupted),
                                                                      changed=changed)))
        first = False
    stream.write("\n]}\n")
