"""Listings fit the terminal: piped output is never wrapped or cut; on a narrow terminal
``sessions ls`` and ``agents ls`` shrink the preview, then the agent, never the session id."""

from __future__ import annotations

import re

import pytest

from tests.helpers.config import CUSTOM_TOOLS
from tests.helpers.terminal import pexpect_module, screen_lines, spawn_chatflow


LONG_ID = "20261130-005223-8f3a9c1d2e4b"
LONG_PREVIEW = "please summarise the quarterly report for the board meeting on thursday " * 2


def _spawn_ls(columns: int) -> str:
    """What ``sessions ls`` shows on a terminal ``columns`` wide (no colours)."""
    pexpect = pexpect_module()
    child = spawn_chatflow(["sessions", "ls"], cols=columns, rows=40, NO_COLOR="1")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return child.before.decode("utf-8", "replace").replace("\r\n", "\n")


@pytest.fixture
def long_session(chatflow, provider):
    for _ in range(2):
        r = chatflow("chat", "-s", LONG_ID, LONG_PREVIEW)
        assert r.returncode == 0, r
    return LONG_ID


def test_ls_piped_never_wraps_or_truncates(chatflow, long_session):
    out = chatflow("sessions", "ls").stdout
    header, row = out.splitlines()
    assert header.split() == ["SESSION", "AGENT", "STATUS", "TURNS", "UPDATED", "TITLE"]
    assert row.startswith(LONG_ID + " ")
    cells = re.split(r"\s{2,}", row)
    assert cells[:4] == [LONG_ID, "Assistant", "idle", "2"]
    assert cells[4].endswith("ago")
    [listed] = chatflow("sessions", "ls", "--json").json()
    assert cells[5] == listed["title"] and len(cells[5]) > 60
    assert "\u2026" not in out


def test_ls_on_a_narrow_terminal_shrinks_the_title_then_stacks_never_cutting_the_id(long_session):
    out = _spawn_ls(80)
    lines = [line for line in out.splitlines() if line.strip()]
    assert all(len(line) <= 80 for line in lines), lines
    header, row = lines
    assert header.split() == ["SESSION", "AGENT", "STATUS", "TURNS", "UPDATED", "TITLE"]
    cells = re.split(r"\s{2,}", row)
    assert cells[:4] == [LONG_ID, "Assistant", "idle", "2"] and cells[4].endswith("ago")
    assert cells[5].endswith("\u2026") and LONG_PREVIEW.startswith(cells[5][:-1])

    for width in (60, 55):  # the title no longer fits as a column: a block a session, title kept
        block = [line.rstrip() for line in _spawn_ls(width).splitlines() if line.strip()]
        assert all(len(line) <= width for line in block), block
        assert block[0] == f"{LONG_ID}  idle"
        assert block[1].startswith("  ") and block[1].endswith("\u2026") and LONG_PREVIEW.startswith(block[1][2:-1])
        assert re.fullmatch(r"  2 turns · .+ ago · Assistant", block[2]), block
        assert len(block) == 3


def test_agents_and_sessions_ls_stay_readable_at_40_columns(chatflow, provider, config_file):
    pexpect = pexpect_module()
    config_file(CUSTOM_TOOLS + '\n[[agents]]\nname = "Billing"\ninstructions = "You handle refunds and invoices '
                'for every customer of the shop, politely."\nhandoffs = ["Support"]\n')
    for sid in ("support-ticket-0042", "20261130-120000-abcdef"):
        assert chatflow("chat", "-s", sid, "Where is my order? It was due last week.").returncode == 0
    for args in (["agents", "ls"], ["sessions", "ls"]):
        child = spawn_chatflow(args, cols=40, NO_COLOR="1")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        lines = [ln for ln in screen_lines(child.before) if ln.strip()]
        assert lines and all(len(ln) <= 40 for ln in lines), lines
        assert sum(len(ln.strip()) <= 2 for ln in lines) == 0, lines  # no one-character-per-line column
        text = "\n".join(lines)
        if args[0] == "agents":
            assert "Support" in text and "Billing" in text and "approve_refund" in text
        else:
            assert "support-ticket-0042" in text and "20261130-120000-abcdef" in text and "idle" in text
