"""``chatflow memory ...`` through the real process, where a new user found it wrong: a refused
import leaves nothing behind, an unknown export version and a path given twice are refused,
paths are one NFC spelling without invisible characters, a path is a document or a folder,
``show --version`` says what is wrong, a folder's ``rm`` says how to undo it all, and one
store mounted twice in two modes is refused."""

from __future__ import annotations

import json
from pathlib import Path

from chatflow_cli.core.errors import ExitStatus

COMPOSED = "caf\u00e9.md"
DECOMPOSED = "cafe\u0301.md"


def _export(path: Path, docs: list[tuple[str, str]], *, version: object = 1, store: str = "notes") -> Path:
    lines = [{"format": "chatflow-memory", "version": version, "store": store, "description": "", "last_seq": 0}]
    lines += [{"path": p, "text": t, "version": 1} for p, t in docs]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def _stores(chatflow) -> list[str]:
    return [s["name"] for s in chatflow("memory", "ls", "--json").json()]


def _refused(r, text: str) -> None:
    assert r.returncode == ExitStatus.USAGE and text in r.stderr, r
    assert r.stderr.startswith("chatflow: error: ") and "Traceback" not in r.stderr, r


def test_a_refused_import_leaves_nothing_behind(chatflow, tmp_path) -> None:
    chatflow("memory", "create", "other")  # the database exists
    clash = _export(tmp_path / "clash.jsonl", [("a.md", "ok"), ("b", "doc"), ("b/c.md", "under a document")])
    _refused(chatflow("memory", "import", str(clash), "--into", "fresh"), "'b/c.md' would be under the document 'b'")
    assert _stores(chatflow) == ["other"]
    bad = _export(tmp_path / "bad.jsonl", [("a.md", "ok"), ("x\u202e.md", "bidi")])
    _refused(chatflow("memory", "import", str(bad)), "U+202E")
    _refused(chatflow("memory", "import", str(bad)), "line 3")
    assert _stores(chatflow) == ["other"]
    # into a store that exists: it is as it was
    chatflow("memory", "write", "other", "keep.md", input="kept")
    before = chatflow("memory", "history", "other", "--json").json()
    into = _export(tmp_path / "into.jsonl", [("keep.md", "changed"), ("keep.md/x", "under it")])
    _refused(chatflow("memory", "import", str(into), "--into", "other"), "under the document 'keep.md'")
    assert chatflow("memory", "history", "other", "--json").json() == before
    assert chatflow("memory", "show", "other", "keep.md").stdout == "kept\n"


def test_an_unknown_export_version_and_a_path_twice_are_refused(chatflow, tmp_path) -> None:
    r = chatflow("memory", "import", str(_export(tmp_path / "v99.jsonl", [("a.md", "x")], version=99)))
    _refused(r, "memory export format version 99 is not one this chatflow reads")
    r = chatflow("memory", "import", str(_export(tmp_path / "none.jsonl", [("a.md", "x")], version=None)))
    _refused(r, "format version None")
    twice = _export(tmp_path / "twice.jsonl", [("a.md", "first"), ("b.md", "b"), ("a.md", "second")])
    _refused(chatflow("memory", "import", str(twice)), "the path 'a.md' is there twice (first on line 2)")
    nfc = _export(tmp_path / "nfc.jsonl", [(COMPOSED, "first"), (DECOMPOSED, "second")])
    _refused(chatflow("memory", "import", str(nfc)), f"the path '{COMPOSED}' is there twice")
    assert _stores(chatflow) == []
    ok = _export(tmp_path / "ok.jsonl", [(DECOMPOSED, "one spelling")])
    assert chatflow("memory", "import", str(ok)).returncode == 0
    assert [d["path"] for d in chatflow("memory", "ls", "notes", "--json").json()] == [COMPOSED]


def test_paths_are_nfc_and_refuse_invisible_characters(chatflow) -> None:
    chatflow("memory", "create", "notes")
    assert chatflow("memory", "write", "notes", DECOMPOSED, input="typed one way\n").returncode == 0
    assert chatflow("memory", "show", "notes", COMPOSED).stdout == "typed one way\n"
    assert chatflow("memory", "write", "notes", COMPOSED, input="typed the other\n").returncode == 0
    assert [(d["path"], d["version"]) for d in chatflow("memory", "ls", "notes", "--json").json()] == [(COMPOSED, 2)]
    for char in ("\u202e", "\u200b", "\ufeff"):
        _refused(chatflow("memory", "write", "notes", f"invoice{char}.md", input="x"), f"U+{ord(char):04X}")
    assert chatflow("memory", "history", "notes", "--json").json()[-1]["seq"] == 2


