"""The REPL and the token budget: the toolbar's context use in tokens, /compact, and an
automatic compaction before a turn (against the fake server, in process)."""

from __future__ import annotations

from chatflow_cli.core.compaction import DEFAULT_PROMPT
from chatflow_cli.core.messages import Message
from chatflow_cli.core.tokens import estimate_tokens, short_count
from tests.helpers.repl_driver import recording_output


def _sid(d) -> str:
    (summary,) = d.store().list_sessions()
    return summary.session_id


def test_toolbar_shows_context_tokens_of_the_model_context(repl_driver) -> None:
    repl_driver.write_config("max_context_tokens = 8192\ncompact_at = 0\n")
    screen, output = recording_output(repl_driver)
    repl_driver.server.add_text("fine")

    def script(d) -> None:
        d.wait_for(lambda: "ctx 0/8.2k" in screen.getvalue(), what="the first toolbar")
        d.type("hello there\r")
        d.wait_text("fine")
        d.wait_prompt()
        stored = d.store().get(_sid(d))
        tokens = sum(m.tokens for m in stored.history)
        assert tokens > 0
        d.wait_for(lambda: f"ctx {short_count(tokens)}/8.2k" in screen.getvalue(), what="the toolbar after turn 1")

    repl_driver.run(script, output=output)


def test_slash_compact_with_instructions(repl_driver) -> None:
    d = repl_driver
    for i in (1, 2, 3):
        d.server.add_text(f"answer {i}")
    d.server.add_text("SUMMARY: questions one and two")

    def script(d) -> None:
        for i in (1, 2, 3):
            d.type(f"question {i}\r")
            d.wait_text(f"answer {i}")
        d.wait_prompt()
        d.type("/compact keep the numbers\r")
        d.wait_text("compacted turns 1..2")

    d.run(script)
    body = d.requests()[-1]
    assert body["messages"][0]["content"] == DEFAULT_PROMPT and "tools" not in body
    assert "Focus: keep the numbers" in body["messages"][1]["content"]
    store = d.store()
    ((summary, removed),) = store.summaries(_sid(d))
    assert summary.summary_through == 2 and summary.content == "SUMMARY: questions one and two" and not removed
    assert [m.content for m in store.get(_sid(d)).history][-3:] == [summary.content, "question 3", "answer 3"]


def test_automatic_compaction_before_a_repl_turn(repl_driver) -> None:
    d = repl_driver
    d.write_config("max_context_tokens = 2000\n")  # 1,500 tokens for messages; compaction at 80 %
    for i in (1, 2, 3):
        d.server.add_text(f"answer {i} " + "detail " * 60)
    d.server.add_text("SUMMARY of turns before")
    d.server.add_text("the fourth answer")
    big = "question 4 " + "word " * 600
    assert estimate_tokens(Message.user(big)) > 700

    def script(d) -> None:
        for i in (1, 2, 3):
            d.type(f"question {i} " + "word " * 60 + "\r")
            d.wait_text(f"answer {i}")
        d.wait_prompt()
        d.type(big + "\r")
        d.wait_text("the fourth answer")
        d.wait_text("compacted turns 1..")  # the automatic compaction is announced

    d.run(script)
    compaction, turn = d.requests()[-2], d.requests()[-1]
    assert compaction["messages"][0]["content"] == DEFAULT_PROMPT
    assert {"role": "system", "content": "SUMMARY of turns before"} in turn["messages"]
    assert d.store().summaries(_sid(d))[0][0].summary_through >= 1


def test_a_narrow_toolbar_keeps_the_context_use(repl_driver) -> None:
    from prompt_toolkit.data_structures import Size
    from prompt_toolkit.output.vt100 import Vt100_Output

    repl_driver.write_config("max_context_tokens = 8192\ncompact_at = 0\n")
    screen, _wide = recording_output(repl_driver)
    output = Vt100_Output(screen, lambda: Size(rows=24, columns=40), term="xterm")
    repl_driver.server.add_text("fine")

    def script(d) -> None:
        d.type("hello there\r")
        d.wait_text("fine")
        d.wait_prompt()
        tokens = sum(m.tokens for m in d.store().get(_sid(d)).history)
        d.wait_for(lambda: f"ctx {short_count(tokens)}/8.2k" in screen.getvalue(), what="the whole ctx figure")

    repl_driver.run(script, output=output)  # 40 columns: the token count and model gave way, not ctx
