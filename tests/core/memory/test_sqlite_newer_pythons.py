"""The SQLite store under newer Pythons with warnings as errors.

Python 3.12 deprecates binding a sequence to numbered placeholders (``?1``) and 3.14 makes it
an error, so the store's core operations are run, with ``-W error``, under every newer
interpreter found on this machine (pyenv's 3.12/3.13 or ``python3.12``/``python3.13`` on
PATH). The store needs only the standard library, so the checkout alone is on PYTHONPATH.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

SCRIPT = r'''
import sys
import tempfile
from pathlib import Path

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.memory.sqlite import SQLiteSessionStore
from chatflow_cli.core.messages import Message

agent = Agent(name="Assistant", instructions="Helpful bot", model="gpt-4o")
with tempfile.TemporaryDirectory() as tmp:
    store = SQLiteSessionStore(db_path=str(Path(tmp) / "s.db"))
    ctx = store.get_or_create("s", agent)
    for n in range(1, 5):
        ctx.add_message(Message.user(f"question {n} about parcels"))
        ctx.add_message(Message.model(f"answer {n}"))
        ctx.complete_turn(f"answer {n}")
        store.save(ctx)
    again = store.get("s")
    assert again is not None and again.turn_count == 4, again
    assert [t.messages[0].content for t in store.load_turns("s")][0] == "question 1 about parcels"
    assert store.search("parcels", session_id="s"), "no search hit"
    store.rollback("s", last=1)
    assert store.session_summary("s").turn_count == 3
    store.fork("s", 2, into="f")
    assert store.session_summary("f").turn_count == 2
    assert sorted(s.session_id for s in store.list_sessions()) == ["f", "s"]
    store.close()
print("ok", sys.version_info[:2])
'''


def _newer_pythons() -> list[str]:
    """One interpreter per minor version 3.12 and 3.13 found here (pyenv's first, then PATH)."""
    found: dict[str, str] = {}
    for minor in ("3.12", "3.13"):
        candidates = sorted(glob.glob(f"/root/.pyenv/versions/{minor}.*/bin/python"))
        on_path = shutil.which(f"python{minor}")
        for exe in [*candidates, *([on_path] if on_path else [])]:
            if os.access(exe, os.X_OK):
                found[minor] = exe
                break
    return list(found.values())


def test_sqlite_store_core_operations_raise_no_warning_on_newer_pythons(tmp_path: Path) -> None:
    pythons = _newer_pythons()
    if not pythons:
        pytest.skip("no Python 3.12 or 3.13 here (pyenv's /root/.pyenv/versions/3.1[23].*, python3.12/3.13 on PATH)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYENV_VERSION"))}
    env["PYTHONPATH"] = str(REPO)
    for exe in pythons:
        done = subprocess.run([exe, "-W", "error", "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=120)
        assert done.returncode == 0 and done.stdout.startswith("ok"), f"{exe}:\n{done.stdout}{done.stderr}"
