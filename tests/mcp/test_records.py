"""What is recorded and shown of MCP calls: calls waiting for an approval wherever a pending call
is described, the completion of their ids, and the round trip of MCP outputs through an export
(issue 27). The real ``chatflow`` process, the fake model server and the test server
(tests/mcp/toolbox.py) started by chatflow over stdio."""

from __future__ import annotations

from tests.mcp.test_cli import _server_toml


def _two_asking(chatflow, provider, config_file, session: str) -> None:
    config_file(_server_toml())  # approval: "ask", the default
    provider.add_tool_calls([("call_1", "toolbox__echo", '{"text": "one"}'),
                             ("call_2", "toolbox__echo", '{"text": "two"}')])
    r = chatflow("chat", "-s", session, "please")
    assert r.returncode == 0 and "--approve call_1" in r.stderr, r


def test_the_repl_says_a_call_waits_for_an_approval_and_how_to_give_it(chatflow, provider, config_file,
                                                                      pty_chatflow):
    from tests.helpers.pty_driver import leave

    config_file(_server_toml())
    provider.add_tool_calls([("call_1", "toolbox__echo", '{"text": "one"}')])
    assert chatflow("chat", "-s", "r2", "please").returncode == 0
    provider.add_text("Echoed.")
    provider.add_text("Going on.")
    repl = pty_chatflow("chat", "-s", "r2", width=160)
    repl.wait_prompt()
    waiting = ("waiting for approval (--approve call_1 / --deny call_1) · your next message asks you first (y/n/a)")
    recap = " ".join(repl.screen().split())
    assert waiting in recap and "--tool-result" not in recap, recap
    repl.send("/show\r")
    repl.wait_text(waiting, count=2)
    repl.send("go on\r")
    repl.wait_text("turn 1 is waiting for your approval first.")
    repl.wait_text("allow toolbox__echo (server toolbox)? [y/n/a]")
    repl.send("y\r")
    repl.wait_prompt_after("Going on.")
    leave(repl)
    tools = [m for m in provider.requests[1]["messages"] if m["role"] == "tool"]
    assert tools == [{"role": "tool", "tool_call_id": "call_1", "content": "one"}]


def test_an_approval_that_leaves_others_waiting_names_them_as_approvals(chatflow, provider, config_file):
    _two_asking(chatflow, provider, config_file, "a2")
    r = chatflow("chat", "-s", "a2", "--approve", "call_1")
    assert r.returncode == 0, r
    assert "still waiting for: call_2 (approve it with --approve call_2 or refuse it with --deny call_2)" \
        in " ".join(r.stderr.split()), r
    shown = chatflow("sessions", "show", "a2").stdout
    assert "waiting for approval (--approve call_2 / --deny call_2)" in shown and "--tool-result" not in shown
    _two_asking(chatflow, provider, config_file, "a3")
    r = chatflow("chat", "-s", "a3", "--deny", "call_2", "--json")
    assert r.returncode == 0, r
    assert r.json()["pending_tool_use_ids"] == ["call_1"] and r.json()["awaiting_approval"] == ["call_1"], r
    replay = chatflow("replay", "a3").stdout
    assert "waiting for approvals" in replay and "custom tool results" not in replay, replay


