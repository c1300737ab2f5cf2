"""The REPL (issue 6), driven through prompt-toolkit's pipe input against the fake server.

Every test runs the real ``run_repl`` on a real SQLite file, with the real Runner and
model client talking HTTP to tests/helpers/fakeserver.py; keys are typed as a terminal sends them
(``\\r`` for Enter, ``\\x1b\\r`` for Esc-Enter, ``\\x03`` for Ctrl-C, ``\\x04`` for Ctrl-D,
``\\x1b[200~...\\x1b[201~`` for a bracketed paste).
"""

from __future__ import annotations

import stat
import time
from typing import ClassVar

from chatflow_cli.core.messages import Role, check_history
from chatflow_cli.repl import ABANDON_AFTER_S
from tests.helpers.repl_driver import recording_output
from tests.helpers.sent import user_texts
from tests.repl import tools_for_repl
from tests.repl.tools_for_repl import lookup_agent


def only_session(d) -> str:
    sessions = d.store().list_sessions()
    assert len(sessions) == 1
    return sessions[0].session_id


def test_three_line_paste_is_one_message_sent_only_on_enter(repl_driver) -> None:
    d = repl_driver
    d.server.add_text("Got all three lines.")

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("\x1b[200~first line\r\nsecond line\r\nthird line\x1b[201~")
        d.wait_drawn("third line")  # the prompt has the whole paste
        assert d.requests() == [], "a paste must not send anything before Enter"
        d.type("\r")
        d.wait_text("Got all three lines.")

    d.run(script)
    assert d.exit_code == 0
    requests = d.requests()
    assert len(requests) == 1
    assert user_texts(requests[0]) == ["first line\nsecond line\nthird line"]
    store = d.store()
    session = store.get(only_session(d))
    assert session.turn_count == 1
    assert [m.role for m in session.history if m.role is not Role.SYSTEM] == [Role.USER, Role.MODEL]


