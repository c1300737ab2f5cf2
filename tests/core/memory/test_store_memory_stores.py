"""The memory-store contract, run against every store kind (in memory, SQLite, PostgreSQL):
stores, documents, versioned writes with a gap-free seq, conflicts, reverts, search, the
async twins, and what another connection sees."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from chatflow_cli.core.errors import (
    DocumentNotFoundError,
    DocumentTooLargeError,
    ExitStatus,
    MemoryConflictError,
    MemoryStoreNotFoundError,
    UsageError,
)
from chatflow_cli.core.memory import BaseSessionStore
from chatflow_cli.core.resources.documents import MAX_DOCUMENT_BYTES, Author

WHO = Author("s1", 3, "Orders")


def test_create_list_delete_stores(any_store: BaseSessionStore) -> None:
    any_store.clock = lambda: 1_700_000_000.0
    made = any_store.create_memory_store("notes", description="what we know")
    assert (made.name, made.description, made.created_at, made.last_seq) == ("notes", "what we know",
                                                                             1_700_000_000.0, 0)
    any_store.create_memory_store("crm")
    with pytest.raises(UsageError, match="exists already"):
        any_store.create_memory_store("notes")
    assert any_store.create_memory_store("notes", exist_ok=True).description == "what we know"
    any_store.write_document("crm", "a.md", "héllo")
    assert [(s.name, s.documents, s.size_bytes, s.last_seq) for s in any_store.memory_stores()] == [
        ("crm", 1, 6, 1), ("notes", 0, 0, 0)]
    assert any_store.delete_memory_store("crm") is True
    assert any_store.delete_memory_store("crm") is False
    assert [s.name for s in any_store.memory_stores()] == ["notes"]
    with pytest.raises(MemoryStoreNotFoundError) as caught:
        any_store.read_document("crm", "a.md")
    assert caught.value.exit_code is ExitStatus.NOT_FOUND
    # a store created again starts again
    any_store.create_memory_store("crm")
    assert any_store.memory_history("crm") == []
    assert any_store.write_document("crm", "a.md", "x").seq == 1


def test_documents_round_trip_byte_for_byte(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    text = "línea 1\r\nline 2\n\ttab \u2028 emoji 🙂 \x1b[31m\n" + "z" * 1000
    v = any_store.write_document("notes", "customers/acme.md", text, author=WHO)
    assert (v.seq, v.op, v.path, v.author) == (1, "create", "customers/acme.md", WHO)
    doc = any_store.read_document("notes", "customers/acme.md")
    assert (doc.text, doc.version) == (text, 1)
    any_store.write_document("notes", "customers/zeta.md", "z")
    any_store.write_document("notes", "readme.md", "r")
    any_store.write_document("notes", "customersx.md", "not in the folder")
    assert [d.path for d in any_store.list_documents("notes")] == [
        "customers/acme.md", "customers/zeta.md", "customersx.md", "readme.md"]
    assert [d.path for d in any_store.list_documents("notes", "customers/")] == [
        "customers/acme.md", "customers/zeta.md"]
    assert any_store.list_documents("notes", "customers")[0].size_bytes == len(text.encode())
    assert [d.text for d in any_store.read_documents("notes", "customers")] == [text, "z"]
    with pytest.raises(DocumentNotFoundError):
        any_store.read_document("notes", "customers/nobody.md")


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../b", "a//b", "./a", "a\x00b", "a\nb", "a\\b", "",
                                  "x" * 513])
def test_paths_outside_the_store_are_refused(any_store: BaseSessionStore, path: str) -> None:
    any_store.create_memory_store("notes")
    with pytest.raises(UsageError) as caught:
        any_store.write_document("notes", path, "x")
    assert caught.value.exit_code is ExitStatus.USAGE
    assert any_store.memory_history("notes") == []


def test_a_document_over_the_limit_is_refused(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.write_document("notes", "big.md", "é" * (MAX_DOCUMENT_BYTES // 2))  # exactly the limit
    with pytest.raises(DocumentTooLargeError, match="100,000"):
        any_store.write_document("notes", "big.md", "é" * (MAX_DOCUMENT_BYTES // 2) + "x")
    with pytest.raises(DocumentTooLargeError):
        any_store.insert_in_document("notes", "big.md", 0, "more")
    with pytest.raises(UsageError, match="NUL"):
        any_store.write_document("notes", "nul.md", "a\x00b")
    assert [v.seq for v in any_store.memory_history("notes")] == [1]


def test_edits_are_versioned_with_a_gap_free_seq(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.create_document("notes", "a.md", "one\nthree\n", author=WHO)
    any_store.insert_in_document("notes", "a.md", 1, "two")
    any_store.replace_in_document("notes", "a.md", "three", "THREE", author=WHO)
    any_store.rename_document("notes", "a.md", "b/a.md")
    any_store.create_document("notes", "c.md", "c")
    any_store.delete_document("notes", "c.md")
    history = any_store.memory_history("notes")
    assert [(v.seq, v.op, v.path, v.previous_path) for v in history] == [
        (1, "create", "a.md", None), (2, "insert", "a.md", None), (3, "str_replace", "a.md", None),
        (4, "rename", "b/a.md", "a.md"), (5, "create", "c.md", None), (6, "delete", "c.md", None)]
    assert history[2].text == "one\ntwo\nTHREE\n" and history[2].author == WHO
    assert history[0].author == WHO and history[1].author == Author()
    assert [v.seq for v in any_store.memory_history("notes", "a.md")] == [1, 2, 3, 4]
    assert [v.seq for v in any_store.memory_history("notes", after_seq=4, limit=1)] == [5]
    assert any_store.read_document("notes", "b/a.md").version == 4
    assert any_store.memory_store("notes").last_seq == 6


def test_a_stale_edit_fails_and_writes_nothing(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.create_document("notes", "a.md", "Acme likes tea.")
    seen = any_store.read_document("notes", "a.md")
    any_store.replace_in_document("notes", "a.md", "tea", "coffee", author=Author("s2", 1, "B"))
    with pytest.raises(MemoryConflictError, match="not in 'a.md'") as caught:
        any_store.replace_in_document("notes", "a.md", "tea", "green tea", author=WHO)
    assert caught.value.current_version == 2
    with pytest.raises(MemoryConflictError, match="version 2"):
        any_store.write_document("notes", "a.md", "overwrite", expected_version=seen.version)
    with pytest.raises(MemoryConflictError, match="exists already"):
        any_store.create_document("notes", "a.md", "again")
    any_store.create_document("notes", "b.md", "x x")
    with pytest.raises(MemoryConflictError, match="2 times"):
        any_store.replace_in_document("notes", "b.md", "x", "y")
    with pytest.raises(MemoryConflictError, match="exists already"):
        any_store.rename_document("notes", "a.md", "b.md")
    assert [v.seq for v in any_store.memory_history("notes")] == [1, 2, 3]
    assert any_store.read_document("notes", "a.md").text == "Acme likes coffee."


def test_revert_is_a_new_write(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.create_document("notes", "a.md", "v1")
    any_store.write_document("notes", "a.md", "v2")
    any_store.write_document("notes", "a.md", "v3")
    with pytest.raises(MemoryConflictError, match="written again after write 2"):
        any_store.revert_memory("notes", 2)
    undo = any_store.revert_memory("notes", 3, author=WHO)
    assert (undo.seq, undo.op, undo.reverts, undo.text) == (4, "revert", 3, "v2")
    assert any_store.revert_memory("notes", 2, force=True).text == "v1"
    any_store.rename_document("notes", "a.md", "b.md")
    any_store.revert_memory("notes", 6)
    assert [d.path for d in any_store.list_documents("notes")] == ["a.md"]
    any_store.create_document("notes", "new.md", "n")
    any_store.revert_memory("notes", 8)  # undo a create: the document goes
    assert [d.path for d in any_store.list_documents("notes")] == ["a.md"]
    any_store.delete_document("notes", "a.md")
    any_store.revert_memory("notes", 10)  # undo a delete: it comes back
    assert any_store.read_document("notes", "a.md").text == "v1"
    with pytest.raises(UsageError, match="no write 99"):
        any_store.revert_memory("notes", 99)
    assert [v.seq for v in any_store.memory_history("notes")] == list(range(1, 12))


def test_delete_a_folder_and_missing_things(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    for path in ("f/a.md", "f/b/c.md", "g.md"):
        any_store.write_document("notes", path, path)
    with pytest.raises(DocumentNotFoundError):
        any_store.delete_document("notes", "f")
    assert [v.path for v in any_store.delete_document("notes", "f", recursive=True)] == ["f/a.md", "f/b/c.md"]
    assert [d.path for d in any_store.list_documents("notes")] == ["g.md"]
    with pytest.raises(MemoryStoreNotFoundError):
        any_store.write_document("nope", "a.md", "x")
    with pytest.raises(MemoryStoreNotFoundError):
        any_store.list_documents("nope")
    with pytest.raises(DocumentNotFoundError):
        any_store.replace_in_document("notes", "missing.md", "a", "b")


def test_search_finds_documents_like_sessions(any_store: BaseSessionStore) -> None:
    any_store.create_memory_store("notes")
    any_store.create_memory_store("crm")
    any_store.write_document("notes", "deploy.md", "How to deploy the gateway: run make deploy. Café.")
    any_store.write_document("notes", "other.md", "nothing here about it")
    any_store.write_document("crm", "customers/acme.md", "Acme: deploy on Fridays is forbidden")
    hits = any_store.search_memory("deploy")
    assert [(h.store, h.path) for h in hits] == [("notes", "deploy.md"), ("crm", "customers/acme.md")]
    assert "\x02deploy\x03" in hits[0].snippet
    assert hits[0].to_dict()["snippet"].count("[deploy]") >= 1
    assert [h.path for h in any_store.search_memory("deploy", stores=["crm"])] == ["customers/acme.md"]
    assert [h.path for h in any_store.search_memory("deploy", stores=["notes"])] == ["deploy.md"]
    # every store named: as no store named
    assert any_store.search_memory("deploy", stores=["crm", "notes"]) == hits
    assert [h.path for h in any_store.search_memory("deploy", stores=["crm", "crm"])] == ["customers/acme.md"]
    assert [h.path for h in any_store.search_memory("cafe")] == ["deploy.md"]
    assert sorted(h.path for h in any_store.search_memory('"make deploy" OR forbidden')) == [
        "customers/acme.md", "deploy.md"]
    assert [h.path for h in any_store.search_memory("acme")] == ["customers/acme.md"]  # the path is searched
    assert [h.path for h in any_store.search_memory("deplo* NOT gateway")] == ["customers/acme.md"]
    any_store.write_document("notes", "deploy.md", "rewritten")
    assert [h.path for h in any_store.search_memory("gateway")] == []
    any_store.delete_document("crm", "customers/acme.md")
    assert any_store.search_memory("forbidden") == []
    with pytest.raises(UsageError):
        any_store.search_memory('"unbalanced')
    with pytest.raises(MemoryStoreNotFoundError):
        any_store.search_memory("x", stores=["nope"])


def test_another_connection_sees_the_writes(make_store: Callable[..., BaseSessionStore]) -> None:
    first = make_store()
    first.create_memory_store("notes")
    first.write_document("notes", "a.md", "from the first")
    second = make_store()
    assert second.read_document("notes", "a.md").text == "from the first"
    second.replace_in_document("notes", "a.md", "first", "second")
    assert first.read_document("notes", "a.md").version == 2
    assert [h.path for h in first.search_memory("second")] == ["a.md"]


def test_async_twins(any_store: BaseSessionStore) -> None:
    async def main() -> None:
        await any_store.acreate_memory_store("notes")
        await any_store.acreate_document("notes", "a.md", "one", author=WHO)
        await any_store.areplace_in_document("notes", "a.md", "one", "two")
        await any_store.ainsert_in_document("notes", "a.md", 1, "three")
        await any_store.arename_document("notes", "a.md", "b.md")
        await any_store.awrite_document("notes", "c.md", "c", expected_version=0)
        await any_store.awrite_documents("notes", {"c.md": "c", "d.md": "d"})
        await any_store.adelete_document("notes", "d.md")
        await any_store.arevert_memory("notes", 7)
        assert (await any_store.aread_document("notes", "b.md")).text == "two\nthree"
        assert [d.path for d in await any_store.alist_documents("notes")] == ["b.md", "c.md", "d.md"]
        assert len(await any_store.aread_documents("notes")) == 3
        assert [v.seq for v in await any_store.amemory_history("notes")] == list(range(1, 9))
        assert [h.path for h in await any_store.asearch_memory("three")] == ["b.md"]
        assert [s.name for s in await any_store.amemory_stores()] == ["notes"]
        assert (await any_store.amemory_store("notes")).last_seq == 8
        assert await any_store.adelete_memory_store("notes") is True

    asyncio.run(main())


# -- mounts ----------------------------------------------------------------------------------
def test_mounts_are_events_that_survive_load_fork_and_unmount(make_store: Callable[..., BaseSessionStore]) -> None:
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.memory import SessionContext
    from chatflow_cli.core.messages import Message
    from chatflow_cli.core.resources import Mount

    store = make_store()
    agent = Agent(name="A", instructions="x", model="m")
    notes, crm, keys = Mount.memory_store("notes"), Mount.memory_store("crm", "read-only"), Mount.vault("keys")
    ctx = SessionContext("s1", agent, resources=[notes, crm, keys])
    assert ctx.resources == [notes, crm, keys]
    ctx.add_message(Message.user("hi"))
    ctx.add_message(Message.model("hello"))
    ctx.complete_turn("hello")
    store.save(ctx)
    again = make_store().get("s1")
    assert again is not None and again.resources == [notes, crm, keys]
    assert again.mount(notes) is False  # already mounted: nothing journalled
    assert again.mount(Mount.memory_store("crm")) is True  # another mode
    assert again.unmount("notes") is True and again.unmount("notes") is False
    store.save(again)
    types = [e.type for e in store.events("s1") if e.type.startswith("resource.")]
    assert types == ["resource.mounted"] * 4 + ["resource.unmounted"]
    assert [e.payload for e in store.events("s1") if e.type == "resource.unmounted"] == [notes.to_dict()]
    loaded = make_store().get("s1")
    assert loaded is not None and loaded.resources == [Mount.memory_store("crm"), keys]
    assert make_store().session_resources("s1") == [Mount.memory_store("crm"), keys]
    assert store.session_resources("nobody") == []
    fork = store.fork("s1", 1)
    forked = make_store().get(fork.session_id)
    assert forked is not None and forked.resources == [Mount.memory_store("crm"), keys]
    assert [e.type for e in store.events(fork.session_id)][:3] == ["session.created", "resource.mounted",
                                                                    "resource.mounted"]
    # a rollback keeps the mounts (they are not turns)
    store.rollback("s1", 0)
    rolled = make_store().get("s1")
    assert rolled is not None and rolled.resources == [Mount.memory_store("crm"), keys]


def test_mount_events_are_the_stores_to_write(any_store: BaseSessionStore) -> None:
    from chatflow_cli.core.agents import Agent

    any_store.get_or_create("s1", Agent(name="A", instructions="x", model="m"))
    with pytest.raises(UsageError, match="session.mount"):
        any_store.append_event("s1", "resource.mounted", {"kind": "memory_store", "name": "x", "mode": "read-only"})
