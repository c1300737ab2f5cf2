"""``sessions search``, ``fork``, ``rename``, ``archive``/``unarchive``, ``ls`` filters and
``show --turn`` through the real ``chatflow`` process on a real database."""

from __future__ import annotations

import os
import subprocess

import pytest

from chatflow_cli.core.errors import ExitStatus
from chatflow_cli.core.memory import SearchHit
from chatflow_cli.core.memory.search import HIGHLIGHT_END, HIGHLIGHT_START
from chatflow_cli.render.search import search_hit_lines
from tests.conftest import COMMAND, REPO


@pytest.fixture
def fake_server(shared_fake_server):
    """The module's server, as fresh as a new one: ``history``'s sessions keep their endpoint."""
    return shared_fake_server


@pytest.fixture
def history(chatflow, provider, home_snapshot):
    """Two sessions of 3 and 2 turns, written by chatflow once per module's server (copied per test)."""
    def build():
        for sid, texts in (("deploys", ("how do I deploy the gateway", "and roll it back", "thanks")),
                           ("weather", ("is it sunny in Lisbon", "and tomorrow"))):
            for text in texts:
                r = chatflow("chat", "-s", sid, text)
                assert r.returncode == 0, r

    home_snapshot.restore(f"search-fork-history-{provider.port}", build)
    provider.reset()
    return ["deploys", "weather"]


def test_search_prints_turn_level_hits_and_json(chatflow, history):
    r = chatflow("sessions", "search", "deploy")
    assert r.returncode == 0, r
    lines = r.stdout.splitlines()
    assert lines[0].startswith("deploys · turn 1 · ") and "ago" in lines[0]
    assert "deploy" in lines[1] and lines[1].startswith("  ")
    [hit] = chatflow("sessions", "search", "deploy", "--json").json()
    assert (hit["session_id"], hit["turn"], hit["removed"]) == ("deploys", 1, None)
    assert "[deploy]" in hit["snippet"] and hit["age_s"] >= 0
    rows = chatflow("sessions", "search", "and", "--output", "jsonl").jsonl()
    assert {(h["session_id"], h["turn"]) for h in rows} == {("deploys", 2), ("weather", 2)}
    assert [h["session_id"] for h in chatflow("sessions", "search", "and", "--session", "weather", "--json").json()] \
        == ["weather"]
    assert chatflow("sessions", "search", "and", "--limit", "1", "--json").json().__len__() == 1
    assert chatflow("sessions", "search", "and", "--since", "1h", "--json").json().__len__() == 2
    none = chatflow("sessions", "search", "zeppelin")
    assert none.returncode == 0 and none.stdout == "" and "no turns match" in none.stderr


@pytest.mark.parametrize("query", ['"', "AND", "*", "a OR", "NOT x"])
def test_an_unparsable_query_is_a_usage_error_with_a_hint(chatflow, history, query):
    r = chatflow("sessions", "search", query)
    assert r.returncode == ExitStatus.USAGE, r
    [line] = r.stderr_lines
    assert line.startswith("chatflow: error: search query") and "prefix*" in line
    assert "Traceback" not in r.stderr


def test_rollback_then_search_finds_rolled_back_text_only_with_all(chatflow, history):
    assert chatflow("sessions", "rollback", "deploys", "--to", "1", "--yes").returncode == 0
    assert chatflow("sessions", "search", "roll", "--json").json() == []
    [hit] = chatflow("sessions", "search", "roll", "--all", "--json").json()
    assert (hit["turn"], hit["removed"]) == (2, "rolled_back")
    text = chatflow("sessions", "search", "roll", "--all").stdout
    assert "rolled back" in text.splitlines()[0]


def test_show_turn_jumps_to_the_hit(chatflow, history):
    r = chatflow("sessions", "show", "deploys", "--turn", "2", "--json")
    assert [t["number"] for t in r.json()["turns"]] == [2]
    missing = chatflow("sessions", "show", "deploys", "--turn", "9")
    assert missing.returncode == ExitStatus.USAGE and "no turn 9" in missing.stderr


def test_fork_copies_turns_and_show_names_the_parent(chatflow, history):
    r = chatflow("sessions", "fork", "deploys", "--at", "2", "--into", "deploys-b")
    assert r.returncode == 0, r
    assert r.stdout == "deploys-b\n" and "forked deploys at turn 2" in r.stderr
    shown = chatflow("sessions", "show", "deploys-b", "--json").json()
    assert [t["number"] for t in shown["turns"]] == [1, 2]
    assert shown["session"]["forked_from"]["session_id"] == "deploys"
    assert "forked from deploys at turn 2" in chatflow("sessions", "show", "deploys-b").stdout
    tree = chatflow("sessions", "ls", "--tree").stdout.splitlines()
    at = [i for i, line in enumerate(tree) if line.startswith("deploys ")][0]
    assert tree[at + 1].startswith("\u2514\u2500 deploys-b")
    # fork then roll back the fork: the source is untouched
    before = chatflow("sessions", "show", "deploys", "--json").json()
    assert chatflow("sessions", "rollback", "deploys-b", "--to", "0", "--yes").returncode == 0
    assert chatflow("sessions", "show", "deploys", "--json").json() == before
    bad = chatflow("sessions", "fork", "deploys", "--at", "7")
    assert bad.returncode == ExitStatus.USAGE and "nothing changed" in bad.stderr
    taken = chatflow("sessions", "fork", "deploys", "--at", "1", "--into", "weather")
    assert taken.returncode == ExitStatus.USAGE and "already exists" in taken.stderr
    assert chatflow("sessions", "fork", "nope", "--at", "1").returncode == ExitStatus.NOT_FOUND


