"""The streaming Markdown renderer (issue 6): every line once, a bounded live tail, inert control codes.

The output goes to ``Console(file=io.StringIO(), width=80, height=24, force_terminal=True)``
and is replayed through a small terminal emulator (tests/helpers/vt.py) whose cursor, like a
real one, cannot climb back into the scrollback: a renderer that redraws more than the
screen holds, or crops its tail, shows up as repeated or missing lines.
"""

from __future__ import annotations

import io
import re
from collections import Counter

import pytest
from rich.console import Console
from rich.markdown import Markdown
from rich.text import Text

from chatflow_cli.render.markdown_blocks import BlockScanner
from chatflow_cli.render.markdown_stream import MarkdownStream, sanitize_terminal_text
from tests.helpers.answer import assert_each_line_once, long_answer, markers, tokens
from tests.helpers.clock import FakeClock
from tests.helpers.vt import Terminal


def stream(
    text: str,
    *,
    width: int = 80,
    height: int = 24,
    step: float = 0.001,
    refresh_per_second: float = 20.0,
    on_token=None,
    pieces: list[str] | None = None,
    color_system: str = "standard",
) -> tuple[MarkdownStream, str, Console]:
    out = io.StringIO()
    console = Console(file=out, width=width, height=height, force_terminal=True, color_system=color_system)
    clock = FakeClock(now=0.0, step=step)
    renderer = MarkdownStream(console, clock=clock, refresh_per_second=refresh_per_second, reflow=True)
    for index, piece in enumerate(pieces if pieces is not None else tokens(text)):
        clock.tick()
        renderer.feed(piece)
        if on_token is not None:
            on_token(index, console, renderer)
    renderer.finish()
    return renderer, out.getvalue(), console


def test_1500_line_answer_every_line_exactly_once_in_80x24() -> None:
    answer = long_answer(1500, code_blocks=5)
    assert answer.count("\n") == 1500 and answer.count("```") == 10
    renderer, raw, _ = stream(answer)
    term = Terminal(80, 24)
    term.feed(raw)
    assert_each_line_once(answer, "\n".join(term.lines()))
    # Redrawn live many times, yet the tail never grew past half the screen.
    assert len(renderer.stats) > 100
    assert max(stat.tail_rows for stat in renderer.stats) <= 12
    # The raw output repeats the tail while it is live, so it is the emulator that proves "once".
    assert Counter(markers(raw)).most_common(1)[0][1] > 1


def test_code_blocks_are_highlighted_and_complete() -> None:
    answer = long_answer(400, code_blocks=2, code_lines=50)
    _, raw, _ = stream(answer)
    term = Terminal(80, 24)
    term.feed(raw)
    lines = term.lines()
    code = [line for line in lines if "compute(" in line]
    assert len(code) == 50
    assert all(line.startswith("     value_") for line in code)  # 1 cell of padding + 4 of indent
    # monokai (in 16 colours): "=" in red on the code block's black background, names in white.
    assert "\x1b[91;40m=" in raw and "\x1b[97;40mvalue_0" in raw


def test_refresh_on_every_token_still_shows_each_line_once() -> None:
    answer = long_answer(300, code_blocks=2, code_lines=30)
    renderer, raw, _ = stream(answer, refresh_per_second=0)
    assert len(renderer.stats) > 1000
    term = Terminal(80, 24)
    term.feed(raw)
    assert_each_line_once(answer, "\n".join(term.lines()))


@pytest.mark.parametrize(("width", "height"), [(40, 8), (80, 5), (30, 24)])
def test_terminal_smaller_than_the_answer(width: int, height: int) -> None:
    answer = long_answer(500, code_blocks=2, code_lines=40)
    renderer, raw, _ = stream(answer, width=width, height=height)
    term = Terminal(width, height)
    term.feed(raw)
    assert_each_line_once(answer, "\n".join(term.logical_lines()))
    assert max(stat.tail_rows for stat in renderer.stats) <= max(2, height // 2)


def test_resize_while_streaming_neither_repeats_nor_hides() -> None:
    answer = long_answer(600, code_blocks=2, code_lines=40)
    term = Terminal(80, 24)
    sizes = {1500: (60, 16), 3000: (100, 30), 4500: (50, 12)}

    def on_token(index: int, console: Console, renderer: MarkdownStream) -> None:
        term.feed(console.file.getvalue())  # type: ignore[attr-defined]
        console.file.seek(0)  # type: ignore[attr-defined]
        console.file.truncate()  # type: ignore[attr-defined]
        if index in sizes:
            width, height = sizes[index]
            term.resize(width, height)
            console.size = (width, height)

    _, rest, _ = stream(answer, on_token=on_token)
    term.feed(rest)
    assert_each_line_once(answer, "\n".join(term.logical_lines()))


def test_non_terminal_prints_each_block_once_without_escape_codes() -> None:
    answer = long_answer(300, code_blocks=1, code_lines=20)
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None, force_terminal=False)
    renderer = MarkdownStream(console)
    for piece in tokens(answer):
        renderer.feed(piece)
    renderer.finish()
    text = out.getvalue()
    assert "\x1b" not in text
    assert renderer.stats == []
    assert_each_line_once(answer, text)


