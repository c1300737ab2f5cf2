"""Exports and imports are strict JSON: no bare ``NaN``/``Infinity`` out, none accepted in;
and a search reads the rows of a file that holds one.

A database written before the stores refused NaN may hold one (made here as that chatflow
wrote it: Python's ``json`` spells it ``NaN``); exporting its session is an error naming it,
never a line a strict JSON reader refuses.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from chatflow_cli.core.errors import ImportFormatError, StoreError
from chatflow_cli.core.interop import export_lines, read_source
from chatflow_cli.core.messages import Message, Role
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from tests.helpers.nan_db import PLACEHOLDER, legacy_nan_db


def _strict(line: str) -> object:
    return json.loads(line, parse_constant=lambda name: pytest.fail(f"bare {name} exported"))


@pytest.mark.parametrize("fmt", ["chatflow", "md"])
def test_exporting_a_session_holding_nan_is_an_error_naming_it(tmp_path: Path, fmt: str) -> None:
    with SQLiteSessionStore(legacy_nan_db(tmp_path / "old.db")) as store:
        with pytest.raises(StoreError, match="session bad cannot be exported: a float NaN or Infinity .* cannot be written as strict JSON") as caught:
            "".join(export_lines(store, "bad", fmt))
        assert type(caught.value).__name__ == "NonFiniteNumberError" and caught.value.session_id == "bad"
        good = "".join(export_lines(store, "good", fmt))
    assert "NaN" not in good and "hello there" in good
    if fmt == "chatflow":
        header = _strict(good.splitlines()[0])
        assert isinstance(header, dict) and header["session"]["session_id"] == "good"


def test_the_openai_form_of_a_session_holding_nan_is_strict_json(tmp_path: Path) -> None:
    # the Chat Completions form carries neither items nor metadata: nothing of the NaN is written
    with SQLiteSessionStore(legacy_nan_db(tmp_path / "old.db")) as store:
        lines = "".join(export_lines(store, "bad", "openai")).splitlines()
    assert [_strict(line) for line in lines] == [{"messages": [{"role": "user", "content": "hello"},
                                                               {"role": "assistant", "content": "hello back"}]}]


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("fmt", ["chatflow", "openai", "claude-code", "md"])
def test_an_import_refuses_nan_naming_the_line(tmp_path: Path, fmt: str, token: str) -> None:
    # a file that is strict JSON apart from one bare token: the reader names its line
    with SQLiteSessionStore(tmp_path / "src.db") as store:
        ctx = store.get_or_create("src", "Assistant")
        ctx.add_message(Message(Role.USER, "hello", items=({"role": "user", "score": PLACEHOLDER},)))
        ctx.add_message(Message.model("hi"))
        ctx.complete_turn("hi")
        store.save(ctx)
        exported = "".join(export_lines(store, "src", "md" if fmt == "md" else "chatflow"))
    if fmt == "openai":
        exported = '{"messages":[{"role":"user","content":"hi","score":12345.25}]}\n'
    elif fmt == "claude-code":
        exported = ('{"type":"user","uuid":"u1","parentUuid":null,"sessionId":"c","timestamp":'
                    '"2026-01-01T00:00:00Z","message":{"role":"user","content":"hi"},"score":12345.25}\n')
    assert repr(PLACEHOLDER) in exported
    path = tmp_path / "in.txt"
    path.write_text(exported.replace(repr(PLACEHOLDER), token), encoding="utf-8")
    with pytest.raises(ImportFormatError, match=rf"line \d+: .*not JSON \({re.escape(token)} is not JSON"):
        read_source(str(path), fmt)


def test_search_reads_a_row_sqlite_json_functions_refuse(tmp_path: Path) -> None:
    with SQLiteSessionStore(legacy_nan_db(tmp_path / "old.db")) as store:
        assert sorted(h.session_id for h in store.search("hello")) == ["bad", "good"]
        assert [(h.session_id, h.role) for h in store.search('"hello back"')] == [("bad", "model")]


def test_add_items_of_an_sdk_session_refuses_nan_and_the_file_stays_searchable(tmp_path: Path) -> None:
    pytest.importorskip("agents", reason="the agents-sdk extra (openai-agents) is not installed")
    from chatflow_cli.core.sdk_session import ChatflowSession

    session = ChatflowSession("bad", tmp_path / "new.db")
    with pytest.raises(TypeError, match="item 0 is not JSON-serialisable: a float NaN or Infinity"):
        asyncio.run(session.add_items([{"role": "user", "content": "hello", "score": float("nan")}]))
    asyncio.run(session.add_items([{"role": "user", "content": "hello", "score": 0.5}]))
    assert [h.session_id for h in session.store.search("hello")] == ["bad"]
    session.close()