def test_esc_enter_inserts_a_newline_and_ctrl_c_clears_the_prompt(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("a draft I abandon\x03")
        d.type("line one\x1b\rline two\r")
        d.wait_text("ok: line one")

    repl_driver.run(script)
    requests = repl_driver.requests()
    assert len(requests) == 1
    assert user_texts(requests[0]) == ["line one\nline two"]


def test_ctrl_c_during_a_tool_call_keeps_the_repl_open_and_the_session_valid(repl_driver) -> None:
    d = repl_driver
    d.write_config(lookup_agent("slow_lookup"))
    tools_for_repl.started.clear()
    tools_for_repl.release.clear()
    d.server.add_tool_calls([("call_slow", "slow_lookup", '{"query": "orders"}')])

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("look up my orders\r")
        assert tools_for_repl.started.wait(15), "the tool never started"
        d.wait_text("slow_lookup")
        d.type("\x03")
        d.wait_text("interrupted")
        d.type("are you still there?\r")
        d.wait_text("ok: are you still there?")

    try:
        d.run(script)
    finally:
        tools_for_repl.release.set()
    requests = d.requests()
    assert len(requests) == 2
    # The second request carries the interrupted turn with a synthetic result for the call.
    tool_messages = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_slow"]
    session = d.store().get(only_session(d))
    assert session.turn_count == 2
    check_history(list(session.history))
    kinds = [e.type for e in d.store().events(session.session_id)]
    assert "turn.interrupted" in kinds
    assert d.screen().count("interrupted") >= 1


def test_rollback_1_then_a_new_message_is_turn_2(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        for text in ("first question", "second question", "third question"):
            d.type(text + "\r")
            d.wait_text(f"ok: {text}")
        d.type("/rollback 1\r")
        d.wait_drawn("[y/N]")
        d.type("y\r")
        d.wait_text("the next message is turn 2")
        d.type("a new second question\r")
        d.wait_text("ok: a new second question")

    repl_driver.run(script)
    d = repl_driver
    session = d.store().get(only_session(d))
    assert session.turn_count == 2
    assert [t.number for t in session.turns] == [1, 2]
    assert session.turns[1].messages[0].content == "a new second question"
    assert user_texts(d.requests()[-1]) == ["first question", "a new second question"]
    assert [e.payload["to_turn"] for e in d.store().events(session.session_id) if e.type == "rollback"] == [1]


def test_rollback_asks_first_and_no_keeps_everything(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("only question\r")
        d.wait_text("ok: only question")
        d.type("/rollback 0\r")
        d.wait_drawn("[y/N]")
        d.type("n\r")
        d.wait_text("nothing was changed")

    repl_driver.run(script)
    session = repl_driver.store().get(only_session(repl_driver))
    assert session.turn_count == 1


def test_unknown_command_suggests_and_never_calls_the_model(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("/shwo\r")
        d.wait_text("did you mean /show?")
        d.type("/help\r")
        d.wait_text("/rollback [N]")

    repl_driver.run(script)
    assert repl_driver.requests() == []


def test_provider_error_is_one_line_and_retry_resends_the_message(repl_driver) -> None:
    d = repl_driver
    d.server.add_error(400, {"error": {"message": "context too long", "type": "invalid_request_error"}})

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("please summarise\r")
        d.wait_text("error:")
        d.type("/retry\r")
        d.wait_text("ok: please summarise")

    d.run(script)
    rows = d.screen().splitlines()
    starts = [i for i, row in enumerate(rows) if row.startswith("error:")]
    assert len(starts) == 1  # one message, wrapped between words at the terminal's width
    message = []
    for row in rows[starts[0]:]:
        if not row.strip() or "\u203a" in row:
            break
        message.append(row.strip())
    assert " ".join(message) == (f"error: the server at {d.server.url} rejected the request (HTTP 400): "
                                 "context too long (/retry sends the message again)")
    requests = d.requests()
    assert [user_texts(r)[-1] for r in requests] == ["please summarise", "please summarise"]
    session = d.store().get(only_session(d))
    assert session.turn_count == 1  # the failed turn left the window; the retry is turn 1


def test_custom_tool_asks_for_the_result_and_continues_the_turn(repl_driver) -> None:
    d = repl_driver
    d.write_config(
        '[[agents]]\nname = "Refunds"\ninstructions = "You process refunds."\n'
        'tools = [{ name = "approve_refund", description = "Ask a human to approve a refund.", '
        'parameters = { type = "object", properties = { order_id = { type = "string" } }, '
        'required = ["order_id"] } }]\n'
    )
    d.server.add_tool_calls([("call_ok", "approve_refund", '{"order_id": "A7"}')])
    d.server.add_text("Refund approved and sent.")

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("refund order A7\r")
        d.wait_text("type its result")
        d.type('{"approved": true}\r')
        d.wait_text("Refund approved and sent.")

    d.run(script)
    requests = d.requests()
    assert len(requests) == 2
    tool_messages = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert tool_messages == [{"role": "tool", "tool_call_id": "call_ok", "content": '{"approved": true}'}]
    session = d.store().get(only_session(d))
    assert session.turn_count == 1 and session.pending_tool_calls == ()


def test_handoff_is_shown_and_the_new_agent_answers(repl_driver) -> None:
    d = repl_driver
    d.write_config(
        '[[agents]]\nname = "Triage"\ninstructions = "You route."\nhandoffs = ["Billing"]\n\n'
        '[[agents]]\nname = "Billing"\ninstructions = "You handle invoices."\n'
    )
    d.server.add_tool_calls([("call_h", "transfer_to_billing", "{}")])
    d.server.add_text("Billing here: your invoice is paid.")

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("where is my invoice?\r")
        d.wait_text("Billing here")
        d.type("/agent\r")
        d.wait_text("● Billing")

    d.run(script)
    screen = d.screen()
    assert "handoff: Triage -> Billing" in screen
    assert screen.index("handoff: Triage -> Billing") < screen.index("Billing here")
    session = d.store().get(only_session(d))
    assert session.active_agent.name == "Billing"


def test_rollback_over_a_handoff_brings_back_the_agent_before_it(repl_driver) -> None:
    """``/rollback 1`` after a handoff in turn 2: the prompt's agent, ``/agent`` and the next
    turn are Triage's again."""
    d = repl_driver
    d.write_config(
        '[[agents]]\nname = "Triage"\ninstructions = "You route."\nhandoffs = ["Billing"]\n\n'
        '[[agents]]\nname = "Billing"\ninstructions = "You handle invoices."\n'
    )
    d.server.add_text("Triage here.")
    d.server.add_tool_calls([("call_h", "transfer_to_billing", "{}")])
    d.server.add_text("Billing here: your invoice is paid.")
    d.server.add_text("Triage again.")

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("hello\r")
        d.wait_text("Triage here.")
        d.type("where is my invoice?\r")
        d.wait_text("Billing here")
        d.wait_drawn("Billing ›")
        d.type("/rollback 1\r")
        d.wait_drawn("[y/N]")
        mark = len(d.drawn_text())
        d.type("y\r")
        d.wait_text("the next message is turn 2")
        d.wait_drawn("Triage ›", after=mark)  # the prompt drawn after the rollback
        d.type("/agent\r")
        d.wait_text("● Triage")
        d.type("one more thing\r")
        d.wait_text("Triage again.")

    d.run(script)
    requests = d.requests()
    assert requests[-1]["messages"][0] == {"role": "system", "content": "You route."}
    session = d.store().get(only_session(d))
    assert session.active_agent.name == "Triage"


def test_tool_calls_show_as_they_start_and_finish(repl_driver) -> None:
    d = repl_driver
    d.write_config(lookup_agent("slow_lookup"))
    tools_for_repl.release.set()
    d.server.add_tool_calls([("call_q", "slow_lookup", '{"query": "' + "x" * 900 + '"}')])
    d.server.add_text("Here is what I found.")

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("find it\r")
        d.wait_text("Here is what I found.")

    d.run(script)
    screen = d.screen()
    assert "Helper called slow_lookup" in screen
    assert "↳ found" in screen
    assert (
        " ".join(screen.split()).count("more characters; /show has them all") == 2
    )  # the 900-character argument and result are folded
    assert "x" * 900 not in screen.replace("\n", "")
    assert screen.index("slow_lookup") < screen.index("↳ found") < screen.index("Here is what I found.")


def test_history_file_is_private_and_keeps_messages(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("remember this line\r")
        d.wait_text("ok: remember this line")

    repl_driver.run(script)
    path = repl_driver.home / "repl_history"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "remember this line" in path.read_text()


def test_sessions_new_switch_and_show(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("hello one\r")
        d.wait_text("ok: hello one")
        first = only_session(d)
        d.type("/new\r")
        d.wait_text("new session")
        d.type("hello two\r")
        d.wait_text("ok: hello two")
        d.type("/sessions\r")
        d.wait_text("hello two", count=2)
        d.type(f"/switch {first}\r")
        d.wait_text(f"session {first}: 1 turn,")
        d.wait_text("Turn 1")  # the recap of its last exchange
        d.type("/show\r")
        d.wait_text("Turn 1", count=2)
        d.type("/switch nope\r")
        d.wait_text("no session nope")

    repl_driver.run(script)
    assert len(repl_driver.store().list_sessions()) == 2


def test_metadata_and_model_commands(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("/metadata ticket=T-9\r")
        d.wait_text("ticket = T-9")
        d.type("/model other-model\r")
        d.wait_text("model: other-model")
        d.type("hi\r")
        d.wait_text("ok: hi")

    repl_driver.run(script)
    d = repl_driver
    assert d.requests()[-1]["model"] == "other-model"
    assert d.store().get(only_session(d)).metadata == {"ticket": "T-9"}


def test_slash_completion_offers_commands_and_session_ids(repl_driver) -> None:
    from chatflow_cli.repl import slash_completions

    captured = {}

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("hi\r")
        d.wait_text("ok: hi")
        captured["sid"] = only_session(d)

    repl_driver.run(script)

    class FakeRepl:
        class runner:
            agents: ClassVar[dict] = {}

        @staticmethod
        def _session_ids() -> list[str]:
            return [s.session_id for s in repl_driver.store().list_sessions()]

    assert [c[0] for c in slash_completions(FakeRepl, "/r")] == ["/rollback", "/retry"]
    assert [c[0] for c in slash_completions(FakeRepl, "/switch ")] == [captured["sid"]]
    assert slash_completions(FakeRepl, "hello /r") == []


def test_ctrl_d_at_an_empty_prompt_leaves(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("\x04")

    repl_driver.run(script)
    assert repl_driver.exit_code == 0
    assert repl_driver.requests() == []


def test_ctrl_c_while_the_reply_streams_keeps_the_partial_text(repl_driver) -> None:
    d = repl_driver
    words = [f"word{i} " for i in range(400)]
    d.server.add_text("".join(words), chunks=words, delay=0.02)

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("tell me a long story\r")
        d.wait_text("word20")
        d.type("\x03")
        d.wait_text("interrupted")
        d.type("shorter please\r")
        d.wait_text("ok: shorter please")

    d.run(script)
    raw = d.out.getvalue()
    assert "thinking" in raw  # the spinner showed until the first token
    session = d.store().get(only_session(d))
    assert session.turn_count == 2
    partial = session.turns[0].messages[1]
    assert partial.role is Role.MODEL and partial.interrupted
    assert partial.content.startswith("word0 word1") and "word399" not in partial.content
    check_history(list(session.history))
    assert "word399" not in d.screen()


def test_keys_typed_during_a_reply_wait_in_the_next_prompt(repl_driver) -> None:
    d = repl_driver
    words = [f"w{i} " for i in range(60)]
    d.server.add_text("".join(words), chunks=words, delay=0.02)

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("go\r")
        d.wait_text("w5")
        d.type("next one")
        d.wait_text("w59")
        d.wait_prompt()
        d.wait_drawn("next one")  # the keys typed during the reply are in the next prompt
        d.type("\r")
        d.wait_text("ok: next one")

    d.run(script)
    assert [user_texts(r)[-1] for r in d.requests()] == ["go", "next one"]


def test_edit_opens_the_editor_and_prefills_the_message(repl_driver, tmp_path, monkeypatch) -> None:
    editor = tmp_path / "fake-editor.sh"
    editor.write_text("#!/bin/sh\nprintf 'from the editor\\nsecond line\\n' > \"$1\"\n")
    editor.chmod(0o755)
    monkeypatch.setenv("EDITOR", str(editor))

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("/edit\r")
        d.wait_text("press Enter to send")
        d.wait_drawn("second line")  # the edited text fills the prompt
        d.type("\r")
        d.wait_text("ok: from the editor")

    repl_driver.run(script)
    assert user_texts(repl_driver.requests()[0]) == ["from the editor\nsecond line"]


def test_bottom_toolbar_shows_session_agent_model_turn_context_and_tokens(repl_driver) -> None:
    screen, output = recording_output(repl_driver)

    def script(d) -> None:
        d.wait_for(lambda: "ctx 0/40" in screen.getvalue(), what="the first toolbar")
        d.type("hi\r")
        d.wait_text("ok: hi")
        d.wait_for(lambda: "ctx 1/40" in screen.getvalue(), what="the toolbar after turn 1")

    repl_driver.run(script, output=output)
    drawn = screen.getvalue()
    sid = only_session(repl_driver)
    assert sid in drawn and "Assistant" in drawn and "fake-model" in drawn
    assert "turn 1" in drawn and "ctx 1/40" in drawn
    usage = next(e.payload["usage"] for e in repl_driver.store().events(sid) if e.type == "turn.completed")
    assert f"{usage['total_tokens']} tok" in drawn


def test_ctrl_c_while_the_server_goes_silent_mid_reply(repl_driver) -> None:
    d = repl_driver
    d.server.add_text("Hello there, I was saying", chunks=["Hello there,", " I was saying"], delay=[0.0, 0.0, 600.0])

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("are you there?\r")
        d.wait_text("Hello there,")
        started = time.monotonic()
        d.type("\x03")
        d.wait_text("was kept as interrupted", timeout=10)
        assert time.monotonic() - started < ABANDON_AFTER_S, "Ctrl-C must close the silent stream at once"
        d.type("hello\r")
        d.wait_text("ok: hello")

    d.run(script)
    session = d.store().get(only_session(d))
    assert session.turn_count == 2
    assert session.turns[0].messages[1].content == "Hello there," and session.turns[0].messages[1].interrupted
    check_history(list(session.history))


def test_ctrl_c_when_the_server_never_answers_gives_the_prompt_back(repl_driver) -> None:
    d = repl_driver
    d.server.add_hang()

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("are you there?\r")
        d.wait_for(lambda: len(d.requests()) == 1, what="the request")
        started = time.monotonic()
        d.type("\x03")
        # ModelStream.cancel() aborts a request still waiting for headers, so the normal
        # interrupted line comes at once, before the REPL's fallback (ABANDON_AFTER_S) would.
        d.wait_text("turn 1 was kept as interrupted", timeout=ABANDON_AFTER_S + 10)
        assert time.monotonic() - started < ABANDON_AFTER_S, "Ctrl-C must abort the hung request at once"
        assert "the server is not answering" not in d.screen()
        d.type("/help\r")  # the REPL answers again
        d.wait_text("/rollback [N]")
        d.type("hello\r")  # and the session takes the next message
        d.wait_text("ok: hello")

    d.run(script)
    session = d.store().get(only_session(d))
    assert session.turn_count == 2
    assert session.turns[0].messages[0].content == "are you there?"
    check_history(list(session.history))


def test_retry_after_an_answer_replaces_the_last_turn(repl_driver) -> None:
    d = repl_driver
    d.server.add_text("A first answer.")
    d.server.add_text("A second answer.")

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("question\r")
        d.wait_text("A first answer.")
        d.type("/retry\r")
        d.type("y\r")  # the question asked first (drawn by the prompt: tests/repl/test_slash_commands.py sees it)
        d.wait_text("A second answer.")

    d.run(script)
    session = d.store().get(only_session(d))
    assert session.turn_count == 1
    assert session.turns[0].messages[-1].content == "A second answer."
    assert [user_texts(r) for r in d.requests()] == [["question"], ["question"]]


def test_library_warnings_print_as_lines_above_the_reply(repl_driver) -> None:
    d = repl_driver
    d.write_config(lookup_agent("noisy_lookup"))
    d.server.add_tool_calls([("call_n", "noisy_lookup", '{"query": "plans"}')])
    words = [f"part{i} " for i in range(40)]
    d.server.add_text("".join(words), chunks=words, delay=0.01)

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("find plans\r")
        d.wait_text("part39")

    d.run(script)
    screen = d.screen()
    assert screen.count("warning: the cache for plans is cold") == 1
    assert screen.index("warning: the cache") < screen.index("part0")
    assert screen.count("part20") == 1