def test_streamed_output_matches_a_static_render() -> None:
    doc = (
        "# Title\n\nFirst paragraph with **bold** and `code`,\nwrapped over two source lines.\n\n"
        "- one\n- two\n  - nested\n- three\n\n> quoted\n> text\n\n```python\ndef f(x):\n    return x * 2\n```\n\n"
        "## Next\n\nLast words.\n"
    )
    static = io.StringIO()
    from chatflow_cli.render import markdown_renderable

    # the same as ``sessions show`` renders it (single line breaks kept)
    Console(file=static, width=60, color_system=None).print(markdown_renderable(doc))
    streamed = io.StringIO()
    console = Console(file=streamed, width=60, color_system=None)
    renderer = MarkdownStream(console, live=False)
    for piece in tokens(doc, seed=11):
        renderer.feed(piece)
    renderer.finish()

    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip("\n").split("\n")]

    assert norm(streamed.getvalue()) == norm(static.getvalue())


HOSTILE = [
    "\x1b]52;c;aGVsbG8=\x07",  # OSC 52: write the clipboard
    "\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\",  # OSC 8 hyperlink
    "\x1b[2J\x1b[H",  # clear the screen
    "\x1b[31mred\x1b[0m",  # CSI SGR
    "\x9b2J",  # the one-character C1 CSI
    "\x9d0;title\x9c",  # C1 OSC: set the window title
    "bell\x07 back\x08space form\x0cfeed vt\x0b nul\x00 del\x7f",
    "cr\rover",  # a lone CR would overwrite the line
    "\u202eevil\u202c",  # bidi override
]


@pytest.mark.parametrize("payload", HOSTILE)
def test_control_sequences_from_the_model_are_inert(payload: str) -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, height=24, force_terminal=True)
    renderer = MarkdownStream(console)
    text = f"before {payload} after\n\n```\ncode {payload}\n```\n"
    for piece in tokens(text, seed=5):
        renderer.feed(piece)
    renderer.finish()
    raw = out.getvalue()
    # What remains are only the sequences Rich itself emits: SGR colours, cursor moves, erase, cursor show/hide.
    residue = re.sub(r"\x1b\[[0-9;]*[mAKG]|\x1b\[\?25[lh]|\r|\n", "", raw)
    for forbidden in ("\x1b", "\x07", "\x08", "\x00", "\x0b", "\x0c", "\x7f", "\x9b", "\x9c", "\x9d", "\u202e"):
        assert forbidden not in residue
    assert "\x1b[2J" not in raw and "\x1b]" not in raw
    term = Terminal(80, 24)
    term.feed(raw)
    shown = "\n".join(term.lines())
    assert shown.count("before") == 1 and shown.count("after") == 1
    if "\x1b" in payload:
        assert "\u241b" in shown  # ␛ is visible instead
    if "\x9b" in payload or "\x9d" in payload:  # each C1 control is named instead
        named = payload.replace("\x9b", "<U+009B>").replace("\x9c", "<U+009C>").replace("\x9d", "<U+009D>")
        assert f"before {named} after" in shown.splitlines()


def test_the_stream_uses_the_one_sanitizer() -> None:
    """The renderer's sanitizer is render.safe_text itself (its table: tests/render/test_sanitizer.py)."""
    from chatflow_cli.render import safe_text

    assert sanitize_terminal_text is safe_text


def test_crlf_split_across_deltas_is_one_newline() -> None:
    out = io.StringIO()
    renderer = MarkdownStream(Console(file=out, width=40, color_system=None), live=False)
    for piece in ["line one\r", "\nline two\r", "\n"]:
        renderer.feed(piece)
    assert renderer.finish() == "line one\nline two\n"
    assert "\u240d" not in out.getvalue()


def scan(text: str) -> list[tuple[str, str]]:
    scanner = BlockScanner()
    blocks = []
    for line in text.split("\n"):
        blocks.extend(scanner.push_line(line))
    blocks.extend(scanner.close())
    return [(b.kind, b.text) for b in blocks]


def test_scanner_keeps_a_fence_whole_across_blank_lines_and_hashes() -> None:
    text = "intro\n```python\n# not a heading\n\n- not a list\n```\nafter"
    assert scan(text) == [
        ("para", "intro"),
        ("fence", "```python\n# not a heading\n\n- not a list\n```"),
        ("para", "after"),
    ]


