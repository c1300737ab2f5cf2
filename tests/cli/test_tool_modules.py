"""Where tool modules are imported from: next to the config file first, then the current directory."""

from __future__ import annotations

import os


def test_tool_modules_are_found_next_to_the_config_file_then_in_the_current_directory(
        chatflow, provider, config_file, tmp_path):
    cfg = config_file(
        'default_agent = "Desk"\n[[agents]]\nname = "Desk"\ninstructions = "x"\n'
        'tools = ["neartools:near", "cwdtools:here"]\n'
    )
    body = ("from chatflow_cli import tool\n\n@tool\ndef {name}() -> str:\n"
            "    \"\"\"Say where.\"\"\"\n    return '{name} from {where}'\n")
    (cfg.parent / "neartools.py").write_text(body.format(name="near", where="the config dir"))
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "cwdtools.py").write_text(body.format(name="here", where="the cwd"))
    # the config directory wins over the current directory for the same name
    (workdir / "neartools.py").write_text(body.format(name="near", where="the WRONG place"))
    assert "PYTHONPATH" not in os.environ or str(cfg.parent) not in os.environ["PYTHONPATH"]
    provider.add_tool_calls([("c1", "near", "{}"), ("c2", "here", "{}")])
    provider.add_text("done")
    r = chatflow("chat", "-s", "t", "where?", cwd=workdir)
    assert r.returncode == 0, r
    results = [m["content"] for m in provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert results == ["near from the config dir", "here from the cwd"]
    elsewhere = chatflow("chat", "-s", "t2", "where?", cwd=tmp_path)  # cwdtools is not found from here
    assert elsewhere.returncode != 0 and "cannot import tool module 'cwdtools'" in elsewhere.stderr, elsewhere


_PING = "from chatflow_cli import tool\n\n@tool\ndef ping() -> str:\n    \"\"\"Ping.\"\"\"\n    return 'pong'\n"


def test_max_tool_rounds_is_a_setting_of_config_toml(chatflow, provider, config_file):
    cfg = config_file('max_tool_rounds = 2\n[[agents]]\nname = "Desk"\ninstructions = "x"\n'
                      'tools = ["pingtools:ping"]\n')
    (cfg.parent / "pingtools.py").write_text(_PING)
    shown = chatflow("config", "show", "--json").json()
    assert (shown["max_tool_rounds"], shown["max_tool_rounds_source"]) == (2, "file")
    for i in range(3):  # a model that keeps calling: the third round is past the limit of 2
        provider.add_tool_calls([(f"c{i}", "ping", "{}")])
    r = chatflow("chat", "-s", "loop", "go")
    assert r.returncode == 5, r
    assert "past max_tool_rounds=2 in turn 1" in r.stderr and "max_tool_rounds in config.toml" in r.stderr
    assert len(provider.requests) == 3
    provider.add_tool_calls([("c9", "ping", "{}")])
    provider.add_text("done")
    assert chatflow("chat", "-s", "fine", "go").returncode == 0  # two rounds are allowed


def test_max_tool_rounds_default_and_bad_values(chatflow, config_file):
    shown = chatflow("config", "show", "--json").json()
    assert (shown["max_tool_rounds"], shown["max_tool_rounds_source"]) == (10, "default")
    for value in ("-1", "1001", "2.5", '"ten"', "true"):
        config_file(f'model = "m"\nmax_tool_rounds = {value}\n')
        r = chatflow("config", "show")
        assert r.returncode == 9, (value, r)
        assert "line 2:" in r.stderr and "max_tool_rounds must be a whole number from 0 to 1000" in r.stderr, r
