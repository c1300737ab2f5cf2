"""``sessions export`` and ``sessions import``: sessions out of and into the store.

The work is the library's (:mod:`chatflow_cli.core.interop`); these commands pick the
sessions, open the output, and say what happened.

``export`` writes to stdout, or with ``-o FILE`` to a file that appears whole or not at all
(a regular file is written beside it, then renamed over it, keeping its mode; a symlink's
target is the file written; a device or FIFO is written directly): an error, Ctrl-C
(SIGINT), SIGTERM or SIGHUP while it is written removes the file beside it and leaves FILE
as it was; a signal then ends the process as it would have (exit 130 for Ctrl-C, killed by
the signal otherwise). An export that writes no session leaves FILE alone. ``import`` reads a file or
stdin, checks every session whole before writing any of it, and prints what it added.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, Protocol

from ..context import notice, validate_session_id
from ..core.errors import ChatflowError, NonFiniteNumberError, RunInterrupted, UsageError
from ..lookup import find_session, not_found, store_or_missing
from ..render import dumps, plural, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State
    from ..core.memory.protocol import ListingStore

__all__ = ["export_sessions", "import_file"]


class _Sink(Protocol):
    """Where an export goes: stdout or :class:`_Output`."""

    def write(self, text: str, /) -> int: ...


def _pick(state: State, session_ids: list[str], *, all_: bool,
          since: float | None) -> tuple[ListingStore | None, list[str]]:
    """The store and the ids to export, oldest first for ``--all``/``--since``: archived
    sessions too (an export of "all" is a backup; it drops nothing)."""
    if session_ids:
        session_ids = list(dict.fromkeys(session_ids))  # an id given twice is exported once, first place kept
        store = store_or_missing(state, session_ids[0])
        for sid in session_ids:
            if store.active_agent_name(sid) is None:
                raise not_found(sid)
        if since is not None:
            cutoff = time.time() - since
            session_ids = [sid for sid in session_ids if store.session_summary(sid).updated_at >= cutoff]
        return store, session_ids
    maybe = state.store(create=False)
    if maybe is None:
        return None, []
    store = maybe
    after = None if since is None else time.time() - since
    summaries = [*store.list_sessions(since=after), *store.list_sessions(since=after, archived=True)]
    return store, [s.session_id for s in sorted(summaries, key=lambda s: (s.created_at, s.session_id))]


def _write_json(state: State, store: ListingStore | None, session_ids: list[str], out: _Sink) -> None:
    from .sessions import show_session

    out.write("[" if len(session_ids) != 1 else "")
    for k, sid in enumerate(session_ids):
        if len(session_ids) != 1:
            out.write(",\n" if k else "\n")
        buffer = io.StringIO()
        try:
            show_session(state, sid, include_rolled_back=False, full=False, output="json", pager=False, stream=buffer)
        except NonFiniteNumberError as exc:
            raise NonFiniteNumberError(f"session {sid} cannot be exported: {exc}", session_id=sid) from None
        out.write(buffer.getvalue().rstrip("\n"))
    out.write("\n]\n" if len(session_ids) != 1 else "\n")


def _instructions(state: State) -> dict[str, str]:
    """Agent name -> instructions, as configured (the default agent's when none is)."""
    from ..config import DEFAULT_AGENT_NAME, DEFAULT_INSTRUCTIONS

    agents = state.settings().agents
    if not agents:
        return {DEFAULT_AGENT_NAME: DEFAULT_INSTRUCTIONS}
    return {spec.name: spec.instructions for spec in agents}


def _write(state: State, store: ListingStore | None, session_ids: list[str], fmt: str, per_turn: bool,
           out: _Sink) -> int:
    """Write the sessions; return how many were written (``openai`` leaves out, with a
    warning, a session with no live turn)."""
    from ..core.interop import export_lines

    if fmt == "json":
        _write_json(state, store, session_ids, out)
        return len(session_ids)
    instructions = _instructions(state) if fmt == "openai" else None
    left_out: list[str] = []

    def warn(text: str) -> None:
        left_out.append(text)
        notice(state, f"warning: {safe_text(text)}")

    if store is None:  # no store yet: nothing to export (_pick gave no ids)
        return 0
    for sid in session_ids:
        for piece in export_lines(store, sid, fmt, per_turn=per_turn, instructions=instructions, warn=warn):
            out.write(piece)
    return len(session_ids) - len(left_out)


def export_sessions(state: State, session_ids: list[str], *, all_: bool, since: float | None, fmt: str,
                    output: str | None, per_turn: bool) -> None:
    """Write sessions in ``fmt`` to stdout or ``output``.

    Args:
        state: The run.
        session_ids: The sessions (or none with ``all_``/``since``).
        all_: Every session, archived ones too.
        since: Only sessions updated in the last ``since`` seconds.
        fmt: ``chatflow``, ``md``, ``openai`` or ``json``.
        output: A file to write (``-``: stdout), or None for stdout.
        per_turn: ``openai`` only: one line per turn window.

    Raises:
        SessionNotFoundError: An id with no session (nothing is written).
        UsageError: ``per_turn`` with another format than ``openai``; ``output`` is a directory.
        ChatflowError: ``output`` cannot be written (``cannot write FILE: ...``, exit 1): no
            such directory, no permission, a symlink loop, a full disk.
    """
    if per_turn and fmt != "openai":
        raise UsageError("--per-turn goes with --format openai")
    store, ids = _pick(state, session_ids, all_=all_, since=since)
    to_stdout = output is None or output == "-"
    target = None if output is None or to_stdout else _output_path(output)
    if not ids:
        notice(state, "no sessions to export" + ("" if to_stdout else f": {output} is not written"))
    if output is None or target is None:
        _write(state, store, ids, fmt, per_turn, state.env.stdout)
        state.env.stdout.flush()
        if fmt == "md" and store is not None and any(_files_of(store, sid) for sid in ids):
            notice(state, "the attached files are not written with the Markdown on stdout: export with -o FILE "
                          "to write them beside it (attachments/)")
        return
    if not ids:
        return
    sink = _Output(target, output)
    with _signals_unwind() as stopped:
        try:
            written = _write(state, store, ids, fmt, per_turn, sink)
            if written:
                sink.commit()
            else:
                sink.discard()
        except BaseException:
            sink.discard()
            raise
    if stopped:  # pragma: no cover - the process ends by the signal it got, as it would have
        _die_by(stopped[0])
    if not written:
        notice(state, f"no session was written: {output} is not written")
        return
    if fmt == "md" and store is not None:
        _write_files(store, ids, target.parent)
    notice(state, f"exported {plural(written, 'session')} to {output}")


def _files_of(store: ListingStore, session_id: str) -> dict[str, Any]:
    """The attachments of a session's messages, by the file name the Markdown links to."""
    from ..core.attachments import file_name

    found: dict[str, Any] = {}
    if not getattr(store, "attachment_hashes", None) or not store.attachment_hashes(session_id):  # type: ignore[attr-defined]
        return found
    for record in store.load_turns(session_id, first=0):
        for message in record.messages:
            for attachment in message.attachments:
                found[file_name(attachment)] = attachment
    return found


def _write_files(store: ListingStore, session_ids: list[str], where: Path) -> None:
    """The files the Markdown transcripts link to, into ``attachments/`` beside them: a file
    already there with the same bytes is left as it is, one with other bytes (changed since an
    earlier export) is written again -- a name that is a hash is not trusted to be one."""
    from ..core.attachments import FILES_FOLDER

    for sid in session_ids:
        files = _files_of(store, sid)
        if not files:
            continue
        folder = where / FILES_FOLDER
        try:
            folder.mkdir(exist_ok=True)
            blobs = store.attachment_data({a.sha256 for a in files.values()})  # type: ignore[attr-defined]
            for name, attachment in files.items():
                path = folder / name
                data = blobs.get(attachment.sha256)
                if data is None or _holds(path, data):
                    continue
                partial = folder / f".{name}.partial"
                partial.write_bytes(data)
                os.replace(partial, path)
        except OSError as exc:
            raise ChatflowError(f"cannot write {folder}: {exc.strerror or exc}") from None


def _holds(path: Path, data: bytes) -> bool:
    """Whether the regular file at ``path`` holds exactly ``data``."""
    try:
        return path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def _output_path(output: str) -> Path:
    """The file ``-o`` names, symlinks followed (the link stays; its target is written).

    Raises:
        UsageError: it is a directory.
    """
    path = Path(os.path.realpath(Path(output).expanduser()))
    if path.is_dir():
        raise UsageError(f"cannot write {output}: it is a directory (give a file name for the export)")
    return path


class _Output:
    """The file an export writes, opened at the first write (an export that writes nothing
    creates or replaces nothing).

    ``path`` is a regular file or none yet: the text goes to a temporary file beside it,
    renamed over it by :meth:`commit` (so it appears whole or not at all), with the mode
    (and owner, where allowed) of the file it replaces, or for a new file the mode
    ``open(path, "w")`` would give (0666 less the umask). Anything else (a character
    device, a FIFO, ``/dev/stdout``) is opened and written directly: it cannot be replaced.

    Every failure to write it -- a full disk (``/dev/full``), an ``open`` or ``stat``
    refused (no such directory, no permission, a symlink loop) -- raises
    :class:`ChatflowError` ``cannot write FILE: ...`` (exit 1, as for stdout). Only a FILE
    that is a directory is a :class:`UsageError` (:func:`_output_path`).
    """

    def __init__(self, path: Path, shown: str) -> None:
        self.path = path
        self.shown = shown
        self.file: IO[str] | None = None
        self.tmp = ""
        try:
            self.existing: os.stat_result | None = path.stat()
        except FileNotFoundError:
            self.existing = None
        except OSError as exc:  # ELOOP (a symlink loop), EACCES on a folder on the way...
            raise ChatflowError(f"cannot write {shown}: {exc.strerror or exc}") from None
        self.direct = self.existing is not None and not stat.S_ISREG(self.existing.st_mode)

    def write(self, text: str) -> int:
        if self.file is None:
            self._open()
        assert self.file is not None
        try:
            return self.file.write(text)
        except OSError as exc:
            raise ChatflowError(f"cannot write {self.shown}: {exc.strerror or exc}") from None

    def _open(self) -> None:
        try:
            if self.direct:
                self.file = open(self.path, "w", encoding="utf-8", newline="\n")  # noqa: SIM115 - closed in commit/discard
                return
            with _signals_blocked():  # the temp file is made and known to discard() at once
                fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=str(self.path.parent))
        except OSError as exc:
            raise ChatflowError(f"cannot write {self.shown}: {exc.strerror or exc}") from None
        self.file = os.fdopen(fd, "w", encoding="utf-8", newline="\n")

    def commit(self) -> None:
        """Close the file; a temporary file takes the mode (and owner) due and is renamed
        over the target."""
        if self.file is None:
            return
        try:
            if self.tmp:
                self.file.flush()
                fd = self.file.fileno()
                if self.existing is not None:
                    os.fchmod(fd, stat.S_IMODE(self.existing.st_mode))
                    if (self.existing.st_uid, self.existing.st_gid) != (os.getuid(), os.getgid()):
                        with contextlib.suppress(OSError):  # only root may give a file away
                            os.fchown(fd, self.existing.st_uid, self.existing.st_gid)
                else:
                    os.fchmod(fd, 0o666 & ~_umask())
            self.file.close()
        except OSError as exc:
            raise ChatflowError(f"cannot write {self.shown}: {exc.strerror or exc}") from None
        if self.tmp:
            with _signals_blocked():  # renamed, or not: never a signal between the two
                os.replace(self.tmp, self.path)
                self.tmp = ""

    def discard(self) -> None:
        """Close the file and remove the temporary one (the target is left as it was)."""
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None
        if self.tmp:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            self.tmp = ""