def test_approve_deny_and_tool_result_complete_the_ids_that_wait_for_them(chatflow, provider, config_file):
    from tests.helpers.config import CUSTOM_TOOLS

    config_file(CUSTOM_TOOLS + 'mcp_servers = ["toolbox"]\n' + _server_toml())
    provider.add_tool_calls([("call_C", "notify", "{}"), ("call_M", "toolbox__echo", '{"text": "hi"}'),
                             ("call_N", "toolbox__echo", '{"text": "ho"}')])
    assert chatflow("chat", "-s", "mix", "go").returncode == 0
    provider.add_text("Other.")
    assert chatflow("chat", "-s", "other", "hello").returncode == 0  # the latest session now waits for nothing

    def bash(line: str) -> list[str]:
        words = line.split(" ")
        r = chatflow(env={"_CHATFLOW_COMPLETE": "complete_bash", "COMP_WORDS": line,
                          "COMP_CWORD": str(len(words) - 1)})
        assert r.returncode == 0, r
        return r.stdout.split()

    assert bash("chatflow chat -s mix --approve ") == ["call_M", "call_N"]
    assert bash("chatflow chat --session=mix --deny call_N") == ["call_N"]
    assert bash("chatflow chat -s mix --tool-result ") == ["call_C"]
    assert bash("chatflow chat -s mix --tool-result call_C ") == []  # its OUTPUT is yours to write
    assert bash("chatflow chat -s other --approve ") == []
    assert bash("chatflow chat -c --approve ") == []
    zsh = chatflow(env={"_CHATFLOW_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "chatflow chat -s mix --deny call_"})
    assert '"call_M"' in zsh.stdout and '"call_N"' in zsh.stdout and "call_C" not in zsh.stdout, zsh
    assert chatflow("chat", "-s", "mix", "--approve", "call_M").returncode == 0  # answered: no longer offered
    assert bash("chatflow chat -s mix --approve ") == ["call_N"]
    provider.add_tool_calls([("call_L", "toolbox__echo", '{"text": "latest"}')])
    assert chatflow("chat", "-s", "other", "again").returncode == 0
    assert bash("chatflow chat -c --approve ") == ["call_L"]
    fish = chatflow(env={"_CHATFLOW_COMPLETE": "complete_fish", "_TYPER_COMPLETE_ARGS": "chatflow chat -c --deny ",
                         "_TYPER_COMPLETE_FISH_ACTION": "get-args"})
    assert fish.stdout.split() == ["call_L"], fish


def test_a_whole_mcp_output_survives_export_and_import_into_a_fresh_home(chatflow, provider, config_file, tmp_path):
    import json

    config_file(_server_toml(approval="always"))
    provider.add_tool_calls([("call_1", "toolbox__huge", '{"size": 25000}')])
    provider.add_text("Long.")
    provider.add_tool_calls([("call_2", "toolbox__echo", '{"text": "short"}')])
    provider.add_text("Short.")
    assert chatflow("chat", "-s", "big", "go").returncode == 0
    assert chatflow("chat", "-s", "big", "again").returncode == 0
    sent = provider.requests[1]["messages"][-1]["content"]
    assert len(sent) < 25000 and "[cut: the result has 25,000 characters" in sent

    def outputs(*home: str) -> list[dict]:
        env = {"CHATFLOW_HOME": home[0]} if home else None
        r = chatflow("sessions", "export", "big", env=env)
        assert r.returncode == 0, r
        return [e["data"] for e in map(json.loads, r.stdout.splitlines()) if e.get("type") == "mcp.output"]

    before = outputs()
    assert [e["tool_use_id"] for e in before] == ["call_1"] and before[0]["output"] == "0123456789" * 2500
    shown = chatflow("sessions", "show", "big", "--json")
    exported = tmp_path / "big.jsonl"
    exported.write_text(chatflow("sessions", "export", "big").stdout, encoding="utf-8")
    fresh = tmp_path / "fresh-home"
    fresh.mkdir()
    done = chatflow("sessions", "import", str(exported), env={"CHATFLOW_HOME": str(fresh)})
    assert done.returncode == 0, done
    after = chatflow("sessions", "show", "big", "--json", env={"CHATFLOW_HOME": str(fresh)})
    assert after.returncode == 0, after
    assert after.json() == shown.json()  # the provider's token counts too (the context use)
    assert outputs(str(fresh)) == before
    replayed = chatflow("replay", "big", "--json", env={"CHATFLOW_HOME": str(fresh)})
    assert [e["data"]["output"] for e in replayed.jsonl() if e["type"] == "mcp.output"] == \
        ["0123456789" * 2500], replayed


def test_an_agent_s_tool_choice_from_config_forces_its_mcp_tool_on_the_first_request(chatflow, provider,
                                                                                     config_file):
    config_file(_server_toml(approval="always") + '\n[[agents]]\nname = "Echo"\ninstructions = "Echo."\n'
                'mcp_servers = ["toolbox"]\ntool_choice = "toolbox__echo"\n')
    provider.add_tool_calls([("call_1", "toolbox__echo", '{"text": "forced"}')])
    provider.add_text("Echoed.")
    r = chatflow("chat", "-s", "tc", "say it")
    assert r.returncode == 0 and r.stdout == "Echoed.\n", r
    first, second = provider.requests
    assert first["tool_choice"] == {"type": "function", "function": {"name": "toolbox__echo"}}
    assert "tool_choice" not in second  # later requests of the turn: the provider's default
    config_file('[[agents]]\nname = "Echo"\ntool_choice = 3\n')
    bad = chatflow("chat", "-s", "tc", "again")
    assert bad.returncode == 9 and "tool_choice must be auto, none, required or the name of one of its tools" \
        in bad.stderr, bad


def _db(home: str | None = None):
    import os
    import sqlite3
    from pathlib import Path

    return sqlite3.connect(Path(home or os.environ["CHATFLOW_HOME"]) / "chatflow.db")


def test_an_image_a_tool_returns_is_an_attachment_sent_after_the_results(chatflow, provider, config_file, tmp_path):
    import base64
    import hashlib

    from tests.mcp.toolbox import _png

    png = _png(64, 32)
    config_file(_server_toml(approval="always"))
    provider.add_tool_calls([("call_1", "toolbox__photo", '{"width": 64, "height": 32}'),
                             ("call_2", "toolbox__echo", '{"text": "and words"}')])
    provider.add_text("A red rectangle.")
    r = chatflow("chat", "-s", "img", "--output", "jsonl", "what does it show?")
    assert r.returncode == 0, r
    [photo] = [e["data"] for e in r.jsonl() if e["type"] == "tool.call_finished" and e["data"]["id"] == "call_1"]
    line = f"photo-1.png (image/png, {len(png)} B, 64x32)"
    assert photo["output"] == f"a red rectangle\n\n[image {line}]" and photo["is_error"] is False, photo
    assert photo["attachments"] == [{"sha256": hashlib.sha256(png).hexdigest(), "media_type": "image/png",
                                     "size": len(png), "name": "photo-1.png", "width": 64, "height": 32}]
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    sent = provider.requests[1]["messages"]
    assert sent[-3:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": f"a red rectangle\n\n[image {line}]"},
        {"role": "tool", "tool_call_id": "call_2", "content": "and words"},
        {"role": "user", "content": [
            {"type": "text", "text": "The images the tool results above returned: photo-1.png from toolbox__photo "
                                     "(call call_1)."},
            {"type": "image_url", "image_url": {"url": url}}]}]
    # the next turn sends it again, read back from the database; the same image again is one row
    provider.add_tool_calls([("call_3", "toolbox__photo", '{"width": 64, "height": 32}')])
    provider.add_text("The same one.")
    assert chatflow("chat", "-s", "img", "again").returncode == 0
    images = [p for m in provider.requests[-1]["messages"] if m["role"] == "user" and isinstance(m["content"], list)
              for p in m["content"] if p["type"] == "image_url"]
    assert [p["image_url"]["url"] for p in images] == [url, url]
    with _db() as conn:
        assert conn.execute("SELECT data FROM chatflow_attachments").fetchall() == [(png,)]
    shown = chatflow("sessions", "show", "img").stdout
    assert shown.count(f"  attached: {line}") == 2, shown
    # exported and imported into a fresh home: the same session, the same bytes
    exported = tmp_path / "img.jsonl"
    exported.write_text(chatflow("sessions", "export", "img").stdout, encoding="utf-8")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert chatflow("sessions", "import", str(exported), env={"CHATFLOW_HOME": str(fresh)}).returncode == 0
    after = chatflow("sessions", "show", "img", "--json", env={"CHATFLOW_HOME": str(fresh)})
    assert after.json() == chatflow("sessions", "show", "img", "--json").json()
    with _db(str(fresh)) as conn:
        assert conn.execute("SELECT data FROM chatflow_attachments").fetchall() == [(png,)]


def test_an_approved_call_s_image_reaches_a_text_only_model_as_text(chatflow, provider, config_file):
    from tests.mcp.toolbox import _png

    line = f"photo-1.png (image/png, {len(_png(8, 8))} B, 8x8)"
    config_file(_server_toml())  # ask: the image comes back through --approve
    provider.add_tool_calls([("call_1", "toolbox__photo", '{"width": 8, "height": 8}')])
    assert chatflow("chat", "-m", "fake-text-only", "-s", "txt", "draw").returncode == 0
    provider.add_text("I cannot see it, but it is red.")
    r = chatflow("chat", "-m", "fake-text-only", "-s", "txt", "--approve", "call_1")
    assert r.returncode == 0 and r.stdout == "I cannot see it, but it is red.\n", r
    refused, sent = provider.requests[-2:]  # the provider refused the image; sent again without it
    assert refused["messages"][-1]["role"] == "user" and refused["messages"][-1]["content"][1]["type"] == "image_url"
    assert sent["messages"][-1]["role"] == "tool" and sent["messages"][-1]["content"].endswith(
        f"[image {line}]\n[the images are not shown: this model takes no images]"), sent
    assert f"  attached: {line}" in chatflow("sessions", "show", "txt").stdout
    with _db() as conn:
        assert conn.execute("SELECT count(*) FROM chatflow_attachments").fetchone() == (1,)
