"""``chatflow agents ls``: the configured agents, their tools, a tool module that does not import."""

from __future__ import annotations

import os

from tests.helpers.config import CUSTOM_TOOLS


def test_agents_ls_reports_a_tool_module_that_does_not_import(chatflow, config_file, tmp_path):
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "brokentools.py").write_text("import no_such_module_anywhere\n")
    config_file('[[agents]]\nname = "Support"\ninstructions = "x"\ntools = ["brokentools:f"]\n')
    r = chatflow("agents", "ls")
    assert r.returncode == 9, r
    assert "cannot import tool module 'brokentools'" in r.stderr and "No module named" in r.stderr
    assert r.stdout == ""


def test_agents_ls_json_keeps_display_text_out_of_data(chatflow, config_file, tmp_path):
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "goodtools.py").write_text(
        "from chatflow_cli import tool\n\n@tool\ndef check(order_id: str) -> str:\n    \"\"\"Check.\"\"\"\n    return 'ok'\n")
    config_file(CUSTOM_TOOLS.replace('tools = [', 'tools = [\n  "goodtools:check",'))
    [row] = chatflow("agents", "ls", "--json").json()
    assert row["tools"] == [{"name": "check", "kind": "python", "ref": "goodtools:check"},
                            {"name": "approve_refund", "kind": "custom"}, {"name": "notify", "kind": "custom"}]
    assert row["name"] == "Support" and row["start"] is True
    lines = chatflow("agents", "ls", "--output", "jsonl").jsonl()
    assert lines == [row]
    text = chatflow("agents", "ls")
    assert "approve_refund (custom)" in text.stdout and "Support *" in text.stdout


def test_agents_ls_default_and_config_path(chatflow, isolated_home):
    agents = chatflow("agents", "ls", "--json").json()
    assert [a["name"] for a in agents] == ["Assistant"]
    r = chatflow("config", "path")
    assert r.returncode == 0 and r.stdout.strip() == os.environ["CHATFLOW_CONFIG"]
    assert not (isolated_home / "chatflow.db").exists()


def test_a_session_whose_agent_left_config_goes_on_with_the_default_agent_and_says_so(chatflow, provider,
                                                                                       config_file):
    config_file('[[agents]]\nname = "Support"\ninstructions = "You answer questions."\n'
                '[[agents]]\nname = "Billing"\ninstructions = "You handle refunds."\n')
    assert chatflow("chat", "-s", "gone", "-a", "Billing", "refund please").returncode == 0
    config_file('[[agents]]\nname = "Support"\ninstructions = "You answer questions."\n')  # Billing removed
    r = chatflow("chat", "-s", "gone", "--json", "and now?")
    assert r.returncode == 0, r
    notes = [line for line in r.stderr_lines if "no longer configured" in line]
    assert notes == ["chatflow: agent 'Billing' of session gone is no longer configured: continuing with agent "
                     "'Support' (choose another with --agent NAME, or /agent NAME in the REPL)"], r.stderr
    assert r.json()["agent"] == "Support"
    assert provider.requests[-1]["messages"][0] == {"role": "system", "content": "You answer questions."}
    again = chatflow("chat", "-s", "gone", "third")
    assert again.returncode == 0 and "no longer configured" not in again.stderr
    [listed] = [s for s in chatflow("sessions", "ls", "--json").json() if s["session_id"] == "gone"]
    assert listed["agent"] == "Support"
