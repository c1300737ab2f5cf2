"""The attachment contract, run against every store kind (in memory, SQLite, PostgreSQL): the
bytes once per hash and given back byte for byte, a window loaded without them, forks that
reference instead of copying, and a delete that removes what no session uses any more."""

from __future__ import annotations

import hashlib

import pytest

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.attachments import Attachment, attachment_from_bytes
from chatflow_cli.core.memory import BaseSessionStore
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.messages import Message, Role


def _image(kind: str, size: tuple[int, int]) -> bytes:
    import io

    image = pytest.importorskip("PIL.Image")
    buffer = io.BytesIO()
    image.new("RGB", size, (200, 20, 20)).save(buffer, format=kind)
    return buffer.getvalue()


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


def test_a_window_and_a_listing_load_without_making_attachments(any_store: BaseSessionStore, agent: Agent,
                                                               store_kind: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a window or listing sessions pays nothing for attachments nobody reads: their
    metadata becomes Attachment values only when a message's attachments are read (the
    speed target: 100 image turns load within 1.2x of 100 text turns)."""
    if store_kind == "memory":
        pytest.skip("the in-memory store keeps Message values: nothing is loaded")
    odd = attachment_from_bytes(b"x\n", 'a],"b\\ "name":"\u00e9.txt')  # a name that looks like JSON
    image = Attachment(hashlib.sha256(b"img").hexdigest(), "image/png", 3, "p.png", 2, 1, b"img")
    sdk = Message(Role.USER, "with items", items=({"type": "message", "attachments": [{"x": 1}]},),
                  attachments=(image,))
    _turn(any_store, agent, "s", Message.user("one", [image, odd]))
    _turn(any_store, agent, "s", sdk)
    _turn(any_store, agent, "s", Message(Role.USER, "nested only", items=({"attachments": [{"y": "]}"}]},)))
    made: list[object] = []
    real = Attachment.from_dict.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Attachment, "from_dict", classmethod(lambda cls, data: made.append(data) or real(cls, data)))
    window = any_store.get("s")
    assert window is not None
    listed = any_store.list_sessions()
    history = window.history
    assert made == [] and [s.session_id for s in listed] == ["s"]
    users = [m for m in history if m.role is Role.USER]
    assert users[0].attachments == (image, odd) and len(made) == 2
    assert users[1] == sdk and users[1].items == sdk.items
    assert users[2].attachments == () and users[2].items == ({"attachments": [{"y": "]}"}]},)


def test_a_tool_result_s_images_are_kept_with_it_until_its_turn_goes_on(any_store: BaseSessionStore,
                                                                       agent: Agent) -> None:
    """Images a tool returned while its call waited (an approval, a custom tool beside it): the
    bytes are stored with the submitted result, and the TOOL message stored when the turn goes
    on carries them, whether they came through ``submit_tool_result`` or a recorded event."""
    from chatflow_cli.core.messages import ToolCall

    first = attachment_from_bytes(_image("PNG", (2, 3)), "a-1.png")  # whole images: a cut one is refused
    second = attachment_from_bytes(_image("GIF", (4, 5)), "b-1.gif")
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
