"""The command line on a PostgreSQL database: chosen by ``--db URL``, ``$CHATFLOW_DB`` or
config.toml's ``db``; store errors are one line and exit 8; the password never shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from tests.helpers.pgserver import PASSWORD, PgServer, free_port


def _no_password(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text


def test_db_url_flag_env_and_config_select_the_same_postgres_database(
    chatflow: Callable[..., Any], provider: Any, pg_server: PgServer, pg_dsn: str,
    config_file: Callable[[str], Path],
) -> None:
    first = chatflow("--db", pg_dsn, "chat", "-s", "pg-1", "hello there")
    assert first.returncode == 0, first
    assert first.stdout.strip() == "ok: hello there"
    _no_password(first.stdout, first.stderr)

    by_env = chatflow("sessions", "ls", "--json", env={"CHATFLOW_DB": pg_dsn})
    assert by_env.returncode == 0, by_env
    assert [s["session_id"] for s in by_env.json()] == ["pg-1"]

    # config.toml names the database without its password; PGPASSWORD gives it, as libpq does
    name = pg_dsn.rsplit("/", 1)[1]
    config_file(f'db = "{pg_server.dsn(name, password=None)}"\n')
    by_file = chatflow("chat", "-s", "pg-1", "again", env={"PGPASSWORD": PASSWORD})
    assert by_file.returncode == 0, by_file
    shown = chatflow("sessions", "show", "pg-1", "--json", env={"PGPASSWORD": PASSWORD})
    assert [t["number"] for t in shown.json()["turns"]] == [1, 2]
    # the default SQLite file was never made
    assert not (Path(__import__("os").environ["CHATFLOW_HOME"]) / "chatflow.db").exists()


def test_config_show_and_errors_never_show_the_password(
    chatflow: Callable[..., Any], pg_server: PgServer, pg_dsn: str
) -> None:
    shown = chatflow("--db", pg_dsn, "config", "show", "--json")
    assert shown.returncode == 0, shown
    data = shown.json()
    assert data["db_path"] == pg_dsn.replace(PASSWORD, "***") and data["db_source"] == "flag"
    _no_password(shown.stdout, shown.stderr)
    text = chatflow("config", "show", env={"CHATFLOW_DB": pg_dsn})
    assert "chatflow:***@" in text.stdout and text.stderr.count(PASSWORD) == 0
    _no_password(text.stdout)

    wrong = pg_dsn.replace(PASSWORD, "Wrong-Pass-9876")
    for debug in ([], ["--debug"]):
        bad = chatflow(*debug, "--db", wrong, "sessions", "ls")
        assert bad.returncode == 8, bad
        assert "authentication failed" in bad.stderr
        assert "Wrong-Pass-9876" not in bad.stdout + bad.stderr
        if not debug:
            assert len(bad.stderr_lines) == 1 and bad.stderr_lines[0].startswith("chatflow: error: ")


def test_a_refused_connection_is_exit_8(chatflow: Callable[..., Any], pg_server: PgServer) -> None:
    dsn = f"postgresql://chatflow:{PASSWORD}@127.0.0.1:{free_port()}/nothing"
    r = chatflow("--db", dsn, "sessions", "ls")
    assert r.returncode == 8, r
    assert r.stderr_lines[0].startswith("chatflow: error: cannot connect to PostgreSQL database")
    assert "chatflow:***@127.0.0.1" in r.stderr
    _no_password(r.stdout, r.stderr)
    json_mode = chatflow("--db", dsn, "sessions", "ls", "--json")
    assert json_mode.returncode == 8 and json_mode.json()["exit_code"] == 8
    _no_password(json_mode.stdout, json_mode.stderr)


def test_a_database_from_a_newer_chatflow_is_exit_8(chatflow: Callable[..., Any], provider: Any,
                                                    pg_dsn: str) -> None:
    import psycopg

    assert chatflow("--db", pg_dsn, "chat", "hi").returncode == 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO chatflow_schema_migrations VALUES (99, 'from the future', 0)")
    r = chatflow("--db", pg_dsn, "sessions", "ls")
    assert r.returncode == 8, r
    assert "schema version 99" in r.stderr and "upgrade chatflow" in r.stderr
    _no_password(r.stderr)


def test_a_password_in_config_toml_is_refused(chatflow: Callable[..., Any], config_file: Callable[[str], Path],
                                              pg_dsn: str) -> None:
    config_file(f'db = "{pg_dsn}"\n')
    r = chatflow("sessions", "ls")
    assert r.returncode == 9, r
    assert "db must not hold a password" in r.stderr and "PGPASSWORD" in r.stderr
    _no_password(r.stdout, r.stderr)


@pytest.mark.parametrize("where", ["flag", "env"])
def test_a_sqlite_path_still_works_through_every_way(chatflow: Callable[..., Any], provider: Any, tmp_path: Path,
                                                     where: str) -> None:
    db = tmp_path / "other.db"
    args = ["--db", str(db)] if where == "flag" else []
    env = {"CHATFLOW_DB": str(db)} if where == "env" else None
    assert chatflow(*args, "chat", "-s", "x", "hi", env=env).returncode == 0
    assert db.exists()


def test_replay_follow_on_postgres_prints_new_events_as_they_are_committed(
    chatflow: Callable[..., Any], provider: Any, pg_dsn: str
) -> None:
    import json
    import os
    import subprocess

    from chatflow_cli.core.memory.postgres import PostgresSessionStore
    from tests.conftest import COMMAND, REPO

    assert chatflow("--db", pg_dsn, "chat", "-s", "watched", "hello").returncode == 0
    follow = subprocess.Popen([*COMMAND, "--db", pg_dsn, "replay", "watched", "--follow", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    store = PostgresSessionStore(pg_dsn)
    last = store.last_seq("watched")
    try:
        assert follow.stdout is not None
        seen = [json.loads(follow.stdout.readline()) for _ in range(last)]  # the log so far
        assert [e["seq"] for e in seen] == list(range(1, last + 1))
        assert seen[0]["type"] == "session.created" and "turn.completed" in [e["type"] for e in seen]
        store.append_event("watched", "note", {"from": "another process"})
        store.close()
        line = json.loads(follow.stdout.readline())
        assert line["type"] == "note" and line["data"] == {"from": "another process"}
    finally:
        follow.terminate()
        follow.communicate(timeout=30)
    _no_password(follow.stderr.read().decode() if follow.stderr and not follow.stderr.closed else "")


@pytest.mark.parametrize("password", ["p@ss:w/rd%Z9", "a/b@c", "x@y"])
def test_a_url_whose_password_holds_a_raw_at_or_slash_is_a_usage_error_that_shows_none_of_it(
        chatflow: Callable[..., Any], password: str) -> None:
    # No server is needed: the URL is refused before any connection is tried.
    dsn = f"postgresql://bot2:{password}@127.0.0.1:{free_port()}/chatflow2"
    refused = chatflow("--db", dsn, "sessions", "ls")
    assert refused.returncode == 2, refused
    assert refused.stderr_lines == [
        "chatflow: error: the user name or password in the database URL holds a raw '@' or '/': "
        "percent-encode them ('@' as %40, '/' as %2F), or leave the password out of the URL "
        "and use PGPASSWORD or ~/.pgpass"]
    shown = chatflow("--db", dsn, "config", "show")  # shows the setting, masked whole
    assert shown.returncode == 0, shown
    assert "postgresql://bot2:***@127.0.0.1:" in shown.stdout
    for r in (refused, shown):
        for piece in {password, *password.replace("@", "/").split("/")} - {""}:
            if len(piece) >= 3:
                assert piece not in r.stdout + r.stderr, (piece, r)


def test_an_upper_case_scheme_is_read_as_postgresql(chatflow: Callable[..., Any], pg_server: PgServer) -> None:
    dsn = f"POSTGRESQL://chatflow:{PASSWORD}@127.0.0.1:{free_port()}/nothing"
    r = chatflow("--db", dsn, "sessions", "ls")
    assert r.returncode == 8, r
    assert r.stderr_lines[0].startswith("chatflow: error: cannot connect to PostgreSQL database"), r
    assert "missing \"=\"" not in r.stderr
    _no_password(r.stdout, r.stderr)


def test_a_server_restart_mid_turn_prints_no_pool_log_lines(chatflow: Callable[..., Any], provider: Any,
                                                             pg_server: PgServer, pg_dsn: str) -> None:
    """The pool logs each broken connection it drops; without --debug none of that reaches stderr."""
    import threading
    import time

    assert chatflow("--db", pg_dsn, "chat", "-s", "restart", "first").returncode == 0
    provider.add_text("slow answer", delay=1.5)
    before = len(provider.requests)

    def restart() -> None:
        deadline = time.monotonic() + 30
        while len(provider.requests) <= before and time.monotonic() < deadline:
            time.sleep(0.02)
        pg_server.restart()

    restarter = threading.Thread(target=restart)
    restarter.start()
    r = chatflow("--db", pg_dsn, "chat", "-s", "restart", "during a restart")
    restarter.join()
    assert r.returncode == 0, r
    assert r.stdout.strip() == "slow answer"
    assert "discarding" not in r.stderr and "error connecting" not in r.stderr, r.stderr
    _no_password(r.stdout, r.stderr)
