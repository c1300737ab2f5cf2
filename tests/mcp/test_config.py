"""Declaring MCP servers: config.toml tables, the mcpServers JSON others use, references (issue 27)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatflow_cli.config_file import validate_file
from chatflow_cli.core.errors import ConfigError
from chatflow_cli.core.mcp import MCPServerError
from chatflow_cli.core.mcp.refs import resolve


def _validate(tmp_path: Path, text: str) -> dict:
    import tomllib

    return validate_file(tmp_path / "config.toml", text, tomllib.loads(text))


def test_servers_from_toml_and_a_pasted_json_file_reach_the_agents(tmp_path):
    (tmp_path / "desktop.json").write_text(json.dumps({"globalShortcut": "x", "mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "tracker": {"type": "http", "url": "https://t.example/mcp", "headers": {"A": "${vault:work/t}"},
                    "alwaysAllow": ["x"]}}}))
    out = _validate(tmp_path, """
mcp_config = "desktop.json"
[mcp_servers.git]
command = "git-mcp"
approval = "never"
tool_approval = { git_log = "always" }
[[agents]]
name = "Dev"
mcp_servers = ["time", { name = "git", tools = ["git_log"] }]
""")
    specs = {s.name: s for s in out["mcp_servers"]}
    assert list(specs) == ["git", "time", "tracker"]
    assert specs["tracker"].transport == "http" and specs["tracker"].headers == {"A": "${vault:work/t}"}
    assert specs["git"].build().policy_for("git_log") == "always" and specs["git"].build().policy_for("x") == "never"
    assert out["agents"][0].mcp_servers == (("time", None), ("git", ("git_log",)))


@pytest.mark.parametrize("text, says", [
    ('[mcp_servers.a]\ncommand = "x"\nbogus = 1\n', "line 1: MCP server 'a': unknown key 'bogus'"),
    ('[mcp_servers.a]\nurl = "ftp://x"\n', "url must be an http:// or https:// URL"),
    ('[mcp_servers.a]\ncommand = "x"\napproval = "maybe"\n', "approval 'maybe': use always, ask or never"),
    ('[[agents]]\nname = "A"\nmcp_servers = ["nope"]\n', "line 3: agent 'A': mcp_servers: 'nope' is not a declared"),
    ('mcp_config = "missing.json"\n', "missing.json: cannot read"),
])
def test_a_bad_declaration_is_one_line_naming_the_place(tmp_path, text, says):
    with pytest.raises(ConfigError) as caught:
        _validate(tmp_path, text)
    assert says in caught.value.message


def test_references_resolve_without_ever_showing_a_value(monkeypatch):
    monkeypatch.setenv("MCP_TEST_TOKEN", "abcdefgh12345")
    assert resolve("env:MCP_TEST_TOKEN", None, "w") == "abcdefgh12345"
    assert resolve("Bearer ${MCP_TEST_TOKEN}", None, "w") == "Bearer abcdefgh12345"
    assert resolve("${env:MCP_TEST_TOKEN}/${UNSET_MCP_VAR:-fallback}", None, "w") == "abcdefgh12345/fallback"
    assert resolve("plain value", None, "w") == "plain value"
    with pytest.raises(MCPServerError, match=r"^w: the environment variable UNSET_MCP_VAR is not set$"):
        resolve("${UNSET_MCP_VAR}", None, "w")
    with pytest.raises(MCPServerError, match=r"vault:work/t cannot be read here"):
        resolve("vault:work/t", None, "w")


def test_variables_in_the_command_and_args_of_a_pasted_file_are_expanded(tmp_path, monkeypatch):
    import sys

    from chatflow_cli.core.mcp.config import read_mcp_json

    toolbox = Path(__file__).with_name("toolbox.py")
    monkeypatch.setenv("MCP_TEST_PYTHON", sys.executable)
    monkeypatch.setenv("MCP_TEST_TOOLS", str(toolbox.parent))
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"box": {
        "command": "${MCP_TEST_PYTHON}", "args": ["${MCP_TEST_TOOLS}/${UNSET_MCP_VAR:-toolbox.py}"]}}}))
    server = read_mcp_json(tmp_path / "mcp.json")[0].build()
    try:
        assert server.describe() == "'${MCP_TEST_PYTHON}' '${MCP_TEST_TOOLS}/${UNSET_MCP_VAR:-toolbox.py}'"
        assert server.agent_tools()["box__echo"].invoke({"text": "expanded"}) == "expanded"
    finally:
        server.stop()


def test_reading_a_config_with_servers_imports_neither_asyncio_nor_the_sdk(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "config.toml"
    config.write_text('[mcp_servers.time]\ncommand = "uvx"\nargs = ["mcp-server-time"]\n'
                      '[[agents]]\nname = "A"\nmcp_servers = ["time"]\n')
    code = ("import sys; from chatflow_cli.config import load_settings; s = load_settings(config=sys.argv[1]); "
            "print(len(s.mcp_servers), 'asyncio' in sys.modules, 'mcp' in sys.modules)")
    import os

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this checkout's code
    out = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.stdout.split() == ["1", "False", "False"], out.stderr
