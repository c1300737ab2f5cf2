"""``chatflow chat --memory`` through the real process against the fake server: a model that
views, writes and edits a stale passage; two sessions sharing a store, one read-only, which
refuses a forged write; the mounts in replay, sessions show --json, fork and export/import;
bad input and its exit codes."""

from __future__ import annotations

import json

from chatflow_cli.core.errors import ExitStatus


def _tool_results(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def _offered(request: dict) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools") or []]


def test_two_sessions_share_a_store_one_read_only(chatflow, provider, tmp_path) -> None:
    assert chatflow("memory", "create", "customers").returncode == 0
    # session a (read-write): create, view, then edit
    provider.add_tool_calls([("c1", "memory_create", json.dumps({"path": "acme.md", "file_text": "Acme: EUR\n"}))])
    provider.add_tool_calls([("c2", "memory_view", json.dumps({"path": "acme.md"}))])
    provider.add_text("noted")
    r = chatflow("chat", "-s", "a", "--memory", "customers", "Acme pays in EUR")
    assert r.returncode == 0 and r.stdout.strip() == "noted", r
    assert "memory_str_replace" in _offered(provider.requests[0])
    created, view = _tool_results(provider.requests[2])
    assert created == "created customers/acme.md (version 1)" and "1\tAcme: EUR" in view
    # session b (read-only): no write tool; a forged write is a tool error, nothing written
    provider.add_tool_calls([("f1", "memory_str_replace", json.dumps({"path": "acme.md", "old_str": "EUR",
                                                                      "new_str": "USD"}))])
    provider.add_text("cannot")
    r = chatflow("chat", "-s", "b", "--memory", "customers:ro", "Acme pays in USD now")
    assert r.returncode == 0, r
    assert _offered(provider.requests[3]) == ["memory_view", "memory_search"]
    (forged,) = _tool_results(provider.requests[4])
    assert forged.startswith("Error: unknown tool 'memory_str_replace'"), forged
    assert chatflow("memory", "show", "customers", "acme.md").stdout == "Acme: EUR\n"
    # session a edits a passage that another write changed first: refused, said so, nothing lost
    assert chatflow("memory", "write", "customers", "acme.md", input="Acme: EUR since 2020\nContact: Bob\n"
                    ).returncode == 0
    provider.add_tool_calls([("s1", "memory_str_replace", json.dumps({"path": "acme.md", "old_str": "Acme: EUR\n",
                                                                      "new_str": "Acme: GBP\n"}))])
    provider.add_text("it changed")
    assert chatflow("chat", "-s", "a", "update Acme").returncode == 0  # mounted already: no --memory needed
    (stale,) = _tool_results(provider.requests[-1])[-1:]
    assert stale.startswith("Error:") and "not in 'acme.md'" in stale, stale
    assert chatflow("memory", "show", "customers", "acme.md").stdout == "Acme: EUR since 2020\nContact: Bob\n"
    history = chatflow("memory", "history", "customers", "--json").json()
    assert [(v["seq"], v["op"], v["session_id"], v["turn"]) for v in history] == [
        (1, "create", "a", 1), (2, "write", None, None)]
    # the mounts are in the log: replay, sessions show --json
    replay = chatflow("replay", "b").stdout
    assert "resource.mounted" in replay and "memory store customers (read-only)" in replay
    head = chatflow("sessions", "show", "a", "--json").json()["session"]
    assert head["resources"] == [{"kind": "memory_store", "name": "customers", "mode": "read-write"}]
    events = [json.loads(line) for line in chatflow("replay", "a", "--output", "jsonl").stdout.splitlines()]
    assert [e["data"] for e in events if e["type"] == "resource.mounted"] == [
        {"kind": "memory_store", "name": "customers", "mode": "read-write"}]
    # a fork and an export/import keep them
    fork = chatflow("sessions", "fork", "b", "--into", "b2")
    assert fork.returncode == 0, fork
    assert chatflow("sessions", "show", "b2", "--json").json()["session"]["resources"] == [
        {"kind": "memory_store", "name": "customers", "mode": "read-only"}]
    export = tmp_path / "b.jsonl"
    assert chatflow("sessions", "export", "b", "-o", str(export)).returncode == 0
    assert chatflow("sessions", "delete", "b", "--yes").returncode == 0
    r = chatflow("sessions", "import", str(export))
    assert r.returncode == 0, r
    assert chatflow("sessions", "show", "b", "--json").json()["session"]["resources"] == [
        {"kind": "memory_store", "name": "customers", "mode": "read-only"}]


def test_memory_bad_input(chatflow, provider, config_file) -> None:
    r = chatflow("chat", "-s", "x", "--memory", "nope", "hi")
    assert r.returncode == ExitStatus.NOT_FOUND and "memory store 'nope' does not exist" in r.stderr, r
    chatflow("memory", "create", "notes")
    r = chatflow("chat", "-s", "x", "--memory", "notes:rx", "hi")
    assert r.returncode == ExitStatus.USAGE and "mount mode 'rx'" in r.stderr, r
    r = chatflow("chat", "-s", "x", "--memory", "../notes", "hi")
    assert r.returncode == ExitStatus.USAGE and "is not valid" in r.stderr, r
    assert provider.requests == []  # nothing was sent
    # a path outside the store, a document too large: tool errors the model reads; the turn goes on
    provider.add_tool_calls([("p1", "memory_create", json.dumps({"path": "../../etc/x", "file_text": "x"})),
                             ("p2", "memory_create", json.dumps({"path": "big.md", "file_text": "x" * 100_001}))])
    provider.add_text("ok")
    r = chatflow("chat", "-s", "y", "--memory", "notes", "go")
    assert r.returncode == 0, r
    outside, big = _tool_results(provider.requests[-1])
    assert "outside the store" in outside and "over the limit of 100,000" in big
    assert chatflow("memory", "ls", "notes", "--json").json() == []
    # per agent in config.toml
    config_file('[[agents]]\nname = "Desk"\ninstructions = "x"\nmemory = ["notes:ro"]\n')
    provider.add_text("hi")
    assert chatflow("chat", "-s", "z", "hello").returncode == 0
    assert _offered(provider.requests[-1]) == ["memory_view", "memory_search"]


def test_memory_calls_of_one_reply_run_in_the_order_given(chatflow, provider) -> None:
    # each call depends on the one before it: run at once, some fail or see stale text
    assert chatflow("memory", "create", "rv").returncode == 0
    calls = [("c1", "memory_create", json.dumps({"path": "r1.md", "file_text": "alpha"})),
             ("c2", "memory_str_replace", json.dumps({"path": "r1.md", "old_str": "alpha", "new_str": "beta"})),
             ("c3", "memory_view", json.dumps({"path": "r1.md"}))]
    calls += [(f"i{n}", "memory_insert", json.dumps({"path": "r1.md", "insert_line": n, "insert_text": f"line {n}"}))
              for n in range(1, 11)]
    calls.append(("c4", "memory_view", json.dumps({"path": "r1.md"})))
    provider.add_tool_calls(calls)
    provider.add_text("done")
    r = chatflow("chat", "-s", "o", "--memory", "rv", "remember")
    assert r.returncode == 0, r
    results = _tool_results(provider.requests[-1])
    assert results[:2] == ["created rv/r1.md (version 1)", "replaced the passage in rv/r1.md (version 2)"], results
    assert results[2].endswith("\n     1\tbeta"), results[2]
    assert results[3:13] == [f"inserted the text after line {n} of rv/r1.md (version {n + 2})" for n in range(1, 11)]
    assert results[13].endswith("\n".join(f"{n + 1:6d}\t" + (f"line {n}" if n else "beta") for n in range(11)))
    history = chatflow("memory", "history", "rv", "--json").json()
    assert [v["op"] for v in history] == ["create", "str_replace"] + ["insert"] * 10
