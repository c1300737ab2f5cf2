"""What a new user types at the vault commands, with the real ``chatflow`` process.

* A value typed where a name goes (``gh_token=ghp_...``, the token itself, ``--env
  VAR=ghp_...``, ``--vault``/``--memory``, an extra argument): refused with a line saying
  what is wrong, and the value is in nothing printed: stderr, the ``--json`` error object, the
  ``--debug`` traceback.
* One name rule for vaults and memory stores (``check_resource_name``): ``vault create Work2``
  is refused as ``chat --vault Work2`` is; a vault stored under an older rule can be listed and
  removed, not filled or mounted. On SQLite and PostgreSQL.
* A value is one line, from a pipe and from a terminal; ``--multiline`` keeps more.
* ``/vault`` in the REPL mounts and unmounts a vault, journaled like ``/memory``.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

from tests.cli.test_vaults import _config, _tool_results
from tests.helpers.pty_driver import leave
from tests.helpers.stored import open_store


def _secret() -> str:
    return f"ghp_SECRET{uuid.uuid4().hex}"


def _vault_file() -> Path:
    return Path(os.environ["CHATFLOW_HOME"]) / "vault-secrets.json"


def _stored() -> dict[str, Any]:
    return json.loads(_vault_file().read_text()) if _vault_file().exists() else {}


# ---------------------------------------------------------------------------------------
# a value where a name goes
# ---------------------------------------------------------------------------------------
def test_a_value_typed_where_a_name_goes_is_never_printed(chatflow, provider):
    value = _secret()
    token = value.lower()  # a valid-shaped name that is a credential
    tail = value[10:]  # the random part: no piece of the value may be printed
    assert chatflow("vault", "create", "work").returncode == 0
    assert chatflow("memory", "create", "notes").returncode == 0
    cases: list[tuple[tuple[str, ...], int, str]] = [
        (("vault", "set", "work", f"gh_token={value}"), 2,
         "entry name is not valid: it holds '=': a vault value is never given on the command line"),
        (("vault", "set", "work", token), 2, "entry name is not valid: it looks like a credential"),
        (("vault", "set", "work", f"gh token {value}"), 2, "entry name is not valid: it holds a space"),
        (("vault", "set", "work", "x" * 30 + value), 2, "entry name is not valid: it has 72 characters, over 64"),
        (("vault", "set", "work", "gh_token", "--env", f"GH_TOKEN={value}"), 2,
         "--env takes an environment variable's name, and this is not one: it holds '='"),
        (("vault", "set", f"work={value}", "gh_token"), 2, "vault name is not valid: it holds '='"),
        (("vault", "create", f"work={value}"), 2, "vault name is not valid: it holds '='"),
        (("vault", "create", token), 2, "vault name is not valid: it looks like a credential"),
        (("vault", "create", value), 2, "vault name is not valid: it holds an uppercase letter: names are lowercase;"),
        (("vault", "create", "work", value), 2, "unexpected extra argument(s) ([redacted])"),
        (("vault", "rm", "work", f"gh_token={value}"), 2, "entry name is not valid: it holds '='"),
        (("vault", "rm", "work", token), 3, "vault 'work' has no entry (the name given, not shown)"),
        (("vault", "rm", "work", "gh_token", value), 2, "unexpected extra argument(s) ([redacted])"),
        (("vault", "ls", f"x={value}"), 2, "vault name is not valid: it holds '='"),
        (("vault", "ls", token), 3, "no vault (the name given, not shown) (vaults: work)"),
        (("chat", "--vault", f"work={value}", "hi"), 2, "vault name is not valid: it holds '='"),
        (("chat", "--vault", token, "hi"), 3, "no vault (the name given, not shown)"),
        (("chat", "--memory", f"notes:{value}", "hi"), 2, "mount mode (not shown) does not exist: write notes:ro"),
        (("chat", "--memory", f"{value}:ro", "hi"), 2, "memory store name is not valid: it holds an uppercase"),
        (("memory", "create", f"n={value}"), 2, "memory store name is not valid: it holds '='"),
        (("memory", "create", token), 2, "memory store name is not valid: it looks like a credential"),
    ]
    for args, code, line in cases:
        for extra in ((), ("--debug",)):
            r = chatflow(*extra, *args, input=f"{value}\n")
            assert r.returncode == code, (args, r)
            assert line in r.stderr, (args, r)
            assert tail not in r.stdout + r.stderr, f"the value was printed by: chatflow {' '.join(extra + args)}"
            if extra:
                assert "Traceback" in r.stderr or "Got unexpected" in r.stderr, r
    # the --json error objects of chat and the vault commands
    for args in (("vault", "set", "work", f"gh_token={value}", "--json"), ("vault", "ls", f"x={value}", "--json"),
                 ("chat", "--json", "--vault", f"work={value}", "hi"), ("--debug", "vault", "set", "work", token, "--json")):
        r = chatflow(*args, input=value)
        assert r.returncode == 2, (args, r)
        assert r.json()["exit_code"] == 2 and "is not valid" in r.json()["error"], (args, r)
        assert tail not in r.stdout + r.stderr, f"the value was printed by: chatflow {' '.join(args)}"
    # nothing was stored under a name that holds the value
    listed = chatflow("vault", "ls", "--json").json()
    assert [(v["name"], v["entries"]) for v in listed] == [("work", [])] and not _stored()


def test_a_name_breaking_the_rule_is_never_quoted_nor_suggested(chatflow, provider):
    """A name-shaped value (letters of both cases, too short a run to look like a token) where a
    vault, memory store or entry name goes: no line, --json error or --debug trace quotes it or
    a lowercased suggestion, and a lookup says the name is not valid rather than "no vault"."""
    value = "Zq9SECRETvalue-7781xx"
    assert chatflow("vault", "create", "work").returncode == 0
    assert chatflow("memory", "create", "notes").returncode == 0
    not_valid = "the vault name given is not a valid name (it holds an uppercase letter: names are lowercase)"
    cases: list[tuple[tuple[str, ...], int, str]] = [
        (("vault", "create", value), 2, "vault name is not valid: it holds an uppercase letter"),
        (("vault", "set", value, "gh_token"), 2, not_valid),
        (("vault", "rm", value), 2, not_valid),
        (("vault", "rm", value, "gh_token"), 2, not_valid),
        (("vault", "ls", value), 2, not_valid),
        (("vault", "set", "work", value), 2, "entry name is not valid: it mixes uppercase and lowercase letters"),
        (("vault", "rm", "work", value), 3, "vault 'work' has no entry (the name given, not shown)"),
        (("chat", "--vault", value, "hi"), 2, "vault name is not valid: it holds an uppercase letter"),
        (("chat", "--memory", value, "hi"), 2, "memory store name is not valid: it holds an uppercase letter"),
        (("memory", "create", value), 2, "memory store name is not valid: it holds an uppercase letter"),
        (("memory", "ls", value), 2, "memory store name is not valid: it holds an uppercase letter"),
        (("memory", "show", value, "a.md"), 2, "memory store name is not valid: it holds an uppercase letter"),
    ]
    for args, code, line in cases:
        for extra in ((), ("--debug",), ("--json",)):
            if extra == ("--json",) and args[:2] not in (("vault", "set"), ("vault", "ls")) and args[0] != "chat":
                continue  # a command without --json
            call = (*extra, *args) if extra != ("--json",) else ("chat", "--json", *args[1:]) if args[0] == "chat" \
                else (*args, "--json")
            r = chatflow(*call, input="abcdefgh-value-1\n")
            assert r.returncode == code, (call, r)
            assert line in r.stderr, (call, r)
            printed = (r.stdout + r.stderr).lower()
            assert "zq9secret" not in printed and "7781" not in printed, f"printed by: chatflow {' '.join(call)}"
            if extra == ("--json",):
                assert r.json()["exit_code"] == code, (call, r)
    home = Path(os.environ["CHATFLOW_HOME"])
    for path in home.rglob("*"):
        if path.is_file():
            assert b"zq9secret" not in path.read_bytes().lower(), path


def test_a_store_name_that_looks_like_a_credential_is_never_quoted(chatflow, tmp_path):
    """A token where a memory store's name goes follows the name rule's characters but looks
    like a credential: no memory command, --debug trace, REPL line or history file shows it."""
    token = "ghp_abc123def456ghi789jkl0"
    for args in (("memory", "show", token, "a.md"), ("memory", "ls", token)):  # no database yet, then one
        r = chatflow("--debug", *args)
        assert r.returncode == 3 and "no memory store (the name given, not shown)" in r.stderr, r
        assert token not in r.stdout + r.stderr, r
    assert chatflow("memory", "create", "notes").returncode == 0
    for args in (("memory", "ls", token), ("memory", "export", token), ("memory", "history", token),
                 ("memory", "rm", token, "--yes"), ("memory", "search", "foo", "--store", token),
                 ("chat", "--memory", token, "hi")):
        for extra in ((), ("--debug",)):
            r = chatflow(*extra, *args, input="x\n")
            assert r.returncode == 3, (args, r)
            assert token not in r.stdout + r.stderr and "ghp_" not in r.stderr, (args, r)
    home = Path(os.environ["CHATFLOW_HOME"])
    assert not [p for p in home.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]


# ---------------------------------------------------------------------------------------
# one name rule; names from before it
# ---------------------------------------------------------------------------------------
def test_vault_names_follow_the_mount_rule_and_older_ones_can_be_listed_and_removed(chatflow, provider, config_file,
                                                                                       database):
    r = chatflow("vault", "create", "Work2")
    assert r.returncode == 2, r
    assert ("vault name is not valid: it holds an uppercase letter: names are lowercase; use 1-64 "
            "characters of a-z, 0-9, '_', '.', '-', starting with a letter or a digit") in r.stderr, r
    assert "Work2" not in r.stderr and "work2" not in r.stderr, r
    chat = chatflow("chat", "--vault", "Work2", "hi")
    assert chat.returncode == 2 and "vault name is not valid" in chat.stderr and "ork2" not in chat.stderr, chat
    config_file('[[agents]]\nname = "A"\ninstructions = "x"\nvaults = ["Work2"]\n')
    bad = chatflow("config", "show")
    assert bad.returncode == 9 and "vaults must be a list of vault names: vault name is not valid" in bad.stderr
    config_file("")
    for good in ("work2", "team.crm", "acme-2024", "a" * 64):
        assert chatflow("vault", "create", good).returncode == 0, good
    # a vault stored by an older chatflow, whose rule let uppercase letters in
    value = _secret()
    database.execute("INSERT INTO chatflow_vaults (name, created_at_utc) VALUES (?, ?)", ("Work2", 1.0))
    database.execute("INSERT INTO chatflow_vault_entries (vault, entry, location, updated_at_utc) VALUES (?, ?, ?, ?)",
                     ("Work2", "gh_token", "file", 1.0))
    _vault_file().parent.mkdir(mode=0o700, exist_ok=True)
    _vault_file().write_text(json.dumps({"Work2": {"gh_token": value}}))
    _vault_file().chmod(0o600)
    listed = chatflow("vault", "ls")
    assert listed.returncode == 0 and "Work2" in listed.stdout.splitlines(), listed
    assert [e["name"] for e in chatflow("vault", "ls", "Work2", "--json").json()["entries"]] == ["gh_token"]
    refused = chatflow("vault", "set", "Work2", "other", input=value)
    assert refused.returncode == 2, refused
    assert ("this vault was made before vault names were lowercase only: it cannot be mounted, so no entry is set "
            "in it; create a vault with a valid name, set its entries there, then remove this one") in refused.stderr
    assert "ork2" not in refused.stderr, refused
    removed = chatflow("vault", "rm", "Work2", "gh_token")
    assert removed.returncode == 0 and "removed entry gh_token of the vault given" in removed.stderr, removed
    assert _stored() == {}
    removed = chatflow("vault", "rm", "Work2")
    assert removed.returncode == 0 and "removed the vault given" in removed.stderr and "ork2" not in removed.stderr
    assert "Work2" not in [v["name"] for v in chatflow("vault", "ls", "--json").json()]
    assert database.execute("SELECT vault FROM chatflow_vault_entries WHERE vault = ?", ("Work2",)) == []


# ---------------------------------------------------------------------------------------
# a value is one line
# ---------------------------------------------------------------------------------------
def test_a_value_from_stdin_is_one_line_unless_multiline(chatflow):
    assert chatflow("vault", "create", "work").returncode == 0
    value = _secret()
    for text, kept in ((value, value), (value + "\n", value), (value + "\r\n", value)):
        assert chatflow("vault", "set", "work", "tok", input=text).returncode == 0
        assert _stored()["work"]["tok"] == kept, repr(text)
    # pass show's output: the password, then the rest of the entry
    piped = f"{value}\nlogin: ann\nurl: github.com\n"
    r = chatflow("vault", "set", "work", "other", input=piped)
    assert r.returncode == 2, r
    assert ("the value has 3 lines, and a vault value is one line: nothing was stored. From a password manager, give "
            "its first line (pass show NAME | head -n 1 | chatflow vault set work other); --multiline keeps every "
            "line") in r.stderr
    assert value[10:] not in r.stdout + r.stderr
    assert "other" not in _stored()["work"] and [e["name"] for e in chatflow(
        "vault", "ls", "work", "--json").json()["entries"]] == ["tok"]
    assert chatflow("vault", "set", "work", "other", input=value + "\n\n").returncode == 2  # a blank second line too
    pem = "-----BEGIN KEY-----\nMIIBVwIBADANBgkq\n-----END KEY-----\n"
    assert chatflow("vault", "set", "work", "key", "--multiline", input=pem).returncode == 0
    assert _stored()["work"]["key"] == pem[:-1]


def test_a_value_typed_at_a_terminal_is_one_line_and_a_pasted_rest_is_refused(chatflow, pty_chatflow):
    assert chatflow("vault", "create", "work").returncode == 0
    value = _secret()
    typed = pty_chatflow("vault", "set", "work", "tok")
    typed.wait_text("value of work/tok (not shown):")
    typed.send(value + "\r")
    assert typed.wait_exit() == 0
    assert value not in typed.screen() and _stored()["work"]["tok"] == value
    pasted = pty_chatflow("vault", "set", "work", "other")
    pasted.wait_text("value of work/other (not shown):")
    pasted.send(f"{value}\rlogin: ann\rrm -rf notes\r")  # one paste: the rest must not reach a shell either
    assert pasted.wait_exit() == 2
    assert "more than one line was pasted, and a vault value is one line: nothing was stored" in pasted.screen()
    assert value not in pasted.screen() and "other" not in _stored()["work"]
    multi = pty_chatflow("vault", "set", "work", "key", "--multiline")
    multi.wait_text("end with Ctrl-D on a line of its own")
    multi.send("first-line-1\rsecond-line-2\r")
    multi.send("\x04")
    assert multi.wait_exit() == 0
    assert "second-line-2" not in multi.screen() and _stored()["work"]["key"] == "first-line-1\nsecond-line-2"


# ---------------------------------------------------------------------------------------
# /vault in the REPL
# ---------------------------------------------------------------------------------------
def test_slash_vault_mounts_and_unmounts_a_vault_journaled_like_slash_memory(chatflow, provider, config_file,
                                                                             pty_chatflow):
    value = _secret()
    _config(config_file)
    for name in ("work", "empty"):
        assert chatflow("vault", "create", name).returncode == 0
    assert chatflow("vault", "set", "work", "gh_token", input=value).returncode == 0
    provider.add_tool_calls([("c1", "whoami", '{"user": "ann"}')])
    provider.add_text("you are ann")
    repl = pty_chatflow("chat", "-s", "rv")
    repl.wait_prompt()
    repl.send("/vault\r")
    repl.wait_text("mounted: none; vaults: empty, work")
    repl.send("/vault mount nope\r")
    repl.wait_text("/vault: no vault 'nope' (vaults: empty, work")
    repl.send(f"/vault mount work={value}\r")  # shown as typed at the prompt, never in the answer
    repl.wait_text("/vault: vault name is not valid: it holds '='")
    assert all(value[10:] not in line for line in repl.screen().splitlines() if "is not valid" in line)
    repl.send("/vault mount work\r")
    repl.wait_text("mounted vault work")
    repl.send("/vault\r")
    repl.wait_text("mounted: work; vaults: empty, work")
    repl.send("who am I?\r")
    repl.wait_text("you are ann")
    repl.wait_prompt_after("you are ann")
    repl.send("/vault unmount work\r")
    repl.wait_text("unmounted vault work")
    repl.send("/vault unmount work\r")
    repl.wait_text("vault work is not mounted")
    leave(repl)
    history = (Path(os.environ["CHATFLOW_HOME"]) / "repl_history").read_text()
    assert "/vault mount work\n" in history and value[10:] not in history  # the line holding it is not kept
    assert _tool_results(provider.requests[-1]) == [f"ann: token sha256 {hashlib.sha256(value.encode()).hexdigest()}"]
    with open_store() as st:
        mounts = [(e.type, e.payload) for e in st.events("rv") if e.type.startswith("resource.")]
    assert mounts == [("resource.mounted", {"kind": "vault", "name": "work", "mode": "read-only"}),
                      ("resource.unmounted", {"kind": "vault", "name": "work", "mode": "read-only"})]
