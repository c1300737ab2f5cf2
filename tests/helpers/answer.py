"""A long, realistic Markdown answer for the streaming renderer's tests and benchmark.

:func:`long_answer` builds ``lines`` source lines (1,500 by default) of headings,
one-line and multi-line paragraphs, tight and loose lists, block quotes, a paragraph taller
than half the screen and ``code_blocks`` fenced code blocks (Python, Bash, JSON, ...).
Every non-blank line carries a unique marker ``L0001``, ``L0002``... (one word, so that
wrapping never splits it) so a test can check that each line reaches the terminal exactly
once and in order. :func:`tokens` cuts a text into token-sized pieces like a model does.
"""

from __future__ import annotations

import random
import re
from collections import Counter

MARKER = re.compile(r"L\d{4}")

_WORDS = [
    "session",
    "turn",
    "window",
    "prune",
    "store",
    "event",
    "runner",
    "agent",
    "tool",
    "handoff",
    "stream",
    "token",
    "model",
    "context",
    "message",
    "history",
    "rollback",
    "sqlite",
    "journal",
    "replay",
    "cursor",
    "status",
    "lease",
    "owner",
]

_CODE = [
    ("python", "    value_{n} = compute({n}, limit=window)  # {m}"),
    ("bash", "echo \"{m} step {n}\" && chatflow chat -s s{n} 'ping'"),
    ("json", '  "{m}": {{"turn": {n}, "agent": "triage", "ok": true}},'),
    ("sql", "SELECT seq, type FROM chatflow_events WHERE seq > {n}; -- {m}"),
    ("rust", '    let x{n} = store.get("{m}").unwrap_or_default();'),
]


def long_answer(lines: int = 1500, code_blocks: int = 5, code_lines: int = 60, seed: int = 7) -> str:
    """Return a Markdown answer of exactly ``lines`` lines (``\\n``-separated, final newline)."""
    rng = random.Random(seed)
    out: list[str] = []
    counter = 0

    def marker() -> str:
        nonlocal counter
        counter += 1
        return f"L{counter:04d}"

    def words(k: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(k))

    budget_for_code = code_blocks * (code_lines + 3)
    prose_budget = lines - budget_for_code
    code_at = {int(prose_budget * (i + 1) / (code_blocks + 1)) for i in range(code_blocks)}
    block = 0
    tall_done = False
    while len(out) < prose_budget:
        if code_at and len(out) >= min(code_at):
            code_at.discard(min(code_at))
            lang, pattern = _CODE[block % len(_CODE)]
            block += 1
            out.append(f"```{lang}")
            for n in range(code_lines):
                out.append(pattern.format(n=n, m=marker()))
            out.append("```")
            out.append("")
            continue
        kind = rng.choice(["h", "p", "p", "p", "ul", "ol", "quote", "mp", "loose"])
        if not tall_done and len(out) > prose_budget // 3:
            kind, tall_done = "tall", True
        if kind == "h":
            out.append(f"{'#' * rng.randint(1, 3)} {marker()} {words(3).title()}")
        elif kind == "p":
            out.append(f"{marker()} The {words(4)} keeps `{rng.choice(_WORDS)}` and **{words(2)}** {words(3)}.")
        elif kind == "mp":
            for _ in range(rng.randint(2, 4)):
                out.append(f"{marker()} {words(6)}")
        elif kind == "tall":
            for _ in range(30):
                out.append(f"{marker()} {words(9)}")
        elif kind == "ul":
            for _ in range(rng.randint(3, 8)):
                out.append(f"- {marker()} {words(5)}")
                if rng.random() < 0.2:
                    out.append(f"  - {marker()} nested {words(3)}")
        elif kind == "ol":
            for i in range(rng.randint(3, 7)):
                out.append(f"{i + 1}. {marker()} {words(5)}")
        elif kind == "loose":
            for _ in range(rng.randint(2, 4)):
                out.append(f"- {marker()} {words(4)}")
                out.append("")
                out.append(f"  {marker()} continued {words(4)}")
                out.append("")
            out.pop()
        elif kind == "quote":
            for _ in range(rng.randint(1, 3)):
                out.append(f"> {marker()} {words(6)}")
        out.append("")
    del out[prose_budget:]
    while len(out) < prose_budget:
        out.append("")
    # Close the document with the remaining code blocks if the prose ran short.
    while code_at:
        code_at.discard(min(code_at))
        lang, pattern = _CODE[block % len(_CODE)]
        block += 1
        out.append(f"```{lang}")
        out.extend(pattern.format(n=n, m=marker()) for n in range(code_lines))
        out.append("```")
        out.append("")
    while len(out) < lines:
        out.append(f"{marker()} {words(5)}" if len(out) % 2 == 0 else "")
    out = out[:lines]
    # The cut must not leave a fence open or split a loose list.
    return "\n".join(out) + "\n"


def markers(text: str) -> list[str]:
    return MARKER.findall(text)


def tokens(text: str, seed: int = 3) -> list[str]:
    """Cut ``text`` into pieces of 1 to 7 characters (about 4 on average, like BPE tokens)."""
    rng = random.Random(seed)
    pieces: list[str] = []
    i = 0
    while i < len(text):
        k = rng.randint(1, 7)
        pieces.append(text[i : i + k])
        i += k
    return pieces


def assert_each_line_once(source: str, screen_text: str, *, at_least: bool = False) -> None:
    """Every marked line of ``source`` is on the screen exactly once and in order; with
    ``at_least`` it is enough that none is missing (a repeat is allowed)."""
    seen = Counter(markers(screen_text))
    wanted = markers(source)
    assert len(wanted) > 50, "the answer has too few marked lines to test anything"
    lost = [m for m in wanted if seen[m] == 0]
    assert not lost, f"{len(lost)} lines lost, e.g. {lost[:8]}"
    if not at_least:
        twice = {m: seen[m] for m in wanted if seen[m] > 1}
        assert not twice, f"{len(twice)} lines shown more than once, e.g. {dict(list(twice.items())[:8])}"
        assert markers(screen_text) == wanted, "lines out of order"
