"""Vaults (issue 26) with the real ``chatflow`` process and the fake server.

* ``vault create / set / ls / rm`` and their bad input: a value given as an argument, bad
  names, an unknown vault or entry, a value too short; exit codes as documented.
* Where a value lives: the owner-only file (0600, replaced atomically; one open to others is
  refused, exit 9) when the keyring backend is ``keyring.backends.fail.Keyring`` (what the
  test suite sets by default), the keyring when a real backend is chosen
  (``keyrings.alt``'s plaintext file backend), or an ``env:VAR`` reference.
* A tool with a ``Secret`` parameter: it gets the value from the mounted vault and the model
  never sees it (not in the tool schema, not in any request); a missing secret is a tool error
  result naming the vault and the entry, and the turn goes on.
* The secret grep: a tool that returns the value and one that raises with it; every file
  chatflow wrote (data dir, config dir, export) and everything it printed is searched for it.

The commands and the missing secret run on SQLite and PostgreSQL (the ``database`` fixture).
tests/cli/test_vault_input.py has the names, values typed in the wrong place, stdin and the
REPL's ``/vault``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest

TOOLS = '''
import hashlib
from typing import Annotated

from chatflow_cli import Secret, tool


@tool
def whoami(user: str, token: Annotated[str, Secret("gh_token")]) -> str:
    """Say who the token belongs to."""
    return f"{user}: token sha256 {hashlib.sha256(token.encode()).hexdigest()}"


@tool
def leaky(token: Annotated[str, Secret("gh_token")]) -> dict:
    """Return the token (a careless tool)."""
    return {"token": token, "also": f"Bearer {token}"}


@tool
def raising(token: Annotated[str, Secret("gh_token")]) -> str:
    """Raise with the token in the message."""
    raise RuntimeError(f"the server refused token {token}")
'''


def _config(config_file: Any, vaults: str = "") -> Path:
    cfg = config_file(
        'default_agent = "Desk"\n[[agents]]\nname = "Desk"\ninstructions = "x"\n'
        f'tools = ["vaulttools:whoami", "vaulttools:leaky", "vaulttools:raising"]\n{vaults}')
    (cfg.parent / "vaulttools.py").write_text(TOOLS)
    return cfg


def _secret() -> str:
    return f"ghp_SECRET{uuid.uuid4().hex}"


def _tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def _vault_file() -> Path:
    return Path(os.environ["CHATFLOW_HOME"]) / "vault-secrets.json"


# ---------------------------------------------------------------------------------------
# the commands
# ---------------------------------------------------------------------------------------
def test_vault_commands_list_names_and_locations_never_values(chatflow, database):
    value = _secret()
    assert chatflow("vault", "create", "work").returncode == 0
    r = chatflow("vault", "set", "work", "gh_token", input=value + "\n")
    assert r.returncode == 0, r
    assert f"set work/gh_token in file {_vault_file()}" in r.stderr
    r = chatflow("vault", "set", "work", "other", "--env", "MY_TOKEN_VAR", "--json")
    assert r.returncode == 0, r
    assert r.json() == {"name": "other", "location": "env:MY_TOKEN_VAR", "where": "env:MY_TOKEN_VAR",
                        "updated_at": r.json()["updated_at"]}
    assert chatflow("vault", "create", "empty").returncode == 0
    listed = chatflow("vault", "ls")
    assert listed.returncode == 0, listed
    assert listed.stdout.splitlines() == [
        "empty  (no entries)", "work", f"  gh_token  file {_vault_file()}", "  other     env:MY_TOKEN_VAR"]
    one = chatflow("vault", "ls", "work", "--json").json()
    assert [(e["name"], e["location"]) for e in one["entries"]] == [("gh_token", "file"), ("other", "env:MY_TOKEN_VAR")]
    for out in (listed, one, chatflow("vault", "ls", "--json")):
        assert value not in str(getattr(out, "stdout", out)) + str(getattr(out, "stderr", ""))
    # the database (SQLite's file, or every PostgreSQL table) holds names and locations, never the value
    assert database.holds("MY_TOKEN_VAR") and not database.holds(value)
    assert json.loads(_vault_file().read_text()) == {"work": {"gh_token": value}}
    # remove an entry (its value goes too), then the vault
    assert chatflow("vault", "rm", "work", "gh_token").returncode == 0
    assert json.loads(_vault_file().read_text()) == {}
    assert [e["name"] for e in chatflow("vault", "ls", "work", "--json").json()["entries"]] == ["other"]
    r = chatflow("vault", "rm", "work")
    assert r.returncode == 0 and "removed vault work" in r.stderr, r
    assert [v["name"] for v in chatflow("vault", "ls", "--json").json()] == ["empty"]


def test_vault_bad_input_gets_a_clear_line_and_its_exit_code(chatflow):
    value = _secret()
    assert chatflow("vault", "create", "work").returncode == 0
    # a value on the command line is refused, and not echoed back
    r = chatflow("vault", "set", "work", "gh_token", value)
    assert r.returncode == 2, r
    assert "a vault value is never taken from the command line" in r.stderr and value not in r.stderr + r.stdout
    assert chatflow("vault", "ls", "work", "--json").json()["entries"] == []
    cases = [
        (("vault", "create", "work"), 2, "vault 'work' exists already"),
        (("vault", "create", "../etc"), 2, "vault name is not valid: it does not start with a letter or a digit"),
        (("vault", "create", "-x"), 2, ""),
        (("vault", "set", "work", "bad/entry"), 2, "entry name is not valid: it holds '/' other than"),
        (("vault", "set", "nope", "gh_token"), 3, "no vault 'nope' (vaults: work; create one with: chatflow vault create nope)"),
        (("vault", "ls", "nope"), 3, "no vault 'nope'"),
        (("vault", "rm", "nope"), 3, "no vault 'nope'"),
        (("vault", "rm", "work", "missing"), 3, "vault 'work' has no entry 'missing'"),
        (("vault", "set", "work", "e", "--env", "1BAD"), 2, "--env takes an environment variable's name"),
        (("vault", "set", "work", "e", "--keyring", "--file"), 2, "--keyring and --file exclude each other"),
    ]
    for args, code, line in cases:
        r = chatflow(*args, input=value)
        assert r.returncode == code, (args, r)
        assert line in r.stderr, (args, r)
    short = chatflow("vault", "set", "work", "e", input="short\n")
    assert short.returncode == 2 and "at least 8 characters" in short.stderr, short
    empty = chatflow("vault", "set", "work", "e", input="")
    assert empty.returncode == 2 and "no value for work/e" in empty.stderr, empty
    chat = chatflow("chat", "--vault", "nope", "hi")
    assert chat.returncode == 3 and "no vault 'nope'" in chat.stderr, chat


def test_the_vault_file_is_owner_only_and_one_open_to_others_is_refused(chatflow, provider, config_file):
    os.umask(0o022)
    value = _secret()
    assert chatflow("vault", "create", "work").returncode == 0
    assert chatflow("vault", "set", "work", "gh_token", input=value).returncode == 0
    path = _vault_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # written atomically
    path.chmod(0o644)
    r = chatflow("vault", "set", "work", "again", input=value)
    assert r.returncode == 9, r
    assert f"the vault file {path} is open to other users (mode 0644)" in r.stderr and f"chmod 600 {path}" in r.stderr
    # a tool whose secret would come from it gets an error result saying why; the turn goes on
    _config(config_file)
    provider.add_tool_calls([("c1", "whoami", '{"user": "ann"}')])
    provider.add_text("could not")
    r = chatflow("chat", "--vault", "work", "who am I?")
    assert r.returncode == 0, r
    [result] = _tool_results(provider.requests[-1])
    assert result.startswith("Error: whoami needs a secret that could not be read: the vault file") and "0644" in result
    path.chmod(0o600)
    provider.add_tool_calls([("c2", "whoami", '{"user": "ann"}')])
    provider.add_text("done")
    assert chatflow("chat", "--vault", "work", "who am I?").returncode == 0
    assert _tool_results(provider.requests[-1])[-1].endswith(hashlib.sha256(value.encode()).hexdigest())


# ---------------------------------------------------------------------------------------
# tools with secrets
# ---------------------------------------------------------------------------------------
def test_a_tool_gets_its_secret_from_the_mounted_vault_and_the_model_never_sees_it(chatflow, provider, config_file):
    value = _secret()
    _config(config_file)
    for name in ("empty", "work"):
        assert chatflow("vault", "create", name).returncode == 0
    assert chatflow("vault", "set", "work", "gh_token", input=value).returncode == 0
    provider.add_tool_calls([("c1", "whoami", '{"user": "ann"}')])
    provider.add_text("you are ann")
    r = chatflow("chat", "-s", "v1", "--vault", "empty", "--vault", "work", "who am I?")
    assert r.returncode == 0, r
    first = provider.requests[0]
    schema = next(t for t in first["tools"] if t["function"]["name"] == "whoami")["function"]["parameters"]
    assert schema["properties"] == {"user": {"type": "string"}} and schema["required"] == ["user"]
    assert _tool_results(provider.requests[-1]) == [f"ann: token sha256 {hashlib.sha256(value.encode()).hexdigest()}"]
    # a model that passes the secret parameter itself is refused: it cannot choose the token
    provider.add_tool_calls([("c2", "whoami", '{"user": "ann", "token": "forged-token"}')])
    provider.add_text("ok")
    assert chatflow("chat", "-s", "v1", "--vault", "work", "again").returncode == 0
    assert _tool_results(provider.requests[-1])[-1].startswith("Error: invalid arguments for whoami: unknown argument")
    for body in provider.requests:
        assert value not in json.dumps(body)


def test_a_vault_mount_is_journaled_so_a_resumed_session_keeps_its_secret(chatflow, provider, config_file):
    value = _secret()
    _config(config_file)
    assert chatflow("vault", "create", "work").returncode == 0
    assert chatflow("vault", "set", "work", "gh_token", input=value).returncode == 0
    provider.add_text("hello")
    assert chatflow("chat", "-s", "r1", "--vault", "work", "hi").returncode == 0
    events = chatflow("replay", "r1", "--json").stdout
    assert '"resource.mounted"' in events and '"vault"' in events, events
    # resumed without --vault (chat -c: the latest session): the mount is the session's
    provider.add_tool_calls([("c1", "whoami", '{"user": "ann"}')])
    provider.add_text("you are ann")
    r = chatflow("chat", "-c", "who am I?")
    assert r.returncode == 0, r
    assert _tool_results(provider.requests[-1]) == [f"ann: token sha256 {hashlib.sha256(value.encode()).hexdigest()}"]
    # a session that never mounted it gets no secret
    provider.add_tool_calls([("c2", "whoami", '{"user": "ann"}')])
    provider.add_text("none")
    assert chatflow("chat", "-s", "r2", "who am I?").returncode == 0
    assert "no vault is mounted on this session" in _tool_results(provider.requests[-1])[0]
    # per agent in config.toml: vaults = [...] is mounted like memory = [...]
    _config(config_file, 'vaults = ["work"]\n')
    provider.add_tool_calls([("c3", "whoami", '{"user": "bob"}')])
    provider.add_text("you are bob")
    assert chatflow("chat", "-s", "r3", "who am I?").returncode == 0
    assert _tool_results(provider.requests[-1]) == [f"bob: token sha256 {hashlib.sha256(value.encode()).hexdigest()}"]
    for body in provider.requests:
        assert value not in json.dumps(body)


def test_a_missing_secret_is_a_tool_error_naming_vault_and_entry_and_the_turn_goes_on(chatflow, provider, config_file,
                                                                                       database):
    _config(config_file)
    assert chatflow("vault", "create", "work").returncode == 0
    provider.add_tool_calls([("c1", "whoami", '{"user": "ann"}')])
    provider.add_text("no token, sorry")
    r = chatflow("chat", "-s", "m1", "--vault", "work", "--json", "who am I?")
    assert r.returncode == 0, r
    assert r.json()["content"] == "no token, sorry"
    assert _tool_results(provider.requests[-1]) == [
        "Error: whoami needs the secret 'gh_token', which no mounted vault holds (searched: 'work'); nothing ran. "
        "Add it with: chatflow vault set work gh_token"]
    assert r.json()["status"] == "idle" and r.json()["turn"] == 1, r.json()
    # no vault mounted at all
    provider.add_tool_calls([("c2", "whoami", '{"user": "ann"}')])
    provider.add_text("none mounted")
    assert chatflow("chat", "-s", "m2", "who am I?").returncode == 0
    assert _tool_results(provider.requests[-1]) == [
        "Error: whoami needs the secret 'gh_token' from a vault, and no vault is mounted on this session; nothing ran"]
    # an env: reference whose variable is unset: the line names the variable to set (a
    # variable's name is no secret); set, it is used
    assert chatflow("vault", "set", "work", "gh_token", "--env", "GH_TOKEN_FOR_TEST").returncode == 0
    provider.add_tool_calls([("c3", "whoami", '{"user": "ann"}')])
    provider.add_text("unset")
    assert chatflow("chat", "-s", "m3", "--vault", "work", "who?").returncode == 0
    assert _tool_results(provider.requests[-1]) == [
        "Error: whoami needs the secret 'gh_token': vault 'work' takes it from the environment variable "
        "GH_TOKEN_FOR_TEST, which is not set (searched: 'work'); nothing ran. Set GH_TOKEN_FOR_TEST in the "
        "environment chatflow runs in"]
    value = _secret()
    provider.add_tool_calls([("c4", "whoami", '{"user": "ann"}')])
    provider.add_text("set")
    assert chatflow("chat", "-s", "m4", "--vault", "work", "who?", env={"GH_TOKEN_FOR_TEST": value}).returncode == 0
    assert _tool_results(provider.requests[-1])[0].endswith(hashlib.sha256(value.encode()).hexdigest())
    # a value stored in the file and removed from it by hand: the line says to set it again
    assert chatflow("vault", "set", "work", "gh_token", "--file", input=value).returncode == 0
    _vault_file().write_text("{}")
    provider.add_tool_calls([("c5", "whoami", '{"user": "ann"}')])
    provider.add_text("gone")
    assert chatflow("chat", "-s", "m5", "--vault", "work", "who?").returncode == 0
    assert _tool_results(provider.requests[-1]) == [
        "Error: whoami needs the secret 'gh_token': vault 'work' lists it in the file, but the value is no longer "
        "there (searched: 'work'); nothing ran. Set it again with: chatflow vault set work gh_token"]


def test_an_agents_vaults_in_config_toml_fill_its_tools(chatflow, provider, config_file):
    value = _secret()
    _config(config_file, 'vaults = ["team"]\n')
    assert chatflow("vault", "create", "team").returncode == 0
    assert chatflow("vault", "set", "team", "gh_token", input=value).returncode == 0
    provider.add_tool_calls([("c1", "whoami", '{"user": "bo"}')])
    provider.add_text("bo")
    assert chatflow("chat", "who?").returncode == 0
    assert _tool_results(provider.requests[-1]) == [f"bo: token sha256 {hashlib.sha256(value.encode()).hexdigest()}"]
    config_file('[[agents]]\nname = "A"\nvaults = ["../x"]\n')
    bad = chatflow("config", "show")
    assert bad.returncode == 9 and "vaults must be a list of vault names" in bad.stderr, bad


def test_the_keyring_is_used_when_a_backend_is_there(chatflow, provider, config_file, tmp_path, monkeypatch):
    pytest.importorskip("keyrings.alt")
    from keyrings.alt.file import PlaintextKeyring

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    ring = PlaintextKeyring()  # the backend the chatflow processes use, read from this test
    env = {"PYTHON_KEYRING_BACKEND": "keyrings.alt.file.PlaintextKeyring", "XDG_DATA_HOME": str(tmp_path / "xdg")}
    value = _secret()
    _config(config_file)
    assert chatflow("vault", "create", "work", env=env).returncode == 0
    r = chatflow("vault", "set", "work", "gh_token", input=value, env=env)
    assert r.returncode == 0, r
    assert "set work/gh_token in keyring (keyrings.alt.file.PlaintextKeyring)" in r.stderr
    assert not _vault_file().exists()
    assert chatflow("vault", "ls", "work", "--json", env=env).json()["entries"][0]["location"] == "keyring"
    assert ring.get_password("chatflow-vault:work", "gh_token") == value
    provider.add_tool_calls([("c1", "whoami", '{"user": "cy"}')])
    provider.add_text("cy")
    assert chatflow("chat", "--vault", "work", "who?", env=env).returncode == 0
    assert _tool_results(provider.requests[-1]) == [f"cy: token sha256 {hashlib.sha256(value.encode()).hexdigest()}"]
    # without a usable keyring the value cannot be read: the tool says so, the value is not lost
    provider.add_tool_calls([("c2", "whoami", '{"user": "cy"}')])
    provider.add_text("no keyring")
    assert chatflow("chat", "--vault", "work", "who?").returncode == 0
    assert "is kept in the keyring, and no keyring is usable now" in _tool_results(provider.requests[-1])[0]
    assert chatflow("vault", "rm", "work", "gh_token", env=env).returncode == 0
    assert ring.get_password("chatflow-vault:work", "gh_token") is None


# ---------------------------------------------------------------------------------------
# the secret grep
# ---------------------------------------------------------------------------------------
def test_a_vault_value_is_never_written_or_printed(chatflow, provider, config_file, tmp_path):
    value = _secret()
    env = {"GH_TOKEN_GREP": value}
    _config(config_file)
    outputs: list[tuple[str, bytes]] = []

    def run(*args: str, expect: int = 0, **kw: Any) -> Any:
        r = chatflow(*args, env={**env, **kw.pop("env", {})}, **kw)
        outputs.append((" ".join(args), r.stdout_bytes + r.stderr_bytes))
        assert r.returncode == expect, r
        return r

    run("vault", "create", "work")
    run("vault", "set", "work", "gh_token", "--env", "GH_TOKEN_GREP")
    calls = [("c1", "leaky", "{}"), ("c2", "raising", "{}"), ("c3", "whoami", '{"user": "d"}')]
    provider.add_tool_calls(calls)
    provider.add_text("done")
    r = run("chat", "-s", "g1", "--vault", "work", "go")
    results = _tool_results(provider.requests[-1])
    assert results[0] == '{"token": "[redacted]", "also": "Bearer [redacted]"}'
    assert results[1] == "Error: raising raised RuntimeError: the server refused token [redacted]"
    for fmt in (("--json",), ("--output", "jsonl")):
        provider.add_tool_calls([(f"c{fmt[-1]}", "leaky", "{}"), (f"d{fmt[-1]}", "raising", "{}")])
        provider.add_text("done")
        run("chat", "-s", "g1", "--vault", "work", *fmt, "again")
    provider.add_tool_calls([("c9", "raising", "{}")])
    provider.add_text("done")
    run("--debug", "chat", "-s", "g1", "--vault", "work", "debug")
    # a provider error that echoes the value: scrubbed from the error line
    provider.add_tool_calls([("c10", "leaky", "{}")])
    provider.add_error(400, message=f"bad request holding {value}")
    run("--debug", "chat", "-s", "g1", "--vault", "work", "fail", expect=5)
    run("sessions", "show", "g1", "--all", "--full")
    run("sessions", "show", "g1", "--json")
    run("replay", "g1", "--json")
    run("sessions", "search", "redacted")
    export = tmp_path / "export.jsonl"
    run("sessions", "export", "g1", "-o", str(export))
    run("sessions", "export", "g1", "--format", "md")
    run("vault", "ls", "--json")
    for label, data in outputs:
        assert value.encode() not in data, f"the vault value appeared in the output of: {label}"
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert export in written and any(p.name == "chatflow.db" for p in written)
    for path in written:
        assert value.encode() not in path.read_bytes(), f"the vault value was written to {path}"
    for body in provider.requests:
        assert value not in json.dumps(body), "the vault value went to the model"


LOGGING_TOOLS = '''
import logging
from typing import Annotated

from chatflow_cli import Secret, tool

log = logging.getLogger("chattytools")


@tool
def chatty(token: Annotated[str, Secret("gh_token")]) -> str:
    """Use the token, and log it (a careless tool)."""
    log.warning("calling the API with token %s", token)
    log.error(f"the token was {token}")
    logging.warning("root logger: %s", token)
    try:
        raise RuntimeError(f"refused {token}")
    except RuntimeError:
        log.exception("failed")
    return "done"
'''


def test_a_tools_own_log_lines_never_print_a_vault_secret(chatflow, provider, config_file) -> None:
    secret = _secret()
    cfg = config_file('default_agent = "Desk"\n[[agents]]\nname = "Desk"\ninstructions = "x"\n'
                      'tools = ["chattytools:chatty"]\n')
    (cfg.parent / "chattytools.py").write_text(LOGGING_TOOLS)
    assert chatflow("vault", "create", "work").returncode == 0
    assert chatflow("vault", "set", "work", "gh_token", input=secret).returncode == 0
    for flags in ((), ("--debug",)):
        provider.add_tool_calls([("c1", "chatty", "{}")])
        provider.add_text("ok")
        r = chatflow(*flags, "chat", "--vault", "work", "go")
        assert r.returncode == 0, r
        assert secret not in r.stdout + r.stderr, (flags, r.stderr)
        # the lines are still printed, with the value taken out
        assert "calling the API with token [redacted]" in r.stderr, (flags, r.stderr)
        assert "the token was [redacted]" in r.stderr and "root logger: [redacted]" in r.stderr, (flags, r.stderr)
        assert "RuntimeError: refused [redacted]" in r.stderr, (flags, r.stderr)


def test_a_mounted_vaults_values_are_scrubbed_before_any_tool_reads_the_vault(chatflow, provider, config_file,
                                                                              tmp_path):
    """A memory document holds the token and the model views it before any tool of this process
    read the vault: the values of a mounted vault are secrets from the start of the run, so the
    view's result is scrubbed whatever the order of the calls."""
    value = f"{_secret()}-zq998877"  # its last word can be searched for on its own
    env = {"GH_TOKEN_EARLY": value}
    _config(config_file)
    outputs: list[tuple[str, bytes]] = []

    def run(*args: str, expect: int = 0, **kw: Any) -> Any:
        r = chatflow(*args, env=env, **kw)
        outputs.append((" ".join(args), r.stdout_bytes + r.stderr_bytes))
        assert r.returncode == expect, r
        return r

    run("vault", "create", "work")
    run("vault", "set", "work", "gh_token", "--env", "GH_TOKEN_EARLY")
    run("memory", "create", "notes")
    run("memory", "write", "notes", "deploy.md", input=f"the deploy token is {value}\n")
    provider.add_tool_calls([("c1", "memory_view", json.dumps({"path": "deploy.md"}))])
    provider.add_tool_calls([("c2", "whoami", '{"user": "d"}')])
    provider.add_text("done")
    run("chat", "-s", "early", "--vault", "work", "--memory", "notes:ro", "what is the deploy token?")
    (view,) = _tool_results(provider.requests[1])
    assert "the deploy token is [redacted]" in view, view
    provider.add_tool_calls([("c3", "memory_search", json.dumps({"query": "deploy"}))])
    provider.add_text("done")
    run("--debug", "chat", "-s", "early", "search it")  # resumed: the mounts come from the log
    assert "[redacted]" in _tool_results(provider.requests[-1])[-1]
    # a search for a word inside the value: the snippet's match marks must not split it past the scrubbing
    provider.add_tool_calls([("c4", "memory_search", json.dumps({"query": "zq998877"}))])
    provider.add_text("done")
    run("chat", "-s", "early", "search inside it")
    found = _tool_results(provider.requests[-1])[-1]
    assert "notes/deploy.md" in found and "[redacted]" in found, found
    assert "zq998877" not in found and value[:-9] not in found, found
    run("sessions", "show", "early", "--all", "--full")
    run("sessions", "show", "early", "--json")
    run("replay", "early", "--json")
    export = tmp_path / "early.jsonl"
    run("sessions", "export", "early", "-o", str(export))
    run("sessions", "export", "early", "--format", "md")
    for label, data in outputs[4:]:  # after `memory write`, which read it from stdin
        assert value.encode() not in data, f"the vault value appeared in the output of: {label}"
    for body in provider.requests:
        assert value[:-9] not in json.dumps(body), "the vault value went to the model"
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert export in written
    for path in written:
        if not path.name.startswith("chatflow.db"):
            assert value.encode() not in path.read_bytes(), f"the vault value was written to {path}"
    # the database: only the memory document (the user's own) holds it
    import sqlite3

    db = sqlite3.connect(next(p for p in written if p.name == "chatflow.db"))
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert "chatflow_events" in tables and "chatflow_messages" in tables
    for table in tables:
        rows = repr(db.execute(f'SELECT * FROM "{table}"').fetchall())
        if not table.startswith("chatflow_memory_"):
            assert value not in rows, f"the vault value is in the table {table}"
