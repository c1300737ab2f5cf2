"""Keys at the REPL prompt: Enter in a reverse search, Ctrl-X Ctrl-E, history without blank
input, keys typed while a turn runs (type-ahead, in order), Tab after a slash typed fast."""

from __future__ import annotations

import time

from tests.helpers.pty_driver import leave
from tests.helpers.repl_driver import turn_done
from tests.helpers.sent import sent


def test_enter_in_a_reverse_search_sends_the_match(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        for text in ("alpha question", "beta question"):
            d.type(text + "\r")
            turn_done(d, f"ok: {text}")
        mark = len(d.drawn_text())
        d.type("\x12alph")  # Ctrl-R, then part of the first message
        d.wait_drawn("alpha question", after=mark)  # the search found it
        d.type("\r")
        d.wait_text("ok: alpha question", count=2)

    repl_driver.run(script)
    assert sent(repl_driver.requests()) == ["alpha question", "beta question", "alpha question"]


def test_ctrl_x_ctrl_e_puts_the_edited_text_back_for_review(repl_driver, tmp_path, monkeypatch) -> None:
    done = tmp_path / "editor-ran"
    editor = tmp_path / "fake-editor.sh"
    editor.write_text(f"#!/bin/sh\nprintf 'edited in the editor\\n' > \"$1\"\ntouch {done}\n")
    editor.chmod(0o755)
    monkeypatch.setenv("EDITOR", str(editor))

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("draft\x18\x05")  # Ctrl-X Ctrl-E
        d.wait_for(done.exists, what="the editor")
        d.wait_drawn("edited in the editor")  # back in the prompt, for review
        assert d.requests() == [], "the edited message must wait for Enter"
        d.type("\r")
        d.wait_text("ok: edited in the editor")

    repl_driver.run(script)
    assert sent(repl_driver.requests()) == ["edited in the editor"]


def test_whitespace_only_input_is_not_saved_in_history(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("kept line\r")
        turn_done(d, "ok: kept line")
        d.type("   \r")
        d.type("\x1b\r\r")  # a lone newline
        d.type("after\r")
        d.wait_text("ok: after")

    repl_driver.run(script)
    from prompt_toolkit.history import FileHistory

    entries = list(FileHistory(str(repl_driver.home / "repl_history")).load_history_strings())
    assert entries == ["after", "kept line"]
    assert sent(repl_driver.requests()) == ["kept line", "after"]


def test_keys_typed_during_a_turn_act_at_the_next_prompt_as_typed(repl_driver) -> None:
    """Type-ahead works as in a shell: text, editing keys and Enter typed during a reply act,
    in order, once the turn ends; Esc-Enter is a new line in the message."""
    d = repl_driver
    words = [f"w{i} " for i in range(80)]
    d.server.add_text("".join(words), chunks=words, delay=0.02)

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("go\r")
        d.wait_text("w5")
        for keys in ("abx", "\x7f", "c", "\x1b\r", "de", "\r"):  # Backspace, Esc-Enter, Enter
            d.type(keys)
            time.sleep(0.05)
        d.wait_text("ok: abc")
        d.wait_text("de")

    d.run(script)
    assert sent(d.requests()) == ["go", "abc\nde"]


def test_keys_still_unread_when_a_turn_ends_are_type_ahead_in_order() -> None:
    """Keys typed just before the turn ends (not read yet) are kept for the next prompt in
    order, and a Ctrl-C discards what was typed before it."""
    import asyncio
    from types import SimpleNamespace

    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.input.typeahead import get_typeahead

    from chatflow_cli.repl import Repl

    interrupts = []

    async def main(keys: str) -> tuple[list, list]:
        with create_pipe_input() as pipe:
            watcher = SimpleNamespace(input=pipe, _typeahead=[])
            with Repl._watch_keys(watcher, lambda: interrupts.append(1)):
                pipe.send_text(keys)
            left = pipe.read_keys() + pipe.flush_keys()
            return get_typeahead(pipe), left

    kept, left = asyncio.run(main("abc\r\x04\x1b[200~pas\r\nte\x1b[201~de"))
    assert [p.data for p in kept] == ["a", "b", "c", "\r", "\x04", "pas\r\nte", "d", "e"]
    assert left == [] and interrupts == []
    kept, left = asyncio.run(main("typed\x03after"))
    assert "".join(p.data for p in kept) == "after" and interrupts == [1]


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
    assert sent(provider.requests) == ["first", "second question", "third"]
    assert "r2w39" in repl.screen()  # the reply ended before the REPL left
    assert "resume: chatflow chat -s ahead" in repl.screen()


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


def test_mount_lines_whose_argument_may_hold_a_value_stay_out_of_the_history_file() -> None:
    """``/vault`` and ``/memory`` lines with an argument that is not a plain name (a token, a
    ``KEY=value``, either with a ``:ro`` mode) are not written to the history file; plain
    ones, and every other line, are."""
    from chatflow_cli.repl.prompt import _may_hold_a_value

    for line in ("/memory mount ghp_abc123def456ghi789jkl0", "/memory mount Zq9SECRETvalue-7781xx:ro",
                 "/vault mount work=ghp_x", "/memory unmount sk-abcdef0123456789abcdef"):
        assert _may_hold_a_value(line), line
    for line in ("/memory mount notes:ro", "/vault mount work", "/memory", "hello ghp_abc123def456ghi789jkl0"):
        assert not _may_hold_a_value(line), line
