"""chatflow's one terminal sanitizer, ``render.safe_text``: one table of every Unicode class
that can move a line, a cursor or the reading order, and what it becomes in body text and in
one-row fields (``sessions ls`` previews). The REPL's streamed Markdown, the piped reply,
``sessions show`` and ``sessions ls`` all go through it; the last tests run the real process."""

from __future__ import annotations

import unicodedata

import pytest

from chatflow_cli.render import BIDI_CONTROLS, safe_text

# (name, input, in body text, in a one-row field)
TABLE = [
    # line breaks
    ("LF", "a\nb", "a\nb", "a b"),
    ("CR LF", "a\r\nb", "a\nb", "a b"),
    ("lone CR (overwrites the line)", "a\rb", "a\u240db", "a\u240db"),
    ("U+2028 LINE SEPARATOR", "a\u2028b", "a\nb", "a b"),
    ("U+2029 PARAGRAPH SEPARATOR", "a\u2029b", "a\nb", "a b"),
    ("VT", "a\x0bb", "a\u240bb", "a\u240bb"),
    ("FF", "a\x0cb", "a\u240cb", "a\u240cb"),
    ("FS", "a\x1cb", "a\u241cb", "a\u241cb"),
    ("GS", "a\x1db", "a\u241db", "a\u241db"),
    ("RS", "a\x1eb", "a\u241eb", "a\u241eb"),
    ("NEL (C1)", "a\x85b", "a<U+0085>b", "a<U+0085>b"),
    # tab
    ("TAB", "a\tb", "a\tb", "a b"),
    # C0 controls and escape sequences
    ("NUL", "a\x00b", "a\u2400b", "a\u2400b"),
    ("BEL", "a\x07b", "a\u2407b", "a\u2407b"),
    ("BS", "a\x08b", "a\u2408b", "a\u2408b"),
    ("ESC CSI (clear screen)", "\x1b[2J", "\u241b[2J", "\u241b[2J"),
    ("ESC OSC 52 (clipboard)", "\x1b]52;c;eA==\x07", "\u241b]52;c;eA==\u2407", "\u241b]52;c;eA==\u2407"),
    ("ESC OSC 8 (hyperlink)", "\x1b]8;;http://x\x1b\\t", "\u241b]8;;http://x\u241b\\t", "\u241b]8;;http://x\u241b\\t"),
    ("US", "a\x1fb", "a\u241fb", "a\u241fb"),
    ("DEL", "a\x7fb", "a\u2421b", "a\u2421b"),
    # C1 controls
    ("C1 CSI U+009B", "\x9b31m", "<U+009B>31m", "<U+009B>31m"),
    ("C1 OSC U+009D", "\x9d0;t\x9c", "<U+009D>0;t<U+009C>", "<U+009D>0;t<U+009C>"),
    ("C1 U+0080", "\x80", "<U+0080>", "<U+0080>"),
    ("C1 U+009F", "\x9f", "<U+009F>", "<U+009F>"),
    # bidirectional controls
    ("ALM U+061C", "a\u061cb", "a<U+061C>b", "a<U+061C>b"),
    ("LRM U+200E", "a\u200eb", "a<U+200E>b", "a<U+200E>b"),
    ("RLM U+200F", "a\u200fb", "a<U+200F>b", "a<U+200F>b"),
    ("LRE U+202A", "\u202a", "<U+202A>", "<U+202A>"),
    ("RLE U+202B", "\u202b", "<U+202B>", "<U+202B>"),
    ("PDF U+202C", "\u202c", "<U+202C>", "<U+202C>"),
    ("LRO U+202D", "\u202d", "<U+202D>", "<U+202D>"),
    ("RLO U+202E (Trojan Source)", "\u202eevil", "<U+202E>evil", "<U+202E>evil"),
    ("LRI U+2066", "\u2066", "<U+2066>", "<U+2066>"),
    ("RLI U+2067", "\u2067", "<U+2067>", "<U+2067>"),
    ("FSI U+2068", "\u2068", "<U+2068>", "<U+2068>"),
    ("PDI U+2069", "\u2069", "<U+2069>", "<U+2069>"),
    # other format characters: printed, never obeyed by a terminal; needed by emoji and scripts
    ("ZWSP U+200B", "a\u200bb", "a\u200bb", "a\u200bb"),
    ("ZWNJ U+200C", "\u0645\u200c\u0627", "\u0645\u200c\u0627", "\u0645\u200c\u0627"),
    ("ZWJ emoji sequence", "\U0001f469\u200d\U0001f4bb", "\U0001f469\u200d\U0001f4bb", "\U0001f469\u200d\U0001f4bb"),
    ("variation selector", "\u2764\ufe0f", "\u2764\ufe0f", "\u2764\ufe0f"),
    ("tag characters (flag)", "\U0001f3f4\U000e0067\U000e0062\U000e007f", "\U0001f3f4\U000e0067\U000e0062\U000e007f",
     "\U0001f3f4\U000e0067\U000e0062\U000e007f"),
    ("SOFT HYPHEN", "co\u00adop", "co\u00adop", "co\u00adop"),
    ("BOM / ZWNBSP", "\ufeffa", "\ufeffa", "\ufeffa"),
    # not text at all
    ("lone surrogate", "a\ud800b", "a\ufffdb", "a\ufffdb"),
    # ordinary text
    ("letters, CJK, accents", "h\u00e9llo \u2713 \u4f60\u597d", "h\u00e9llo \u2713 \u4f60\u597d", "h\u00e9llo \u2713 \u4f60\u597d"),
]


