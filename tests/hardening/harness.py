"""Helpers shared by the hardening tests (issue 7): real processes, real SQLite files.

Everything here drives chatflow from the outside, the way a user or a script does:

* :func:`run` / :func:`spawn` start the real ``chatflow`` console script (the environment
  of the test, which ``tests/conftest.py`` already isolated, plus what the test adds);
* :func:`read_events` / :func:`event_types` read the event log with plain ``sqlite3`` (a
  separate connection: only committed rows are seen, exactly what survives a crash);
* :func:`dump_db` gives a logical dump of a database, to prove a failed command changed
  nothing (file bytes may differ after a WAL checkpoint; the content may not);
* :func:`window_problems` runs the validity checks of the session-core issue over the
  stored context window;
* :func:`write_tools_module` / :func:`write_config` set up a ``config.toml`` agent whose
  tools are real ``module:function`` references.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).with_name("chatflow")
#: How to start chatflow: the installed console script, else ``python -m chatflow_cli``.
COMMAND = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "chatflow_cli"]
#: Directory holding the ``sitecustomize`` that injects faults (kill at a COMMIT, full disk).
FAULTS_DIR = Path(__file__).resolve().parent / "faults"


from tests.conftest import Result  # noqa: E402  (one Result for every folder's process runs)
from tests.helpers.wait import wait_until  # noqa: E402


def env_for(extra: Mapping[str, str] | None = None, *, pythonpath: Iterable[str | os.PathLike[str]] = ()) -> dict[str, str]:
    """The environment of a chatflow child: this process's (already isolated) plus ``extra``."""
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    paths = [*(os.fspath(p) for p in pythonpath), str(REPO), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if extra:
        env.update(extra)
    return env


def run(*args: str, input: bytes | str | None = None, env: Mapping[str, str] | None = None,
        pythonpath: Iterable[str | os.PathLike[str]] = (), timeout: float = 90,
        cwd: str | os.PathLike[str] | None = None, **popen: Any) -> Result:
    """Run ``chatflow ARGS`` to the end; stdin is ``/dev/null`` unless ``input`` is given.

    ``popen`` goes to :func:`subprocess.run` (e.g. ``user=``/``group=`` to drop root).
    """
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run(
        [*COMMAND, *args], input=data, stdin=subprocess.DEVNULL if data is None else None,
        capture_output=True, env=env_for(env, pythonpath=pythonpath), timeout=timeout, cwd=cwd, **popen,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr, list(args))


def spawn(*args: str, env: Mapping[str, str] | None = None, pythonpath: Iterable[str | os.PathLike[str]] = (),
          cwd: str | os.PathLike[str] | None = None, stdin: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """Start ``chatflow ARGS`` in the background (stdout/stderr piped)."""
    return subprocess.Popen(
        [*COMMAND, *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env_for(env, pythonpath=pythonpath), cwd=cwd,
    )


def communicate_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[tuple[bytes, bytes]]:
    """Wait for every process, reading all their pipes at once: reading them one after another
    would leave a later process blocked on a full stdout pipe while it holds a session that
    the earlier ones wait for."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(procs))) as pool:
        return list(pool.map(lambda proc: proc.communicate(timeout=timeout), procs))


def kill9(proc: subprocess.Popen[Any]) -> tuple[bytes, bytes]:
    """SIGKILL ``proc`` (no clean-up of any kind runs in it) and reap it."""
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out, err = proc.communicate(timeout=30)
    return out, err


def wait_for(predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.02,
             proc: subprocess.Popen[Any] | None = None, what: str = "condition") -> Any:
    """Poll ``predicate`` (sleeping ``interval`` between tries) until it returns a truthy value
    (:func:`tests.helpers.wait.wait_until` with this suite's 30 s default)."""
    return wait_until(predicate, timeout, what, interval=interval, proc=proc)


# ---------------------------------------------------------------------------------------
# the database, read from outside
# ---------------------------------------------------------------------------------------
def default_db() -> Path:
    return Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db"


def _connect(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(db), timeout=30)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def read_events(db: Path, session_id: str) -> list[tuple[int, str, str]]:
    """``[(seq, type, payload_json), ...]`` of one session, in seq order ([] when none)."""
    if not db.exists():
        return []
    conn = _connect(db)
    try:
        try:
            rows = conn.execute(
                "SELECT seq, event_type, payload_json FROM chatflow_events WHERE session_id = ? ORDER BY seq",
                (session_id,),
            ).fetchall()
        except sqlite3.OperationalError as exc:  # the schema is not there yet
            if "no such table" in str(exc):
                return []
            raise
        return [(int(a), str(b), str(c)) for a, b, c in rows]
    finally:
        conn.close()


def event_types(db: Path, session_id: str) -> list[str]:
    return [t for _, t, _ in read_events(db, session_id)]


def assert_seq_gap_free(events: list[tuple[int, str, str]]) -> None:
    seqs = [e[0] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), f"seq not 1..n without gaps: {seqs}"


def search_index_problems(db: Path) -> list[str]:
    """How the full-text index disagrees with the stored messages ([] when in step): every
    message has exactly its index row with the text the store indexes, and FTS5's own
    integrity check passes."""
    from chatflow_cli.core.memory.sqlite.search import _fts_columns

    conn = _connect(db)
    try:
        problems = []
        # every message up to the index's highest rowid is indexed; those above it are
        # indexed by the next search (SQLiteSessionStore.index_pending)
        missing = conn.execute(
            "SELECT m.message_id FROM chatflow_messages AS m LEFT JOIN chatflow_messages_fts AS f "
            "ON f.rowid = m.message_id WHERE f.rowid IS NULL AND m.message_id <= "
            "(SELECT COALESCE(MAX(rowid), 0) FROM chatflow_messages_fts)"
        ).fetchall()
        if missing:
            problems.append(f"messages below the index's high-water mark missing from it: {[r[0] for r in missing]}")
        extra = conn.execute(
            "SELECT f.rowid FROM chatflow_messages_fts AS f LEFT JOIN chatflow_messages AS m "
            "ON m.message_id = f.rowid WHERE m.message_id IS NULL"
        ).fetchall()
        if extra:
            problems.append(f"index rows of no message: {[r[0] for r in extra]}")
        # the index holds the words of each message as the store computes them (search.words_of)
        wrong = [
            (mid,) for mid, text, body, tools in conn.execute(
                "SELECT m.message_id, m.message_json, f.body, f.tools FROM chatflow_messages AS m "
                "JOIN chatflow_messages_fts AS f ON f.rowid = m.message_id"
            )
            if (body, tools) != _fts_columns(text)
        ]
        if wrong:
            problems.append(f"index rows whose text differs from their message: {[r[0] for r in wrong]}")
        try:
            conn.execute("INSERT INTO chatflow_messages_fts (chatflow_messages_fts) VALUES ('integrity-check')")
            conn.commit()
        except sqlite3.DatabaseError as exc:
            problems.append(f"FTS5 integrity-check: {exc}")
        return problems
    finally:
        conn.close()


def dump_db(db: Path) -> str:
    """A logical dump of ``db`` (schema and rows), independent of WAL checkpoints."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return "\n".join(conn.iterdump())
    finally:
        conn.close()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def window_problems(db: Path, session_id: str, *, pending_ok: bool = True) -> list[str]:
    """The validity checks over the stored context window of ``session_id`` (read through the store)."""
    from chatflow_cli.core.messages import history_problems
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    store = SQLiteSessionStore(str(db))
    try:
        ctx = store.get(session_id)
        assert ctx is not None, f"session {session_id} is gone"
        return history_problems(ctx.history, pending_ok=pending_ok)
    finally:
        store.close()


def assert_one_error_line(r: Result, code: int, *, mentions: str | None = None) -> str:
    """``r`` failed with exit ``code``: exactly one ``chatflow: error:`` line on stderr, no traceback."""
    assert r.returncode == code, r
    assert "Traceback" not in r.stderr, r
    lines = r.stderr_lines
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {r!r}"
    line = lines[0]
    assert line.startswith("chatflow: error: "), r
    assert len(line) < 400, f"the error line is {len(line)} characters long"
    assert "\x1b" not in line
    if mentions is not None:
        assert mentions.lower() in line.lower(), r
    return line


def sessions_json(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    r = run("sessions", "ls", "--json", "--limit", "0", env=env)
    assert r.returncode == 0, r
    return r.json()


# ---------------------------------------------------------------------------------------
# config and tools
# ---------------------------------------------------------------------------------------
TOOLS_MODULE = textwrap.dedent(
    '''
    """Tools for the hardening tests: each writes a marker file, then may sleep."""
    import os
    import pathlib
    import time

    from chatflow_cli import tool

    _MARKS = pathlib.Path(os.environ.get("HARDEN_MARK_DIR", "."))


    def _mark(name: str) -> None:
        _MARKS.mkdir(parents=True, exist_ok=True)
        (_MARKS / name).write_text(str(os.getpid()))


    @tool
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: The city.
        """
        _mark("get_weather.started")
        time.sleep(float(os.environ.get("HARDEN_SLEEP_GET_WEATHER", "0")))
        _mark("get_weather.finished")
        return f"12C in {city}"


    @tool
    def get_time(tz: str) -> str:
        """The time in a time zone.

        Args:
            tz: The time zone.
        """
        _mark("get_time.started")
        time.sleep(float(os.environ.get("HARDEN_SLEEP_GET_TIME", "0")))
        _mark("get_time.finished")
        return f"12:00 in {tz}"


    @tool
    def fetch_page(url: str) -> str:
        """Fetch a web page (returns text that holds terminal control sequences).

        Args:
            url: The page.
        """
        _mark("fetch_page.started")
        return "page says \x1b]0;TOOLTITLE\x07 and \x1b]52;c;VE9PTENMSVA=\x07 and \x1b[2J done"
    '''
)


def write_tools_module(directory: Path, name: str = "harden_tools") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(TOOLS_MODULE, encoding="utf-8")
    return path


def write_config(text: str) -> Path:
    """Write ``config.toml`` where ``CHATFLOW_CONFIG`` points; returns its path."""
    path = Path(os.environ["CHATFLOW_CONFIG"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


WEATHER_AGENT = """
[[agents]]
name = "Weather"
instructions = "Answer with the tools."
tools = ["harden_tools:get_weather", "harden_tools:get_time"]
"""


def provider_env(server: Any, **extra: str) -> dict[str, str]:
    """Environment pointing chatflow at the fake server."""
    return {"OPENAI_BASE_URL": server.url, "CHATFLOW_MODEL": "fake-model", **extra}
