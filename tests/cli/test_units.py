"""In-process tests of the CLI's pure parts: settings precedence, config validation, safe rendering."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest

from chatflow_cli.assembly import build_agents
from chatflow_cli.config import (
    DEFAULT_REMOTE_MODEL,
    ensure_private_dir,
    load_settings,
    mask_secret,
    resolve_model,
)
from chatflow_cli.core.errors import ConfigError
from chatflow_cli.core.memory import TurnRecord
from chatflow_cli.core.messages import Message, ToolCall
from chatflow_cli.render import Lines, dumps, fold, safe_text, turn_dict, turn_handoffs, turn_renderables


# -- settings ------------------------------------------------------------------------------
def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_precedence_flags_env_file_defaults(tmp_path):
    cfg = _write(tmp_path, 'model = "file-model"\nbase_url = "http://file/v1"\n')
    env = {"CHATFLOW_HOME": str(tmp_path / "home"), "CHATFLOW_CONFIG": str(cfg)}
    s = load_settings(env=env)
    assert (s.model, s.base_url) == ("file-model", "http://file/v1")
    assert s.sources["model"] == "file"
    env.update(CHATFLOW_MODEL="env-model", OPENAI_BASE_URL="http://env/v1")
    s = load_settings(env=env)
    assert (s.model, s.base_url, s.sources["model"]) == ("env-model", "http://env/v1", "env")
    s = load_settings(env=env, model="flag-model", base_url="http://flag/v1")
    assert (s.model, s.base_url, s.sources["base_url"]) == ("flag-model", "http://flag/v1", "flag")
    s = load_settings(env={"CHATFLOW_HOME": str(tmp_path / "home")}, config=_write(tmp_path / "empty", ""))
    assert (s.model, s.base_url, s.config_loaded) == (None, None, True)
    assert s.db_path == tmp_path / "home" / "chatflow.db"
    assert load_settings(env=env, db=str(tmp_path / "x.db")).db_path == tmp_path / "x.db"


def test_api_key_comes_from_the_named_variable_and_is_never_shown(tmp_path):
    cfg = _write(tmp_path, 'api_key_env = "MY_PROVIDER_KEY"\n')
    env = {"CHATFLOW_HOME": str(tmp_path), "CHATFLOW_CONFIG": str(cfg), "MY_PROVIDER_KEY": "sk-abcdef123456",
           "OPENAI_API_KEY": "sk-other"}
    s = load_settings(env=env)
    assert s.api_key == "sk-abcdef123456" and s.api_key_env == "MY_PROVIDER_KEY"
    assert "sk-abcdef123456" not in repr(s)
    assert "sk-" not in mask_secret(s.api_key) and mask_secret(None) == "(not set)"
    choice = resolve_model(s, local_available=False)
    assert choice.model == DEFAULT_REMOTE_MODEL and choice.api_key == "sk-abcdef123456" and not choice.local
    assert "sk-abcdef123456" not in repr(choice)


def test_model_choice_local_and_errors(tmp_path):
    env = {"CHATFLOW_HOME": str(tmp_path), "CHATFLOW_CONFIG": str(_write(tmp_path / "empty", ""))}
    s = load_settings(env=env)
    assert resolve_model(s, local_available=True).local is True
    with pytest.raises(ConfigError, match="OPENAI_API_KEY.*--base-url.*chatflow-cli\\[local\\]"):
        resolve_model(s, local_available=False)
    with pytest.raises(ConfigError, match="local extra"):
        resolve_model(load_settings(env=env, model="local"), local_available=False)
    with pytest.raises(ConfigError, match="needs an endpoint"):
        resolve_model(load_settings(env=env, model="gpt-4o"), local_available=True)
    choice = resolve_model(load_settings(env=env, base_url="http://x/v1", model="m"), local_available=True)
    assert (choice.model, choice.base_url, choice.local) == ("m", "http://x/v1", False)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('model = "a"\nmodel = "b"\n', 2, "Cannot overwrite"),
        ('model = 3\n', 1, "model must be"),
        ('\n\nbase_url = ""\n', 3, "base_url must be"),
        ('temperature = 1\n', 1, "unknown key 'temperature'"),
        ('api_key_env = "sk-123 456"\n', 1, "NAME of an environment variable"),
        ('[[agents]]\ninstructions = "x"\n', 1, "name is missing"),
        ('[[agents]]\nname = "A"\n[[agents]]\nname = "A"\n', 4, "defined twice"),
        ('[[agents]]\nname = "A"\ntools = ["not a ref"]\n', 3, "module:function"),
        ('[[agents]]\nname = "A"\ntools = [{ name = "t", parameters = { type = "string" } }]\n', 3,
         "JSON Schema object"),
        ('default_agent = "Z"\n[[agents]]\nname = "A"\n', 1, "not a configured agent"),
        ('max_turns = 0\n', 1, "positive integer"),
    ],
)
def test_bad_config_names_file_line_and_problem(tmp_path, text, line, words):
    cfg = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(env={"CHATFLOW_HOME": str(tmp_path), "CHATFLOW_CONFIG": str(cfg)})
    message = str(info.value)
    assert str(cfg) in message and f"line {line}:" in message and words in message, message
    assert "\n" not in message


def test_build_agents_with_handoff_cycle_and_custom_tool(tmp_path):
    cfg = _write(tmp_path, """
