"""The PostgreSQL test server helper: where no server can be started, its tests skip saying
why, and under ``CI=true`` they fail instead (CI must install what it needs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run_one_pg_test(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_uses_pg.py"
    test.write_text("def test_needs_a_server(pg_server):\n    assert pg_server.started\n")
    (tmp_path / "conftest.py").write_text("from tests.helpers.pgserver import pg_dsn, pg_server  # noqa: F401\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0",
         f"--rootdir={REPO}", "-c", str(REPO / "pyproject.toml"), str(test)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**{k: v for k, v in os.environ.items() if k != "CI"}, "PYTHONPATH": str(REPO),
             "CHATFLOW_TEST_PG_BIN": str(tmp_path / "no-postgres-here"), **env},
    )


def test_no_server_binaries_skip_saying_why(tmp_path: Path) -> None:
    done = _run_one_pg_test(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout
    assert "no PostgreSQL server: no initdb in $CHATFLOW_TEST_PG_BIN" in done.stdout


def test_no_server_binaries_fail_under_ci(tmp_path: Path) -> None:
    done = _run_one_pg_test(tmp_path, CI="true")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "CI=true and no PostgreSQL server could be started" in done.stdout


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_real_server_starts_as_the_unprivileged_account(pg_server: object, ci: str) -> None:
    from tests.helpers.pgserver import PgServer

    assert isinstance(pg_server, PgServer) and pg_server.started
    if os.geteuid() == 0:  # initdb refuses root: the data directory belongs to the postgres account
        import pwd

        assert pwd.getpwuid(pg_server.data.stat().st_uid).pw_name == "postgres"
