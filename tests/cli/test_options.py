"""Options: single-value options given twice, repeatable ones kept, global options after the
command, ``-s``/``-c`` before it."""

from __future__ import annotations

import pytest

from tests.helpers.terminal import PROMPT_READS_KEYS, pexpect_module, spawn_chatflow


@pytest.mark.parametrize("args, option", [
    (["chat", "-s", "a", "-s", "b", "hi"], "--session/-s"),
    (["chat", "-m", "x", "--model", "y", "hi"], "--model/-m"),
    (["sessions", "ls", "--limit", "1", "-n", "2"], "--limit/-n"),
    (["replay", "x", "--since", "1", "--since", "2"], "--since"),
    (["sessions", "ls", "--db", "a.db", "--db", "b.db"], "--db"),
    (["--db", "a.db", "sessions", "ls", "--db", "b.db"], "--db"),
    (["sessions", "--db", "a.db", "ls", "--db", "b.db"], "--db"),
    (["--config", "a.toml", "chat", "-s", "a", "--config", "b.toml", "hi"], "--config"),
])
def test_a_single_value_option_given_twice_is_a_usage_error(chatflow, provider, args, option):
    r = chatflow(*args)
    assert r.returncode == 2, r
    assert f"{option} was given more than once" in r.stderr
    assert provider.requests == []


def test_metadata_repeats_are_all_kept(chatflow, provider):
    r = chatflow("chat", "-s", "m", "--metadata", "a=1", "--metadata", "b=2", "hi")
    assert r.returncode == 0, r
    [row] = chatflow("sessions", "ls", "--json").json()
    assert row["metadata"] == {"a": "1", "b": "2"}


def test_global_options_are_accepted_after_the_command(chatflow, provider, tmp_path):
    db = tmp_path / "other.db"
    r = chatflow("chat", "--db", str(db), "-s", "g", "--no-color", "hi")
    assert r.returncode == 0, r
    assert db.exists()
    ls = chatflow("sessions", "ls", "--db", str(db), "--json")
    assert [s["session_id"] for s in ls.json()] == ["g"]
    assert chatflow("sessions", "ls", "--json").json() == []  # the default database was not used
    bad = chatflow("agents", "ls", "--config", str(tmp_path / "missing.toml"))
    assert bad.returncode == 9 and "missing.toml" in bad.stderr, bad
    debug = chatflow("sessions", "show", "nope", "--debug")
    assert debug.returncode == 3 and "Traceback" in debug.stderr, debug


def test_session_before_the_command_reads_a_piped_message(chatflow, provider):
    r = chatflow("-s", "work", input="hello work\n")
    assert r.returncode == 0, r
    assert r.stdout == "ok: hello work\n"
    assert "new session work" in r.stderr
    r = chatflow("--session", "work", input="again\n")
    assert r.returncode == 0 and "new session" not in r.stderr, r
    r = chatflow("-c", input="third\n")
    assert r.returncode == 0, r
    shown = chatflow("sessions", "show", "work", "--json").json()
    assert [t["messages"][0]["content"] for t in shown["turns"]] == ["hello work", "again", "third"]


def test_session_before_a_command_is_refused_with_a_hint(chatflow):
    r = chatflow("-s", "work", "sessions", "ls")
    assert r.returncode == 2 and "chatflow sessions --session" in r.stderr, r


def test_session_before_the_command_opens_the_repl_on_it(provider, chatflow):
    pexpect = pexpect_module()
    assert chatflow("chat", "-s", "work", "first").returncode == 0
    child = spawn_chatflow(["--session", "work"])
    child.expect_exact(PROMPT_READS_KEYS)  # the REPL's prompt
    child.send("second\r")
    child.expect("ok: second")
    child.expect_exact(PROMPT_READS_KEYS)  # the reply has ended: the next prompt reads keys
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    shown = chatflow("sessions", "show", "work", "--json").json()
    assert [t["messages"][0]["content"] for t in shown["turns"]] == ["first", "second"]


def test_chat_options_before_no_command_apply_to_the_piped_message(chatflow, provider):
    r = chatflow("-s", "opts", "-m", "fake-other", "--system", "Be brief.", "--max-turns", "3",
                 input="hello\n")
    assert r.returncode == 0, r
    sent = provider.requests[-1]
    assert sent["model"] == "fake-other"
    assert {"role": "system", "content": "Be brief."} in sent["messages"]
    [row] = chatflow("sessions", "ls", "--json").json()
    assert row["session_id"] == "opts" and row["max_turns"] == 3


def test_chat_options_before_a_command_are_refused_with_a_hint(chatflow):
    r = chatflow("-m", "x", "sessions", "ls")
    assert r.returncode == 2 and "chatflow sessions --model" in r.stderr, r


def test_model_before_no_command_opens_the_repl_with_it(provider, chatflow):
    pexpect = pexpect_module()
    child = spawn_chatflow(["-s", "work", "-m", "fake-repl-model"])
    child.expect_exact(PROMPT_READS_KEYS)
    child.send("hi\r")
    child.expect("ok: hi")
    child.expect_exact(PROMPT_READS_KEYS)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert provider.requests[-1]["model"] == "fake-repl-model"


def _users(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


def test_max_context_tokens_before_no_command_applies_to_the_repl_and_the_piped_message(chatflow, provider,
                                                                                        config_file):
    """``chatflow -s ID --max-context-tokens N`` (the manual: the option works for chat and the
    REPL): a turn too big for N leaves the window of the REPL's request and of a piped one."""
    config_file("compact_at = 0\n")  # no summary: the big turn simply leaves the window
    big = "question 1 " + "word " * 1500  # about 2,400 estimated tokens, over a budget of 1,024
    assert chatflow("chat", "-s", "w", "--max-context-tokens", "100000", big).returncode == 0
    assert len(_users(provider.requests[-1])) == 1
    pexpect = pexpect_module()
    child = spawn_chatflow(["-s", "w", "--max-context-tokens", "1024"])
    child.expect_exact(PROMPT_READS_KEYS)
    child.send("second\r")
    child.expect("ok: second")
    child.expect_exact(PROMPT_READS_KEYS)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert _users(provider.requests[-1]) == ["second"]
    r = chatflow("-s", "w", "--max-context-tokens", "1024", input="third\n")
    assert r.returncode == 0, r
    assert _users(provider.requests[-1]) == ["second", "third"]  # the big turn is still left out
