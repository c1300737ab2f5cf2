"""Text that is not valid UTF-8 (lone surrogates, as ``os.fsdecode`` makes of undecodable file
names): a tool result or a model reply carrying one is stored and sent on escaped; a user
message carrying one is a usage error that writes nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.errors import UsageError
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.messages import Role
from chatflow_cli.core.runner import Runner
from chatflow_cli.core.tools import tool
from tests.helpers.fakeserver import FakeServer

MODEL = "fake-model"


def test_a_tool_result_with_a_lone_surrogate_is_stored_and_the_model_sees_it(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    name = os.fsdecode(b"file-\xff.txt")  # 'file-\udcff.txt': not encodable as UTF-8

    @tool
    def list_files() -> str:
        """List files."""
        return name

    runner = make_runner(Agent("A", "x", model=MODEL, tools=[list_files]))
    fake_server.add_tool_calls([("call_f", "list_files", "{}")])
    fake_server.add_text("there is one file")
    result = runner.run("surr", "what files?")
    assert result.content == "there is one file"
    tool_msg = [m for m in sqlite_store.get("surr").history if m.role is Role.TOOL][0]
    assert tool_msg.content == "file-\\udcff.txt" and not tool_msg.is_error
    sent = fake_server.requests[1]["messages"][-1]
    assert sent["role"] == "tool" and sent["content"] == "file-\\udcff.txt"


def test_model_text_with_a_lone_surrogate_escape_is_stored(
    fake_server: FakeServer, make_runner: Callable[..., Runner], sqlite_store: Any
) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL, tools=[]))
    fake_server.add_chunks([{"choices": [{"index": 0, "delta": {"content": "bad \ud800 char"},
                                          "finish_reason": "stop"}]}])
    result = runner.run("surr2", "hi")
    assert result.content == "bad \\ud800 char"
    assert sqlite_store.get("surr2").history[-1].content == "bad \\ud800 char"


def test_a_user_message_with_a_lone_surrogate_is_a_usage_error_and_writes_nothing(
    make_runner: Callable[..., Runner], sqlite_store: Any, fake_server: FakeServer
) -> None:
    runner = make_runner(Agent("A", "x", model=MODEL))
    runner.run("surr3", "hello")
    seq = sqlite_store.last_seq("surr3")
    with pytest.raises(UsageError):
        runner.run("surr3", "bad \udcff")
    with pytest.raises(UsageError):
        runner.run("surr4", "bad \udcff")
    assert sqlite_store.last_seq("surr3") == seq and sqlite_store.get("surr4") is None
    assert sqlite_store.get("surr3").status is SessionStatus.IDLE and len(fake_server.requests) == 1
