"""``sessions show`` on a terminal: the fast Markdown layout and batched output (issue 5).

The speed itself is measured by tests/benchmarks/bench_cli.py; these tests check that the
fast paths show the same thing Rich's Markdown shows, fall back to Rich for what they do
not cover, and write a long session in a few large writes.
"""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatflow_cli.core.memory import TurnRecord
from chatflow_cli.core.messages import Message, ToolCall
from chatflow_cli.render import Lines, has_markdown, markdown_lines, markdown_renderable, turn_renderables
from chatflow_cli.render.markdown import Trimmed


def _rich_plain(text: str, width: int) -> str:
    """Rich's Markdown layout of ``text`` as chatflow parses it (single line breaks kept)."""
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(markdown_renderable(text))
    return _normal(console.file.getvalue())


def _normal(text: str) -> str:
    """Rich pads every line to the width and starts a leading list with a blank line."""
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def _ours(text: str, width: int) -> str | None:
    lines = markdown_lines(text, width)
    return None if lines is None else _normal("\n".join(line.plain for line in lines))


SIMPLE = [
    "Order **7** is in transit:\n\n- hub 3\n- arrives `tomorrow`\n\nAnything else?",
    "1. one\n2. two long item that wraps around the width of forty cells\n\nend *em* ~~s~~ a\nb",
    "- a\n  - nested item that is long enough to wrap around the width\n  - c\n- d",
    "8. x\n9. y\n10. z",
    "word " * 30,
    "a **bold phrase that is long** and `code span here` with _under_ and ***both***.",
    "line one  \nline two\\\nline three",
    "supercalifragilisticexpialidocious" * 3,
    "Tom &amp; Jerry \\*not em\\*",
    "x\n\n\n\ny",
    "- a\n- b\n\n1. c\n2. d",
    "中文字符测试 " * 12,
]
FALLBACK = ["# Heading", "see [link](http://x)", "- item\n\n- loose", "```\ncode\n```", "> quote", "a | b\n--|--\n1 | 2",
            "---", "<b>html</b>", "![img](x.png)"]


@pytest.mark.parametrize("width", [30, 80])
@pytest.mark.parametrize("text", SIMPLE)
def test_markdown_lines_shows_what_rich_shows(text, width):
    assert _ours(text, width) == _rich_plain(text, width)


@pytest.mark.parametrize("text", FALLBACK)
def test_markdown_lines_leaves_the_rest_to_rich(text):
    assert markdown_lines(text, 80) is None


_WORD = st.sampled_from(["order", "42", "hub", "in", "transit", "très", "tomorrow", "ok.", "x" * 25, "中文"])
_SPAN = st.one_of(
    _WORD,
    _WORD.map(lambda w: f"**{w}**"),
    _WORD.map(lambda w: f"*{w}*"),
    _WORD.map(lambda w: f"`{w}`"),
    _WORD.map(lambda w: f"~~{w}~~"),
)
_LINE = st.lists(_SPAN, min_size=1, max_size=12).map(" ".join)
_BLOCK = st.one_of(
    st.lists(_LINE, min_size=1, max_size=3).map("\n".join),
    st.lists(_LINE, min_size=1, max_size=4).map(lambda items: "\n".join(f"- {i}" for i in items)),
    st.tuples(st.integers(1, 12), st.lists(_LINE, min_size=1, max_size=4)).map(
        lambda t: "\n".join(f"{t[0] + k}. {i}" for k, i in enumerate(t[1]))),
    st.tuples(_LINE, st.lists(_LINE, min_size=1, max_size=3)).map(
        lambda t: f"- {t[0]}\n" + "\n".join(f"  - {i}" for i in t[1])),
)


@settings(max_examples=150, deadline=None)
@given(blocks=st.lists(_BLOCK, min_size=1, max_size=4), width=st.integers(12, 120))
def test_markdown_lines_matches_rich_on_generated_answers(blocks, width):
    text = "\n\n".join(blocks)
    ours = _ours(text, width)
    if ours is None:  # only a loose list (two lists of one kind in a row make one) is left to Rich
        from markdown_it import MarkdownIt

        tokens = MarkdownIt().enable("strikethrough").enable("table").parse(text)
        assert any(t.type == "paragraph_open" and not t.hidden and t.level > 0 for t in tokens), text
        return
    assert ours == _rich_plain(text, width), text


