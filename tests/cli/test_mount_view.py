"""Which resources each turn ran with, said everywhere a turn is shown (the real ``chatflow``
process against the fake server): ``chat --output json`` and ``jsonl``'s final event,
``sessions show`` (text, ``--json``, ``jsonl``) and ``replay``, all derived from the event log;
a resumed session whose memory store or vault was deleted since (said once, unmounted with
a reason)."""

from __future__ import annotations

from tests.conftest import db_path

NOTES_RW = {"kind": "memory_store", "name": "notes", "mode": "read-write"}
NOTES_RO = {"kind": "memory_store", "name": "notes", "mode": "read-only"}
WORK = {"kind": "vault", "name": "work", "mode": "read-only"}


def _section(text: str, turn: int) -> str:
    """The lines of ``sessions show``'s turn ``turn`` (its title rule up to the next)."""
    start = text.index(f"── Turn {turn}")
    following = text.find("── Turn ", start + 1)
    return text[start:following if following != -1 else None]


def _unmount(session_id: str, name: str) -> None:
    """Unmount a memory store as ``/memory unmount`` does, through the library."""
    from chatflow_cli import SQLiteSessionStore

    store = SQLiteSessionStore(str(db_path()))
    try:
        session = store.get(session_id)
        assert session is not None and session.unmount(name)
        store.save(session)
    finally:
        store.close()


def test_every_turn_says_the_resources_it_ran_with(chatflow, provider) -> None:
    assert chatflow("memory", "create", "notes").returncode == 0
    assert chatflow("vault", "create", "work").returncode == 0
    provider.add_text("one")
    r = chatflow("chat", "-s", "m", "--memory", "notes", "--output", "json", "first")
    assert r.returncode == 0, r
    assert r.json()["resources"] == [NOTES_RW]
    provider.add_text("two")
    r = chatflow("chat", "-s", "m", "--memory", "notes:ro", "--vault", "work", "--output", "jsonl", "second")
    assert r.returncode == 0, r
    final = r.jsonl()[-1]
    assert final["type"] == "result" and final["data"]["resources"] == [NOTES_RO, WORK], final
    _unmount("m", "notes")
    provider.add_text("three")
    r = chatflow("chat", "-s", "m", "--output", "json", "third")
    assert r.returncode == 0, r
    assert r.json()["resources"] == [WORK]

    # sessions show --json / jsonl: each turn's own, the head the mounts in force now
    shown = chatflow("sessions", "show", "m", "--json").json()
    assert shown["session"]["resources"] == [WORK]
    assert [t["resources"] for t in shown["turns"]] == [[NOTES_RW], [NOTES_RO, WORK], [WORK]]
    lines = chatflow("sessions", "show", "m", "--output", "jsonl").jsonl()
    assert [line["turn"]["resources"] for line in lines[1:]] == [[NOTES_RW], [NOTES_RO, WORK], [WORK]]
    assert chatflow("sessions", "show", "m", "--turn", "2", "--json").json()["turns"][0]["resources"] == [
        NOTES_RO, WORK]

    # the text says the same, in the same words as replay
    text = chatflow("sessions", "show", "m").stdout
    head = text[:text.index("── Turn 1")]
    assert "mounted: vault work (read-only)" in head, text
    assert "mounted: memory store notes (read-write)\n" in _section(text, 1), text
    assert "mounted: memory store notes (read-only), vault work (read-only)\n" in _section(text, 2), text
    assert "mounted: vault work (read-only)\n" in _section(text, 3) and "notes" not in _section(text, 3), text

    replay = chatflow("replay", "m").stdout
    ends = [line for line in replay.splitlines() if "turn.completed" in line]
    assert len(ends) == 3, replay
    assert ends[0].endswith("· mounted: memory store notes (read-write)"), ends
    assert ends[1].endswith("· mounted: memory store notes (read-only), vault work (read-only)"), ends
    assert ends[2].endswith("· mounted: vault work (read-only)"), ends
    assert "resource.unmounted" in replay and "memory store notes (read-only)" in replay
    # from a later seq on, the mounts made before it still count
    events = chatflow("replay", "m", "--output", "json").json()
    since = next(e["seq"] for e in events if e["type"] == "turn.completed" and e["turn"] == 1)
    later = [line for line in chatflow("replay", "m", "--since", str(since)).stdout.splitlines()
             if "turn.completed" in line]
    assert later[0].endswith("· mounted: memory store notes (read-only), vault work (read-only)"), later


def test_a_turn_with_nothing_mounted_says_nothing_and_has_empty_resources(chatflow, provider) -> None:
    provider.add_text("plain")
    r = chatflow("chat", "-s", "p", "--output", "json", "hello")
    assert r.returncode == 0 and r.json()["resources"] == [], r
    shown = chatflow("sessions", "show", "p", "--json").json()
    assert shown["session"]["resources"] == [] and shown["turns"][0]["resources"] == []
    assert "mounted" not in chatflow("sessions", "show", "p").stdout
    assert "mounted" not in chatflow("replay", "p").stdout


def test_a_resumed_session_whose_store_or_vault_was_deleted_says_so_once(chatflow, provider) -> None:
    assert chatflow("memory", "create", "notes").returncode == 0
    assert chatflow("vault", "create", "work").returncode == 0
    provider.add_text("one")
    assert chatflow("chat", "-s", "g", "--memory", "notes", "--vault", "work", "first").returncode == 0
    assert "memory_view" in [t["function"]["name"] for t in provider.requests[-1]["tools"]]
    assert chatflow("memory", "rm", "notes", "--yes").returncode == 0
    assert chatflow("vault", "rm", "work").returncode == 0

    provider.add_text("two")
    r = chatflow("chat", "-s", "g", "second")
    assert r.returncode == 0 and r.stdout.strip() == "two", r
    notices = [line for line in r.stderr.splitlines() if "no longer exists" in line]
    assert notices == [
        "chatflow: memory store 'notes' no longer exists (it was mounted on session g): unmounted; the session "
        "goes on without it",
        "chatflow: vault 'work' no longer exists (it was mounted on session g): unmounted; the session goes on "
        "without it"], r.stderr
    assert not provider.requests[-1].get("tools")  # no memory tools for a store that is gone
    # the unmounts are in the log, with the reason; the turn ran without them
    events = chatflow("replay", "g", "--output", "json").json()
    gone = [e["data"] for e in events if e["type"] == "resource.unmounted"]
    assert gone == [{**NOTES_RW, "reason": "memory store 'notes' no longer exists"},
                    {**WORK, "reason": "vault 'work' no longer exists"}], gone
    assert "memory store notes (read-write): memory store 'notes' no longer exists" in chatflow("replay", "g").stdout
    shown = chatflow("sessions", "show", "g", "--json").json()
    assert shown["session"]["resources"] == []
    assert [t["resources"] for t in shown["turns"]] == [[NOTES_RW, WORK], []]
    # said once: the next run has nothing to say
    provider.add_text("three")
    r = chatflow("chat", "-s", "g", "third")
    assert r.returncode == 0 and "no longer exists" not in r.stderr, r
