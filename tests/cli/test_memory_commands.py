"""``chatflow memory ...`` as a person uses it, through the real process: create, write,
show, history, revert, rm, export/import, search, and the exit codes of bad input."""

from __future__ import annotations

import json

from chatflow_cli.core.errors import ExitStatus


def test_a_person_reads_fixes_and_moves_a_store(chatflow, tmp_path) -> None:
    assert chatflow("memory", "ls").returncode == 0  # no database yet: nothing, no error
    r = chatflow("memory", "create", "notes", "--description", "what I said")
    assert r.returncode == 0 and "created memory store notes" in r.stderr, r
    assert chatflow("memory", "create", "notes").returncode == ExitStatus.USAGE
    text = "Acme likes tea.\nContact: Bob\n"
    r = chatflow("memory", "write", "notes", "customers/acme.md", input=text)
    assert r.returncode == 0 and "write 1" in r.stderr, r
    assert chatflow("memory", "show", "notes", "customers/acme.md").stdout == text
    shown = chatflow("memory", "show", "notes", "customers/acme.md", "--json").json()
    assert (shown["text"], shown["version"]) == (text, 1)
    # a write that expects another version is refused and says so
    r = chatflow("memory", "write", "notes", "customers/acme.md", "--if-version", "0", input="x")
    assert r.returncode == ExitStatus.USAGE and "is at version 1" in r.stderr, r
    assert chatflow("memory", "write", "notes", "customers/acme.md", "--if-version", "1",
                    input="Acme likes coffee.\n").returncode == 0
    stores = chatflow("memory", "ls", "--json").json()
    assert [(s["name"], s["documents"], s["last_seq"], s["description"]) for s in stores] == [
        ("notes", 1, 2, "what I said")]
    docs = chatflow("memory", "ls", "notes", "--json").json()
    assert [(d["path"], d["version"]) for d in docs] == [("customers/acme.md", 2)]
    history = chatflow("memory", "history", "notes", "--json").json()
    assert [(v["seq"], v["op"], v["session_id"]) for v in history] == [(1, "create", None), (2, "write", None)]
    assert "outside a session" in chatflow("memory", "history", "notes").stdout
    assert chatflow("memory", "show", "notes", "customers/acme.md", "--version", "1").stdout == text
    r = chatflow("memory", "revert", "notes", "2")
    assert r.returncode == 0 and "as write 3" in r.stderr, r
    assert chatflow("memory", "show", "notes", "customers/acme.md").stdout == text
    hits = chatflow("memory", "search", "tea", "--json").json()
    assert [(h["store"], h["path"]) for h in hits] == [("notes", "customers/acme.md")] and "[tea]" in hits[0]["snippet"]
    assert "notes/customers/acme.md" in chatflow("memory", "search", "bob").stdout
    # export, import into another store, unchanged documents skipped on a second import
    export = tmp_path / "notes.jsonl"
    assert chatflow("memory", "export", "notes", "-o", str(export)).returncode == 0
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert lines[0]["format"] == "chatflow-memory" and lines[1] == {"path": "customers/acme.md", "text": text,
                                                                   "version": 3}
    r = chatflow("memory", "import", str(export), "--into", "copy")
    assert r.returncode == 0 and "imported 1 document into memory store copy" in r.stderr, r
    assert "0 documents" in chatflow("memory", "import", str(export), "--into", "copy").stderr
    assert chatflow("memory", "show", "copy", "customers/acme.md").stdout == text
    # rm: a document (a new write), then a whole store
    r = chatflow("memory", "rm", "notes", "customers/acme.md")
    assert r.returncode == 0 and "revert notes 4" in r.stderr, r
    assert chatflow("memory", "show", "notes", "customers/acme.md").returncode == ExitStatus.NOT_FOUND
    assert chatflow("memory", "rm", "copy", "--yes").returncode == 0
    assert [s["name"] for s in chatflow("memory", "ls", "--json").json()] == ["notes"]


def test_bad_input_gets_a_clear_line_and_its_exit_code(chatflow, tmp_path) -> None:
    chatflow("memory", "create", "notes")
    cases = [
        (("memory", "show", "nope", "a.md"), ExitStatus.NOT_FOUND, "memory store 'nope' does not exist"),
        (("memory", "ls", "nope"), ExitStatus.NOT_FOUND, "memory store 'nope' does not exist"),
        (("memory", "show", "notes", "a.md"), ExitStatus.NOT_FOUND, "has no document 'a.md'"),
        (("memory", "show", "notes", "../etc/passwd"), ExitStatus.USAGE, "outside the store"),
        (("memory", "show", "notes", "/etc/passwd"), ExitStatus.USAGE, "is absolute"),
        (("memory", "create", "Bad Name"), ExitStatus.USAGE, "is not valid"),
        (("memory", "revert", "notes", "7"), ExitStatus.USAGE, "has no write 7"),
        (("memory", "search", '"open'), ExitStatus.USAGE, "search"),
        (("memory", "import", str(tmp_path / "missing.jsonl")), ExitStatus.USAGE, "no such file"),
    ]
    for args, code, text in cases:
        r = chatflow(*args)
        assert r.returncode == code and text in r.stderr, (args, r)
        assert r.stderr.startswith("chatflow: error: ") and "Traceback" not in r.stderr, r
    r = chatflow("memory", "write", "notes", "big.md", input="x" * 100_001)
    assert r.returncode == ExitStatus.USAGE and "over the limit of 100,000" in r.stderr, r
    (tmp_path / "bad.jsonl").write_text('{"format": "something else"}\n')
    r = chatflow("memory", "import", str(tmp_path / "bad.jsonl"))
    assert r.returncode == ExitStatus.USAGE and "not a chatflow memory export" in r.stderr, r


def test_memory_in_config_toml(chatflow, config_file) -> None:
    config_file('[[agents]]\nname = "Desk"\ninstructions = "x"\nmemory = ["notes", "crm:ro"]\n')
    assert chatflow("agents", "ls").returncode == 0
    config_file('[[agents]]\nname = "Desk"\ninstructions = "x"\nmemory = ["notes:rx"]\n')
    r = chatflow("agents", "ls")
    assert r.returncode == ExitStatus.CONFIG and "line 4" in r.stderr and "mount mode 'rx'" in r.stderr, r
