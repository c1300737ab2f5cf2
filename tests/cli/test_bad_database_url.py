"""A malformed PostgreSQL URL in ``--db``, ``CHATFLOW_DB`` or config.toml: a clear line naming
the problem and the exit code of bad input, never the password, never "unexpected ValueError"."""

from __future__ import annotations

import json
import uuid

from chatflow_cli.core.errors import ExitStatus


def test_malformed_database_urls_are_usage_errors_that_never_print_the_password(chatflow, config_file) -> None:
    password = f"pw{uuid.uuid4().hex[:10]}"
    cases = {
        f"postgresql://ann:{password}@[bad/db": "unclosed '['",
        f"postgresql://ann:{password}@db]/x": "unclosed '['",
        f"postgresql://ann:{password}@host:notaport/db": "port is not a number",
        f"postgresql://ann:{password}@host:99999/db": "port is not a number",
        f"postgresql://ann:{password}%zz@host/db": "not followed by two hex digits",
        f"postgresql://ann:{password}%00@host/db": "not followed by two hex digits, or a %00",
        f"postgresql://ann:{password}@host/db\n": "control character",
    }
    for url, problem in cases.items():
        for how in ("flag", "env"):
            r = (chatflow("--db", url, "sessions", "ls") if how == "flag"
                 else chatflow("sessions", "ls", env={"CHATFLOW_DB": url}))
            assert r.returncode == ExitStatus.USAGE, (url, how, r)
            assert problem in r.stderr and "unexpected" not in r.stderr, (url, how, r)
            assert password not in r.stdout + r.stderr, (url, how, r)
            assert len(r.stderr.strip().splitlines()) == 1, r
    r = chatflow("--db", f"postgresql://ann:{password}@[bad/db", "sessions", "ls", "--json")
    assert r.returncode == ExitStatus.USAGE and password not in r.stdout + r.stderr, r
    assert json.loads(r.stdout)["exit_code"] == ExitStatus.USAGE
    # in config.toml (which never holds a password): a config error naming the line
    config_file('db = "postgresql://ann@[bad/db"\n')
    r = chatflow("sessions", "ls")
    assert r.returncode == ExitStatus.CONFIG and "line 1: db: the database URL cannot be read" in r.stderr, r
