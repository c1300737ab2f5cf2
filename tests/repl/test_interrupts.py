"""Interrupting the REPL: SIGHUP mid-answer and Ctrl-C while a long or huge reply arrives keep
what was received as an interrupted turn and say what was stored."""

from __future__ import annotations

import os
import re

from tests.helpers.pty_driver import leave, long_paragraph, notice
from tests.helpers.stored import open_store


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
    assert d.exit_code == 129  # as a one-shot chat hung up (128 + 1)
    session = d.store().get(d.store().latest_session_id())
    assert session.turn_count == 1
    partial = session.turns[0].messages[1]
    assert partial.interrupted and partial.content.startswith("word0 word1") and "word399" not in partial.content
    kinds = [e.type for e in d.store().events(session.session_id)]
    assert "turn.interrupted" in kinds and "session.recovered" not in kinds
    assert session.status.value == "idle"


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
    with open_store() as st:
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
    with open_store() as st:
        (record,) = st.load_turns("huge")
        reply = record.messages[-1]
        if "display stopped" in line:
            shown, total = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+)", line.split("(", 1)[1])[:2])
            assert not reply.interrupted and reply.content == para and total == len(para) and shown < total
            assert "/show prints it" in line
        else:
            assert "kept as interrupted" in line and reply.interrupted


def test_ctrl_c_before_any_reply_says_so_and_show_marks_the_turn(provider, pty_chatflow) -> None:
    """Ctrl-C while the model is still thinking keeps the turn (the user message) as interrupted,
    says that no reply had arrived, and ``/show`` marks it as ``sessions show`` does."""
    provider.add_text("too late", delay=[8.0])
    repl = pty_chatflow("chat", "-s", "early-stop")
    repl.wait_prompt()
    repl.send("hello\r")
    repl.wait_text("thinking")
    repl.send("\x03")
    repl.wait_prompt_after("the session is ready.")
    assert "⏹ interrupted: turn 1 was kept as interrupted before any reply arrived; the session is ready." in " ".join(
        repl.screen().split())
    repl.send("/show\r")
    repl.wait_prompt_after("(interrupted)")
    shown = repl.rows()
    turn = next(i for i, row in enumerate(shown) if row.startswith("── Turn 1"))
    assert shown[turn].startswith("── Turn 1 · interrupted ──")
    assert [row.rstrip() for row in shown[turn + 1:turn + 3]] == ["You: hello", "  (interrupted)"]
    leave(repl)


def test_ctrl_c_while_a_huge_reply_that_came_in_one_piece_is_drawn_stops_the_display(provider, pty_chatflow) -> None:
    """A 190 KB reply that arrives as one event, in the second turn: the display is drawn in
    slices with the keyboard read between them, so Ctrl-C stops it at once; the turn, which
    had arrived whole, stays stored complete and the notice says how much was shown."""
    para = long_paragraph(190_000)
    provider.add_text("a short first answer")
    provider.add_text(para, chunks=[para])
    repl = pty_chatflow("chat", "-s", "one-piece")
    repl.wait_prompt()
    repl.send("first\r")
    repl.wait_prompt_after("a short first answer")
    repl.send("go\r")
    repl.wait_text("alpha")
    repl.send("\x03")  # the terminal is not read meanwhile: the display cannot have finished
    repl.wait_prompt_after("⏹", timeout=60)
    line = notice(repl)
    leave(repl)
    assert "display stopped: turn 2 had arrived whole and is stored complete" in line, line
    shown, total = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+)", line.split("(", 1)[1])[:2])
    assert total == len(para) and shown < total
    assert "stopping" not in repl.screen().split("⏹", 1)[1]
    with open_store() as st:
        record = st.load_turns("one-piece")[-1]
        assert record.messages[-1].content == para and not record.messages[-1].interrupted


def test_ctrl_c_during_slash_compact_stops_it_at_once_and_stores_nothing(provider, pty_chatflow, chatflow) -> None:
    """/compact waits on the model; Ctrl-C cancels the request at once (the summary would take
    30 s), the session is released and no summary is stored."""
    for i in (1, 2):
        provider.add_text(f"answer {i}")
    provider.add_text("a summary too late", delay=[30.0])
    repl = pty_chatflow("chat", "-s", "compact-stop")
    repl.wait_prompt()
    for i in (1, 2):
        repl.send(f"question {i}\r")
        repl.wait_prompt_after(f"answer {i}")
    repl.send("/compact\r")
    repl.wait_text("compacting turns 1..1")
    repl.send("\x03")
    repl.wait_prompt_after("nothing was compacted; the session is ready.")
    leave(repl)
    shown = chatflow("sessions", "show", "compact-stop", "--json").json()
    assert shown["session"]["status"] == "idle" and shown["session"]["context"]["summary_through"] is None
    assert [t["number"] for t in shown["turns"]] == [1, 2]


def test_sigterm_mid_answer_keeps_the_partial_reply_says_so_and_exits_143(provider, pty_chatflow, chatflow) -> None:
    import signal

    words = [f"word{i} " for i in range(300)]
    provider.add_text("".join(words), chunks=words, delay=0.05)
    repl = pty_chatflow("chat", "-s", "term")
    repl.wait_prompt()
    repl.send("tell me a long story\r")
    repl.wait_text("word20")
    repl.child.kill(signal.SIGTERM)
    assert repl.wait_exit(timeout=30) == 143
    assert "terminated (SIGTERM)" in repl.screen()
    with open_store() as st:
        (record,) = st.load_turns("term")
        reply = record.messages[-1]
        assert reply.interrupted and reply.content.startswith("word0 word1") and "word299" not in reply.content
        kinds = [e.type for e in st.events("term")]
        assert "turn.interrupted" in kinds and "session.recovered" not in kinds
