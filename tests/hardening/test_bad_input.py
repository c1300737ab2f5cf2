"""Hostile input and hostile servers (issue 7, "Bad input").

Each case runs the real ``chatflow`` process and expects: one ``chatflow: error:`` line on
stderr, the exit code :class:`~chatflow_cli.core.errors.ExitStatus` documents for it, no
traceback, and nothing already stored lost or changed — a logical dump of the database
(or the bytes of a file that is not one) before and after are compared. Failed turns
against a bad server may *add* to the event log (a ``turn.failed`` event, by design), so
there the check is: the old events are a prefix of the new, and the context window is
exactly what it was.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest

from chatflow_cli.core.errors import ExitStatus
from chatflow_cli.core.messages import Message
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from tests.helpers.fakeserver import FakeServer
from tests.hardening import harness as h


@pytest.fixture
def fake_server(shared_fake_server: FakeServer) -> FakeServer:
    """The module's server, as fresh as a new one: ``stored``'s session keeps its endpoint."""
    return shared_fake_server


@pytest.fixture
def env(fake_server: FakeServer) -> dict[str, str]:
    return h.provider_env(fake_server)


@pytest.fixture
def stored(env: dict[str, str], fake_server: FakeServer, home_snapshot: Any) -> Path:
    """A database holding two finished turns of session ``s1`` (written by chatflow itself,
    once per module's server; each test gets its own copy)."""

    def build() -> None:
        for text in ("hello", "and again"):
            r = h.run("chat", "-s", "s1", text, env=env)
            assert r.returncode == 0, r

    home_snapshot.restore(f"bad-input-s1-{fake_server.port}", build)
    fake_server.reset()
    return h.default_db()


def _window(db: Path, session_id: str = "s1") -> list[dict[str, Any]]:
    store = SQLiteSessionStore(str(db))
    try:
        ctx = store.get(session_id)
        assert ctx is not None
        return [m.to_dict() for m in ctx.history]
    finally:
        store.close()


def _checkpoint(db: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------
# database files
# ---------------------------------------------------------------------------------------
COMMANDS = [
    ("chat", "-s", "s1", "hi"),
    ("sessions", "ls"),
    ("sessions", "show", "s1"),
    ("sessions", "rollback", "s1", "--to", "1", "--yes"),
    ("replay", "s1"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_a_file_that_is_not_sqlite(command: tuple[str, ...], env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "notes.db"
    bad.write_bytes(b"These are my private notes, not a database.\n" * 200)
    before = h.file_digest(bad)
    r = h.run("--db", str(bad), *command, env=env)
    h.assert_one_error_line(r, ExitStatus.STORE, mentions="not a SQLite database")
    assert h.file_digest(bad) == before
    made = sorted(p.name for p in tmp_path.iterdir() if p.name != "config")  # config: the tests' config.toml
    assert made == ["notes.db"], "chatflow created files next to it"


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_a_truncated_database(command: tuple[str, ...], stored: Path, env: dict[str, str], tmp_path: Path) -> None:
    _checkpoint(stored)
    data = stored.read_bytes()
    assert len(data) > 4 * 4096
    cut = tmp_path / "cut.db"
    cut.write_bytes(data[: len(data) // 2])
    before = h.file_digest(cut)
    r = h.run("--db", str(cut), *command, env=env)
    line = h.assert_one_error_line(r, ExitStatus.STORE)
    assert line == f"chatflow: error: {cut} is corrupt or truncated (database disk image is malformed)", r
    assert h.file_digest(cut) == before


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_a_newer_schema_is_refused_never_migrated_down(command: tuple[str, ...], stored: Path,
                                                       env: dict[str, str]) -> None:
    conn = sqlite3.connect(stored)
    with conn:
        conn.execute("INSERT INTO chatflow_schema_migrations (version, name, applied_at_utc) VALUES (99, 'future', 0)")
        conn.execute("CREATE TABLE chatflow_future_feature (x INTEGER)")
    conn.close()
    before = h.dump_db(stored)
    r = h.run(*command, env=env)
    h.assert_one_error_line(r, ExitStatus.STORE, mentions="newer")
    assert h.dump_db(stored) == before


def _drop_dac_override() -> None:  # pragma: no cover - runs in the child before exec
    """Make root obey file modes: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the
    bounding set, so the exec'd chatflow never has them (prctl PR_CAPBSET_DROP)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


@pytest.fixture
def unprivileged_base(tmp_path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A base directory, and ``subprocess`` arguments under which file modes bind.

    As root, file modes do not stop writes, so there chatflow runs without the
    capabilities that bypass them (the files stay root's; root is then just their owner).
    """
    base = tmp_path / "ro"
    base.mkdir()
    popen: dict[str, Any] = {"preexec_fn": _drop_dac_override} if os.geteuid() == 0 else {}
    try:
        yield base, popen
    finally:
        for path in [base, *base.rglob("*")]:
            try:
                path.chmod(0o700 if path.is_dir() else 0o600)
            except OSError:
                pass


@pytest.mark.parametrize("existing", [True, False], ids=["existing-db", "no-db-yet"])
def test_a_read_only_data_directory(existing: bool, unprivileged_base: tuple[Path, dict[str, Any]],
                                    fake_server: FakeServer) -> None:
    base, popen = unprivileged_base
    home = base / "home"
    (base / "config.toml").write_text("", encoding="utf-8")  # a named config file must exist
    (base / "config.toml").chmod(0o644)
    env = h.provider_env(fake_server, CHATFLOW_HOME=str(home), CHATFLOW_CONFIG=str(base / "config.toml"),
                         HOME=str(base))
    db = home / "chatflow.db"
    if existing:
        r = h.run("chat", "-s", "s1", "hello", env=env, **popen)
        assert r.returncode == 0, r
        assert db.exists()
    else:
        home.mkdir(mode=0o700)
    home.chmod(0o500)
    if existing:
        db.chmod(0o400)
    before = h.dump_db(db) if existing else None
    r = h.run("chat", "-s", "s1", "more", env=env, **popen)
    line = h.assert_one_error_line(r, ExitStatus.STORE)
    reason = "attempt to write a readonly database" if existing else f"[Errno 13] Permission denied: {str(db)!r}"
    assert line == f"chatflow: error: {db} cannot be written: read-only file or directory ({reason})", r
    ls = h.run("sessions", "ls", env=env, **popen)
    if ls.returncode != 0:  # reading may be impossible too (WAL needs its -shm file): then cleanly
        h.assert_one_error_line(ls, ExitStatus.STORE)
    assert len(fake_server.requests) == (1 if existing else 0), "a model call was made for a turn that cannot be stored"
    home.chmod(0o700)
    if existing:
        db.chmod(0o600)
        assert h.dump_db(db) == before
    else:
        assert list(home.iterdir()) == []


def test_a_full_disk_refuses_a_turn_and_corrupts_nothing(stored: Path, env: dict[str, str]) -> None:
    before = h.dump_db(stored)
    big = "word " * 60_000  # 300 kB: needs pages the "disk" does not have
    r = h.run("chat", "-s", "s1", "-", input=big, env={**env, "CHATFLOW_HARDEN_MAX_PAGES": "1"},
              pythonpath=[h.FAULTS_DIR])
    h.assert_one_error_line(r, ExitStatus.STORE, mentions="full")
    assert h.dump_db(stored) == before
    with sqlite3.connect(stored) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_disk_that_fills_up_mid_turn(stored: Path, env: dict[str, str], fake_server: FakeServer) -> None:
    """The user message fits, the model's 300 kB answer does not: the turn fails cleanly."""
    old_events = h.read_events(stored, "s1")
    old_window = _window(stored)
    conn = sqlite3.connect(stored)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    fake_server.add_text("x" * 300_000, chunks=["x" * 30_000] * 10)
    r = h.run("chat", "-s", "s1", "tell me everything", env={**env, "CHATFLOW_HARDEN_MAX_PAGES": str(pages + 4)},
              pythonpath=[h.FAULTS_DIR])
    h.assert_one_error_line(r, ExitStatus.STORE, mentions="full")
    with sqlite3.connect(stored) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    new_events = h.read_events(stored, "s1")
    assert new_events[: len(old_events)] == old_events
    h.assert_seq_gap_free(new_events)
    assert h.window_problems(stored, "s1", pending_ok=True) == []
    # with room again, the session goes on and the failed turn is not in the window
    again = h.run("chat", "-s", "s1", "short please", env=env)
    assert again.returncode == 0, again
    window = _window(stored)
    assert window[: len(old_window)] == old_window
    assert [m["content"] for m in window[len(old_window):]] == ["short please", "ok: short please"]
    assert h.window_problems(stored, "s1", pending_ok=False) == []


# ---------------------------------------------------------------------------------------
# stdin, flags, session ids
# ---------------------------------------------------------------------------------------
def test_invalid_utf8_on_stdin(stored: Path, env: dict[str, str], fake_server: FakeServer) -> None:
    before = h.dump_db(stored)
    calls = len(fake_server.requests)
    for args in (("chat", "-s", "s1", "-"), ("chat", "-s", "s1"), ()):
        r = h.run(*args, input=b"caf\xe9 \xff\xfe au lait\n", env=env)
        h.assert_one_error_line(r, ExitStatus.USAGE, mentions="UTF-8")
    assert h.dump_db(stored) == before
    assert len(fake_server.requests) == calls


def test_invalid_utf8_in_arguments_and_escaped_lone_surrogates(stored: Path, env: dict[str, str],
                                                               fake_server: FakeServer) -> None:
    """Bytes that are not UTF-8 in argv arrive as lone surrogates (PEP 383), and JSON can spell
    one (``"\\ud800"``): neither can be stored or sent, so both are bad input (exit 2)."""
    import subprocess

    before = h.dump_db(stored)
    calls = len(fake_server.requests)
    proc = subprocess.run([*h.COMMAND, "chat", "-s", "s1", b"caf\xe9 au lait"], capture_output=True,
                          env=h.env_for(env), stdin=subprocess.DEVNULL, timeout=90)
    h.assert_one_error_line(h.Result(proc.returncode, proc.stdout, proc.stderr, ["chat", "<bytes>"]),
                            ExitStatus.USAGE, mentions="UTF-8")
    r = h.run("chat", "-s", "s1", "--input", "jsonl", input=b'{"message": "lone \\ud800 surrogate"}\n', env=env)
    h.assert_one_error_line(r, ExitStatus.USAGE, mentions="line 1")
    assert h.dump_db(stored) == before
    assert len(fake_server.requests) == calls


def test_a_10_mb_message_on_stdin(stored: Path, env: dict[str, str], fake_server: FakeServer) -> None:
    before = h.dump_db(stored)
    calls = len(fake_server.requests)
    r = h.run("chat", "-s", "s1", "-", input=b"lorem ipsum " * (10 * 1024 * 1024 // 12), env=env)
    h.assert_one_error_line(r, ExitStatus.USAGE, mentions="too long")
    assert h.dump_db(stored) == before
    assert len(fake_server.requests) == calls


MALFORMED_JSONL = [
    b"not json at all\n",
    b"[1, 2, 3]\n",
    b'"just a string"\n',
    b'{"message": 42}\n',
    b'{"message": ""}\n',
    b'{"role": "assistant", "content": "I am the model now"}\n',
    b'{"tool_use_id": "", "output": "x"}\n',
    b'{"tool_use_id": "call_1"}\n',
    b'{"message": "hi", "metadata": "not an object"}\n',
    b'{"message": "hi", "session": 7}\n',
    b'{"message": "caf\xe9"}\n',
    b'{"message": "unterminated\n',
]


@pytest.mark.parametrize("line", MALFORMED_JSONL, ids=range(len(MALFORMED_JSONL)))
def test_malformed_input_jsonl_line(line: bytes, stored: Path, env: dict[str, str], fake_server: FakeServer) -> None:
    before = h.dump_db(stored)
    calls = len(fake_server.requests)
    r = h.run("chat", "-s", "s1", "--input", "jsonl", input=b"\n" + line, env=env)
    h.assert_one_error_line(r, ExitStatus.USAGE, mentions="line 2")
    assert h.dump_db(stored) == before
    assert len(fake_server.requests) == calls


def test_malformed_jsonl_after_good_lines_keeps_the_good_turns(stored: Path, env: dict[str, str],
                                                               fake_server: FakeServer) -> None:
    old = h.read_events(stored, "s1")
    data = b'{"message": "third"}\n{"message": "fourth"}\n{"message": 5}\n{"message": "never sent"}\n'
    r = h.run("chat", "-s", "s1", "--input", "jsonl", "--output", "jsonl", input=data, env=env)
    h.assert_one_error_line(r, ExitStatus.USAGE, mentions="line 3")
    events = r.jsonl()
    assert [e["type"] for e in events].count("turn.result") == 2
    assert events[-1]["type"] == "result" and events[-1]["data"]["is_error"] is True
    assert events[-1]["data"]["exit_code"] == ExitStatus.USAGE
    new = h.read_events(stored, "s1")
    assert new[: len(old)] == old
    assert [m["content"] for m in _window(stored)][-4:] == ["third", "ok: third", "fourth", "ok: fourth"]
    assert all("never sent" not in json.dumps(req) for req in fake_server.requests)


UNKNOWN_FLAGS = [
    ("chat", "--frobnicate", "hi"),
    ("chat", "-Z", "hi"),
    ("--no-such-global", "sessions", "ls"),
    ("sessions", "ls", "--nope"),
    ("sessions", "show", "s1", "--colour"),
    ("sessions", "rollback", "s1", "--to", "1", "--force"),
    ("replay", "s1", "--since", "x"),
    ("chat", "--output", "yaml", "hi"),
    ("frobnicate",),
]


@pytest.mark.parametrize("args", UNKNOWN_FLAGS, ids=[" ".join(a) for a in UNKNOWN_FLAGS])
def test_unknown_flags(args: tuple[str, ...], stored: Path, env: dict[str, str], fake_server: FakeServer) -> None:
    before = h.dump_db(stored)
    calls = len(fake_server.requests)
    r = h.run(*args, env=env)
    h.assert_one_error_line(r, ExitStatus.USAGE)
    assert r.stdout == ""
    assert h.dump_db(stored) == before
    assert len(fake_server.requests) == calls


BAD_IDS = ["two words", "it's", '"quoted"', "../../etc/passwd", "a/b", "x" * 10_000, "tab\there", "nul?\x7f",
           "\x1b[2Jclear", "", "ünïcödé"]


@pytest.mark.parametrize("session_id", BAD_IDS, ids=range(len(BAD_IDS)))
def test_hostile_session_ids(session_id: str, stored: Path, env: dict[str, str], fake_server: FakeServer,
                             tmp_path: Path) -> None:
    before = h.dump_db(stored)
    calls = len(fake_server.requests)
    home_files = sorted(p.name for p in stored.parent.iterdir())
    r = h.run("chat", "-s", session_id, "hi", env=env)
    h.assert_one_error_line(r, ExitStatus.USAGE, mentions="session id")
    assert "\x1b" not in r.stderr
    for args, codes in (
        (("sessions", "show", session_id), {ExitStatus.NOT_FOUND, ExitStatus.USAGE}),
        (("sessions", "rollback", session_id, "--to", "0", "--yes"), {ExitStatus.NOT_FOUND, ExitStatus.USAGE}),
        (("sessions", "delete", session_id, "--yes"), {ExitStatus.NOT_FOUND, ExitStatus.USAGE}),
        (("replay", session_id), {ExitStatus.NOT_FOUND, ExitStatus.USAGE}),
    ):
        other = h.run(*args, env=env)
        assert other.returncode in codes, other
        h.assert_one_error_line(other, other.returncode)
        assert "\x1b" not in other.stderr
    assert h.dump_db(stored) == before
    assert len(fake_server.requests) == calls
    assert sorted(p.name for p in stored.parent.iterdir()) == home_files
    assert not (tmp_path / "etc").exists()


# ---------------------------------------------------------------------------------------
# hostile servers
# ---------------------------------------------------------------------------------------
def _hand_to(db: Path, session_id: str, agent: str) -> None:
    """Make ``agent`` the session's active agent, as a handoff does."""
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    store = SQLiteSessionStore(str(db))
    try:
        session = store.get(session_id)
        assert session is not None
        session.set_active_agent(Agent(agent))
        store.save(session)
    finally:
        store.close()


def _failed_turn_left_session_as_before(db: Path, old_events: list[Any], old_window: list[Any], text: str) -> None:
    new_events = h.read_events(db, "s1")
    assert new_events[: len(old_events)] == old_events
    h.assert_seq_gap_free(new_events)
    assert _window(db) == old_window, "a failed turn changed the context window"
    added = [(t, json.loads(p)) for _, t, p in new_events[len(old_events):]]
    types = [t for t, _ in added]
    assert "turn.failed" in types and "turn.completed" not in types, types
    assert any(t == "message.user" and p["message"]["content"] == text for t, p in added), "user message not in the log"
    assert types[-1] == "status" and added[-1][1]["status"] == "idle"
    assert h.window_problems(db, "s1", pending_ok=False) == []


SERVER_FAULTS = [
    ("invalid_json_in_sse", lambda s: s.add_invalid_json(), (ExitStatus.PROVIDER,), "invalid JSON"),
    ("closed_mid_stream", lambda s: s.add_close_midstream(), (ExitStatus.NETWORK,), "did not finish"),
    ("html_with_200", lambda s: s.add_html(), (ExitStatus.PROVIDER,), "HTML"),
    ("never_answers", lambda s: [s.add_hang() for _ in range(5)], (ExitStatus.NETWORK,), "1 s"),
    ("http_500_forever", lambda s: [s.add_error(500) for _ in range(5)], (ExitStatus.RATE_LIMITED,), None),
    ("no_done_no_finish", lambda s: s.add_chunks([{"choices": [{"index": 0, "delta": {"content": "Hel"}}]}],
                                                  done=False), (ExitStatus.NETWORK,), "did not finish"),
]
#: Faults where the reply stopped before a finish reason: what arrived is kept as an interrupted turn.
BROKEN_STREAMS = {"closed_mid_stream", "no_done_no_finish"}


@pytest.mark.parametrize("name,script,codes,mentions", SERVER_FAULTS, ids=[f[0] for f in SERVER_FAULTS])
def test_a_misbehaving_server(name: str, script: Any, codes: tuple[int, ...] | None, mentions: str | None,
                              stored: Path, env: dict[str, str], fake_server: FakeServer) -> None:
    old_events = h.read_events(stored, "s1")
    old_window = _window(stored)
    script(fake_server)
    r = h.run("chat", "-s", "s1", "--timeout", "1", "are you there?", env=env, timeout=120)
    assert r.returncode in codes, r
    h.assert_one_error_line(r, r.returncode, mentions=mentions)
    if name in BROKEN_STREAMS:
        new_window = _window(stored)
        assert new_window[: len(old_window)] == old_window
        assert [(m["role"], m.get("content"), m.get("interrupted", False)) for m in new_window[len(old_window):]] == [
            ("user", "are you there?", False), ("model", "Hel", True)]
        added = [t for _, t, _ in h.read_events(stored, "s1")[len(old_events):]]
        assert "turn.interrupted" in added and "turn.failed" not in added and "turn.completed" not in added
        assert h.window_problems(stored, "s1", pending_ok=False) == []
        fake_server.clear()
        assert h.run("chat", "-s", "s1", "retry", env=env).returncode == 0
        return
    if r.returncode == ExitStatus.RATE_LIMITED:
        status = [json.loads(p) for _, t, p in h.read_events(stored, "s1") if t == "status"][-1]
        assert status["status"] == "rescheduled" and status.get("retry_at"), status
        assert _window(stored) == old_window
        fake_server.clear()
        return
    _failed_turn_left_session_as_before(stored, old_events, old_window, "are you there?")
    fake_server.clear()
    again = h.run("chat", "-s", "s1", "retry", env=env)
    assert again.returncode == 0, again


def test_tool_arguments_that_are_not_json(stored: Path, env: dict[str, str], fake_server: FakeServer,
                                          tmp_path: Path) -> None:
    """Arguments cut mid-JSON (as SmolLM2 does with a small max_tokens) never run; the turn fails with one line."""
    h.write_tools_module(tmp_path / "tools")
    h.write_config(h.WEATHER_AGENT)
    _hand_to(stored, "s1", "Weather")  # s1's agent is configured (else chat switches to it first, and says so)
    old_events = h.read_events(stored, "s1")
    old_window = _window(stored)
    fake_server.add_tool_calls([("call_cut", "get_weather", '{"city": "Par')], split=3, repeat_id_name=True)
    run_env = {**env, "HARDEN_MARK_DIR": str(tmp_path / "marks")}
    r = h.run("chat", "-s", "s1", "weather in Paris?", env=run_env, pythonpath=[tmp_path / "tools"])
    h.assert_one_error_line(r, ExitStatus.PROVIDER, mentions="not a complete JSON object")
    assert not (tmp_path / "marks" / "get_weather.started").exists(), "the tool ran with arguments that are not JSON"
    _failed_turn_left_session_as_before(stored, old_events, old_window, "weather in Paris?")
    fake_server.add_text("Sunny.")
    again = h.run("chat", "-s", "s1", "weather in Paris?", env=run_env, pythonpath=[tmp_path / "tools"])
    assert again.returncode == 0 and again.stdout == "Sunny.\n", again
    assert Message.from_dict(_window(stored)[-1]).content == "Sunny."
