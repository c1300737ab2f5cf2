"""The Runner with memory stores mounted: the tools offered, a view, writes recorded with
who made them, a stale edit refused, a read-only mount that offers no write tool and refuses
a forged write, and mounting events."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.resources import Mount
from chatflow_cli.core.runner import Runner
from tests.helpers.fakeserver import FakeServer

AGENT = Agent(name="Keeper", instructions="Use your memory.", model="fake-model")


def _offered(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools") or []]


def _results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def test_view_write_and_a_stale_edit(fake_server: FakeServer, make_runner: Callable[..., Runner],
                                     sqlite_store: Any) -> None:
    sqlite_store.create_memory_store("notes")
    sqlite_store.write_document("notes", "acme.md", "Acme likes tea.\n")
    runner = make_runner(AGENT)
    # the view, then the edits, in separate rounds
    fake_server.add_tool_calls([("v1", "memory_view", json.dumps({"path": "acme.md"}))])
    fake_server.add_tool_calls([("r1", "memory_str_replace", json.dumps({"path": "acme.md", "old_str": "tea",
                                                                         "new_str": "coffee"})),
                                ("c1", "memory_create", json.dumps({"path": "bob.md", "file_text": "Bob: CTO"}))])
    fake_server.add_text("noted")
    result = runner.run("s1", "remember", resources=[Mount.memory_store("notes")])
    assert result.content == "noted"
    first = fake_server.requests[0]
    assert _offered(first)[:7] == ["memory_view", "memory_search", "memory_create", "memory_str_replace",
                                   "memory_insert", "memory_delete", "memory_rename"]
    (view,) = _results(fake_server.requests[1])
    assert "1\tAcme likes tea." in view and "version 1" in view
    replace, create = _results(fake_server.requests[2])[1:]
    assert replace.startswith("replaced the passage in notes/acme.md (version") and create.startswith(
        "created notes/bob.md (version")
    assert sqlite_store.read_document("notes", "acme.md").text == "Acme likes coffee.\n"
    history = sqlite_store.memory_history("notes")
    assert sorted((v.op, v.author.session_id, v.author.turn, v.author.agent) for v in history[1:]) == [
        ("create", "s1", 1, "Keeper"), ("str_replace", "s1", 1, "Keeper")]
    assert [v.seq for v in history] == [1, 2, 3]
    mounted = [e for e in sqlite_store.events("s1") if e.type == "resource.mounted"]
    assert [e.payload for e in mounted] == [{"kind": "memory_store", "name": "notes", "mode": "read-write"}]
    assert mounted[0].seq < min(e.seq for e in sqlite_store.events("s1") if e.type == "message.model")
    # the next turn: mounted already (no new event); a stale passage is refused, nothing written
    fake_server.add_tool_calls([("r2", "memory_str_replace", json.dumps({"path": "acme.md", "old_str": "tea",
                                                                         "new_str": "green tea"}))])
    fake_server.add_text("ok")
    runner.run("s1", "again", resources=[Mount.memory_store("notes")])
    (stale,) = _results(fake_server.requests[-1])[-1:]
    assert stale.startswith("Error:") and "not in 'acme.md'" in stale and "view the document again" in stale
    assert len([e for e in sqlite_store.events("s1") if e.type == "resource.mounted"]) == 1
    assert sqlite_store.memory_store("notes").last_seq == 3


def test_a_read_only_mount_offers_no_write_and_refuses_a_forged_one(
        fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any) -> None:
    sqlite_store.create_memory_store("notes")
    sqlite_store.write_document("notes", "acme.md", "Acme likes tea.\n")
    runner = make_runner(AGENT)
    fake_server.add_tool_calls([("f1", "memory_create", json.dumps({"path": "evil.md", "file_text": "x"})),
                                ("f2", "memory_str_replace", json.dumps({"path": "acme.md", "old_str": "tea",
                                                                         "new_str": "x", "store": "notes"}))])
    fake_server.add_text("done")
    runner.run("ro", "try", resources=[Mount.memory_store("notes", "read-only")])
    assert _offered(fake_server.requests[0]) == ["memory_view", "memory_search"]
    results = _results(fake_server.requests[1])
    assert all(r.startswith("Error: unknown tool") for r in results), results
    assert [v.seq for v in sqlite_store.memory_history("notes")] == [1]
    # a store mounted read-only beside a read-write one: the write tool names only the writable store
    sqlite_store.create_memory_store("crm")
    fake_server.add_tool_calls([("f3", "memory_create", json.dumps({"path": "x.md", "file_text": "x",
                                                                    "store": "notes"}))])
    fake_server.add_text("done")
    runner.run("mixed", "try", resources=[Mount.memory_store("notes", "read-only"), Mount.memory_store("crm")])
    create = next(t for t in fake_server.requests[-2]["tools"] if t["function"]["name"] == "memory_create")
    assert create["function"]["parameters"]["properties"]["store"]["enum"] == ["crm"]
    (refused,) = _results(fake_server.requests[-1])
    assert refused.startswith("Error:") and "mounted read-only" in refused
    assert [v.seq for v in sqlite_store.memory_history("notes")] == [1]
    assert sqlite_store.memory_history("crm") == []


def test_no_mount_no_memory_tool(fake_server: FakeServer, make_runner: Callable[..., Runner]) -> None:
    fake_server.add_text("hi")
    make_runner(AGENT).run("plain", "hi")
    assert "tools" not in fake_server.requests[0] or not fake_server.requests[0]["tools"]


def test_tool_paths_are_nfc_and_a_document_is_never_a_folder(fake_server: FakeServer,
                                                             make_runner: Callable[..., Runner],
                                                             sqlite_store: Any) -> None:
    import pytest

    from chatflow_cli.core.errors import UsageError

    sqlite_store.create_memory_store("notes")
    sqlite_store.write_document("notes", "a/b", "a document")
    runner = make_runner(AGENT)
    fake_server.add_tool_calls([("c1", "memory_create", json.dumps({"path": "a/b/c.md", "file_text": "x"}))])
    fake_server.add_tool_calls([("c2", "memory_create", json.dumps({"path": "a", "file_text": "x"}))])
    fake_server.add_tool_calls([("c3", "memory_create", json.dumps({"path": "cafe\u0301.md", "file_text": "one"}))])
    fake_server.add_tool_calls([("c4", "memory_view", json.dumps({"path": "caf\u00e9.md"}))])
    fake_server.add_tool_calls([("c5", "memory_create", json.dumps({"path": "x\u202e.md", "file_text": "x"}))])
    fake_server.add_tool_calls([("c6", "memory_create", json.dumps({"path": "x\u3164.md", "file_text": "x"}))])
    fake_server.add_tool_calls([("c7", "memory_create", json.dumps({"path": "x.md ", "file_text": "x"}))])
    fake_server.add_tool_calls([("c8", "memory_view", json.dumps({"path": "caf\u00e9\u00a0.md"}))])
    fake_server.add_text("done")
    assert runner.run("s1", "go", resources=[Mount.memory_store("notes")]).content == "done"
    under, folder, created, view, bidi = [_results(fake_server.requests[n])[-1] for n in range(1, 6)]
    assert under.startswith("Error:") and "would be under the document 'a/b'" in under, under
    assert folder.startswith("Error:") and "'a' is a folder (it holds 'a/b')" in folder, folder
    assert created == "created notes/caf\u00e9.md (version 2)" and "1\tone" in view, (created, view)
    assert bidi.startswith("Error:") and "U+202E" in bidi, bidi
    filler, edge, nbsp = [_results(fake_server.requests[n])[-1] for n in range(6, 9)]
    assert filler.startswith("Error:") and "U+3164 HANGUL FILLER" in filler, filler
    assert edge.startswith("Error:") and "begins or ends with a space" in edge, edge
    assert nbsp.startswith("Error:") and "U+00A0 NO-BREAK SPACE" in nbsp, nbsp
    assert [d.path for d in sqlite_store.list_documents("notes")] == ["a/b", "caf\u00e9.md"]
    with pytest.raises(UsageError, match="mounted twice"):
        runner.run("s1", "again", resources=[Mount.memory_store("notes"), Mount.memory_store("notes", "read-only")])


def test_a_view_range_outside_the_document_is_a_clear_error(fake_server: FakeServer,
                                                           make_runner: Callable[..., Runner],
                                                           sqlite_store: Any) -> None:
    sqlite_store.create_memory_store("notes")
    sqlite_store.write_document("notes", "one.md", "only line")
    ranges = [[0, 0], [3, 1], [2, -1], [1, 2], [1, 1], [1, -1]]
    fake_server.add_tool_calls([(f"v{n}", "memory_view", json.dumps({"path": "one.md", "view_range": r}))
                                for n, r in enumerate(ranges)]
                               + [("i", "memory_insert", json.dumps({"path": "one.md", "insert_line": 3,
                                                                     "insert_text": "x"}))])
    fake_server.add_text("ok")
    assert make_runner(AGENT).run("s1", "look", resources=[Mount.memory_store("notes")]).content == "ok"
    results = _results(fake_server.requests[-1])
    for r, text in zip(ranges[:4], results):
        assert text.startswith("Error:") and f"view_range {r!r} is outside 'one.md', which has 1 line" in text, text
    assert results[4].endswith("\n     1\tonly line") and results[5].endswith("\n     1\tonly line")
    assert results[6].startswith("Error:") and "line 3 is outside 'one.md', which has 1 line " in results[6], results[6]
