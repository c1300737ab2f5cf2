"""Compaction with the real SmolLM2 through llama.cpp's server: the model writes a summary of
the earlier turns, and the next turn's request carries it instead of those turns."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.compaction import compact_session
from chatflow_cli.core.runner import Runner

pytestmark = [
    pytest.mark.local_model,
    pytest.mark.slow,
    # a whole model run on 2 cores (the server's CPU is not the test's): CI's second pass; the
    # default run keeps the real model's answer and forced tool call in tests/core/test_local.py
    # and the REPL's in tests/repl/test_repl_e2e.py
    pytest.mark.ci_long,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed"),
]


def test_smollm2_summarises_and_the_next_turn_uses_the_summary(sqlite_store: Any) -> None:
    from chatflow_cli.core.local import LocalServer
    from chatflow_cli.core.model import ModelClient
    from tests.helpers.fakeserver import FakeServer

    agent = Agent("Local", "You are a helpful assistant.")
    with LocalServer() as server:
        client = ModelClient(server.base_url, None, timeout=180, max_retries=0)
        runner = Runner(agent, sqlite_store, model_client=client, default_model=server.model, max_tokens=48,
                        temperature=0.0, compact_at=None)
        runner.run("local-c", "My name is Ada and my order number is 4417.")
        runner.run("local-c", "I prefer answers in French.")
        runner.run("local-c", "What is the capital of Italy?")
        done = compact_session(sqlite_store, "local-c", client, server.model, through=2, max_tokens=96, temperature=0.0)
        client.close()
    assert done.summary.strip() and done.events[0].type == "context.compacted"
    assert done.tokens_after < done.tokens_before
    ((summary, removed),) = sqlite_store.summaries("local-c")
    assert not removed and summary.summary_through == 2 and summary.content == done.summary
    # the next turn's request: the summary, then only the turns after 2 (on a fake server,
    # to read the request exactly)
    with FakeServer() as fake:
        fake.add_text("ok")
        other = ModelClient(fake.url, "k", max_retries=0, timeout=20)
        Runner(agent, sqlite_store, model_client=other, default_model="m").run("local-c", "Thanks!")
        other.close()
        sent = fake.requests[-1]["messages"]
    assert [m["role"] for m in sent][:3] == ["system", "system", "user"]
    assert sent[1]["content"] == done.summary
    assert sent[2]["content"] == "What is the capital of Italy?"
    assert not any("4417" in m["content"] for m in sent[2:])
