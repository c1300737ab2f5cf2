"""chatflow on a (pseudo-)terminal: the REPL opens, replies render, model escapes stay inert (issues 5, 7)."""

from __future__ import annotations

import pytest

from tests.helpers.terminal import PROMPT_READS_KEYS, spawn_chatflow

pexpect = pytest.importorskip("pexpect")


def _spawn(args: list[str], **env: str):
    return spawn_chatflow(args, rows=40, cols=100, **env)


def test_bare_chatflow_on_a_terminal_opens_the_repl(provider, chatflow):
    child = _spawn(["chat", "-s", "tty1"])
    child.expect_exact(PROMPT_READS_KEYS)  # the REPL's prompt
    child.send("hello from the repl\r")
    child.expect("ok: hello from the repl")
    child.expect_exact(PROMPT_READS_KEYS)  # the reply has ended: the next prompt reads keys
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert chatflow("sessions", "ls", "--json").json()[0]["session_id"] == "tty1"


def test_chat_on_a_terminal_renders_markdown_and_keeps_escapes_inert(provider):
    provider.add_text("**bold** and \x1b]0;pwned\x07 \x1b[2J done")
    child = _spawn(["chat", "-s", "tty2", "hi"])
    child.expect(pexpect.EOF)
    child.close()
    out = child.before.decode("utf-8", "replace")
    assert child.exitstatus == 0, out
    assert "bold" in out and "**bold**" not in out  # rendered, not raw Markdown
    assert "\x1b]0;" not in out and "\x1b[2J" not in out and "\x07" not in out
    assert "␛]0;pwned" in out and "␛[2J" in out


def test_no_color_and_flag_turn_colours_off(provider, chatflow):
    assert chatflow("chat", "-s", "c", "hi").returncode == 0
    for args, env in ((["sessions", "show", "c", "--no-pager"], {"NO_COLOR": "1"}),
                      (["--no-color", "sessions", "show", "c", "--no-pager"], {})):
        child = _spawn(args, **env)
        child.expect(pexpect.EOF)
        child.close()
        out = child.before.decode("utf-8", "replace")
        assert child.exitstatus == 0 and "Turn 1" in out
        assert "\x1b[" not in out, out
    child = _spawn(["sessions", "show", "c", "--no-pager"])
    child.expect(pexpect.EOF)
    child.close()
    assert "\x1b[" in child.before.decode("utf-8", "replace")  # colours on a terminal otherwise
