"""Long stderr notices on a narrow terminal wrap at spaces, never inside a word."""

from __future__ import annotations

from tests.helpers.terminal import pexpect_module, screen_lines, spawn_chatflow


def test_a_long_notice_at_40_columns_wraps_between_words(chatflow, provider):
    pexpect = pexpect_module()
    assert chatflow("chat", "-s", "narrow-session", "--system", "Be terse.", "hi").returncode == 0
    child = spawn_chatflow(["chat", "-s", "narrow-session", "--system", "Be verbose.", "again"], cols=40)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    lines = [line.rstrip() for line in screen_lines(child.before)]
    start = next(i for i, line in enumerate(lines) if line.startswith("chatflow: --system not applied"))
    end = next(i for i in range(start, len(lines)) if lines[i].endswith("--system ...)"))
    note = lines[start:end + 1]
    assert len(note) > 1 and all(len(line) <= 40 for line in note), note
    assert all(line.startswith("  ") for line in note[1:]), note
    words = " ".join(note).split()
    expected = ("chatflow: --system not applied: it sets up a new session, and narrow-session keeps its "
                "system prompt (start a new session with -s NEW_ID --system ...)").split()
    assert words == expected, note  # no word was cut in two


def test_a_notice_into_a_pipe_stays_one_line(chatflow, provider):
    assert chatflow("chat", "-s", "piped-session", "--system", "Be terse.", "hi").returncode == 0
    r = chatflow("chat", "-s", "piped-session", "--system", "Be verbose.", "again")
    assert r.returncode == 0, r
    [note] = [line for line in r.stderr.splitlines() if "--system not applied" in line]
    assert note.endswith("--system ...)")


def test_a_long_error_line_at_40_columns_wraps_as_notices_do(chatflow, tmp_path):
    pexpect = pexpect_module()
    missing = tmp_path / "no-such-config.toml"
    child = spawn_chatflow(["--config", str(missing), "config", "show"], cols=40)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 9
    lines = [line.rstrip() for line in screen_lines(child.before)]
    start = next(i for i, line in enumerate(lines) if line.startswith("chatflow: error: config file"))
    end = next(i for i in range(start, len(lines)) if lines[i].endswith("does not exist"))
    error = lines[start:end + 1]
    assert len(error) > 1 and all(line.startswith("  ") for line in error[1:]), error
    assert all(len(line) <= 40 for line in error if str(missing) not in line), error  # a long path stays whole
    words = " ".join(error).split()
    assert words == f"chatflow: error: config file {missing} (named by --config) does not exist".split(), error


def test_an_error_line_into_a_pipe_stays_one_line(chatflow, tmp_path):
    r = chatflow("--config", str(tmp_path / "no-such-config.toml"), "config", "show")
    assert r.returncode == 9
    assert [line for line in r.stderr.splitlines() if line] == [
        f"chatflow: error: config file {tmp_path / 'no-such-config.toml'} (named by --config) does not exist"]
