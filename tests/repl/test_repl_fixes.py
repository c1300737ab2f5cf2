"""Fixes to the REPL and the streaming renderer found by driving the REPL in tmux (issue 6).

REPL tests drive the real ``run_repl`` through prompt-toolkit's pipe input against the fake
server (see tests/repl/conftest.py); renderer tests replay the output through the VT
emulator (tests/repl/vt.py), which reflows on resize like VTE or tmux and, like a real
terminal, cannot move the cursor back into the scrollback.
"""

from __future__ import annotations

import io
import time

from rich.console import Console

from chatflow_cli.markdown_stream import MarkdownStream
from tests.repl.vt import Terminal

SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ 1. the spinner moves
def test_the_thinking_spinner_advances_between_refreshes() -> None:
    out = io.StringIO()
    console = Console(file=out, width=60, height=20, force_terminal=True, color_system=None)
    clock = FakeClock()
    renderer = MarkdownStream(console, clock=clock)
    renderer.set_status("thinking…")
    shown = []
    for _ in range(10):
        clock.now += 0.1  # the REPL's tick
        renderer.refresh(force=False)
        term = Terminal(60, 20)
        term.feed(out.getvalue())
        shown.append(term.lines()[-1])
    renderer.finish()
    frames = [line[0] for line in shown]
    assert all(line.endswith(" thinking…") and line[0] in SPINNER_FRAMES for line in shown), shown
    assert len(set(frames)) >= 5, f"the spinner shows the same frames: {frames}"
    assert all(a != b for a, b in zip(frames, frames[1:])), frames


# ------------------------------------------------------------------ REPL helpers
def user_texts(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


def sent(d) -> list[str]:
    """The last user message of every request the fake server got."""
    return [user_texts(r)[-1] for r in d.requests()]


# ------------------------------------------------------------------ 2. Enter in a Ctrl-R search
def test_enter_in_a_reverse_search_sends_the_match(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        for text in ("alpha question", "beta question"):
            d.type(text + "\r")
            d.wait_text(f"ok: {text}")
        d.type("\x12alph")  # Ctrl-R, then part of the first message
        time.sleep(0.3)
        d.type("\r")
        d.wait_text("ok: alpha question", count=2)

    repl_driver.run(script)
    assert sent(repl_driver) == ["alpha question", "beta question", "alpha question"]