def test_titles_filters_cursor_and_archive(chatflow, provider):
    assert chatflow("chat", "-s", "t1", "--title", "Refund for order 1234", "--metadata", "ticket=T-1",
                    "hello").returncode == 0
    assert chatflow("chat", "-s", "t2", "--metadata", "ticket=T-2", "second line one\nline two").returncode == 0
    rows = {r["session_id"]: r for r in chatflow("sessions", "ls", "--json").json()}
    assert rows["t1"]["title"] == "Refund for order 1234" and rows["t2"]["title"] == "second line one"
    assert [r["session_id"] for r in chatflow("sessions", "ls", "--metadata", "ticket=T-2", "--json").json()] == ["t2"]
    assert [r["session_id"] for r in chatflow("sessions", "ls", "--grep", "REFUND", "--json").json()] == ["t1"]
    assert chatflow("sessions", "ls", "--since", "1h", "--json").json().__len__() == 2
    assert chatflow("sessions", "ls", "--until", "1h", "--json").json() == []
    first = chatflow("sessions", "ls", "-n", "1", "--json").json()
    rest = chatflow("sessions", "ls", "--after", first[-1]["cursor"], "--json").json()
    assert [r["session_id"] for r in first + rest] == [r["session_id"] for r in chatflow("sessions", "ls", "--json").json()]
    assert chatflow("sessions", "ls", "--after", "junk").returncode == ExitStatus.USAGE
    after_t1 = chatflow("sessions", "ls", "--after", first[-1]["session_id"], "--json")
    assert after_t1.returncode == 0, after_t1
    assert [r["session_id"] for r in after_t1.json()] == [r["session_id"] for r in rest]
    for bad in ("nan:x", "t9"):
        refused = chatflow("sessions", "ls", "--after", bad)
        assert refused.returncode == ExitStatus.USAGE, refused
        assert "'cursor' value printed with --json" in refused.stderr and "'next'" not in refused.stderr
    assert chatflow("sessions", "rename", "t2", "Second").returncode == 0
    assert "TITLE" in chatflow("sessions", "ls").stdout.splitlines()[0]
    assert "Second" in chatflow("sessions", "ls").stdout
    # archive: hidden, kept, refuses new turns until unarchived
    assert chatflow("sessions", "archive", "t1").returncode == 0
    assert [r["session_id"] for r in chatflow("sessions", "ls", "--json").json()] == ["t2"]
    assert [r["session_id"] for r in chatflow("sessions", "ls", "--archived", "--json").json()] == ["t1"]
    refused = chatflow("chat", "-s", "t1", "more")
    assert refused.returncode == ExitStatus.SESSION_BUSY
    assert "archived" in refused.stderr and "unarchive t1" in refused.stderr
    assert chatflow("sessions", "archive", "t2", "nope").returncode == ExitStatus.NOT_FOUND
    assert [r["session_id"] for r in chatflow("sessions", "ls", "--json").json()] == ["t2"]  # nothing changed
    assert chatflow("sessions", "unarchive", "t1").returncode == 0
    assert chatflow("chat", "-s", "t1", "more").returncode == 0


def test_search_hits_fit_forty_columns():
    hit = SearchHit("a-rather-long-session-id-2026", 12,
                    f"…the {HIGHLIGHT_START}deploy{HIGHLIGHT_END} failed because the gateway \x1b[31m was down "
                    "and nobody noticed for a while…", "user", 1_000.0, -1.0, "SupportAgentWithLongName",
                    "rolled_back")
    lines = search_hit_lines([hit], width=40, now=4_600.0)
    rows = [row for line in lines for row in line.plain.split("\n")]
    assert all(len(row) <= 40 for row in rows), rows
    assert rows[0] == "a-rather-long-session-id-2026 · turn 12"  # agent and age dropped, never the turn
    assert lines[1].plain == "  rolled back"  # no room beside the turn: a line of its own
    snippet = lines[2].plain.split("\n")
    assert "\x1b" not in "".join(rows) and any("deploy" in row for row in snippet)
    assert all(row.startswith("  ") for row in snippet)
    wide = search_hit_lines([hit], width=120, now=4_600.0)[0].plain
    assert wide == "a-rather-long-session-id-2026 · turn 12 · rolled back · 1h ago · SupportAgentWithLongName"
    styled = [part for line in lines for part in line.parts if part[0] == "deploy"]
    assert styled and styled[0][1] == "bold yellow"


