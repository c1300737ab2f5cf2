"""Every command has --help text with an example; --version (issue 5)."""

from __future__ import annotations

import pytest

from chatflow_cli import __version__

COMMANDS = [
    [], ["chat"], ["sessions"], ["sessions", "ls"], ["sessions", "show"], ["sessions", "rollback"],
    ["sessions", "delete"], ["replay"], ["agents"], ["agents", "ls"], ["config"], ["config", "path"],
    ["config", "show"], ["completion"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "chatflow")
def test_help_has_an_example(chatflow, command):
    r = chatflow(*command, "--help")
    assert r.returncode == 0, r
    assert "Usage: chatflow" in r.stdout
    assert "Example" in r.stdout
    assert "chatflow " in r.stdout.split("Example", 1)[1]
    assert "\x1b" not in r.stdout


def test_version(chatflow):
    r = chatflow("--version")
    assert r.returncode == 0 and r.stdout == f"chatflow {__version__}\n"


def test_python_dash_m(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "chatflow_cli", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"chatflow {__version__}"


# -- 19: polish -------------------------------------------------------------------------------------
def test_help_shows_no_python_types(chatflow):
    for args in (["sessions", "show", "--help"], ["sessions", "delete", "--help"], ["replay", "--help"],
                 ["completion", "--help"], ["chat", "--help"], ["--help"]):
        r = chatflow(*args)
        assert r.returncode == 0, r
        for bad in ("<str>", "<list[str]>", "{ID}", "[ID...]...", "<float>", "<int>"):
            assert bad not in r.stdout, (args, bad, r.stdout)
    assert "Usage: chatflow sessions show [OPTIONS] ID\n" in chatflow("sessions", "show", "--help").stdout
    assert "Usage: chatflow sessions delete [OPTIONS] [ID]...\n" in chatflow("sessions", "delete", "--help").stdout
