"""What a new user tripped on in the REPL, each through the real ``chatflow`` process in a
pseudo-terminal (tests/helpers/pty_driver.py) against the fake server, read back through the
VT emulator as a person would see it."""

from __future__ import annotations

import re
import time

import pytest

from tests.conftest import db_path


def user_texts(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


def sent(provider) -> list[str]:
    """The last user message of every chat request the fake server got."""
    return [user_texts(r)[-1] for r in provider.requests if isinstance(r, dict) and "messages" in r]


def store():
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    return SQLiteSessionStore(str(db_path()))


def chunked(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def leave(repl) -> None:
    repl.send("\x04")
    assert repl.wait_exit() == 0


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


# ------------------------------------------------------------------ 2. /retry after reopening
def test_retry_after_reopening_sends_the_failed_message_and_keeps_the_good_turn(provider, chatflow, pty_chatflow) -> None:
    assert chatflow("chat", "-s", "r1", "first").returncode == 0
    provider.add_error(400, {"error": {"message": "bad request", "type": "invalid_request_error"}})
    repl = pty_chatflow("chat", "-s", "r1")
    repl.wait_prompt()
    repl.send("the message that failed\r")
    repl.wait_prompt_after("error:")
    repl.send("/exit\r")
    assert repl.wait_exit() == 0

    repl = pty_chatflow("chat", "-s", "r1")
    repl.wait_text("your last message failed: /retry sends it again")
    repl.wait_prompt()
    repl.send("/retry\r")
    repl.wait_prompt_after("ok: the message that failed")
    screen = repl.screen()
    assert "rolled back" not in screen and "retrying turn 1" not in screen
    assert sent(provider) == ["first", "the message that failed", "the message that failed"]
    with store() as st:
        session = st.get("r1")
        assert session.turn_count == 2
        assert [t.messages[0].content for t in session.turns] == ["first", "the message that failed"]

    # Nothing failed now: /retry says so, and a completed turn is rolled back only when asked.
    repl.send("/retry\r")
    repl.wait_text("Nothing failed: turn 2 completed")
    repl.send("n\r")
    repl.wait_text("nothing was changed")
    leave(repl)
    assert len(sent(provider)) == 3
    with store() as st:
        assert st.get("r1").turn_count == 2


def test_retry_in_a_new_session_with_nothing_sent_says_nothing_failed(provider, pty_chatflow) -> None:
    repl = pty_chatflow("chat", "-s", "empty")
    repl.wait_prompt()
    repl.send("/retry\r")
    repl.wait_text("nothing failed: there is nothing to retry")
    leave(repl)
    assert sent(provider) == []


# ------------------------------------------------------------------ 5. type-ahead
def test_type_ahead_is_acted_on_in_every_turn_and_ctrl_d_as_a_reply_ends_leaves(provider, pty_chatflow) -> None:
    for n in range(3):
        words = [f"r{n}w{i} " for i in range(40)]
        provider.add_text("".join(words), chunks=words, delay=0.03)
    repl = pty_chatflow("chat", "-s", "ahead")
    repl.wait_prompt()
    repl.send("first\r")
    repl.wait_text("r0w3")
    repl.send("second question\r")  # typed and entered during the first turn's reply
    repl.wait_text("r1w3")
    repl.send("thi")
    repl.send("x\x7fr")  # editing keys act as at the prompt
    repl.send("d\r")
    repl.wait_text("r2w3")
    repl.send("\x04")  # Ctrl-D while the last reply is still arriving
    assert repl.wait_exit() == 0
    assert sent(provider) == ["first", "second question", "third"]
    assert "r2w39" in repl.screen()  # the reply ended before the REPL left
    assert "resume: chatflow chat -s ahead" in repl.screen()


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


# ------------------------------------------------------------------ 18. leaving and resuming
def test_leaving_prints_the_resume_command_and_resuming_recaps_the_last_exchange(provider, pty_chatflow) -> None:
    provider.add_text("The capital of France is Paris.")
    repl = pty_chatflow("chat", "-s", "trip")
    repl.wait_prompt()
    repl.send("capital of France?\r")
    repl.wait_prompt_after("Paris.")
    repl.send("\x04")
    assert repl.wait_exit() == 0
    assert repl.screen().splitlines()[-1] == "session trip (1 turn) · resume: chatflow chat -s trip"

    for args in (["chat", "-s", "trip"], ["chat", "-c"]):
        again = pty_chatflow(*args)
        again.wait_prompt()
        screen = again.screen()
        before_prompt = screen[: screen.rindex("\u203a")]
        assert "You: capital of France?" in before_prompt
        assert "The capital of France is Paris." in before_prompt
        leave(again)


def test_the_recap_of_a_tall_last_turn_keeps_the_message_and_the_end_of_the_reply(provider, chatflow, pty_chatflow) -> None:
    reply = "\n".join(f"line {n} of the answer" for n in range(1, 41))
    provider.add_text(reply)
    assert chatflow("chat", "-s", "tall", "a long one please").returncode == 0
    repl = pty_chatflow("chat", "-s", "tall", width=60, height=24)
    repl.wait_prompt()
    rows = repl.rows()
    leave(repl)
    recap = rows[: next(i for i, row in enumerate(rows) if "\u203a" in row)]
    stripped = [row.strip() for row in recap]
    assert "You: a long one please" in recap and "line 40 of the answer" in stripped
    assert not any(row.endswith("line 1 of the answer") for row in stripped)
    assert any(re.fullmatch(r"  … \d+ rows more; /show prints the whole turn", row) for row in recap)
    banner = next(i for i, row in enumerate(recap) if row.startswith("──"))
    assert len(recap) - banner <= 12 + 1  # half the screen, and a blank line before the prompt


def test_leaving_a_session_never_used_says_nothing_was_stored(provider, pty_chatflow) -> None:
    repl = pty_chatflow("chat")
    repl.wait_prompt()
    leave(repl)
    assert repl.screen().splitlines()[-1] == "nothing was sent; no session was stored"


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


def test_slash_tab_typed_fast_inserts_the_only_match(provider, pty_chatflow, chatflow) -> None:
    assert chatflow("chat", "-s", "other", "hi").returncode == 0
    repl = pty_chatflow("chat", "-s", "tabs")
    repl.wait_prompt()
    time.sleep(0.3)  # the prompt is idle, as a person's would be
    repl.send("/sw\t")  # in one write: the completion started by typing has not finished
    repl.wait_raw("/switch")
    repl.send(" other\r")
    repl.wait_text("session other: 1 turn")
    leave(repl)


def test_did_you_mean_reads_as_a_sentence(provider, pty_chatflow) -> None:
    repl = pty_chatflow("chat", "-s", "typo")
    repl.wait_prompt()
    repl.send("/claer\r")
    repl.wait_text("did you mean /clear?")
    leave(repl)
    line = next(row for row in repl.screen().splitlines() if "did you mean" in row)
    assert "?;" not in line
    assert line == "error: unknown command /claer — did you mean /clear? (/help lists them; start a message with // to send a slash)"
    assert sent(provider) == []


# ------------------------------------------------------------------ 4. a long paragraph, Ctrl-C
def notice(repl) -> str:
    """The ``⏹`` notice (it may wrap over several rows), as one line."""
    after = repl.screen().split("\u23f9", 1)[1]
    return "\u23f9" + " ".join(after.split("\n\n", 1)[0].split())


def long_paragraph(chars: int, seed: int = 3) -> str:
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "**bold words**", "`a code span`", "*italic*", "epsilon", "zeta",
             "international", "x" * 30, "theta,", "iota."]
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out) + " END."


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