def test_fork_at_zero_is_a_usage_error(chatflow, history):
    for at in ("0", "-1"):
        r = chatflow("sessions", "fork", "deploys", "--at", at)
        assert r.returncode == ExitStatus.USAGE, r
        assert "N is a turn number 1..3" in r.stderr and "nothing changed" in r.stderr
    assert sorted(s["session_id"] for s in chatflow("sessions", "ls", "--json").json()) == ["deploys", "weather"]


def test_a_fork_talks_to_the_same_endpoint_and_drops_metadata(chatflow, provider):
    assert chatflow("chat", "-s", "src", "-m", "other-model", "--title", "Refund", "--metadata", "ticket=T-42",
                    "first").returncode == 0
    r = chatflow("sessions", "fork", "src", "--into", "branch")
    assert r.returncode == 0, r
    assert [s["session_id"] for s in chatflow("sessions", "ls", "--metadata", "ticket=T-42", "--json").json()] \
        == ["src"]
    tagged = chatflow("sessions", "fork", "src", "--into", "tagged", "--metadata", "ticket=T-42-b")
    assert tagged.returncode == 0, tagged
    assert [s["session_id"] for s in chatflow("sessions", "ls", "--metadata", "ticket=T-42-b", "--json").json()] \
        == ["tagged"]
    assert chatflow("sessions", "show", "branch", "--json").json()["session"]["model"] == "other-model"
    assert {s["session_id"]: s["title"] for s in chatflow("sessions", "ls", "--json").json()}["branch"] \
        == "Refund (fork)"
    assert chatflow("chat", "-s", "branch", "second").returncode == 0
    assert provider.requests[-1]["model"] == "other-model"


def test_a_fork_whose_output_cannot_be_written_still_reports_its_id(chatflow, history):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    with open("/dev/full", "wb") as full:
        r = subprocess.run([*COMMAND, "sessions", "fork", "deploys", "--at", "1", "--into", "deploys-full"],
                           stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE, env=env, timeout=60)
    assert r.returncode == ExitStatus.ERROR, r
    assert "deploys-full" in r.stderr.decode() and "cannot write the output" in r.stderr.decode()
    assert "deploys-full" in [s["session_id"] for s in chatflow("sessions", "ls", "--json").json()]


def test_search_marks_copied_turns_and_keeps_their_times(chatflow, history):
    before = {h["turn"]: h["created_at"] for h in chatflow("sessions", "search", "deploy", "--json").json()}
    assert chatflow("sessions", "fork", "deploys", "--at", "1", "--into", "deploys-b").returncode == 0
    hits = {h["session_id"]: h for h in chatflow("sessions", "search", "deploy", "--json").json()}
    assert hits["deploys"]["forked_from"] is None
    assert hits["deploys-b"]["forked_from"] == {"session_id": "deploys", "turn": 1}
    assert hits["deploys-b"]["created_at"] == before[1]
    text = chatflow("sessions", "search", "deploy").stdout.splitlines()
    assert any(line.startswith("deploys-b · turn 1 (copy)") for line in text), text
    assert any(line.startswith("deploys · turn 1 · ") for line in text), text


def test_chat_continue_skips_archived_sessions(chatflow, provider):
    assert chatflow("chat", "-s", "older", "one").returncode == 0
    assert chatflow("chat", "-s", "newer", "two").returncode == 0
    assert chatflow("sessions", "archive", "newer").returncode == 0
    r = chatflow("chat", "-c", "three")
    assert r.returncode == 0, r
    turns = {s["session_id"]: s["turns"] for s in chatflow("sessions", "ls", "--json").json()}
    assert turns == {"older": 2}
    assert chatflow("sessions", "archive", "older").returncode == 0
    none = chatflow("chat", "-c", "four")
    assert none.returncode == ExitStatus.NOT_FOUND, none


def test_tree_draws_non_last_forks_with_a_tee(chatflow, history):
    for into in ("deploys-a", "deploys-b"):
        assert chatflow("sessions", "fork", "deploys", "--at", "1", "--into", into).returncode == 0
    assert chatflow("sessions", "fork", "deploys-a", "--at", "1", "--into", "deploys-a1").returncode == 0
    tree = chatflow("sessions", "ls", "--tree").stdout.splitlines()
    at = [i for i, line in enumerate(tree) if line.startswith("deploys ")][0]
    column = tree[0].index("AGENT")
    ids = [line[:column].rstrip() for line in tree[at:at + 4]]
    # siblings newest first: deploys-b, then deploys-a with its own fork under it
    assert ids == ["deploys", "\u251c\u2500 deploys-b", "\u2514\u2500 deploys-a", "   \u2514\u2500 deploys-a1"], tree
