"""The README stays true: its config example loads, and every command it names exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"

TOOLS_MODULE = '''
from chatflow_cli import tool

@tool
def check_order_status(order_id: str) -> dict:
    """Check shipment tracking for an order ID."""
    return {"order_id": order_id, "status": "IN_TRANSIT"}
'''


def _chatflow(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chatflow_cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_every_toml_example_loads_with_its_agents_and_tools(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no config.toml example"
    (tmp_path / "mytools.py").write_text(TOOLS_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    for i, block in enumerate(blocks):
        config = tmp_path / f"config{i}.toml"
        config.write_text(block)
        result = _chatflow("--config", str(config), "agents", "ls", env=env)
        assert result.returncode == 0, result.stderr
        for name in re.findall(r'^name = "([^"]+)"', block, re.M):
            assert name in result.stdout


def test_every_command_in_help_is_in_the_readme() -> None:
    help_text = _chatflow("--help", env=dict(os.environ)).stdout
    commands = re.findall(r"^\s{2,}(\w[\w-]*)\s{2,}", help_text.split("Commands", 1)[-1], re.M)
    assert {"chat", "sessions", "replay"} <= set(commands), help_text
    text = README.read_text()
    missing = [c for c in commands if f"chatflow {c}" not in text]
    assert not missing, f"commands missing from README.md: {missing}"


def test_the_readme_lists_every_slash_command_once_with_its_arguments() -> None:
    """The README's list of slash commands names each REPL command once, as ``/help`` does."""
    from chatflow_cli.repl.commands import COMMANDS

    text = README.read_text()
    paragraph = text[text.index("Slash commands (Tab completes them"):]
    paragraph = " ".join(paragraph[: paragraph.index("`/exit`.") + len("`/exit`.")].split())  # the list
    for name, (args, _) in COMMANDS.items():
        shown = f"`{name} {args}`" if args else f"`{name}`"
        assert paragraph.count(f"`{name}") == 1, (name, paragraph)
        assert shown in paragraph, (shown, paragraph)