# a few of the characters that show nothing or a blank that looks like U+0020 (a no-break space,
# a Hangul filler, a tag): each refused through the real process, naming its code point; every
# one of them, and every place in a path, is checked on ``check_path`` itself in
# tests/core/memory/test_store_memory_rules.py
SPACE_LIKE = ("\u00a0", "\u3164", "\U000e0041")


def test_paths_refuse_space_like_and_invisible_characters_and_edge_spaces(chatflow) -> None:
    chatflow("memory", "create", "notes")
    for char, path in zip(SPACE_LIKE, ("invoice{}.md", "a/{}/b.md", "{}")):
        _refused(chatflow("memory", "write", "notes", path.format(char), input="x"), f"U+{ord(char):04X}")
    _refused(chatflow("memory", "show", "notes", f"invoice{SPACE_LIKE[0]}.md"), "U+00A0")
    _refused(chatflow("memory", "write", "notes", "folder /a.md", input="x"), "begins or ends with a space (U+0020")
    assert chatflow("memory", "write", "notes", "my notes/a b.md", input="kept\n").returncode == 0
    assert [d["path"] for d in chatflow("memory", "ls", "notes", "--json").json()] == ["my notes/a b.md"]


def test_paths_refuse_look_alikes_of_slash_and_dot_and_a_leading_combining_mark(chatflow) -> None:
    """``a／b.md`` would read as the folder ``a`` and ``．．/a.md`` as ``../a.md``: refused, naming
    the code point; ordinary letters with accents (composed or not) stay accepted."""
    chatflow("memory", "create", "notes")
    for path, code in (("a\uff0fb.md", "U+FF0F"), ("a\u2215b.md", "U+2215"), ("a\u2044b.md", "U+2044"),
                       ("\uff0e\uff0e/a.md", "U+FF0E"), ("\u2024\u2024/x.md", "U+2024"), ("notes\u2026md", "U+2026")):
        _refused(chatflow("memory", "write", "notes", path, input="x"), code)
    _refused(chatflow("memory", "write", "notes", "a/\u0301b.md", input="x"), "begins with a combining mark (U+0301")
    for path in ("caf\u00e9.md", "cafe\u0301/x.md", "\u65e5\u672c/\u30e1\u30e2.md", "v1.2/notes.md"):
        assert chatflow("memory", "write", "notes", path, input="kept\n").returncode == 0, path
    assert len(chatflow("memory", "ls", "notes", "--json").json()) == 4


def test_a_path_is_a_document_or_a_folder(chatflow) -> None:
    chatflow("memory", "create", "notes")
    assert chatflow("memory", "write", "notes", "a/b", input="a document").returncode == 0
    _refused(chatflow("memory", "write", "notes", "a/b/c", input="under it"),
             "memory path 'a/b/c' would be under the document 'a/b'")
    assert chatflow("memory", "write", "notes", "x/y/z.md", input="in a folder").returncode == 0
    _refused(chatflow("memory", "write", "notes", "x/y", input="at the folder"),
             "memory path 'x/y' is a folder (it holds 'x/y/z.md')")
    assert [d["path"] for d in chatflow("memory", "ls", "notes", "--json").json()] == ["a/b", "x/y/z.md"]


def test_show_version_says_what_is_wrong(chatflow) -> None:
    chatflow("memory", "create", "notes")
    _refused(chatflow("memory", "show", "notes", "a.md", "--version", "1"),
             "memory store 'notes' has no version 1 (it has no writes yet)")
    chatflow("memory", "write", "notes", "a.md", input="a1")
    chatflow("memory", "write", "notes", "customers/x.md", input="x1")
    chatflow("memory", "write", "notes", "a.md", input="a2")
    chatflow("memory", "rm", "notes", "a.md")
    assert chatflow("memory", "show", "notes", "a.md", "--version", "3").stdout == "a2\n"
    _refused(chatflow("memory", "show", "notes", "a.md", "--version", "2"),
             "version 2 of memory store 'notes' changed customers/x.md, not this document (a.md;")
    _refused(chatflow("memory", "show", "notes", "a.md", "--version", "9"),
             "memory store 'notes' has no version 9 (latest is 4;")
    _refused(chatflow("memory", "show", "notes", "a.md", "--version", "0"), "has no version 0 (latest is 4;")
    _refused(chatflow("memory", "show", "notes", "a.md", "--version", "4"), "version 4 of memory store 'notes' "
             "deleted a.md: it left no text")


