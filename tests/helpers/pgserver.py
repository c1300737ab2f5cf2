"""A real PostgreSQL server for the tests, started from the machine's server binaries.

:class:`PgServer` runs ``initdb`` into a fresh temporary directory and starts ``postgres``
on a free TCP port of 127.0.0.1, with its Unix socket in that directory; :meth:`PgServer.stop`
stops it and removes the directory. ``initdb`` refuses to run as root, so under root the
server runs as the unprivileged ``postgres`` account (``runuser -u postgres --``), which
owns the directory; any other user runs it directly.

Authentication is real: the socket trusts the local superuser (used to create databases),
TCP asks for a password (SCRAM), and every test connects over TCP as the role ``chatflow``
with the password :data:`PASSWORD`, so the password really travels in the DSN.

Fixtures (imported by tests/conftest.py):

* ``pg_server`` -- one server for the whole test session;
* ``pg_dsn`` -- a fresh, empty database on it for one test, as a ``postgresql://`` URL;
* ``pg_dsn_migrated`` -- the same, already holding chatflow's current schema.

Where no server can be started (psycopg not installed, no binaries, no ``postgres`` account,
``initdb`` failed; every reason found is named) the fixtures skip saying why -- except under
``CI=true``, where that is a failure: CI must install what it needs (``.ci/run`` installs
Debian's ``postgresql`` package).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The password of the ``chatflow`` role the tests connect as.
PASSWORD = "pg-test-pw-4b1e9c7d"
ROLE = "chatflow"


class PgUnavailable(Exception):
    """No PostgreSQL server can be started on this machine (the message says why)."""


def find_bin_dir() -> Path:
    """The directory of ``initdb`` and ``pg_ctl``: ``$CHATFLOW_TEST_PG_BIN`` when set, else on
    ``PATH``, else Debian's newest ``/usr/lib/postgresql/<version>/bin``."""
    chosen = os.environ.get("CHATFLOW_TEST_PG_BIN")
    if chosen:
        if not (Path(chosen) / "initdb").is_file():
            raise PgUnavailable(f"no initdb in $CHATFLOW_TEST_PG_BIN ({chosen})")
        return Path(chosen)
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parent.parent.name.split(".")],
    )
    if not candidates:
        raise PgUnavailable("no PostgreSQL server binaries (initdb) on PATH or in /usr/lib/postgresql/*/bin")
    return Path(candidates[-1]).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL server in a temporary directory (see the module docstring)."""

    def __init__(self, bin_dir: Path | None = None, *, durable: bool = False,
                 settings: dict[str, str] | None = None) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.durable = durable  # False: fsync off (tests); True: the server's defaults (benchmarks)
        self.settings = dict(settings or {})  # more -c name=value options
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="chatflow-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            if shutil.which("runuser") is None:
                raise PgUnavailable("running as root and runuser is missing (initdb refuses root)")
            try:
                import pwd

                account = pwd.getpwnam("postgres")
            except KeyError:
                raise PgUnavailable("running as root and there is no unprivileged 'postgres' account") from None
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self.started = False

    # -- running the server's programs -------------------------------------------------
    def _cmd(self, program: str, *args: str) -> list[str]:
        argv = [str(self.bin_dir / program), *args]
        return ["runuser", "-u", "postgres", "--", *argv] if self._as_root else argv

    def _run(self, program: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._cmd(program, *args), capture_output=True, text=True, timeout=timeout, cwd=self.root,
            env={**os.environ, "LC_ALL": "C", "PGPASSWORD": ""},
        )

    def _options(self) -> str:
        opts = [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={self.root}",
            "-c max_connections=200",
            "-c shared_buffers=32MB",
        ]
        if not self.durable:
            opts += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        opts += [f"-c {name}={value}" for name, value in self.settings.items()]
        return " ".join(opts)

    def start(self) -> PgServer:
        """initdb (first time only) and start; PgUnavailable with the server's words on failure."""
        if not self.data.exists():
            pwfile = self.root / "pw"
            pwfile.write_text(PASSWORD + "\n")
            if self._as_root:
                shutil.chown(pwfile, "postgres")
            done = self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256",
                "-E", "UTF8", "--locale=C", "--no-sync", f"--pwfile={pwfile}",
            )
            if done.returncode != 0:
                raise PgUnavailable(f"initdb failed: {(done.stderr or done.stdout).strip()[-500:]}")
        done = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self._options(), "-w", "-t", "60",
                         "start")
        if done.returncode != 0:
            tail = self.log.read_text(errors="replace")[-800:] if self.log.exists() else ""
            raise PgUnavailable(f"the PostgreSQL server did not start: {done.stderr.strip()} {tail}".strip())
        self.started = True
        if not getattr(self, "_role_made", False):
            self.admin(f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{PASSWORD}'")
            self._role_made = True
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back open transactions; ``immediate``: like a crash)."""
        if self.started:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", timeout=60)
            self.started = False

    def restart(self) -> None:
        """Stop and start again on the same port: every open connection is cut."""
        self.stop("fast")
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- administration ------------------------------------------------------------------
    def admin(self, sql: str, dbname: str = "postgres") -> None:
        """Run ``sql`` as the superuser over the socket (autocommit: CREATE DATABASE works)."""
        import psycopg

        with psycopg.connect(host=str(self.root), port=self.port, user="postgres", dbname=dbname,
                             autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self, name: str | None = None, template: str | None = None) -> str:
        """A new database owned by the test role: empty, or a copy of ``template``."""
        name = name or "t_" + uuid.uuid4().hex[:12]
        copy = f' TEMPLATE "{template}"' if template else ""
        self.admin(f'CREATE DATABASE "{name}"{copy} OWNER {ROLE}')
        return name

    def migrated_template(self) -> str:
        """The name of a database holding chatflow's current schema and no data, made (by a
        PostgreSQL store, closed again: a template must have no connections) on first use."""
        if not getattr(self, "_template", None):
            from chatflow_cli.core.memory.postgres import PostgresSessionStore

            name = self.create_database("chatflow_migrated_" + uuid.uuid4().hex[:8])
            PostgresSessionStore(self.dsn(name)).close()
            self._template = name
        return str(self._template)

    def dsn(self, dbname: str, *, password: str | None = PASSWORD, user: str = ROLE) -> str:
        auth = f"{user}:{password}" if password is not None else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true and no PostgreSQL server could be started: {reason}", pytrace=False)
    pytest.skip(f"no PostgreSQL server: {reason}")


_STATE: dict[str, object] = {}


def _psycopg_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("psycopg") is None or importlib.util.find_spec("psycopg_pool") is None:
        return "psycopg / psycopg_pool are not installed (pip install -e '.[postgres]')"
    return None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One real PostgreSQL server for the test session (skips, or fails under CI=true, when none)."""
    if "error" not in _STATE:
        # every reason is told at once: the binaries are looked for even when psycopg is missing
        reasons = []
        try:
            find_bin_dir()
        except PgUnavailable as exc:
            reasons.append(str(exc))
        missing = _psycopg_missing()
        if missing:
            reasons.append(missing)
        if reasons:
            _STATE["error"] = "; ".join(reasons)
    if "error" in _STATE:
        _unavailable(str(_STATE["error"]))
    try:
        server = PgServer().start()
    except (PgUnavailable, OSError, subprocess.SubprocessError) as exc:
        _STATE["error"] = str(exc)
        _unavailable(str(exc))
        raise  # pragma: no cover (skip and fail raise)
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh empty database for one test, as ``postgresql://chatflow:PASSWORD@127.0.0.1:PORT/NAME``."""
    if not pg_server.started:  # a test that stopped it (faults) leaves it for the next one to start
        pg_server.start()
    name = pg_server.create_database()
    yield pg_server.dsn(name)
    if not pg_server.started:
        pg_server.start()
    _drop(pg_server, name)


@pytest.fixture
def pg_dsn_migrated(pg_server: PgServer) -> Iterator[str]:
    """Like ``pg_dsn``, but the database already holds chatflow's current schema: a copy of
    :meth:`PgServer.migrated_template`, which spares each test the migration's DDL (the
    contract suite's stores use it; tests of migrating itself take ``pg_dsn``)."""
    if not pg_server.started:
        pg_server.start()
    name = pg_server.create_database(template=pg_server.migrated_template())
    yield pg_server.dsn(name)
    if not pg_server.started:
        pg_server.start()
    _drop(pg_server, name)


def _drop(pg_server: PgServer, name: str) -> None:
    try:
        pg_server.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception:  # a database left behind dies with the server's directory
        pass
