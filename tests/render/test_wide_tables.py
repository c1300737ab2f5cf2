"""Wide Markdown tables keep every character (issue 30): UUIDs, paths and CJK cells at 40,
80 and 120 columns, in the live stream (MarkdownStream replayed through the terminal
emulator), in ``sessions show``'s rendering (``markdown_renderable``, as ``--full`` draws
it) and in the REPL with another code theme. A table whose columns cannot each be as wide as
their widest word is drawn as ``header: value`` lines instead of being cut with ``…``.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from chatflow_cli.render.markdown_stream import MarkdownStream
from chatflow_cli.render.markdown import Trimmed, markdown_renderable
from tests.helpers.clock import FakeClock
from tests.helpers.vt import Terminal

UUIDS = [
    "0f8fad5b-d9cb-469f-a165-70867728950e",
    "0f8fad5b-d9cb-469f-a165-70867728950f",
    "7c9e6679-7425-40de-944b-e07fc1f90ae7",
    "7c9e6679-7425-40de-944b-e07fc1f90ae8",
]
PATHS = ["/var/lib/chatflow/sessions/2026/12/03/gateway-deploy.log", "src/chatflow_cli/core/memory/search.py"]
CJK = ["東京都千代田区丸の内一丁目", "서울특별시중구세종대로"]

TABLES = {
    "uuids": "| a | b | c | d |\n|---|---|---|---|\n| " + " | ".join(UUIDS) + " |\n| " + " | ".join(
        reversed(UUIDS)) + " |\n",
    "paths": "| id | path | where |\n|---|---|---|\n" + "".join(
        f"| {u} | {p} | {c} |\n" for u, p, c in zip(UUIDS, PATHS, CJK)),
    "narrow": "| k | v |\n|---|---|\n| 1 | 東京 |\n",
}
CELLS = {
    "uuids": UUIDS,
    "paths": [*UUIDS[:2], *PATHS, *CJK],
    "narrow": ["東京"],
}


def _joined(lines: list[str]) -> str:
    """The screen's lines stripped and run together: a value folded over lines reads whole."""
    return "".join(line.strip() for line in lines)


def _assert_every_cell_whole(lines: list[str], name: str, width: int) -> None:
    text = "\n".join(lines)
    assert "…" not in text
    joined = _joined(lines)
    for cell in CELLS[name]:
        assert cell in joined, (cell, width, text)
    for line in lines:
        assert Console(width=1000).measure(line).maximum <= width


@pytest.mark.parametrize("width", [40, 80, 120])
@pytest.mark.parametrize("name", list(TABLES))
def test_sessions_show_keeps_every_character_of_every_cell(name: str, width: int) -> None:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    console.print(Trimmed(markdown_renderable(TABLES[name])))
    _assert_every_cell_whole(out.getvalue().splitlines(), name, width)


@pytest.mark.parametrize("width", [40, 80, 120])
@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("code_theme", ["monokai", "ansi_dark"])
def test_the_stream_keeps_every_character_of_every_cell(name: str, width: int, code_theme: str) -> None:
    out = io.StringIO()
    console = Console(file=out, width=width, height=60, force_terminal=True, color_system="standard")
    clock = FakeClock(now=0.0, step=0.001)
    renderer = MarkdownStream(console, clock=clock, refresh_per_second=20.0, reflow=True, code_theme=code_theme)
    text = "Here it is:\n\n" + TABLES[name] + "\nDone.\n"
    for piece in [text[i : i + 7] for i in range(0, len(text), 7)]:
        clock.tick()
        renderer.feed(piece)
    renderer.finish()
    term = Terminal(width, 60)
    term.feed(out.getvalue())
    _assert_every_cell_whole(term.lines(), name, width)


def test_a_table_that_fits_stays_a_table() -> None:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(markdown_renderable(TABLES["narrow"]))
    assert "東京" in out.getvalue() and ":" not in out.getvalue()  # columns, not "k: 1" lines


def test_a_table_too_wide_becomes_header_value_lines() -> None:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(markdown_renderable(TABLES["uuids"]))
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert f"a: {UUIDS[0]}" in lines and f"d: {UUIDS[3]}" in lines and f"a: {UUIDS[3]}" in lines


@pytest.mark.parametrize("width", [40, 80, 120])
def test_sessions_show_full_keeps_every_uuid_of_a_reply(width: int) -> None:
    from chatflow_cli.core.memory import TurnRecord
    from chatflow_cli.core.messages import Message
    from chatflow_cli.render import turn_renderables

    reply = Message.model(TABLES["uuids"], agent="Assistant")
    record = TurnRecord(number=1, messages=(Message.user("ids?"), reply), in_window=True)
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    for item in turn_renderables(record, markdown=True, full=True, width=width):
        console.print(item)
    _assert_every_cell_whole(out.getvalue().splitlines(), "uuids", width)