def test_a_folder_rm_says_how_to_bring_it_all_back(chatflow) -> None:
    chatflow("memory", "create", "notes")
    for path in ("f/a.md", "f/b.md", "f/c/d.md", "g.md"):
        chatflow("memory", "write", "notes", path, input=path)
    r = chatflow("memory", "rm", "notes", "f")
    assert r.returncode == 0 and "deleted 3 documents of notes (chatflow memory revert notes 5-7 brings them all " \
        "back)" in r.stderr, r
    r = chatflow("memory", "revert", "notes", "5-7")
    assert r.returncode == 0 and r.stderr.count("reverted write") == 3, r
    assert [d["path"] for d in chatflow("memory", "ls", "notes", "--json").json()] == [
        "f/a.md", "f/b.md", "f/c/d.md", "g.md"]
    assert chatflow("memory", "show", "notes", "f/c/d.md").stdout == "f/c/d.md\n"
    # several numbers, --json: a list; one number: the write, as before
    undone = chatflow("memory", "revert", "notes", "8", "9", "--json").json()
    assert sorted(v["reverts"] for v in undone) == [8, 9]
    assert chatflow("memory", "revert", "notes", "12", "--json").json()["reverts"] == 12
    for bad in ("7-5", "x", "0"):
        _refused(chatflow("memory", "revert", "notes", bad), "is not a write number")
    # one write of a range refused: none undone
    before = chatflow("memory", "history", "notes", "--json").json()
    _refused(chatflow("memory", "revert", "notes", "1-99"), "has no write")
    assert chatflow("memory", "history", "notes", "--json").json() == before


def test_one_store_mounted_twice_in_two_modes_is_refused(chatflow, provider, config_file) -> None:
    chatflow("memory", "create", "notes")
    provider.add_text("hello")
    r = chatflow("chat", "--memory", "notes", "--memory", "notes:ro", "hi")
    _refused(r, "memory store 'notes' is mounted twice in --memory, as notes:rw and as notes:ro")
    assert provider.requests == []
    r = chatflow("chat", "--memory", "notes:ro", "--memory", "notes:read-only", "hi")  # the same mode: one mount
    assert r.returncode == 0 and r.stdout.strip() == "hello", r
    config_file('[[agents]]\nname = "Desk"\ninstructions = "x"\nmemory = ["notes", "notes:ro"]\n')
    r = chatflow("agents", "ls")
    assert r.returncode == ExitStatus.CONFIG and "memory store 'notes' is mounted twice" in r.stderr, r



def test_a_forced_revert_undoes_a_later_rename(chatflow, provider) -> None:
    chatflow("memory", "create", "rv")
    chatflow("memory", "write", "rv", "acme.md", input="EUR")  # 1
    chatflow("memory", "write", "rv", "acme.md", input="USD")  # 2
    provider.add_tool_calls([("m1", "memory_rename", json.dumps({"old_path": "acme.md",
                                                                "new_path": "customers/acme.md"}))])  # 3
    provider.add_text("moved")
    assert chatflow("chat", "-s", "m", "--memory", "rv", "file Acme under customers").returncode == 0
    _refused(chatflow("memory", "revert", "rv", "2"), "written again after write 2 (by write 3")
    r = chatflow("memory", "revert", "rv", "2", "--force")
    assert r.returncode == 0 and "reverted write 2 of rv as write 4: acme.md restored (moved back from " \
        "customers/acme.md)" in r.stderr, r
    assert [(d["path"]) for d in chatflow("memory", "ls", "rv", "--json").json()] == ["acme.md"]
    assert chatflow("memory", "show", "rv", "acme.md").stdout == "EUR\n"
