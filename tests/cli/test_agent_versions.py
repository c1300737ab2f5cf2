"""Agent versions on the command line: config.toml changes an agent between runs of the real
``chatflow`` process (against the fake server); the session goes on, says once that its agent
changed, ``sessions show`` marks the turn, ``agents ls`` shows the current version, and the
versions travel through export and import."""

from __future__ import annotations

import json
import re

CONFIG = """
[[agents]]
name = "Support"
instructions = "{instructions}"
handoffs = ["Billing"]

[[agents]]
name = "Billing"
instructions = "Bills."
"""


def _version(chatflow, name: str = "Support") -> str:
    rows = chatflow("agents", "ls", "--json").json()
    return next(r["version"] for r in rows if r["name"] == name)


def _chat(chatflow, provider, text: str, *args: str):
    provider.add_text(f"answer to {text}")
    r = chatflow("chat", "-s", "s", *args, text)
    assert r.returncode == 0, r
    return r


def test_a_changed_agent_is_announced_once_and_marked_in_sessions_show(chatflow, provider, config_file) -> None:
    config_file(CONFIG.format(instructions="Help with orders."))
    v1 = _version(chatflow)
    assert re.fullmatch(r"[0-9a-f]{12}", v1)
    for n in (1, 2):
        assert "changed" not in _chat(chatflow, provider, f"q{n}").stderr
    config_file(CONFIG.format(instructions="Help with orders and refunds."))
    v2 = _version(chatflow)
    assert v2 != v1 and _version(chatflow, "Billing") != v2
    r = _chat(chatflow, provider, "q3")
    assert r.stderr.count(f"chatflow: agent Support changed since turn 2 ({v1} -> {v2})\n") == 1, r.stderr
    assert r.stdout == "answer to q3\n"
    for n in (4, 5):  # said once: not on the next turns
        assert "changed" not in _chat(chatflow, provider, f"q{n}").stderr
    # a model given for one run (-m) is not a new version of the agent
    assert "changed" not in _chat(chatflow, provider, "q6", "-m", "other-model").stderr

    text = chatflow("sessions", "show", "s", "--no-pager").stdout
    assert text.count("changed") == 2  # the turn's title mark and the line under it
    assert "── Turn 3 · Support changed " in text
    assert f"agent Support changed: version {v1} -> {v2}" in text
    assert text.index("── Turn 3") < text.index(f"version {v1} -> {v2}") < text.index("── Turn 4")
    shown = chatflow("sessions", "show", "s", "--json").json()
    assert [t["agent_versions"] for t in shown["turns"]] == [{"Support": v1}] * 2 + [{"Support": v2}] * 4
    assert [t["agent_changed"] for t in shown["turns"]] == [[], [], [{"agent": "Support", "from": v1, "to": v2}],
                                                           [], [], []]
    assert shown["session"]["agent_version"] == v2
    assert shown["session"]["agent_versions"] == {"Support": {"version": v2, "turn": 6}}
    only = chatflow("sessions", "show", "s", "--turn", "3", "--json").json()
    assert only["turns"][0]["agent_changed"] == [{"agent": "Support", "from": v1, "to": v2}]
    assert "Support changed" in chatflow("sessions", "show", "s", "--turn", "3", "--no-pager").stdout
    assert chatflow("sessions", "show", "s", "--turn", "4", "--json").json()["turns"][0]["agent_changed"] == []

    # the log keeps it: one agent.changed event, replayed and exported
    events = chatflow("replay", "s", "--json").jsonl()
    changed = [e for e in events if e["type"] == "agent.changed"]
    assert [e["data"] for e in changed] == [{"turn": 3, "agent": "Support", "version": v2, "previous_version": v1,
                                             "since_turn": 2}]
    exported = chatflow("sessions", "export", "s").stdout
    assert chatflow("sessions", "import", "-", "--into", "copy", input=exported).returncode == 0
    again = chatflow("sessions", "export", "copy").stdout

    def shape(stream: str) -> list[tuple[str, str]]:
        return [(e["type"], json.dumps(e["data"], sort_keys=True)) for e in map(json.loads, stream.splitlines()[1:])
                if e["type"] not in ("session.imported", "session.created")]

    assert shape(again)[: len(shape(exported))] == shape(exported)
    copy = chatflow("sessions", "show", "copy", "--json").json()
    assert copy["session"]["agent_versions"] == {"Support": {"version": v2, "turn": 6}}
    assert [t["agent_changed"] for t in copy["turns"]][2] == [{"agent": "Support", "from": v1, "to": v2}]


def test_jsonl_output_streams_the_change_and_json_output_still_notes_it(chatflow, provider, config_file) -> None:
    config_file(CONFIG.format(instructions="v1"))
    _chat(chatflow, provider, "q1")
    config_file(CONFIG.format(instructions="v2"))
    provider.add_text("fine")
    r = chatflow("chat", "-s", "s", "--output", "jsonl", "q2")
    assert r.returncode == 0, r
    lines = r.jsonl()
    kinds = [line["type"] for line in lines]
    assert kinds.index("message.user") < kinds.index("agent.changed") < kinds.index("message.model")
    event = lines[kinds.index("agent.changed")]
    assert event["turn"] == 2 and isinstance(event["seq"], int) and event["data"]["since_turn"] == 1
    assert "chatflow: agent Support changed since turn 1" in r.stderr


def test_agents_ls_shows_each_agents_current_version(chatflow, config_file) -> None:
    config_file(CONFIG.format(instructions="Help."))
    rows = chatflow("agents", "ls", "--json").json()
    versions = {r["name"]: r["version"] for r in rows}
    assert all(re.fullmatch(r"[0-9a-f]{12}", v) for v in versions.values()) and len(set(versions.values())) == 2
    text = chatflow("agents", "ls").stdout
    header, *body = text.splitlines()
    assert header.split()[:3] == ["AGENT", "VERSION", "MODEL"]
    assert body[0].split()[:3] == ["Support", "*", versions["Support"]]
    assert body[1].split()[:2] == ["Billing", versions["Billing"]]
    # the same file gives the same versions; an edit of one agent changes only its own
    assert {r["name"]: r["version"] for r in chatflow("agents", "ls", "--json").json()} == versions
    config_file(CONFIG.format(instructions="Help.").replace('"Bills."', '"Bills and refunds."'))
    after = {r["name"]: r["version"] for r in chatflow("agents", "ls", "--json").json()}
    assert after["Support"] == versions["Support"] and after["Billing"] != versions["Billing"]