def test_markdown_lines_styles_as_rich_does():
    [line] = markdown_lines("a **b** *c* `d` ~~e~~", 80)
    assert ("b", "bold") in line.parts and ("c", "italic") in line.parts
    assert ("d", "bold cyan on black") in line.parts and ("e", "strike") in line.parts
    bullet, number = markdown_lines("- x", 80)[0], markdown_lines("1. y", 80)[0]
    assert bullet.parts[0] == (" • ", "bold") and number.parts[0] == (" 1 ", "cyan")
    ansi = line.ansi("256")
    assert "\x1b[1mb\x1b[0m" in ansi and "\x1b[1;36;40md\x1b[0m" in ansi


def test_has_markdown():
    for text in ("Hello there.", "It costs $5, 10% off!", "see 3.5 and 2-3", "", None):
        assert not has_markdown(text), text
    for text in ("It is **4**.", "a\n- b", "1. first", "    code", "x\n---", "a_b", "# h", "[l](u)", "a\n===",
                 "&amp;", "<b>", "~~s~~", "x\\y", "> q", "a | b"):
        assert has_markdown(text), text


def test_markdown_renderable_shares_one_parser_and_renders_as_rich():
    from rich.console import Console
    from rich.markdown import Markdown

    text = "# Title\n\nsee [the docs](http://example.com) and\n\n```\ncode\n```"
    a, b = markdown_renderable(text), markdown_renderable("other")
    assert a.markup == text and b.markup == "other" and a.parsed != b.parsed

    def render(item):
        console = Console(file=io.StringIO(), width=60, color_system="256", force_terminal=True)
        console.print(item)
        return console.file.getvalue()

    assert render(a) == render(Markdown(text, hyperlinks=False))
    assert "\x1b]8;" not in render(a), "links are shown as text (url), not OSC 8 hyperlinks"


def _turn(number: int, answer: str) -> TurnRecord:
    call = ToolCall(f"c{number}", "check_order_status", '{"order_id": "%d"}' % number)
    return TurnRecord(
        number=number,
        messages=(
            Message.user(f"where is {number}?"),
            Message.model(None, [call], agent="Assistant"),
            Message.tool(call.id, "step 1\nstep 2", name=call.name),
            Message.model(answer, agent="Assistant"),
        ),
        in_window=True,
    )


def test_terminal_turns_use_rich_markdown_only_where_needed():
    simple = turn_renderables(_turn(1, "Order **1**:\n\n- hub\n- `tomorrow`"), markdown=True, width=80)
    assert all(isinstance(item, Lines) for item in simple)
    text = "\n".join(item.plain for item in simple)
    assert "\nAssistant:\nOrder 1:\n\n • hub\n • tomorrow\n" in text  # the reply starts on its own line
    assert " • hub" in text and "**" not in text and "`" not in text
    plain = turn_renderables(_turn(2, "Hello there,\nall good."), markdown=True, width=80)
    assert "Assistant: Hello there,\n           all good." in "\n".join(item.plain for item in plain)
    heading = turn_renderables(_turn(3, "# Done\n\nok"), markdown=True, width=80)
    assert any(isinstance(item, Trimmed) and type(item.inner).__name__ == "Markdown" for item in heading)


class _CountingTTY(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.flushes_with_text: list[int] = []

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)

    def isatty(self) -> bool:
        return True


def _Session():
    """A real stored-session summary: the renderer reads it as it reads the store's."""
    from chatflow_cli.core.events import SessionStatus
    from chatflow_cli.core.memory.protocol import SessionSummary

    return SessionSummary(session_id="long", active_agent_name="Assistant", status=SessionStatus.IDLE,
                          turn_count=300, max_turns=40, created_at=0.0, updated_at=0.0, preview="", metadata={})


def test_long_session_goes_out_in_a_few_large_writes_first_turns_at_once():
    from chatflow_cli.context import Env
    from chatflow_cli.commands.sessions import BATCH_CHARS, _render

    out = _CountingTTY()
    env = Env(stdout=out, stdout_isatty=True, color=True)
    console = env.console()
    seen_after_first: list[str] = []

    def records():
        for n in range(1, 301):
            if n == 2:  # turn 1 must already be out when turn 2 is being read
                seen_after_first.append(out.getvalue())
            yield _turn(n, f"Order **{n}** is in transit:\n\n- hub {n % 7}\n- arrives `tomorrow`\n\nAnything else?")

    _render(console, _Session(), records(), False, markdown=True, out=out)
    shown = out.getvalue()
    assert "Turn 1 " in seen_after_first[0] and "Order \x1b[1m1\x1b[0m" in seen_after_first[0]
    assert re.search(r"Turn 300 ", shown) and shown.count("── Turn ") == 300
    assert len(shown) > BATCH_CHARS
    assert out.writes <= 3 + len(shown) // BATCH_CHARS + 1, out.writes  # not one write per line or item
    assert console.file is out, "the console writes to the terminal again afterwards"
