"""The manual stays true: its config examples load, every command is in it, and the REPL page
lists every slash command."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.helpers import manual

TOOLS_MODULE = '''
from typing import Annotated

from chatflow_cli import Secret, tool

@tool
def check_order_status(order_id: str) -> dict:
    """Check shipment tracking for an order ID."""
    return {"order_id": order_id, "status": "IN_TRANSIT"}

@tool
def open_issues(repo: str, token: Annotated[str, Secret("github_token")]) -> list[str]:
    """List the open issues of a GitHub repository (docs/vaults.md)."""
    return []
'''


def _chatflow(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chatflow_cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_every_toml_example_loads_with_its_agents_and_tools(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", manual.text(), re.S)
    assert blocks, "the manual has no config.toml example"
    (tmp_path / "mytools.py").write_text(TOOLS_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    for i, block in enumerate(blocks):
        config = tmp_path / f"config{i}.toml"
        config.write_text(block)
        result = _chatflow("--config", str(config), "agents", "ls", env=env)
        assert result.returncode == 0, result.stderr
        for name in re.findall(r'^name = "([^"]+)"', block, re.M):
            assert name in result.stdout


def test_every_command_in_help_is_in_the_manual() -> None:
    help_text = _chatflow("--help", env=dict(os.environ)).stdout
    commands = re.findall(r"^\s{2,}(\w[\w-]*)\s{2,}", help_text.split("Commands", 1)[-1], re.M)
    assert {"chat", "sessions", "replay"} <= set(commands), help_text
    text = manual.text()
    missing = [c for c in commands if f"chatflow {c}" not in text]
    assert not missing, f"commands missing from the manual: {missing}"


def test_the_repl_page_lists_every_slash_command_once_with_its_arguments() -> None:
    """The REPL page's list of slash commands names each REPL command once, as ``/help`` does."""
    from chatflow_cli.repl.commands import COMMANDS

    text = manual.page("repl.md")
    paragraph = text[text.index("Slash commands (Tab completes them"):]
    paragraph = " ".join(paragraph[: paragraph.index("`/exit`.") + len("`/exit`.")].split())  # the list
    for name, (args, _) in COMMANDS.items():
        shown = f"`{name} {args}`" if args else f"`{name}`"
        assert paragraph.count(f"`{name}") == 1, (name, paragraph)
        assert shown in paragraph, (shown, paragraph)


# -- the README's test command is the one CI runs -----------------------------------------------

README = manual.README
CI_RUN = manual.REPO / ".ci" / "run"


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``## `` heading)."""
    body = text.split(f"\n## {heading}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def _normal(command: str) -> list[str]:
    """A pip or pytest command as words: ``python -m pip`` is ``pip``, and pip's ``--quiet`` is dropped."""
    words = shlex.split(command)
    if words[:2] in (["python", "-m"], ["python3", "-m"]) and words[2:3] == ["pip"]:
        words = words[2:]
    return [w for w in words if w not in ("--quiet", "-q")] if words[:1] == ["pip"] else words


def _readme_test_commands(text: str, testing: str | None = None) -> list[tuple[list[str], list[str]]]:
    """Each ``pip install ... && python -m pytest`` line of the README's Quickstart and of the
    manual's Testing page (``testing``, default docs/testing.md), as (pip words, pytest words)."""
    found = []
    for heading, body in (("Quickstart", _section(text, "Quickstart")),
                          ("Testing", manual.page("testing.md") if testing is None else testing)):
        blocks = re.findall(r"```bash\n(.*?)```", body, re.S)
        lines = [ln for block in blocks for ln in block.splitlines() if "pytest" in ln]
        assert len(lines) == 1, (heading, lines)
        pip, pytest_ = lines[0].split("&&")
        found.append((_normal(pip), _normal(pytest_)))
    return found


def _ci_test_command(script: str) -> tuple[list[str], list[str]]:
    """.ci/run's project install and the test run that follows it, as (pip words, pytest words)."""
    lines = [ln.strip() for ln in script.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    installs = [i for i, ln in enumerate(lines) if "pip install" in ln and " -e " in ln]
    assert len(installs) == 1, lines
    return _normal(lines[installs[0]]), _normal(lines[installs[0] + 1])


def test_the_readmes_test_command_is_the_one_ci_runs() -> None:
    """The Quickstart's and the Testing section's command are one command, and .ci/run installs
    the same extras and then runs the same pytest command (then its ci_long pass)."""
    script = CI_RUN.read_text()
    ci = _ci_test_command(script)
    readme = _readme_test_commands(README.read_text())
    assert readme == [ci, ci], (readme, ci)
    assert ci[0][:3] == ["pip", "install", "-e"] and "postgres" in ci[0][3], ci
    assert ci[1] == ["python", "-m", "pytest"], ci
    assert "python -m pytest -m ci_long" in script


def test_the_readme_ci_comparison_sees_a_difference() -> None:
    """The comparison above is real: another extra in either place, or another pytest
    command, makes the commands differ."""
    text = README.read_text()
    script = CI_RUN.read_text()
    ci = _ci_test_command(script)
    fewer = text.replace("'.[local,postgres,test]' && python -m pytest", "'.[local,test]' && python -m pytest", 1)
    assert _readme_test_commands(fewer) != [ci, ci]
    testing = manual.page("testing.md").replace("python -m pytest", "python -m pytest -x", 1)
    assert _readme_test_commands(text, testing) != [ci, ci]
    assert _ci_test_command(script.replace("-e '.[local,postgres,test]'", "-e '.[local,test]'")) != ci
    assert _ci_test_command(script.replace("\npython -m pytest\n", "\npython -m pytest -x\n", 1)) != ci
