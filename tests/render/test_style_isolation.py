"""Rendering on one console must not change how another console's output is coloured.

Rich caches a ``Style``'s ANSI codes on the object, for the colour system of the first
console that prints it, and shares ``Style`` objects process-wide (``Style + Style``,
``Style.parse`` are cached by ``lru_cache``: a code block's token style plus its background is
one such object). Markdown printed on a 256-colour console therefore made the REPL's
streamed code blocks, on a 16-colour console, come out in 256-colour codes (and the
other way round). chatflow's renderers print through private copies of those styles.

Each scenario runs in a fresh interpreter: Rich's caches live for the whole process, so
an earlier test could otherwise have primed them either way.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PRELUDE = """
import io
from rich.console import Console
from rich.markdown import Markdown
from rich.syntax import Syntax
from chatflow_cli.render.markdown_stream import MarkdownStream
from chatflow_cli.render.unpadded import print_unpadded
from chatflow_cli.render import markdown_renderable

CODE = "```python\\nvalue = compute(1, limit=window)\\n```\\n"

def console(system):
    return Console(file=io.StringIO(), width=60, height=24, force_terminal=True, color_system=system)

def stream(text, system, theme="monokai"):
    out = console(system)
    renderer = MarkdownStream(out, code_theme=theme, live=True, reflow=True)
    for piece in text.split(" "):
        renderer.feed(piece + " ")
    renderer.finish()
    return out.file.getvalue()
"""


def run(script: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def is_256(raw: str) -> bool:
    return "\x1b[38;5;" in raw or "\x1b[48;5;" in raw or ";38;5;" in raw or ";48;5;" in raw


def test_streamed_code_keeps_16_colours_after_markdown_renderable_on_256_colours() -> None:
    out = run(
        """
        console("256").print(markdown_renderable(CODE))
        print(repr(stream(CODE, "standard")))
        """
    )
    raw = eval(out)
    assert "\x1b[91;40m=" in raw and "\x1b[97;40mvalue" in raw, raw
    assert not is_256(raw), raw


def test_streamed_code_keeps_16_colours_after_rich_markdown_on_256_colours() -> None:
    """The stream does not depend on what other code printed before it, Rich included."""
    out = run(
        """
        console("256").print(Markdown(CODE, hyperlinks=False))
        print(repr(stream(CODE, "standard")))
        out = console("standard")
        print_unpadded(out, Syntax("value = 1", "python", theme="monokai"))
        print(repr(out.file.getvalue()))
        """
    )
    streamed, unpadded = (eval(line) for line in out.splitlines())
    assert "\x1b[97;40mvalue" in streamed and not is_256(streamed), streamed
    assert "\x1b[97;40mvalue" in unpadded and not is_256(unpadded), unpadded


def test_markdown_renderable_does_not_leave_its_colour_system_behind() -> None:
    out = run(
        """
        console("256").print(markdown_renderable(CODE))
        plain = console("standard")
        plain.print(Syntax("value = compute(1, limit=window)", "python", theme="monokai", padding=1))
        print(repr(plain.file.getvalue()))
        """
    )
    raw = eval(out)
    assert "\x1b[97;40mvalue" in raw and not is_256(raw), raw


def test_markdown_renderable_is_not_coloured_by_an_earlier_console() -> None:
    out = run(
        """
        console("standard").print(Markdown(CODE, hyperlinks=False))
        stream(CODE, "standard")
        rich_256 = console("256")
        rich_256.print(markdown_renderable(CODE))
        print(repr(rich_256.file.getvalue()))
        """
    )
    raw = eval(out)
    assert is_256(raw) and "\x1b[97;40m" not in raw, raw
