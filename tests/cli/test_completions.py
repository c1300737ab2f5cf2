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
