"""The real ``chatflow`` process in a pseudo-terminal, read through the VT emulator.

:class:`PtyRepl` spawns ``chatflow ARGS`` (pexpect) with a given terminal size and keeps
everything the terminal received; :meth:`PtyRepl.screen` replays it through
:class:`tests.helpers.vt.Terminal` (scrollback included), so assertions see what a person
would see. Waits poll observable state (text on the screen, the exit) with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from typing import Any

import pexpect

from tests.conftest import COMMAND, REPO
from tests.helpers.vt import Terminal


class PtyRepl:
    def __init__(self, args: list[str], *, width: int = 100, height: int = 40, env: dict[str, str] | None = None) -> None:
        full = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(REPO), EDITOR="false")
        for name in ("NO_COLOR", "COLUMNS", "LINES", "TMUX", "STY"):
            full.pop(name, None)
        full.update(env or {})
        self.width, self.height = width, height
        self.raw = ""
        self._answered = 0
        self.child = pexpect.spawn(
            COMMAND[0], [*COMMAND[1:], *args], env=full, dimensions=(height, width), encoding="utf-8",
            codec_errors="replace", timeout=30,
        )

    # -- reading
    def pump(self, wait: float = 0.05) -> None:
        try:
            while True:
                self.raw += self.child.read_nonblocking(65536, timeout=wait)
                wait = 0
                self._answer_cursor_queries()
        except (pexpect.TIMEOUT, pexpect.EOF):
            pass

    def _answer_cursor_queries(self) -> None:
        """Answer prompt-toolkit's cursor position requests (CPR) as a terminal does."""
        asked = self.raw.count("\x1b[6n")
        while self._answered < asked:
            self._answered += 1
            term = self.terminal()
            with contextlib.suppress(OSError):
                self.child.send(f"\x1b[{term.row - term.top + 1};{term.col + 1}R")

    def terminal(self) -> Terminal:
        term = Terminal(self.width, self.height)
        term.feed(self.raw)
        return term

    def screen(self) -> str:
        """Scrollback and screen as logical lines (soft-wrapped rows joined)."""
        return "\n".join(self.terminal().logical_lines())

    def rows(self) -> list[str]:
        """Scrollback and screen, one string per terminal row."""
        return self.terminal().lines()

    def wait_for(self, condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            self.pump()
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; screen:\n{self.screen()[-3000:]}")
            if not self.child.isalive():
                self.pump()
                value = condition()
                if value:
                    return value
                raise AssertionError(f"chatflow exited while waiting for {what}; screen:\n{self.screen()[-3000:]}")

    def wait_text(self, text: str, count: int = 1, timeout: float = 20.0) -> None:
        self.wait_for(lambda: self.screen().count(text) >= count, timeout, what=repr(text))

    def wait_raw(self, text: str, count: int = 1, timeout: float = 20.0) -> None:
        self.wait_for(lambda: self.raw.count(text) >= count, timeout, what=f"raw {text!r}")

    def wait_prompt(self, count: int = 1, timeout: float = 20.0) -> None:
        """Wait for the ``count``-th prompt (``›``) drawn since the start (the first prompt)."""
        self.wait_for(lambda: self.raw.count("\u203a") >= count, timeout, what=f"prompt #{count}")

    def wait_prompt_after(self, text: str, timeout: float = 20.0) -> None:
        """Wait for ``text`` and then a prompt drawn after its last occurrence (``text`` should be
        one no later drawing has: the bottom toolbar is drawn after each prompt)."""

        def drawn() -> bool:
            at = self.raw.rfind(text)
            return at >= 0 and "\u203a" in self.raw[at + len(text) :]

        self.wait_for(drawn, timeout, what=f"a prompt after {text!r}")

    # -- writing
    def send(self, text: str) -> None:
        self.child.send(text)

    # -- ending
    def wait_exit(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while self.child.isalive():
            self.pump(0.1)
            if time.monotonic() > deadline:
                raise AssertionError(f"chatflow did not exit; screen:\n{self.screen()[-3000:]}")
        self.pump(0)
        self.child.close()
        return self.child.exitstatus if self.child.exitstatus is not None else -(self.child.signalstatus or 0)

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


def leave(repl: PtyRepl) -> None:
    """End the REPL with Ctrl-D and check it exited with 0."""
    repl.send("\x04")
    assert repl.wait_exit() == 0



# ------------------------------------------------------------------ 4. a long paragraph, Ctrl-C
def notice(repl: PtyRepl) -> str:
    """The ``⏹`` notice (it may wrap over several rows), as one line."""
    after = repl.screen().split("\u23f9", 1)[1]
    return "\u23f9" + " ".join(after.split("\n\n", 1)[0].split())



def long_paragraph(chars: int, seed: int = 3) -> str:
    """One Markdown paragraph of at least ``chars`` characters (bold, code spans, long words), ending "END."."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "**bold words**", "`a code span`", "*italic*", "epsilon", "zeta",
             "international", "x" * 30, "theta,", "iota."]
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out) + " END."



def chunked(text: str, size: int = 3) -> list[str]:
    """``text`` in pieces of ``size`` characters (a reply streamed in small chunks)."""
    return [text[i : i + size] for i in range(0, len(text), size)]
