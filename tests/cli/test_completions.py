"""``completions/`` holds the scripts the app generates; session ids complete from the store (issue 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

COMPLETIONS = Path(__file__).resolve().parents[2] / "completions"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_do_not_drift(chatflow, shell):
    r = chatflow("completion", shell)
    assert r.returncode == 0, r
    stored = (COMPLETIONS / f"chatflow.{shell}").read_text(encoding="utf-8")
    assert r.stdout == stored, (
        f"completions/chatflow.{shell} drifted from the app: regenerate it with "
        f"`chatflow completion {shell} > completions/chatflow.{shell}`"
    )
    assert "_CHATFLOW_COMPLETE" in stored


def test_unknown_shell(chatflow):
    r = chatflow("completion", "tcsh")
    assert r.returncode == 2 and "tcsh" in r.stderr


def test_commands_and_session_ids_complete(chatflow, provider):
    for sid in ("alpha-1", "alpha-2", "beta"):
        assert chatflow("chat", "-s", sid, "hi").returncode == 0
    r = chatflow(env={"_CHATFLOW_COMPLETE": "complete_bash", "COMP_WORDS": "chatflow sess", "COMP_CWORD": "1"})
    assert r.stdout.split() == ["sessions"]
    r = chatflow(env={"_CHATFLOW_COMPLETE": "complete_bash", "COMP_WORDS": "chatflow sessions show al",
                      "COMP_CWORD": "3"})
    assert sorted(r.stdout.split()) == ["alpha-1", "alpha-2"]
    r = chatflow(env={"_CHATFLOW_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "chatflow chat -s b"})
    assert '"beta"' in r.stdout and "alpha" not in r.stdout


# -- 10: completion -------------------------------------------------------------------------------
def test_completion_of_agents_shells_and_statuses(chatflow, config_file):
    config_file('[[agents]]\nname = "Support"\ninstructions = "x"\n\n[[agents]]\nname = "Billing"\ninstructions = "y"\n')
    bash = {"_CHATFLOW_COMPLETE": "complete_bash"}
    r = chatflow(env={**bash, "COMP_WORDS": "chatflow chat -a ", "COMP_CWORD": "3"})
    assert r.stdout.split() == ["Support", "Billing"]
    r = chatflow(env={**bash, "COMP_WORDS": "chatflow completion ", "COMP_CWORD": "2"})
    assert r.stdout.split() == ["bash", "zsh", "fish"]
    r = chatflow(env={**bash, "COMP_WORDS": "chatflow sessions ls --status r", "COMP_CWORD": "4"})
    assert r.stdout.split() == ["running", "rescheduled"]
    zsh = chatflow(env={"_CHATFLOW_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "chatflow chat -a B"})
    assert '"Billing"' in zsh.stdout and "Support" not in zsh.stdout
    zsh = chatflow(env={"_CHATFLOW_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "chatflow completion z"})
    assert '"zsh"' in zsh.stdout and "bash" not in zsh.stdout
    fish = chatflow(env={"_CHATFLOW_COMPLETE": "complete_fish", "_TYPER_COMPLETE_ARGS": "chatflow sessions ls --status ",
                         "_TYPER_COMPLETE_FISH_ACTION": "get-args"})
    assert fish.stdout.split() == ["idle", "running", "rescheduled", "terminated"]
    fish = chatflow(env={"_CHATFLOW_COMPLETE": "complete_fish", "_TYPER_COMPLETE_ARGS": "chatflow chat -a S",
                         "_TYPER_COMPLETE_FISH_ACTION": "get-args"})
    assert fish.stdout.split() == ["Support"]


def test_unarchive_completes_archived_sessions_and_archive_the_others(chatflow, provider):
    for sid in ("kept-1", "kept-2"):
        assert chatflow("chat", "-s", sid, "hi").returncode == 0
    assert chatflow("sessions", "archive", "kept-1").returncode == 0
    bash = {"_CHATFLOW_COMPLETE": "complete_bash"}
    r = chatflow(env={**bash, "COMP_WORDS": "chatflow sessions unarchive ke", "COMP_CWORD": "3"})
    assert r.stdout.split() == ["kept-1"]
    r = chatflow(env={**bash, "COMP_WORDS": "chatflow sessions archive ke", "COMP_CWORD": "3"})
    assert r.stdout.split() == ["kept-2"]
