"""``Lines.wrapped``: word-wrapping for a terminal never joins two words nor splits one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chatflow_cli.render import Lines


def test_a_space_with_no_room_left_on_the_row_still_separates_the_words() -> None:
    line = Lines("context 124 tokens (budget unknown) · 5 turns sent")
    assert line.wrapped(38).plain == "context 124 tokens (budget unknown) ·\n5 turns sent"
    assert line.wrapped(37).plain == "context 124 tokens (budget unknown) ·\n5 turns sent"


@settings(max_examples=300, deadline=None)
@given(words=st.lists(st.text(alphabet="abcdefgh·", min_size=1, max_size=12), min_size=1, max_size=30),
       width=st.integers(min_value=13, max_value=60))
def test_wrapping_keeps_every_word_whole_and_apart(words: list[str], width: int) -> None:
    text = " ".join(words)
    rows = Lines(text).wrapped(width).plain.split("\n")
    assert all(len(row) <= width for row in rows)
    assert " ".join(rows).split() == words
