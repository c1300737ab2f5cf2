"""The streaming Markdown renderer under resizes, replayed through the VT emulator
(tests/helpers/vt.py), which reflows on resize like VTE or tmux and, like a real terminal, cannot
move the cursor back into the scrollback: no line repeated or lost, no row padded to the
width, and the thinking spinner advancing between refreshes."""

from __future__ import annotations

import io
import random
from collections import Counter

import pytest
from rich.console import Console

from chatflow_cli.render.markdown_stream import MarkdownStream
from tests.helpers.answer import assert_each_line_once, long_answer, markers, tokens
from tests.helpers.clock import FakeClock
from tests.helpers.vt import Terminal, written_rows


SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def test_the_thinking_spinner_advances_between_refreshes() -> None:
    out = io.StringIO()
    console = Console(file=out, width=60, height=20, force_terminal=True, color_system=None)
    clock = FakeClock(now=100.0)
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


def test_rendered_lines_are_not_padded_to_the_terminal_width() -> None:
    answer = long_answer(240, code_blocks=2, code_lines=20)
    out = io.StringIO()
    console = Console(file=out, width=80, height=24, force_terminal=True, color_system="standard")
    renderer = MarkdownStream(console, clock=FakeClock(now=100.0))
    for piece in tokens(answer):
        renderer.clock.now += 0.001
        renderer.feed(piece)
    renderer.finish()
    term = Terminal(80, 24)
    term.feed(out.getvalue())
    padded = [i for i, row in enumerate(written_rows(term)) if row and row[-1] == " "]
    assert not padded, f"{len(padded)} rows end in padding spaces, e.g. {term.lines()[padded[0]]!r}"
    blank = sum(1 for line in term.logical_lines() if not line.strip())
    term.resize(50, 24)  # a narrower terminal reflows: padding would add blank rows
    assert sum(1 for line in term.lines() if not line.strip()) == blank
    assert_each_line_once(answer, "\n".join(term.logical_lines()))


def stream_with_resizes(
    answer: str,
    resizes: dict[float, tuple[int, int]],
    *,
    step: float = 0.001,
    reflow: bool = True,
    lag: float = 0.0,
) -> Terminal:
    """Stream ``answer`` (one token every ``step`` s of a fake clock) into the VT emulator,
    resizing the terminal at the given clock times. The program (the console) learns the
    new size ``lag`` seconds later — tmux holds it back while resizes keep coming."""
    term = Terminal(80, 24)
    out = io.StringIO()
    console = Console(file=out, width=80, height=24, force_terminal=True, color_system="standard")
    clock = FakeClock(now=100.0)
    start = clock.now
    renderer = MarkdownStream(console, clock=clock, reflow=reflow)
    renderer.set_status("thinking…")
    pending = sorted(resizes.items())
    told: list[tuple[float, tuple[int, int]]] = []
    for piece in tokens(answer):
        clock.now += step
        while pending and clock.now - start >= pending[0][0]:
            term.feed(out.getvalue())
            out.seek(0)
            out.truncate()
            at, size = pending.pop(0)
            term.resize(*size)
            told = [t for t in told if t[0] < at + lag] if lag else []
            told.append((at + lag, size))
        while told and clock.now - start >= told[0][0]:
            term.feed(out.getvalue())
            out.seek(0)
            out.truncate()
            console.size = told.pop(0)[1]
        renderer.feed(piece)
        if clock.now - renderer._last_refresh >= 0.08:  # the REPL's tick
            renderer.refresh(force=False)
    renderer.finish()
    term.feed(out.getvalue())
    return term


def test_forty_quick_resizes_neither_repeat_nor_lose_lines() -> None:
    answer = long_answer(600, code_blocks=3, code_lines=40)
    rng = random.Random(3)
    sizes = [(80, 24), (100, 30), (60, 20), (120, 40), (70, 18), (90, 26)]
    resizes = {0.5 + 0.08 * n: rng.choice(sizes) for n in range(40)}
    term = stream_with_resizes(answer, resizes)
    assert_each_line_once(answer, "\n".join(term.logical_lines()))


@pytest.mark.parametrize("seed", range(6))
def test_resizes_spread_over_an_answer_neither_repeat_nor_lose_lines(seed: int) -> None:
    answer = long_answer(500, code_blocks=3, code_lines=40)
    rng = random.Random(seed)
    times = sorted(rng.uniform(0.2, 8.0) for _ in range(12))
    resizes = {t: (rng.randint(50, 130), rng.randint(14, 45)) for t in times}
    term = stream_with_resizes(answer, resizes)
    assert_each_line_once(answer, "\n".join(term.logical_lines()))


@pytest.mark.parametrize(
    "resizes",
    [
        {1.0: (10, 3), 1.05: (3, 2), 1.2: (80, 24)},  # a burst: nothing is drawn at the tiny sizes
        {1.0: (10, 3), 1.6: (3, 2), 1.7: (80, 24)},  # the tail is drawn at 10x3 for a while
    ],
)
def test_shrinking_to_a_tiny_terminal_loses_no_line(resizes: dict) -> None:
    """The tail's line being written, reflowed at 10 columns, is taller than a 3-row screen:
    its top rows are in the scrollback before the stream can erase them, so that one line
    may show twice; no line is ever lost."""
    answer = long_answer(300, code_blocks=2, code_lines=30)
    term = stream_with_resizes(answer, resizes)
    assert_each_line_once(answer, "\n".join(term.logical_lines()), at_least=True)
    seen = Counter(markers("\n".join(term.logical_lines())))
    assert sum(count - 1 for count in seen.values()) <= 1


@pytest.mark.parametrize("seed", range(4))
def test_a_terminal_that_reports_sizes_late_loses_no_line(seed: int) -> None:
    """tmux rewraps at once but tells the program the size up to a storm's end later: the
    stream draws for a size the terminal no longer has. Lines may then show twice; none
    may be lost (so after a resize only one row per old line is erased)."""
    answer = long_answer(500, code_blocks=3, code_lines=40)
    rng = random.Random(seed)
    sizes = [(80, 24), (100, 30), (60, 20), (120, 40), (70, 18)]
    resizes = {0.5 + 0.08 * n: rng.choice(sizes) for n in range(40)}
    resizes.update({5.0 + 0.5 * n: rng.choice(sizes) for n in range(6)})
    term = stream_with_resizes(answer, resizes, reflow=False, lag=0.4)
    assert_each_line_once(answer, "\n".join(term.logical_lines()), at_least=True)
