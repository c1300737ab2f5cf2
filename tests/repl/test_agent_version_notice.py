"""The REPL says once that the session's agent changed since its last turn (config.toml edited
between two REPL runs on the same session)."""

from __future__ import annotations

from tests.helpers.repl_driver import Driver, turn_done

CONFIG = '[[agents]]\nname = "Support"\ninstructions = "{instructions}"\n'


def test_the_repl_says_once_that_the_agent_changed(repl_driver) -> None:
    d = repl_driver
    d.write_config(CONFIG.format(instructions="Help with orders."))
    d.server.add_text("first answer")

    def first(d) -> None:
        d.wait_text("Enter sends")
        d.type("q1\r")
        turn_done(d, "first answer")

    d.run(first, session_id="s")
    old = d.store().session_summary("s").agent_version
    d.write_config(CONFIG.format(instructions="Help with orders and refunds."))
    d.server.add_text("second answer")
    d.server.add_text("third answer")
    again = Driver(d.server, d.home, d.config)

    def second(d) -> None:
        d.wait_text("Enter sends")
        d.type("q2\r")
        turn_done(d, "second answer")
        d.type("q3\r")
        turn_done(d, "third answer")

    again.run(second, session_id="s")
    new = again.store().session_summary("s").agent_version
    screen = again.screen()
    notice = f"agent Support changed since turn 1 ({old} -> {new})"
    assert old and new and old != new
    assert screen.count("agent Support changed") == 1, screen
    assert notice in screen
    assert screen.index(notice) < screen.index("second answer")  # said before the reply