def test_scanner_blocks() -> None:
    assert scan("# H\npara\ncontinued\n\n- a\n- b\n\n  b continued\n\nnext") == [
        ("heading", "# H"),
        ("para", "para\ncontinued"),
        ("list", "- a"),
        ("list", "- b\n\n  b continued"),
        ("para", "next"),
    ]
    assert scan("Title\n=====\ntext\n---\n\n***") == [
        ("heading", "Title\n====="),
        ("heading", "text\n---"),
        ("hr", "***"),
    ]
    assert scan("a\n2. not a list\n\n1. list\n   ~~~\n   code\n\n   ~~~\n") == [
        ("para", "a\n2. not a list"),
        ("list", "1. list\n   ~~~\n   code\n\n   ~~~"),
    ]
    assert scan("    indented\n\n    code\nnot code") == [("icode", "    indented\n\n    code"), ("para", "not code")]


def test_status_spinner_then_text_replaces_it() -> None:
    out = io.StringIO()
    console = Console(file=out, width=60, height=20, force_terminal=True)
    renderer = MarkdownStream(console)
    renderer.set_status("thinking")
    renderer.feed("Hello **world**\n")
    renderer.print(Text("tool: lookup({})"))
    renderer.feed("done")
    renderer.finish()
    term = Terminal(60, 20)
    term.feed(out.getvalue())
    lines = term.lines()
    assert "thinking" in out.getvalue()
    assert lines == ["Hello world", "tool: lookup({})", "done"]
    assert out.getvalue().endswith("\n\x1b[?25h")  # the cursor is shown again, last


@pytest.mark.parametrize("seed", range(2))
def test_long_paragraphs_stream_exactly_as_the_static_render(seed: int) -> None:
    """A paragraph longer than the live region (one long line, or many short lines kept by
    their single line breaks) is printed as it grows, a few rows at a time, and ends up
    exactly as ``sessions show`` renders it; each refresh stays cheap."""
    import random

    from chatflow_cli.render import markdown_renderable

    rng = random.Random(seed)
    vocabulary = ["alpha", "beta", "**bold words**", "`a code span`", "*italic*", "gamma,", "international",
                  "x" * 40, "- not a list", "1. not a list", "# not a heading", "delta."]
    long_line = " ".join(rng.choice(vocabulary) for _ in range(600))
    short_lines = "\n".join(" ".join(rng.choice(vocabulary[:8]) for _ in range(rng.randint(1, 6))) for _ in range(80))
    doc = f"Intro.\n\n{long_line}\n\n{short_lines}\n\n- item\n\n{long_line[:3000]}\nEnd."
    out = io.StringIO()
    console = Console(file=out, width=90, height=24, force_terminal=True, color_system=None)
    now = [100.0]
    renderer = MarkdownStream(console, clock=lambda: now[0], reflow=True)
    for piece in tokens(doc, seed=seed):
        renderer.feed(piece)
        now[0] += 0.01
    renderer.finish()
    static = io.StringIO()
    Console(file=static, width=90, color_system=None).print(markdown_renderable(doc))
    term = Terminal(90, 24)
    term.feed(out.getvalue())
    assert term.lines() == [line.rstrip() for line in static.getvalue().rstrip("\n").split("\n")]
    longest = max(stat.tail_rows for stat in renderer.stats)
    assert longest <= 12


def test_a_table_shows_no_raw_pipe_text_before_its_delimiter_row_arrives() -> None:
    """Until a table's header and delimiter rows are in, a status line stands for it: the raw
    ``| Na`` of a half-received header is never drawn; once they are, the table is drawn whole."""
    tails: list[str] = []

    def on_token(index: int, console: Console, renderer: MarkdownStream) -> None:
        renderer.refresh()
        tails.append(console.file.getvalue())

    table = "| Name | Qty |\n|---|---|\n| pear | 10 |\n"
    pieces = ["| Na", "me | Qty |\n", "|--", "-|---|\n", "| pear | 10 |\n"]
    _, out, _ = stream(table, pieces=pieces, on_token=on_token, height=40)
    drawn = [Terminal(80, 40) for _ in tails]
    for term, text in zip(drawn, tails):
        term.feed(text)
    screens = [term.lines() for term in drawn]
    assert all(not any("|" in line for line in screen) for screen in screens)
    assert any("receiving a table…" in line for line in screens[0])
    assert [line.strip() for line in screens[3] if line.strip()] == ["Name  Qty", "─────────"]  # drawn whole
    final = Terminal(80, 40)
    final.feed(out)
    assert [line.strip() for line in final.lines() if line.strip()] == ["Name  Qty", "─────────", "pear  10"]
