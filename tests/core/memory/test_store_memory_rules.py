"""The memory-store rules a new user's tests found broken, on every store kind (in memory,
SQLite, PostgreSQL): an import is all or nothing (and makes no store when refused), paths
refuse invisible characters and are one NFC spelling, a path is a document or a folder but
not both (also with writers at once), and several writes are reverted together."""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Callable

import pytest

from chatflow_cli.core.errors import ExitStatus, MemoryConflictError, MemoryStoreNotFoundError, UsageError
from chatflow_cli.core.memory import BaseSessionStore, SessionContext
from chatflow_cli.core.resources import Mount
from chatflow_cli.core.resources.documents import DocumentVersion, check_path

COMPOSED = "caf\u00e9.md"  # é as one code point
DECOMPOSED = "cafe\u0301.md"  # e and a combining acute accent


# -- an import is all or nothing ---------------------------------------------------------------
def test_a_refused_import_creates_no_store(any_store: BaseSessionStore) -> None:
    with pytest.raises(MemoryConflictError, match="document or a folder"):
        any_store.write_documents("fresh", {"a.md": "ok", "b": "doc", "b/c.md": "under a document"}, create=True)
    assert any_store.memory_stores() == []
    with pytest.raises(UsageError):
        any_store.write_documents("fresh", {"a.md": "ok", "bad\u202e.md": "x"}, create=True)
    assert any_store.memory_stores() == []
    with pytest.raises(MemoryStoreNotFoundError):
        any_store.write_documents("fresh", {"a.md": "ok"})
    made = any_store.write_documents("fresh", {"a.md": "ok", "b/c.md": "c"}, create=True, description="from a file")
    assert [v.seq for v in made] == [1, 2]
    assert (any_store.memory_store("fresh").description, any_store.memory_store("fresh").last_seq) == (
        "from a file", 2)