[[agents]]
name = "Support"
handoffs = ["Billing"]
tools = [{ name = "approve", description = "Ask a human", parameters = { type = "object", properties = {} } }]
[[agents]]
name = "Billing"
model = "big"
handoffs = ["Support"]
""")
    s = load_settings(env={"CHATFLOW_HOME": str(tmp_path), "CHATFLOW_CONFIG": str(cfg)})
    start, agents = build_agents(s)
    assert start.name == "Support" and agents["Billing"].handoffs == (agents["Support"],)
    assert set(start.all_tools()) == {"approve", "transfer_to_billing"}
    assert start.all_tools()["approve"].is_custom
    _, forced = build_agents(s, model_override="flag")
    assert {a.model for a in forced.values()} == {"flag"}
    default, only = build_agents(load_settings(env={"CHATFLOW_HOME": str(tmp_path),
                                                    "CHATFLOW_CONFIG": str(_write(tmp_path / "empty", ""))}))
    assert list(only) == ["Assistant"] and default.instructions


# -- rendering -----------------------------------------------------------------------------
HOSTILE = "a\x1b[2Jb\x1b]52;c;ZWNobw==\x07c\x9b31md\u202eevil\r\n\tok"


def test_ensure_private_dir_creates_every_missing_parent_private_under_umask_000(tmp_path):
    """Issue 7: a world-writable parent of CHATFLOW_HOME would let anyone swap the data dir."""
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    target = existing / "a" / "b" / "home"
    old = os.umask(0)
    try:
        assert ensure_private_dir(target) == target
    finally:
        os.umask(old)
    for directory in (existing / "a", existing / "a" / "b", target):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE(existing.stat().st_mode) == 0o755, "a folder that existed is left as it was"
    assert ensure_private_dir(target) == target  # already there: nothing to do


def test_ensure_private_dir_refuses_a_file_in_the_way(tmp_path):
    from chatflow_cli.core.errors import StoreError

    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="cannot create the data directory"):
        ensure_private_dir(tmp_path / "file" / "home")


def test_safe_text_makes_every_control_inert():
    out = safe_text(HOSTILE)
    assert not any(ch in out for ch in "\x1b\x07\x9b\u202e\r")
    assert out.startswith("a␛[2Jb␛]52;c;ZWNobw==␇c<U+009B>31md<U+202E>evil\n\tok")
    assert safe_text(None) == "" and safe_text("plain\ntext") == "plain\ntext"


def test_dumps_keeps_text_verbatim_but_inert():
    line = dumps({"content": HOSTILE})
    assert "\x1b" not in line and "\x9b" not in line and "\u202e" in line  # bidi stays (printable)
    assert json.loads(line)["content"] == HOSTILE


def test_fold():
    long = "\n".join(f"line {i}" for i in range(30))
    folded = fold(long)
    assert folded.startswith("line 0\nline 1") and "line 8" not in folded and "22 more lines" in folded
    assert fold(long, full=True) == long and fold("short") == "short"
    assert "more characters" in fold("x" * 1000)


def _record() -> TurnRecord:
    call = ToolCall("c1", "lookup", json.dumps({"q": "x" * 20}))
    handoff = ToolCall("c2", "transfer_to_billing", "{}")
    return TurnRecord(
        number=7,
        messages=(
            Message.user("find \x1b[31mit\x1b[0m"),
            Message.model(None, [call], agent="Support"),
            Message.tool("c1", "\n".join(f"row {i}" for i in range(20)), name="lookup"),
            Message.model(None, [handoff], agent="Support"),
            Message.tool("c2", "Billing", name="transfer_to_billing"),
            Message.model("Found **it**.", agent="Billing"),
        ),
        in_window=False,
    )


def test_turn_renderables_plain():
    items = turn_renderables(_record(), width=60)
    text = "\n".join(i.plain for i in items)
    assert text.splitlines()[0].startswith("── Turn 7 · outside the context window ──")
    assert "You: find ␛[31mit␛[0m" in text
    assert 'Support called lookup {"q": "xxxxxxxxxxxxxxxxxxxx"}' in text
    assert "row 7" in text and "row 8" not in text and "more lines" in text
    assert "handoff: Support -> Billing" in text and "transfer_to_billing" not in text
    assert "Billing: Found **it**." in text
    assert "\x1b" not in text


def test_turn_renderables_on_a_rich_console():
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=80, color_system=None, force_terminal=False)
    for item in turn_renderables(_record(), markdown=True, width=80):
        console.print(item)
    out = buffer.getvalue()
    assert "Found it." in out and "**" not in out  # Markdown rendered
    assert "\x1b" not in out and "handoff: Support -> Billing" in out


def test_turn_dict_and_handoffs():
    data = turn_dict(_record())
    assert data["number"] == 7 and data["in_window"] is False
    assert data["handoffs"] == [{"from_agent": "Support", "to_agent": "Billing", "tool_call_id": "c2"}]
    assert turn_handoffs(_record()) == data["handoffs"]
    assert data["messages"][0]["content"] == "find \x1b[31mit\x1b[0m"  # verbatim in data


def test_lines_ansi_and_plain():
    lines = Lines("bold", "bold").append(" plain")
    assert lines.plain == "bold plain"
    assert lines.ansi(None) == "bold plain"
    assert lines.ansi("truecolor") == "\x1b[1mbold\x1b[0m plain"
    assert lines.to_text().plain == "bold plain"


# -- shared fixtures -------------------------------------------------------------------------
def test_cli_fixtures_are_shared_with_every_test_folder():
    """``chatflow``, ``provider`` and ``config_file`` live in tests/conftest.py, so the
    hardening (and any other) tests can drive the real process the same way."""
    import subprocess
    import sys

    for folder in ("tests/hardening", "tests/repl"):
        listing = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "--fixtures", folder],
            cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120,
        ).stdout
        defined_in = {"chatflow": "tests/conftest.py", "provider": "tests/conftest.py",
                      "config_file": "tests/conftest.py", "isolated_home": "tests/conftest.py",
                      "fake_server": "tests/helpers/fakeserver.py"}
        for name, where in defined_in.items():
            assert any(line.startswith(f"{name} -- {where}:") for line in listing.splitlines()), \
                (folder, name, listing[-3000:])
