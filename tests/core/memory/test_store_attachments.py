"""The attachment contract, run against every store kind (in memory, SQLite, PostgreSQL): the
bytes once per hash and given back byte for byte, a window loaded without them, forks that
reference instead of copying, and a delete that removes what no session uses any more."""

from __future__ import annotations

import hashlib

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.attachments import Attachment, attachment_from_bytes
from chatflow_cli.core.memory import BaseSessionStore
from chatflow_cli.core.memory.owner import Owner
from chatflow_cli.core.messages import Message


def _turn(store: BaseSessionStore, agent: Agent, session_id: str, message: Message) -> None:
    start = store.begin_turn(session_id, default_agent=agent, user_message=message, owner=Owner.current())
    start.session.add_message(Message.model("seen"))
    start.session.complete_turn("seen")
    store.save(start.session)
    store.release(start.session)


def test_attachments_are_kept_once_by_hash_and_deleted_with_their_last_session(any_store: BaseSessionStore,
                                                                               agent: Agent) -> None:
    every_byte = bytes(range(256)) * 64  # NUL, 0xff and all between: what comes back must be the same
    image = Attachment(hashlib.sha256(every_byte).hexdigest(), "image/png", len(every_byte), "all.png", 8, 8,
                       every_byte)
    log = attachment_from_bytes(b"12:00 error: disk full\n", "app.log")
    _turn(any_store, agent, "s", Message.user("one", [image, log]))
    _turn(any_store, agent, "s", Message.user("two", [image] * 10))  # the same file ten times more
    both = sorted([image.sha256, log.sha256])
    assert any_store.attachment_hashes() == both
    assert any_store.attachment_data([image.sha256, "0" * 64]) == {image.sha256: every_byte}

    # the window carries the metadata, never the bytes
    users = [m for m in any_store.get("s").history if m.attachments]
    assert [len(m.attachments) for m in users] == [2, 10]
    assert users[0].attachments == (image, log) and all(a.data is None for m in users for a in m.attachments)

    any_store.fork("s", 1, into="f")  # turn 1 only: both files, referenced, not copied
    _turn(any_store, agent, "g", Message.user("three", [log]))
    any_store.rollback("s", to_turn=1)  # a rolled-back turn stays in the log, and so do its files
    assert any_store.attachment_hashes("s") == both and any_store.attachment_hashes("f") == both
    assert any_store.delete("s") is True
    assert any_store.attachment_hashes() == both  # f still uses both
    assert any_store.delete("f") is True
    assert any_store.attachment_hashes() == [log.sha256]  # g uses the log
    assert any_store.attachment_data([log.sha256]) == {log.sha256: b"12:00 error: disk full\n"}
    assert any_store.delete("g") is True
    assert any_store.attachment_hashes() == [] and any_store.attachment_data(both) == {}


def test_a_tool_result_s_images_are_kept_with_it_until_its_turn_goes_on(any_store: BaseSessionStore,
                                                                       agent: Agent) -> None:
    """Images a tool returned while its call waited (an approval, a custom tool beside it): the
    bytes are stored with the submitted result, and the TOOL message stored when the turn goes
    on carries them, whether they came through ``submit_tool_result`` or a recorded event."""
    from chatflow_cli.core.messages import ToolCall

    first = attachment_from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR\0\0\0\x02\0\0\0\x03" + b"\0" * 40, "a-1.png")
    second = attachment_from_bytes(b"GIF89a\x04\x00\x05\x00" + b"\0" * 20, "b-1.gif")
    start = any_store.begin_turn("t", default_agent=agent, user_message=Message.user("go"), owner=Owner.current())
    calls = [ToolCall("c1", "shot"), ToolCall("c2", "other"), ToolCall("c3", "ask")]
    start.session.add_message(Message.model(None, calls))
    start.session.record_event("tool.result_submitted", {"turn": 1, "tool_use_id": "c2", "output": "[image]",
                                                         "attachments": [second.to_dict()]}, attachments=[second])
    any_store.release(start.session)
    assert any_store.submit_tool_result("t", "c1", "[image]", attachments=[first]) == ["c3"]
    assert any_store.attachment_data([first.sha256, second.sha256]) == {first.sha256: first.data,
                                                                         second.sha256: second.data}
    assert any_store.submit_tool_result("t", "c3", "done") == []
    go_on = any_store.begin_turn("t", default_agent=agent, user_message=None, owner=Owner.current())
    results = {m.tool_call_id: m.attachments for m in go_on.session.history if m.tool_call_id}
    assert results == {"c1": (first,), "c2": (second,), "c3": ()}
    any_store.release(go_on.session)
    assert any_store.attachment_hashes("t") == sorted([first.sha256, second.sha256])