def test_a_refused_import_changes_nothing_in_a_store(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.write_document("notes", "keep.md", "kept")
    any_store.write_document("notes", "x/y.md", "folder x")
    with pytest.raises(MemoryConflictError, match="'x' is a folder"):
        any_store.write_documents("notes", {"keep.md": "changed", "new.md": "new", "x": "a document at a folder"})
    assert [(d.path, d.version) for d in any_store.list_documents("notes")] == [("keep.md", 1), ("x/y.md", 2)]
    assert any_store.read_document("notes", "keep.md").text == "kept"
    assert [v.seq for v in any_store.memory_history("notes")] == [1, 2]
    assert any_store.memory_store("notes").last_seq == 2


def test_one_path_twice_in_an_import_is_refused(any_store: BaseSessionStore) -> None:
    with pytest.raises(UsageError, match="given twice") as caught:
        any_store.write_documents("notes", {COMPOSED: "one", DECOMPOSED: "two"}, create=True)
    assert COMPOSED in caught.value.message
    assert any_store.memory_stores() == []


# -- paths: no invisible characters, one NFC spelling -------------------------------------------
@pytest.mark.parametrize("char", ["\u202e", "\u202a", "\u2066", "\u200b", "\u200d", "\ufeff", "\u00ad",
                                  "\x7f", "\x85", "\ue000", "\u0378", "\u2028", "\u2029"])
def test_invisible_and_control_characters_are_refused(any_store: BaseSessionStore, char: str) -> None:
    any_store.create_memory_store("notes")
    with pytest.raises(UsageError, match=f"U\\+{ord(char):04X}") as caught:
        any_store.write_document("notes", f"invoice{char}fdp.md", "x")
    assert caught.value.exit_code is ExitStatus.USAGE
    with pytest.raises(UsageError):
        any_store.rename_document("notes", "a.md", f"b{char}.md")
    assert any_store.memory_history("notes") == []


#: what shows nothing or a blank that looks like U+0020 (a no-break space, figure space, the
#: ideographic space, the Hangul fillers, the Braille blank, a variation selector, tags...)
SPACE_LIKE = ("\u00a0", "\u2007", "\u3000", "\u115f", "\u1160", "\u3164", "\uffa0", "\u2800", "\u180e",
              "\u034f", "\ufe0f", "\U000e0041", "\U000e0100")


@pytest.mark.parametrize("char", SPACE_LIKE, ids=lambda c: f"U+{ord(c):04X}")
def test_space_like_and_invisible_characters_are_refused_anywhere_in_a_path(char: str) -> None:
    """Every path that enters a store goes through ``check_path`` (the CLI's refusals of a few
    of these, through the real process, are in tests/cli/test_memory_command_rules.py)."""
    for path in (f"invoice{char}.md", f"a/{char}/b.md", char):
        with pytest.raises(UsageError, match=f"U\\+{ord(char):04X}") as caught:
            check_path(path)
        assert caught.value.exit_code is ExitStatus.USAGE
    for path in ("a.md ", " a.md", "folder /a.md", "a/ b.md"):
        with pytest.raises(UsageError, match="begins or ends with a space"):
            check_path(path)
    assert check_path("my notes/a b.md") == "my notes/a b.md"


def test_a_path_typed_two_ways_is_one_document(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    v = any_store.write_document("notes", DECOMPOSED, "one")
    assert v.path == COMPOSED
    assert any_store.read_document("notes", COMPOSED).text == "one"
    assert any_store.read_document("notes", DECOMPOSED).path == COMPOSED
    any_store.write_document("notes", COMPOSED, "two")
    assert [d.path for d in any_store.list_documents("notes")] == [COMPOSED]
    with pytest.raises(MemoryConflictError, match="exists already"):
        any_store.create_document("notes", DECOMPOSED, "three")
    any_store.replace_in_document("notes", DECOMPOSED, "two", "deux")
    assert [v.seq for v in any_store.memory_history("notes", DECOMPOSED)] == [1, 2, 3]
    folder = unicodedata.normalize("NFD", "r\u00e9sum\u00e9s")
    any_store.rename_document("notes", DECOMPOSED, f"{folder}/{DECOMPOSED}")
    assert [d.path for d in any_store.list_documents("notes", "r\u00e9sum\u00e9s")] == [
        f"r\u00e9sum\u00e9s/{COMPOSED}"]
    assert [h.path for h in any_store.search_memory("deux")] == [f"r\u00e9sum\u00e9s/{COMPOSED}"]
    assert len(any_store.delete_document("notes", folder, recursive=True)) == 1


# -- a path is a document or a folder, never both -----------------------------------------------
def test_a_document_cannot_be_a_folder_too(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.write_document("notes", "a/b", "a document")
    with pytest.raises(MemoryConflictError, match="under the document 'a/b'") as caught:
        any_store.write_document("notes", "a/b/c", "under it")
    assert caught.value.exit_code is ExitStatus.USAGE
    with pytest.raises(MemoryConflictError, match="under the document 'a/b'"):
        any_store.create_document("notes", "a/b/c/d.md", "deeper")
    any_store.write_document("notes", "x/y/z.md", "in a folder")
    for path in ("x/y", "x"):
        with pytest.raises(MemoryConflictError, match=f"'{path}' is a folder \\(it holds 'x/y/z.md'\\)"):
            any_store.write_document("notes", path, "a document at a folder")
        with pytest.raises(MemoryConflictError, match="is a folder"):
            any_store.create_document("notes", path, "again")
    with pytest.raises(MemoryConflictError, match="is a folder"):
        any_store.rename_document("notes", "a/b", "x/y")
    with pytest.raises(MemoryConflictError, match="under the document"):
        any_store.rename_document("notes", "x/y/z.md", "a/b/z.md")
    assert [v.seq for v in any_store.memory_history("notes")] == [1, 2]
    # the same spelled folders that are only a prefix are no clash; a rename into its own folder is
    any_store.write_document("notes", "a/bc", "a sibling")
    any_store.write_document("notes", "x/y.md", "a sibling of the folder y")
    any_store.rename_document("notes", "a/b", "a/b2")
    any_store.write_document("notes", "a/b/c", "now a/b is free to be a folder")
    assert [d.path for d in any_store.list_documents("notes", "a")] == ["a/b/c", "a/b2", "a/bc"]


def test_a_revert_that_would_make_a_document_a_folder_is_refused(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.write_document("notes", "a", "a document")
    any_store.delete_document("notes", "a")
    any_store.write_document("notes", "a/b.md", "a folder now")
    with pytest.raises(MemoryConflictError, match="'a' is a folder"):
        any_store.revert_memory("notes", 2)
    assert [v.seq for v in any_store.memory_history("notes")] == [1, 2, 3]


def test_a_pair_stored_before_the_rule_stays_readable(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.write_document("notes", "a/b/c", "inner")
    with any_store._write() as tx:  # as an older chatflow stored it, without the rule
        now = any_store.clock()
        tx.doc_put("notes", "a/b", "outer", 2, now)  # type: ignore[attr-defined]
        tx.version_add(DocumentVersion("notes", 2, "a/b", "create", "outer", created_at=now))  # type: ignore[attr-defined]
        tx.ms_set_seq("notes", 2)  # type: ignore[attr-defined]
    assert [d.path for d in any_store.list_documents("notes")] == ["a/b", "a/b/c"]
    assert any_store.read_document("notes", "a/b").text == "outer"
    any_store.write_document("notes", "a/b", "outer, edited")
    any_store.replace_in_document("notes", "a/b/c", "inner", "inner, edited")
    assert [d.text for d in any_store.read_documents("notes")] == ["outer, edited", "inner, edited"]
    with pytest.raises(MemoryConflictError):
        any_store.write_document("notes", "a/b/d", "a new document under the document a/b")
    any_store.rename_document("notes", "a/b", "a/outer.md")
    assert [d.path for d in any_store.list_documents("notes")] == ["a/b/c", "a/outer.md"]


def test_writers_at_once_never_make_a_document_a_folder(make_store: Callable[..., BaseSessionStore]) -> None:
    first, second = make_store(), make_store()
    first.create_memory_store("notes")
    rounds = 12
    outcomes: dict[str, list[str]] = {"doc": [], "folder": []}

    def writer(store: BaseSessionStore, role: str, barrier: threading.Barrier) -> None:
        for n in range(rounds):
            barrier.wait(timeout=60)
            path = f"p{n}" if role == "doc" else f"p{n}/c.md"
            try:
                store.write_document("notes", path, role)
                outcomes[role].append("ok")
            except MemoryConflictError:
                outcomes[role].append("refused")

    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=writer, args=(s, role, barrier)) for s, role in
               ((first, "doc"), (second, "folder"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [len(outcomes["doc"]), len(outcomes["folder"])] == [rounds, rounds]
    for n in range(rounds):  # each round: exactly one of the two writes, the other refused
        assert sorted([outcomes["doc"][n], outcomes["folder"][n]]) == ["ok", "refused"], n
    paths = [d.path for d in make_store().list_documents("notes")]
    for n in range(rounds):
        assert (f"p{n}" in paths) != (f"p{n}/c.md" in paths), paths
    assert [v.seq for v in make_store().memory_history("notes")] == list(range(1, rounds + 1))


# -- several writes reverted together -----------------------------------------------------------
def test_a_deleted_folder_comes_back_with_one_revert(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    for path in ("f/a.md", "f/b.md", "f/c/d.md"):
        any_store.write_document("notes", path, path.upper())
    deleted = any_store.delete_document("notes", "f", recursive=True)
    assert [v.seq for v in deleted] == [4, 5, 6]
    undone = any_store.revert_writes("notes", range(4, 7))
    assert [(v.seq, v.reverts) for v in undone] == [(7, 6), (8, 5), (9, 4)]
    assert [(d.path, d.text) for d in any_store.read_documents("notes")] == [
        ("f/a.md", "F/A.MD"), ("f/b.md", "F/B.MD"), ("f/c/d.md", "F/C/D.MD")]


def test_several_reverts_are_all_or_nothing(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.write_document("notes", "a.md", "a1")
    any_store.write_document("notes", "b.md", "b1")
    any_store.write_document("notes", "a.md", "a2")
    any_store.write_document("notes", "b.md", "b2")
    any_store.write_document("notes", "b.md", "b3")  # a later write of b.md, not one to undo
    with pytest.raises(MemoryConflictError, match="written again after write 4"):
        any_store.revert_writes("notes", [3, 4])
    assert [v.seq for v in any_store.memory_history("notes")] == [1, 2, 3, 4, 5]
    # writes of one document undone together: the later one given is no conflict
    undone = any_store.revert_writes("notes", [5, 4, 3])
    assert [v.reverts for v in undone] == [5, 4, 3]
    assert [d.text for d in any_store.read_documents("notes")] == ["a1", "b1"]
    with pytest.raises(UsageError, match="has no write 99 \\(its writes are 1 to 8"):
        any_store.revert_writes("notes", [8, 99])
    with pytest.raises(UsageError):
        any_store.revert_writes("notes", [])
    assert any_store.memory_store("notes").last_seq == 8


def _docs(store: BaseSessionStore) -> list[tuple[str, str]]:
    return [(d.path, d.text) for d in store.read_documents("notes")]


def test_a_forced_revert_follows_the_document_through_later_renames(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.write_document("notes", "acme.md", "EUR")  # 1
    any_store.write_document("notes", "acme.md", "USD")  # 2
    any_store.rename_document("notes", "acme.md", "customers/acme.md")  # 3
    with pytest.raises(MemoryConflictError, match=r"written again after write 2 \(by write 3"):
        any_store.revert_memory("notes", 2)
    assert _docs(any_store) == [("customers/acme.md", "USD")]
    v = any_store.revert_memory("notes", 2, force=True)
    assert (v.seq, v.path, v.previous_path, v.text, v.reverts) == (4, "acme.md", "customers/acme.md", "EUR", 2)
    assert _docs(any_store) == [("acme.md", "EUR")]  # one copy: the rename is undone too
    # twice renamed, edited at its new path, then the create undone: nothing is left anywhere
    any_store.rename_document("notes", "acme.md", "a/acme.md")  # 5
    any_store.rename_document("notes", "a/acme.md", "b/acme.md")  # 6
    any_store.write_document("notes", "b/acme.md", "GBP")  # 7
    v = any_store.revert_memory("notes", 1, force=True)
    assert (v.seq, v.path, v.text, v.reverts) == (8, "b/acme.md", None, 1)
    assert _docs(any_store) == []
    assert any_store.memory_store("notes").last_seq == 8


def test_a_forced_revert_of_a_rename_follows_the_later_ones(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.write_document("notes", "a.md", "A")  # 1
    any_store.rename_document("notes", "a.md", "b.md")  # 2
    any_store.rename_document("notes", "b.md", "c/b.md")  # 3
    any_store.write_document("notes", "other.md", "O")  # 4: another document, untouched
    v = any_store.revert_memory("notes", 2, force=True)
    assert (v.path, v.previous_path, v.text) == ("a.md", "c/b.md", "A")
    assert _docs(any_store) == [("a.md", "A"), ("other.md", "O")]
    # moved, then deleted at its new path: the forced revert restores the one copy
    any_store.write_document("notes", "x.md", "X1")  # 6
    any_store.write_document("notes", "x.md", "X2")  # 7
    any_store.rename_document("notes", "x.md", "y.md")  # 8
    any_store.delete_document("notes", "y.md")  # 9
    v = any_store.revert_writes("notes", [7], force=True)[0]
    assert (v.path, v.previous_path, v.text) == ("x.md", None, "X1")
    assert [p for p, _ in _docs(any_store)] == ["a.md", "other.md", "x.md"]
    # the writes undone together with the rename among them: one transaction, the same end
    any_store.write_document("notes", "z.md", "Z1")  # 11
    any_store.rename_document("notes", "z.md", "zz.md")  # 12
    undone = any_store.revert_writes("notes", [11, 12])
    assert [v.reverts for v in undone] == [12, 11]
    assert [p for p, _ in _docs(any_store)] == ["a.md", "other.md", "x.md"]


# -- one resource, two modes --------------------------------------------------------------------
def test_a_context_refuses_one_store_in_two_modes() -> None:
    from chatflow_cli.core.agents import Agent

    agent = Agent(name="A", instructions="x", model="m")
    with pytest.raises(UsageError, match="'notes' is mounted twice in resources, as notes:rw and as notes:ro"):
        SessionContext("s1", agent, resources=[Mount.memory_store("notes"), Mount.memory_store("notes", "read-only")])
    ctx = SessionContext("s1", agent, resources=[Mount.memory_store("notes"), Mount.memory_store("notes")])
    assert ctx.resources == [Mount.memory_store("notes")]