def _umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Signals that end an export to a file; the file is then neither written nor left half.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class _Stopped(BaseException):
    """Raised in the main thread by a stop signal, to unwind an export to a file."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_unwind() -> Iterator[list[int]]:
    """While the block runs, SIGTERM and SIGHUP raise :class:`_Stopped` (SIGINT raises
    KeyboardInterrupt as always), so its cleanup runs; the signal is then put in the list
    the block receives, for the caller to end the process by it (:func:`_die_by`). Outside
    the main thread, nothing changes."""
    stopped: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield stopped
        return

    def stop(signum: int, _frame: Any) -> None:
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS}
    try:
        yield stopped
    except _Stopped as exc:
        stopped.append(exc.signum)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """SIGINT and the stop signals wait (delivered when the block ends), where available."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = {signal.SIGINT, *_STOP_SIGNALS}
    old = mask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)


def _die_by(signum: int) -> NoReturn:  # pragma: no cover - ends the process
    """End the process by ``signum`` with its default action (the exit status a parent
    expects, 128 + the signal's number in a shell)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    raise SystemExit(128 + signum)


def import_file(state: State, path: str, *, fmt: str | None, into: str | None, dry_run: bool, json_: bool) -> None:
    """Import the sessions of ``path`` (``-``: stdin) and say what was added.

    Args:
        state: The run.
        path: The file, or ``-`` for stdin.
        fmt: The format (None: detect it).
        into: Import into this session id instead of the ids the source gives: an existing
            session's id, whatever it is, or for a new session an id chatflow would make
            (:func:`~chatflow_cli.context.validate_session_id`). Without it, each session
            keeps its source's id, any id the store accepts (what the store holds, it restores).
        dry_run: Check and count, write nothing.
        json_: Print ``{"dry_run": bool, "sessions": [...]}`` instead of text (each session's
            ``skipped``: what the reader left out of the source, reason -> count; in text, a
            line on stderr says the same).

    Raises:
        UsageError: An unreadable file, an undetectable format, an ``into`` that names no
            session and is an id chatflow would not make, an empty source session id, a session that exists and did not come from this source (without ``into``).
        ImportFormatError: The file is malformed (the message names the line or row).
        RunInterrupted: Ctrl-C; the message says which sessions were stored (each one
            whole) and that nothing of the one being written was.
    """
    from ..core.interop import read_source
    from ..core.interop.importer import import_sessions

    if into is not None:
        # an existing session is named by any id the store holds; a new one gets an id chatflow makes
        existing = state.store(create=False)
        if existing is None or find_session(existing, into) is None:
            validate_session_id(into)
    found, sessions = read_source(path, fmt, stdin=getattr(state.env.stdin, "buffer", None) if path == "-" else None)
    if not sessions:
        raise UsageError(f"{path}: no session to import")
    # Without --into, each session keeps its source's id, whatever the store accepts (a session a
    # library user stored under "../x" or "a b" exports, so it imports back): only the id
    # the store refuses, an empty one, is an error here.
    if into is None and any(not session.session_id for session in sessions):
        raise UsageError(f"{path}: a session with an empty id cannot be imported (give one with --into ID)")
    store = state.open_store()
    stored: list[str] = []
    writing: list[str] = []

    def progress(target: str, done: bool) -> None:
        if done:
            stored.append(target)
            writing.clear()
        else:
            writing[:] = [target]

    try:
        results = import_sessions(store, sessions, fmt=found, source=path, into=into, dry_run=dry_run,
                                  progress=progress)
    except KeyboardInterrupt:
        raise RunInterrupted(_interrupted_line(path, stored, writing, dry_run)) from None
    if json_:
        state.env.stdout.write(dumps({"dry_run": dry_run, "format": found,
                                      "sessions": [r.to_dict() for r in results]}) + "\n")
        state.env.stdout.flush()
        return
    for result in results:
        for warning in result.warnings:
            notice(state, f"warning: {result.session_id}: {warning}")
        if result.skipped:  # what the reader left out of the source, by reason
            reasons = ", ".join(f"{n} {reason}" for reason, n in result.skipped.items())
            notice(state, f"{result.session_id}: left out {plural(sum(result.skipped.values()), 'entry', 'entries')} "
                          f"of the source: {reasons}")
        counts = result.counts
        verb = "would add" if dry_run else "added"
        what = f"{plural(counts['turns'], 'turn')}, {plural(counts['messages'], 'message')}"
        if counts.get("rolled_back"):  # turns the source rolled back since it was imported
            what += f", {'would roll back' if dry_run else 'rolled back'} {plural(counts['rolled_back'], 'turn')}"
        if counts.get("rolled_back_in_source"):  # a log's turns its source had rolled back: not live here
            what += (f", of which {plural(counts['rolled_back_in_source'], 'turn')} the source had rolled back "
                     f"(kept in its history): the session {'would hold' if dry_run else 'holds'} "
                     f"{plural(counts['live_turns'], 'turn')}")
        tail = f" ({plural(result.skipped_turns, 'turn')} already there)" if result.skipped_turns else ""
        made = " (new session)" if result.created else ""
        state.env.stdout.write(f"{safe_text(result.session_id)}{made}: {verb} {what}{tail}\n")
    state.env.stdout.flush()


def _interrupted_line(path: str, stored: list[str], writing: list[str], dry_run: bool) -> str:
    """What an import stopped by Ctrl-C leaves: the sessions stored, and none of the one it was writing."""
    if dry_run:
        return f"import of {path} interrupted (dry run): nothing was stored"
    done = f"{plural(len(stored), 'session')} stored" + (f" ({', '.join(safe_text(s) for s in stored[:3])}"
                                                        f"{', ...' if len(stored) > 3 else ''})" if stored else "")
    if writing:
        done += f", nothing of session {safe_text(writing[0])}"
    return f"import of {path} interrupted: {done}; run it again to import the rest"
