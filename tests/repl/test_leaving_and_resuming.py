"""Leaving the REPL prints the command that resumes the session; resuming recaps the last
exchange; a session never used says nothing was stored."""

from __future__ import annotations

import re

from tests.helpers.pty_driver import leave


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


def test_a_killed_repl_still_resumes_at_the_model_and_endpoint_it_talked_to(chatflow, fake_server, pty_chatflow,
                                                                            monkeypatch) -> None:
    """The REPL stores a session's model and endpoint after each turn, not only when it exits:
    a REPL killed (or whose terminal closed) after a turn resumes at the same server and model."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("CHATFLOW_MODEL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    repl = pty_chatflow("chat", "-s", "killed", "--base-url", fake_server.url, "-m", "model-k")
    repl.wait_prompt()
    fake_server.add_text("the first reply")
    repl.send("first\r")
    repl.wait_prompt_after("the first reply")
    repl.child.kill(9)
    repl.child.wait()
    resumed = chatflow("chat", "-s", "killed", "second")  # no flags, no environment: the session's own
    assert resumed.returncode == 0, resumed
    assert [q["model"] for q in fake_server.requests] == ["model-k", "model-k"]


def test_the_repl_says_system_and_max_turns_are_not_applied_to_an_existing_session(provider, chatflow,
                                                                                   pty_chatflow) -> None:
    """As one-shot ``chat`` does: an existing session keeps its window and system prompt, and
    the REPL says so before its banner rather than ignoring the flags."""
    assert chatflow("chat", "-s", "kept", "--max-turns", "5", "first").returncode == 0
    repl = pty_chatflow("chat", "-s", "kept", "--system", "be terse", "--max-turns", "2", width=200)
    repl.wait_prompt()
    screen = repl.screen()
    leave(repl)
    banner = screen.index("chatflow · session kept")
    assert screen.index("chatflow: --max-turns 2 not applied: it sets up a new session, and kept keeps its window "
                        "of 5 turns") < banner
    assert screen.index("chatflow: --system not applied: it sets up a new session, and kept keeps its system "
                        "prompt") < banner
    again = pty_chatflow("chat", "-s", "kept", "--max-turns", "5")  # what it has: nothing to say
    again.wait_prompt()
    assert "not applied" not in again.screen()
    leave(again)


def test_the_recap_marks_an_interrupted_last_turn(provider, pty_chatflow) -> None:
    provider.add_text("too late", delay=[8.0])
    repl = pty_chatflow("chat", "-s", "cut-short")
    repl.wait_prompt()
    repl.send("hello\r")
    repl.wait_text("thinking")
    repl.send("\x03")
    repl.wait_prompt_after("the session is ready.")
    leave(repl)
    again = pty_chatflow("chat", "-s", "cut-short")
    again.wait_prompt()
    rows = [row.rstrip() for row in again.rows()]
    leave(again)
    turn = next(i for i, row in enumerate(rows) if row.startswith("── Turn 1"))
    assert rows[turn].startswith("── Turn 1 · interrupted ──")
    assert rows[turn + 1:turn + 3] == ["You: hello", "  (interrupted)"]


def test_on_a_narrow_terminal_the_resume_command_stays_whole_on_its_own_line(provider, pty_chatflow) -> None:
    repl = pty_chatflow("chat", "-s", "w17", width=40)
    repl.wait_prompt()
    repl.send("hello\r")
    repl.wait_prompt_after("ok: hello")
    repl.send("\x04")
    assert repl.wait_exit() == 0
    rows = [row.rstrip() for row in repl.rows() if row.strip()]
    assert rows[-2:] == ["session w17 (1 turn) · resume with:", "chatflow chat -s w17"]


def test_the_repl_asks_only_for_tool_results_not_yet_given(provider, chatflow, config_file, pty_chatflow) -> None:
    """A turn waits on two custom tools, one answered with ``chat --tool-result``: the REPL
    asks for the other one only, then the turn goes on with both results."""
    from tests.helpers.config import CUSTOM_TOOLS

    config_file(CUSTOM_TOOLS)
    provider.add_tool_calls([("call_B", "approve_refund", '{"order_id": "1"}'), ("call_E", "notify", "{}")])
    assert chatflow("chat", "-s", "half", "refund").returncode == 0
    assert chatflow("chat", "-s", "half", "--tool-result", "call_B", "yes").returncode == 0
    provider.add_text("Refunded and notified.")
    repl = pty_chatflow("chat", "-s", "half")
    repl.wait_prompt()
    recap = " ".join(repl.screen().split())  # the recap shows call_B's result as given
    assert "result: yes (submitted; the turn goes on once every call has its result)" in recap, recap
    assert recap.count("(waiting for --tool-result)") == 1
    repl.send("and now?\r")
    repl.wait_text("notify result")
    repl.send("sent\r")
    repl.wait_prompt_after("Refunded and notified.")
    screen = repl.screen()
    leave(repl)
    assert "approve_refund result" not in screen and "already has a result" not in screen
    sent = [m for m in provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in sent] == [("call_B", "yes"), ("call_E", "sent")]
