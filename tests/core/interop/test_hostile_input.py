"""Readers never crash on hostile input: they read it or raise ImportFormatError."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings, strategies as st

from chatflow_cli.core.errors import ImportFormatError
from chatflow_cli.core.interop.chatflow_format import read_chatflow
from chatflow_cli.core.interop.claude_code import read_claude_code
from chatflow_cli.core.interop.markdown import read_markdown
from chatflow_cli.core.interop.openai_chat import read_openai
from chatflow_cli.core.messages import history_problems

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=20)
_keys = st.sampled_from(["type", "uuid", "parentUuid", "isSidechain", "message", "role", "content", "id",
                         "tool_use_id", "name", "input", "text", "sessionId", "logicalParentUuid", "isMeta",
                         "messages", "tool_calls", "tool_call_id", "function", "arguments", "format", "version",
                         "session", "seq", "data", "turn", "session_id"])
_values = st.sampled_from(["user", "assistant", "tool", "system", "text", "tool_use", "tool_result", "u1", "u2",
                           "a1", "c1", None, True, "chatflow", 1, 2]) | _json
_objects = st.recursive(st.dictionaries(_keys, _values, max_size=6),
                        lambda inner: st.dictionaries(_keys, _values | inner | st.lists(inner, max_size=3), max_size=6),
                        max_leaves=30)


def _lines(objects: list[Any]) -> list[str]:
    return [json.dumps(o) for o in objects]


@settings(max_examples=80, deadline=None)
@given(st.lists(_objects, min_size=1, max_size=8))
def test_claude_code_reader(objects: list[Any]) -> None:
    try:
        sessions = read_claude_code(_lines(objects))
    except ImportFormatError:
        return
    for session in sessions:
        assert history_problems([m for t in session.turns for m in t.messages]) == []


@settings(max_examples=80, deadline=None)
@given(st.lists(_objects, min_size=1, max_size=4))
def test_openai_reader(objects: list[Any]) -> None:
    try:
        read_openai(_lines(objects))
    except ImportFormatError:
        pass


@settings(max_examples=80, deadline=None)
@given(st.lists(_objects, min_size=1, max_size=6))
def test_chatflow_reader(objects: list[Any]) -> None:
    try:
        read_chatflow(_lines(objects))
    except ImportFormatError:
        pass


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=300))
def test_markdown_reader(text: str) -> None:
    try:
        read_markdown("---\nchatflow: \"md 1\"\nsession: \"s\"\n---\n" + text)
    except ImportFormatError:
        pass