@pytest.mark.parametrize(("name", "raw", "body", "row"), TABLE, ids=[row[0] for row in TABLE])
def test_every_class_in_body_text_and_in_a_one_row_field(name: str, raw: str, body: str, row: str) -> None:
    assert safe_text(raw) == body
    assert safe_text(raw, one_line=True) == row
    assert len(safe_text(raw, one_line=True).splitlines()) <= 1  # no tool splitting lines sees two rows


def test_no_control_character_survives_anywhere_in_unicode() -> None:
    """Every code point of category Cc, every bidi control and every line/paragraph separator
    is replaced; a one-row field never splits under ``str.splitlines``."""
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    body, row = safe_text(everything), safe_text(everything, one_line=True)
    for out in (body, row):
        leftovers = {
            f"U+{ord(ch):04X}"
            for ch in set(out)
            if (unicodedata.category(ch) in ("Cc", "Zl", "Zp") and ch not in "\n\t") or ord(ch) in BIDI_CONTROLS
        }
        assert not leftovers
    assert set(body) & {"\n", "\t"} == {"\n", "\t"}
    assert len(row.splitlines()) == 1 and "\t" not in row


def test_the_stream_sanitizer_joins_crlf_split_across_deltas() -> None:
    from chatflow_cli.render import TextSanitizer

    sanitizer = TextSanitizer()
    assert sanitizer.feed("a\r") + sanitizer.feed("\nb\x9b") + sanitizer.flush() == "a\nb<U+009B>"


# ------------------------------------------------------------------ through the real process
def test_sessions_ls_preview_is_one_row_when_piped(provider, chatflow) -> None:
    message = "first\u2028second\u2029third\tfourth\x85fifth\vsixth"
    assert chatflow("chat", "-s", "seps", message).returncode == 0
    assert chatflow("chat", "-s", "plain", "hello").returncode == 0
    result = chatflow("sessions", "ls")
    assert result.returncode == 0, result
    rows = result.stdout.splitlines()  # Python splits on U+2028, U+2029, NEL, VT... too
    assert len(rows) == 3, rows  # the header and one row a session
    (row,) = [r for r in rows if r.startswith("seps")]
    # The TITLE column holds the first line of the first message: U+2028 ends that line.
    assert row.split()[-1] == "first", row


def test_the_same_controls_show_the_same_live_piped_and_in_sessions_show(provider, chatflow, pty_chatflow) -> None:
    """One sanitizer: a C1 control and an LRM look the same in the REPL's live view, in a piped
    reply and in ``sessions show``."""
    reply = "c1 \x9b31m lrm a\u200eb rlo \u202eevil\u202c end"
    expected = "c1 <U+009B>31m lrm a<U+200E>b rlo <U+202E>evil<U+202C> end"
    provider.add_text(reply)
    piped = chatflow("chat", "-s", "ctl", "hi")
    assert expected in piped.stdout, piped
    provider.add_text(reply)
    repl = pty_chatflow("chat", "-s", "ctl2")
    repl.wait_prompt()
    repl.send("hi\r")
    repl.wait_prompt_after(" end")
    assert expected in repl.screen()
    repl.send("\x04")
    assert repl.wait_exit() == 0
    shown = pty_chatflow("sessions", "show", "ctl2", "--no-pager")
    assert shown.wait_exit() == 0
    assert expected in shown.screen()
    assert expected in chatflow("sessions", "show", "ctl", "--no-pager").stdout
