"""Fixes to the REPL and the streaming renderer found by driving the REPL in tmux (issue 6).

REPL tests drive the real ``run_repl`` through prompt-toolkit's pipe input against the fake
server (see tests/repl/conftest.py); renderer tests replay the output through the VT
emulator (tests/helpers/vt.py), which reflows on resize like VTE or tmux and, like a real
terminal, cannot move the cursor back into the scrollback.
"""

from __future__ import annotations

import io
import os
import random
import time
from collections import Counter

import pytest
from rich.console import Console

from chatflow_cli.markdown_stream import MarkdownStream
from tests.repl import tools_for_repl
from tests.helpers.answer import long_answer, markers, tokens
from tests.helpers.repl_driver import recording_output
from tests.helpers.vt import Terminal

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


def turn_done(d, text: str) -> None:
    """Wait for ``text`` of a reply, then for the turn to end: keys typed while it runs
    are type-ahead (printable text only), not keys for the next prompt."""
    d.wait_text(text)
    time.sleep(0.3)


def sent(d) -> list[str]:
    """The last user message of every request the fake server got."""
    return [user_texts(r)[-1] for r in d.requests()]


# ------------------------------------------------------------------ 2. Enter in a Ctrl-R search
def test_enter_in_a_reverse_search_sends_the_match(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        for text in ("alpha question", "beta question"):
            d.type(text + "\r")
            turn_done(d, f"ok: {text}")
        d.type("\x12alph")  # Ctrl-R, then part of the first message
        time.sleep(0.3)
        d.type("\r")
        d.wait_text("ok: alpha question", count=2)

    repl_driver.run(script)
    assert sent(repl_driver) == ["alpha question", "beta question", "alpha question"]


# ------------------------------------------------------------------ 5. /show --full
def test_show_full_prints_a_folded_tool_result_whole(repl_driver) -> None:
    d = repl_driver
    d.config.write_text(
        '[[agents]]\nname = "Helper"\ninstructions = "You look things up."\n'
        'tools = ["tests.repl.tools_for_repl:slow_lookup"]\n'
    )
    os.environ["CHATFLOW_CONFIG"] = str(d.config)
    tools_for_repl.release.set()
    long_query = "q" * 700 + "END"
    d.server.add_tool_calls([("call_q", "slow_lookup", '{"query": "' + long_query + '"}')])
    d.server.add_text("Done looking.")
    marks = {}

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("find it\r")
        turn_done(d, "Done looking.")
        marks["folded"] = d.screen()
        d.type("/show\r")
        d.wait_text("Turn 1")
        marks["show"] = d.screen()
        d.type("/show --full\r")
        d.wait_text("Turn 1", count=2)
        time.sleep(0.3)
        marks["full"] = d.screen()

    d.run(script)
    joined = " ".join(marks["folded"].split())
    assert "/show has them all with --full" in joined  # the fold says how to see everything
    assert "END" not in marks["show"]  # /show folds like the live lines
    full = marks["full"][len(marks["show"]) :]
    assert "error" not in full
    assert long_query in "".join(full.split()), "/show --full must print the whole argument and result"
    term = Terminal(80, 24)
    term.feed(d.out.getvalue())
    padded = [row for row in written_rows(term) if row and row[-1] == " "]
    assert not padded, "REPL output is padded with spaces: " + "".join(c or " " for c in padded[0])


# ------------------------------------------------------------------ 6. /sessions at 80 columns
def test_sessions_list_keeps_whole_ids_at_80_columns(repl_driver) -> None:
    d = repl_driver
    d.config.write_text('[[agents]]\nname = "CustomerSupportEscalations"\ninstructions = "You help."\n')
    os.environ["CHATFLOW_CONFIG"] = str(d.config)
    ids = []

    def script(d) -> None:
        d.wait_text("Enter sends")
        for n in range(3):
            text = f"question number {n} " + "with a long preview that cannot fit " * 4
            d.type(text + "\r")
            turn_done(d, f"ok: question number {n}")
            ids.append(d.store().latest_session_id())
            d.type("/new\r")
            d.wait_text("new session", count=n + 1)
        d.type("/sessions\r")
        d.wait_text(ids[0], count=2)
        time.sleep(0.3)

    d.run(script)
    screen = d.screen()
    listing = screen[screen.rindex("/sessions") :] if "/sessions" in screen else screen
    term = Terminal(80, 24)
    term.feed(d.out.getvalue())
    rows = term.lines()
    for sid in ids:
        assert any(sid in row for row in rows), f"{sid} is cut in the list:\n{listing}"
        row = next(row for row in rows if sid in row and "turn" in row)
        assert "CustomerS" in row and "1 turn" in row and f"question number {ids.index(sid)}" in row
        assert len(row) <= 80


def test_session_lines_drop_the_preview_before_cutting_an_id() -> None:
    from chatflow_cli.core.memory import SessionSummary
    from chatflow_cli.core.events import SessionStatus  # noqa: F401 - the status type
    from chatflow_cli.repl import session_lines

    summaries = [
        SessionSummary(
            f"2024{n}101-120000-abcdef-with-a-long-suffix",
            "Agent" * 5,
            "idle",
            n,
            40,
            0.0,
            1000.0,
            "a preview " * 10,
            {},
        )
        for n in range(3)
    ]
    for width in (80, 60, 40):
        lines = [line.plain for line in session_lines(summaries, width, now=1060.0)]
        for s, line in zip(summaries, lines):
            assert s.session_id in line
            assert len(line) <= max(width, len(s.session_id) + 2)
            assert line == line.rstrip()
    wide = [line.plain for line in session_lines(summaries, 120, now=1060.0)]
    assert all("a preview" in line for line in wide)


# ------------------------------------------------------------------ 8. Ctrl-X Ctrl-E puts the text back
def test_ctrl_x_ctrl_e_puts_the_edited_text_back_for_review(repl_driver, tmp_path, monkeypatch) -> None:
    done = tmp_path / "editor-ran"
    editor = tmp_path / "fake-editor.sh"
    editor.write_text(f"#!/bin/sh\nprintf 'edited in the editor\\n' > \"$1\"\ntouch {done}\n")
    editor.chmod(0o755)
    monkeypatch.setenv("EDITOR", str(editor))

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("draft\x18\x05")  # Ctrl-X Ctrl-E
        d.wait_for(done.exists, what="the editor")
        time.sleep(0.8)
        assert d.requests() == [], "the edited message must wait for Enter"
        d.type("\r")
        d.wait_text("ok: edited in the editor")

    repl_driver.run(script)
    assert sent(repl_driver) == ["edited in the editor"]


# ------------------------------------------------------------------ 9. suggestions and /rollback 0
def test_a_lone_slash_gets_no_far_fetched_suggestion(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("/ hello\r")
        d.wait_text("unknown command")
        d.type("/shwo\r")
        d.wait_text("did you mean /show?")

    repl_driver.run(script)
    screen = repl_driver.screen()
    first = next(line for line in screen.splitlines() if "unknown command /" in line and "shwo" not in line)
    assert "did you mean" not in first and "/help lists them" in first
    assert repl_driver.requests() == []


def test_rollback_0_asks_to_remove_every_turn(repl_driver) -> None:
    drawn, output = recording_output(repl_driver)

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("one\r")
        turn_done(d, "ok: one")
        d.type("/rollback 0\r")
        d.wait_for(lambda: "[y/N]" in drawn.getvalue(), what="the question")
        d.type("n\r")
        d.wait_text("nothing was changed")

    repl_driver.run(script, output=output)
    question = drawn.getvalue()
    assert "Remove every turn" in question and "keep only system messages" in question
    assert "1..0" not in question


# ------------------------------------------------------------------ 10. blank input stays out of history
def test_whitespace_only_input_is_not_saved_in_history(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("kept line\r")
        turn_done(d, "ok: kept line")
        d.type("   \r")
        d.type("\x1b\r\r")  # a lone newline
        d.type("after\r")
        d.wait_text("ok: after")

    repl_driver.run(script)
    from prompt_toolkit.history import FileHistory

    entries = list(FileHistory(str(repl_driver.home / "repl_history")).load_history_strings())
    assert entries == ["after", "kept line"]
    assert sent(repl_driver) == ["kept line", "after"]


# ------------------------------------------------------------------ 7. keys typed while a turn runs
def test_keys_typed_during_a_turn_act_at_the_next_prompt_as_typed(repl_driver) -> None:
    """Type-ahead works as in a shell: text, editing keys and Enter typed during a reply act,
    in order, once the turn ends; Esc-Enter is a new line in the message."""
    d = repl_driver
    words = [f"w{i} " for i in range(80)]
    d.server.add_text("".join(words), chunks=words, delay=0.02)

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("go\r")
        d.wait_text("w5")
        for keys in ("abx", "\x7f", "c", "\x1b\r", "de", "\r"):  # Backspace, Esc-Enter, Enter
            d.type(keys)
            time.sleep(0.05)
        d.wait_text("ok: abc")
        d.wait_text("de")

    d.run(script)
    assert sent(d) == ["go", "abc\nde"]


def test_keys_still_unread_when_a_turn_ends_are_type_ahead_in_order() -> None:
    """Keys typed just before the turn ends (not read yet) are kept for the next prompt in
    order, and a Ctrl-C discards what was typed before it."""
    import asyncio
    from types import SimpleNamespace

    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.input.typeahead import get_typeahead

    from chatflow_cli.repl import Repl

    interrupts = []

    async def main(keys: str) -> tuple[list, list]:
        with create_pipe_input() as pipe:
            watcher = SimpleNamespace(input=pipe, _typeahead=[])
            with Repl._watch_keys(watcher, lambda: interrupts.append(1)):
                pipe.send_text(keys)
            left = pipe.read_keys() + pipe.flush_keys()
            return get_typeahead(pipe), left

    kept, left = asyncio.run(main("abc\r\x04\x1b[200~pas\r\nte\x1b[201~de"))
    assert [p.data for p in kept] == ["a", "b", "c", "\r", "\x04", "pas\r\nte", "d", "e"]
    assert left == [] and interrupts == []
    kept, left = asyncio.run(main("typed\x03after"))
    assert "".join(p.data for p in kept) == "after" and interrupts == [1]


# ------------------------------------------------------------------ 11. SIGHUP mid-answer
def test_sighup_mid_answer_stores_the_partial_reply_as_interrupted_and_leaves(repl_driver) -> None:
    import signal

    d = repl_driver
    words = [f"word{i} " for i in range(400)]
    d.server.add_text("".join(words), chunks=words, delay=0.02)
    caught = []
    previous = signal.signal(signal.SIGHUP, lambda *_: caught.append("test"))  # never kill pytest

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("tell me a long story\r")
        d.wait_text("word20")
        os.kill(os.getpid(), signal.SIGHUP)
        d.wait_for(lambda: d.exit_code is not None, timeout=10, what="the REPL to leave by itself")

    try:
        d.run(script)
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert caught == [], "the REPL did not handle SIGHUP"
    assert d.exit_code == 0
    session = d.store().get(d.store().latest_session_id())
    assert session.turn_count == 1
    partial = session.turns[0].messages[1]
    assert partial.interrupted and partial.content.startswith("word0 word1") and "word399" not in partial.content
    kinds = [e.type for e in d.store().events(session.session_id)]
    assert "turn.interrupted" in kinds and "session.recovered" not in kinds
    assert session.status.value == "idle"


# ------------------------------------------------------------------ 3, 4. resizes and padding
def written_rows(term: Terminal) -> list[list]:
    """Each row's cells up to the last one anything was written to (None: never written)."""
    rows = []
    for row in term.rows:
        end = len(row)
        while end and row[end - 1] is None:
            end -= 1
        rows.append(row[:end])
    return rows


def test_rendered_lines_are_not_padded_to_the_terminal_width() -> None:
    answer = long_answer(240, code_blocks=2, code_lines=20)
    out = io.StringIO()
    console = Console(file=out, width=80, height=24, force_terminal=True, color_system="standard")
    renderer = MarkdownStream(console, clock=FakeClock())
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


def assert_each_line_once(source: str, screen_text: str, *, at_least: bool = False) -> None:
    seen = Counter(markers(screen_text))
    wanted = markers(source)
    lost = [m for m in wanted if seen[m] == 0]
    assert not lost, f"{len(lost)} lines lost, e.g. {lost[:8]}"
    if not at_least:
        twice = {m: seen[m] for m in wanted if seen[m] > 1}
        assert not twice, f"{len(twice)} lines shown more than once, e.g. {dict(list(twice.items())[:8])}"
        assert markers(screen_text) == wanted, "lines out of order"


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
    clock = FakeClock()
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


# ------------------------------------------------------------------ /show marks interrupted turns
def test_show_marks_an_interrupted_turn_as_sessions_show_does(repl_driver) -> None:
    d = repl_driver
    d.server.add_text("Half an ans", chunks=["Half ", "an ans"], finish_reason=None)
    marks = {}

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("hello\r")
        d.wait_text("did not finish")
        d.type("/show\r")
        d.wait_text("Turn 1 · interrupted")
        marks["show"] = d.screen()

    d.run(script)
    assert "Half an ans" in marks["show"].split("Turn 1 · interrupted", 1)[1]
