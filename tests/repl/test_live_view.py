"""The REPL's live view looks as ``sessions show`` draws the same turn: streamed tables, single
line breaks, long paragraphs, narrow terminals, the banner and the spacing around prompts. Each
runs the real ``chatflow`` process in a pseudo-terminal (tests/helpers/pty_driver.py) against
the fake server, read back through the VT emulator as a person would see it."""

from __future__ import annotations

import re

import pytest

from tests.helpers.pty_driver import chunked, leave, long_paragraph


# ------------------------------------------------------------------ 1. streamed tables
@pytest.mark.parametrize("rows", [4, 29])
def test_a_streamed_table_looks_as_in_sessions_show(provider, pty_chatflow, rows: int) -> None:
    """A table arriving a few characters at a time (its columns widen as rows come) is drawn
    as ``sessions show`` draws it: short tables redrawn live, tall ones held until complete."""
    table = "Here:\n\n| name | value |\n|---|---|\n"
    table += "".join(f"| row{i} | {'x' * i} |\n" for i in range(1, rows + 1)) + "\nafter\n"
    provider.add_text(table, chunks=chunked(table), delay=0.003)
    repl = pty_chatflow("chat", "-s", "tab", width=100, height=24)
    repl.wait_prompt()
    repl.send("hello\r")
    repl.wait_prompt_after("after")
    leave(repl)
    live = repl.rows()
    show = pty_chatflow("sessions", "show", "tab", "--no-pager", width=100, height=24)
    assert show.wait_exit() == 0
    shown = show.rows()
    start = next(i for i, row in enumerate(shown) if "name" in row and "value" in row)
    table_rows = [row for row in shown[start:] if row.startswith(" ")]
    assert len(table_rows) == rows + 2  # header, rule, rows
    rule = table_rows[1].strip()
    assert set(rule) == {"─"} and len(rule) >= max(len(row.strip()) for row in table_rows[2:])
    at = live.index(table_rows[0])
    assert live[at : at + len(table_rows)] == table_rows  # the same rows, the same widths
    assert sum(1 for row in live if set(row.strip()) == {"─"}) == 1  # one rule: the table printed once


# ------------------------------------------------------------------ 15. single line breaks
def test_single_line_breaks_are_kept_live_and_in_sessions_show(provider, pty_chatflow) -> None:
    reply = "Rows:\nname,qty\napples,3\npears,5\n\nRoses are **red**,\nviolets are blue.\n"
    provider.add_text(reply, chunks=chunked(reply, 2), delay=0.002)
    repl = pty_chatflow("chat", "-s", "breaks")
    repl.wait_prompt()
    repl.send("csv please\r")
    repl.wait_prompt_after("violets are blue.")
    leave(repl)
    expected = ["Rows:", "name,qty", "apples,3", "pears,5", "", "Roses are red,", "violets are blue."]
    live = repl.rows()
    at = live.index("Rows:")
    assert live[at : at + len(expected)] == expected
    show = pty_chatflow("sessions", "show", "breaks", "--no-pager")
    assert show.wait_exit() == 0
    shown = show.rows()
    at = shown.index("Rows:")
    assert shown[at : at + len(expected)] == expected


# ------------------------------------------------------------------ 17. narrow terminals
LONG_QUESTION = "first line of a fairly long question about internationalization\nsecond line\nthird line"
LONG_REPLY = ("The international telecommunications standardization organisations collaborate "
              "extensively.\nSecond line of the reply stays on its own line.")


def _words_whole(rows: list[str], texts: list[str]) -> None:
    words = {w for text in texts for w in re.findall(r"[A-Za-z]{4,}", text)}
    seen = {w for row in rows for w in re.findall(r"[A-Za-z]+", row)}
    assert words <= seen, f"cut words: {sorted(words - seen)}\n" + "\n".join(rows)


def test_sessions_show_and_replay_at_40_columns_never_cut_a_word(provider, chatflow, pty_chatflow) -> None:
    provider.add_text(LONG_REPLY)
    assert chatflow("chat", "-s", "narrow", LONG_QUESTION).returncode == 0
    show = pty_chatflow("sessions", "show", "narrow", "--no-pager", width=40, height=30)
    assert show.wait_exit() == 0
    rows = show.rows()
    _words_whole(rows, [LONG_QUESTION, LONG_REPLY])
    assert "     second line" in rows and "     third line" in rows  # under the message, not at column 0
    replay = pty_chatflow("replay", "narrow", width=40, height=30)
    assert replay.wait_exit() == 0
    rows = replay.rows()
    _words_whole(rows, [LONG_QUESTION, LONG_REPLY])
    assert all(len(row) <= 40 for row in rows)
    assert "      second line" in rows  # continuation lines under the event type
    assert not any(row.startswith("second line") or row.startswith("third line") for row in rows)


