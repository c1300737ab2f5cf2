"""Files queued with ``/attach`` in the real REPL (a pseudo-terminal, the fake server): sent
by Enter on an empty prompt, never taken by a message they were not meant for (after a failed
turn, after ``/new``), said when Ctrl-D drops them, a path in quotes or with an escaped space,
and an odd name listed on one line."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.pty_driver import leave
from tests.helpers.stored import open_store


def _png(path: Path) -> bytes:
    Image = pytest.importorskip("PIL.Image")
    buffer = io.BytesIO()
    Image.new("RGB", (16, 8), (0, 0, 255)).save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def test_enter_on_an_empty_prompt_sends_the_files_and_quoted_paths_attach(provider: Any, pty_chatflow: Any,
                                                                           tmp_path: Path) -> None:
    folder = tmp_path / "odd dir"
    folder.mkdir()
    png = _png(folder / "ünï cødé 日本.png")
    (folder / "my notes.md").write_text("# hi\n", encoding="utf-8")
    repl = pty_chatflow("chat", "-s", "q1")
    repl.wait_prompt()
    repl.send(f'/attach "{folder / "ünï cødé 日本.png"}"\r')
    repl.wait_prompt_after("sent with your next message")
    repl.send(f"/attach '{folder / 'my notes.md'}'\r")
    repl.wait_prompt_after("my notes.md (text/markdown")
    repl.send("\r")  # no text: the files go alone, as chat -f FILE sends them
    repl.wait_prompt_after("ok:")
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    assert provider.requests[-1]["messages"][-1] == {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "File my notes.md:\n```\n# hi\n```"}]}
    escaped = str(folder / "my notes.md").replace(" ", "\\ ")
    repl.send(f"/attach {escaped}\r")
    repl.wait_prompt_after("sent with your next message")
    repl.send("\x04")  # Ctrl-D: the queued file is not sent, and that is said
    repl.wait_text("not sent: my notes.md (text/markdown, 5 B) (attached files are dropped when you leave)")
    assert repl.wait_exit() == 0
    assert len(provider.requests) == 1
    with open_store() as st:
        assert len(st.get("q1").turns) == 1


def test_a_failed_messages_files_go_with_retry_only_and_new_drops_queued_files(provider: Any, pty_chatflow: Any,
                                                                                tmp_path: Path) -> None:
    _png(tmp_path / "shot.png")
    (tmp_path / "notes.md").write_text("# n\n", encoding="utf-8")
    repl = pty_chatflow("chat", "-s", "r4", "-m", "fake-text-only")
    repl.wait_prompt()
    repl.send(f"/attach {tmp_path / 'shot.png'}\r")
    repl.wait_prompt_after("sent with your next message")
    repl.send("describe\r")
    repl.wait_prompt_after("does not accept images")
    repl.send("/attach\r")
    repl.wait_prompt_after("kept for /retry: shot.png")
    repl.send("/model fake-model\r")
    repl.wait_prompt_after("model: fake-model (from the next message)")
    repl.send("a different message\r")
    repl.wait_prompt_after("ok: a different message")
    assert "not sent with this message: shot.png (image/png" in " ".join(repl.screen().split())
    assert provider.requests[-1]["messages"][-1] == {"role": "user", "content": "a different message"}
    repl.send(f"/attach {tmp_path / 'notes.md'}\r")
    repl.wait_prompt_after("sent with your next message")
    repl.send("/new\r")
    repl.wait_prompt_after("new session")
    assert "not sent: notes.md (text/markdown, 4 B) (attached files are dropped when a new session begins)" \
        in " ".join(repl.screen().split())
    repl.send("hello\r")
    repl.wait_prompt_after("ok: hello")
    assert provider.requests[-1]["messages"][-1] == {"role": "user", "content": "hello"}
    leave(repl)
    with open_store() as st:
        assert [m.attachments for t in st.get("r4").turns for m in t.messages if m.role.value == "user"] == [()]


def test_an_odd_name_is_listed_on_one_line(provider: Any, pty_chatflow: Any, tmp_path: Path) -> None:
    (tmp_path / "odd\nname.md").write_text("x\n", encoding="utf-8")
    repl = pty_chatflow("chat", "-s", "o1")
    repl.wait_prompt()
    repl.send(f"/attach {tmp_path / 'odd'}\x1b\rname.md\r")  # Esc-Enter: a newline in the path
    repl.wait_prompt_after("sent with your next message")
    repl.send("/attach\r")
    repl.wait_prompt_after("attached: odd name.md (text/markdown, 2 B)")
    assert not any(row.startswith("name") for row in repl.rows())
    leave(repl)
