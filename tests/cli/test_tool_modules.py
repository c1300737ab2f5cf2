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