def test_ctrl_c_while_a_long_reply_arrives_stops_at_once_and_keeps_what_was_received(provider, pty_chatflow) -> None:
    head = long_paragraph(60_000)
    tail = [f" late{i}" for i in range(200)]
    provider.add_text(head + "".join(tail), chunks=[head[i : i + 8] for i in range(0, len(head), 8)] + tail,
                      delay=[0.0] * ((len(head) + 7) // 8) + [0.1] * len(tail))
    repl = pty_chatflow("chat", "-s", "stop")
    repl.wait_prompt()
    repl.send("go\r")
    repl.wait_text("alpha")
    repl.send("\x03")
    repl.wait_prompt_after("⏹ interrupted")
    line = notice(repl)
    received, shown = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+) characters", line))
    assert shown <= received
    after = repl.screen().split("⏹ interrupted", 1)[1]
    assert "late" not in after and "END." not in after  # the display stopped there
    leave(repl)
    with store() as st:
        (record,) = st.load_turns("stop")
        reply = record.messages[-1]
        assert reply.interrupted and len(reply.content) == received
        assert st.events("stop")[-1].type != "turn.completed"
        assert any(e.type == "turn.interrupted" for e in st.events("stop"))


def test_ctrl_c_after_a_huge_reply_arrived_at_once_says_what_was_stored(provider, pty_chatflow) -> None:
    """190 KB arriving at once: Ctrl-C while the screen catches up stops the display and says
    what was kept — the turn is stored complete when the model had finished (the REPL says
    how much it showed), else interrupted with what was received."""
    para = long_paragraph(190_000)
    provider.add_text(para, chunks=[para[i : i + 16] for i in range(0, len(para), 16)])
    repl = pty_chatflow("chat", "-s", "huge")
    repl.wait_prompt()
    repl.send("go\r")
    repl.wait_text("alpha")
    repl.send("\x03")
    repl.wait_prompt_after("⏹", timeout=60)
    line = notice(repl)
    leave(repl)
    with store() as st:
        (record,) = st.load_turns("huge")
        reply = record.messages[-1]
        if "display stopped" in line:
            shown, total = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+)", line.split("(", 1)[1])[:2])
            assert not reply.interrupted and reply.content == para and total == len(para) and shown < total
            assert "/show prints it" in line
        else:
            assert "kept as interrupted" in line and reply.interrupted


# ------------------------------------------------------------------ /switch and /new: the session's model
def test_switch_talks_to_the_other_sessions_model_and_new_to_the_default(provider, chatflow, pty_chatflow) -> None:
    """``/switch ID`` uses the model stored with ID (as ``chatflow chat -s ID`` does) and says
    so; ``/new`` goes back to the configured model; each session keeps its own."""
    assert chatflow("chat", "-s", "sa", "-m", "model-a", "one").returncode == 0
    assert chatflow("chat", "-s", "sb", "-m", "model-b", "two").returncode == 0
    repl = pty_chatflow("chat", "-s", "sa")
    repl.wait_prompt()
    repl.send("/switch sb\r")
    repl.wait_prompt_after("model: model-b (session sb)")
    repl.send("three\r")
    repl.wait_for(lambda: sent(provider)[-1:] == ["three"], what="the message after /switch")
    repl.wait_prompt(count=3)
    assert provider.requests[-1]["model"] == "model-b"
    repl.send("/switch sa\r")
    repl.wait_prompt_after("model: model-a (session sa)")
    repl.send("four\r")
    repl.wait_for(lambda: sent(provider)[-1:] == ["four"], what="the message after /switch back")
    assert provider.requests[-1]["model"] == "model-a"
    repl.wait_prompt(count=5)
    repl.send("/new\r")
    repl.wait_prompt_after("model: fake-model (a new session)")
    repl.send("five\r")
    repl.wait_for(lambda: sent(provider)[-1:] == ["five"], what="the message in the new session")
    assert provider.requests[-1]["model"] == "fake-model"
    repl.wait_prompt(count=7)
    leave(repl)
    assert store().session_endpoint("sa")[0] == "model-a"
    assert store().session_endpoint("sb")[0] == "model-b"