# ------------------------------------------------------------------ 19. polish
@pytest.mark.parametrize("width", [100, 40])
def test_the_banner_never_cuts_a_word(provider, pty_chatflow, width: int) -> None:
    repl = pty_chatflow("chat", "-s", "a-rather-long-session-name-here", width=width)
    repl.wait_prompt()
    rows = repl.rows()
    leave(repl)
    banner = rows[: next(i for i, row in enumerate(rows) if "\u203a" in row)]
    text = " ".join(banner)
    for word in ("chatflow", "session", "a-rather-long-session-name-here", "Assistant", "fake-model", "Enter",
                 "sends", "Esc-Enter", "line", "/help", "Ctrl-D", "leaves"):
        assert re.search(rf"(^|\s){re.escape(word)}(\s|$)", text), (word, banner)
    assert all(len(row) <= width for row in banner)


def test_a_blank_line_between_a_reply_and_the_next_prompt(provider, pty_chatflow) -> None:
    provider.add_text("Short answer.")
    repl = pty_chatflow("chat", "-s", "gap")
    repl.wait_prompt()
    repl.send("q\r")
    repl.wait_prompt_after("Short answer.")
    rows = repl.rows()
    at = rows.index("Short answer.")
    assert rows[at + 1] == "" and "\u203a" in rows[at + 2]
    leave(repl)


def test_continuation_lines_in_show_are_under_the_message(provider, pty_chatflow) -> None:
    repl = pty_chatflow("chat", "-s", "multi")
    repl.wait_prompt()
    repl.send("\x1b[200~line one\nline two\nline three\x1b[201~\r")  # a pasted three-line message
    repl.wait_prompt_after("ok: line one")
    repl.send("/show\r")
    repl.wait_prompt_after("Turn 1")
    rows = repl.rows()
    leave(repl)
    at = rows.index("You: line one")
    assert rows[at + 1 : at + 3] == ["     line two", "     line three"]


def test_one_long_paragraph_looks_the_same_live_and_in_sessions_show(provider, pty_chatflow) -> None:
    """The live view prints a long paragraph's final rows as it goes (each refresh costs the
    same however long it grows) and ends up exactly as ``sessions show`` draws it."""
    para = long_paragraph(30_000)
    provider.add_text("Intro line.\n\n" + para + "\n\nLast paragraph.", chunks=None)
    repl = pty_chatflow("chat", "-s", "para", width=100, height=24)
    repl.wait_prompt()
    repl.send("go\r")
    repl.wait_prompt_after("Last paragraph.", timeout=120)
    leave(repl)
    live = repl.rows()
    show = pty_chatflow("sessions", "show", "para", "--no-pager", width=100, height=24)
    assert show.wait_exit() == 0
    shown = show.rows()
    a, b = shown.index("Intro line."), shown.index("Last paragraph.")
    c = live.index("Intro line.")
    assert live[c : c + b - a + 1] == shown[a : b + 1]


def test_replies_with_tables_at_either_end_look_the_same_live_in_show_and_sessions_show(provider, chatflow,
                                                                                          pty_chatflow) -> None:
    """A table that opens or ends a reply, or sits between paragraphs, has one blank row
    around it, live, in ``/show`` and in ``sessions show`` alike (Rich's Markdown would add
    two, and a blank row under the ``Assistant:`` label)."""
    reply = ("| name | qty |\n|---|---|\n| apple | 3 |\n| pear | 10 |\n\nBetween the tables.\n\n"
             "| k | v |\n|---|---|\n| x | 1 |")
    provider.add_text(reply, chunks=[reply[i:i + 7] for i in range(0, len(reply), 7)])
    repl = pty_chatflow("chat", "-s", "tables")
    repl.wait_prompt()
    repl.send("tables\r")
    repl.wait_prompt_after("Between the tables.")
    live = repl.rows()
    start = next(i for i, row in enumerate(live) if row.strip().startswith("name"))
    end = max(i for i, row in enumerate(live) if row.strip().startswith("x"))
    drawn = [row.rstrip() for row in live[start:end + 1]]
    assert drawn == [" name   qty", " ──────────", " apple  3", " pear   10", "", "Between the tables.", "",
                     " k  v", " ────", " x  1"]
    repl.send("/show\r")
    repl.wait_text(" x  1", count=2)
    repl.wait_prompt_after("Turn 1")
    rows = [row.rstrip() for row in repl.rows()]
    leave(repl)
    label = rows.index("Assistant:")
    assert rows[label + 1:label + 1 + len(drawn)] == drawn
    assert rows[label + 1 + len(drawn)] == ""

    show = pty_chatflow("sessions", "show", "tables", "--no-pager")
    assert show.wait_exit() == 0
    shown = [row.rstrip() for row in show.rows()]
    label = shown.index("Assistant:")
    assert shown[label + 1:label + 1 + len(drawn)] == drawn
