"""A stored state the real ``chatflow`` process writes once, copied into each test that starts from it.

Many tests start from a few finished turns written by ``chatflow chat`` itself, then run
the case under test (again the real process). Writing those turns costs one process each,
before every test; :class:`HomeSnapshots` writes them once per test session (per xdist
worker) and gives every later test a byte-for-byte copy of the data directory
(``CHATFLOW_HOME``: the SQLite database with its write-ahead log checkpointed into it, and
whatever else the build left there, with its file modes).

A session keeps the endpoint it was written through, so a snapshot built against a fake
server is only valid with that server: key it by the server's port and use the module's
``shared_fake_server`` (tests/helpers/fakeserver.py) as the test's ``fake_server``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any


def checkpoint(home: Path) -> None:
    """Move every SQLite write-ahead log under ``home`` into its database file."""
    for db in home.rglob("*.db"):
        conn = sqlite3.connect(db)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()


class HomeSnapshots:
    """Data directories built once (by a ``build`` callable) and copied per test, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def restore(self, key: str, build: Callable[[], object]) -> Path:
        """Make this test's ``CHATFLOW_HOME`` hold what ``build()`` leaves in it; returns the home.

        The first test asking for ``key`` runs ``build()`` for real in its own home, which is
        then saved; every later one gets a copy of the saved directory (same bytes, same
        modes). ``key`` must name everything the result depends on (the fake server's port).
        """
        home = Path(os.environ["CHATFLOW_HOME"])
        saved = self.root / key
        if saved.is_dir():
            shutil.copytree(saved, home, dirs_exist_ok=True)
            return home
        build()
        checkpoint(home)
        partial = self.root / f".{key}.partial"
        shutil.copytree(home, partial)
        partial.rename(saved)
        return home


def run_root(tmp_path_factory: Any) -> Path:
    """A directory of this test run that every xdist worker shares (the workers' temporary
    directories sit side by side in it); without xdist, the run's own temporary directory."""
    base = Path(tmp_path_factory.getbasetemp())
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: Any, key: str, build: Callable[[Path], object]) -> Path:
    """A directory that ``build(directory)`` fills once per test run, whichever worker asks
    first; the others wait for it (a lock file) and share it. Tests must only read it."""
    root = run_root(tmp_path_factory) / "built-once"
    root.mkdir(exist_ok=True)
    done = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_dir():
            partial = root / f".{key}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            build(partial)
            checkpoint(partial)
            partial.rename(done)
    return done
